/*
 * fuzz_index.c — libFuzzer target for the shard index decoder (lib/io/index.c),
 * the parser of a shard file's footer, of PREPARE payloads and of manifest
 * records, and for the block table decoder (format version 2), the parser of the
 * table a reader loads before a partial read: all untrusted bytes.
 *
 * An input is one of two kinds, told apart by its first bytes:
 *  - a shard index (it starts with the index magic): decoded;
 *  - "BLKT" ‖ u32 LE n ‖ n bytes of shard index ‖ block table: the index is
 *    decoded, and when valid the rest is decoded as its block table.
 *
 * Besides "no crash, no leak, no overread" (ASan), it checks one property of both
 * decoders: what decodes re-encodes to exactly the same bytes (the encodings are
 * canonical), so a decoder that accepts something it does not fully understand is
 * caught.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "io/io.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Decode an index; abort if it decodes but does not re-encode to the same bytes. */
static struct io_shard_index *check_index(const uint8_t *data, size_t size)
{
	struct io_shard_index *ix = NULL;
	if (io_index_decode(data, size, &ix) != 0)
		return NULL;
	void *again = NULL;
	size_t len = 0;
	if (io_index_encode(ix, &again, &len) != 0 || len != size || memcmp(again, data, size) != 0)
		abort();
	free(again);
	return ix;
}

static void check_table(const struct io_shard_index *ix, const uint8_t *data, size_t size)
{
	const uint8_t *hashes;
	if (io_blocks_decode(ix, data, size, &hashes) != 0)
		return;
	/* The hashes lie inside the input, as many as the index's chunks imply. */
	uint64_t n = io_index_nblocks(ix);
	if (hashes < data || (uint64_t)(data + size - hashes) != n * CKPT_HASH_BYTES)
		abort();
	void *again = NULL;
	size_t len = 0;
	if (io_blocks_encode(ix->block_bytes, hashes, n, &again, &len) != 0 || len != size ||
	    memcmp(again, data, size) != 0)
		abort();
	free(again);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size >= 8 && !memcmp(data, "BLKT", 4)) {
		uint32_t n = (uint32_t)data[4] | (uint32_t)data[5] << 8 | (uint32_t)data[6] << 16 |
		             (uint32_t)data[7] << 24;
		if (n > size - 8)
			return 0;
		struct io_shard_index *ix = check_index(data + 8, n);
		if (ix && ix->block_bytes)
			check_table(ix, data + 8 + n, size - 8 - n);
		io_index_free(ix);
		return 0;
	}
	io_index_free(check_index(data, size));
	return 0;
}
