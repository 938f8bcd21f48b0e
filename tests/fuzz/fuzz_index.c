/*
 * fuzz_index.c — libFuzzer target for the shard index decoder (lib/io/index.c),
 * the parser of a shard file's footer, of PREPARE payloads and of manifest
 * records: all untrusted bytes.
 *
 * Besides "no crash, no leak, no overread" (ASan), it checks one property: what
 * decodes re-encodes to exactly the same bytes (the encoding is canonical), so a
 * decoder that accepts something it does not fully understand is caught.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "io/io.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct io_shard_index *ix = NULL;
	if (io_index_decode(data, size, &ix) == 0) {
		void *again = NULL;
		size_t len = 0;
		if (io_index_encode(ix, &again, &len) != 0 || len != size ||
		    memcmp(again, data, size) != 0)
			abort();
		free(again);
	}
	io_index_free(ix);
	return 0;
}
