/*
 * gen_index_corpus.c — writes the seed corpus of fuzz_index (small valid shard
 * indexes: empty, scalar + blob, multi-chunk zstd/raw, 16-D; version 2 with and
 * without a block table; and framed index + block table inputs) into a directory.
 * Run by hand when the encoding changes: gen_index_corpus tests/fuzz/corpus/index
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/io.h"
#include "testutil.h"

static int emit(const char *dir, const char *name, const struct io_shard_index *ix)
{
	void *buf;
	size_t len;
	char path[4096];
	if (io_index_encode(ix, &buf, &len))
		return 1;
	struct io_shard_index *back;
	if (io_index_decode(buf, len, &back)) {       /* seeds must be valid */
		fprintf(stderr, "%s: %s\n", name, ckpt_err_msg());
		return 1;
	}
	io_index_free(back);
	snprintf(path, sizeof path, "%s/%s", dir, name);
	int rc = tu_write_file(path, buf, len);
	free(buf);
	return rc ? 1 : 0;
}

/* "BLKT" ‖ u32 LE index length ‖ index ‖ block table: fuzz_index's framed input. */
static int emit_framed(const char *dir, const char *name, const struct io_shard_index *ix,
                       const uint8_t *hashes, uint64_t nblocks)
{
	void *ib, *tb;
	size_t il, tl;
	if (io_index_encode(ix, &ib, &il))
		return 1;
	if (io_blocks_encode(ix->block_bytes, hashes, nblocks, &tb, &tl)) {
		free(ib);
		return 1;
	}
	struct io_shard_index *back;
	const uint8_t *h;
	int bad = io_index_decode(ib, il, &back);
	if (!bad) {
		bad = io_blocks_decode(back, tb, tl, &h);
		io_index_free(back);
	}
	if (bad) {
		fprintf(stderr, "%s: %s\n", name, ckpt_err_msg());
		free(ib);
		free(tb);
		return 1;
	}
	size_t n = 8 + il + tl;
	uint8_t *p = malloc(n);
	memcpy(p, "BLKT", 4);
	ckpt_put_le32(p + 4, (uint32_t)il);
	memcpy(p + 8, ib, il);
	memcpy(p + 8 + il, tb, tl);
	char path[4096];
	snprintf(path, sizeof path, "%s/%s", dir, name);
	int rc = tu_write_file(path, p, n);
	free(p);
	free(ib);
	free(tb);
	return rc ? 1 : 0;
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: %s DIR\n", argv[0]);
		return 2;
	}
	int bad = 0;
	struct io_shard_index e = { .step = 5, .rank = 0, .world = 1, .data_end = 4096 };
	bad |= emit(argv[1], "empty", &e);

	struct io_tensor_entry t[3];
	struct io_chunk_entry c[4];
	memset(t, 0, sizeof t);
	memset(c, 0, sizeof c);
	t[0] = (struct io_tensor_entry){ .name = "lr", .kind = CKPT_KIND_SCHEDULER,
	                                 .dtype = CKPT_F64, .policy = CKPT_REPLICATED,
	                                 .ndim = 0, .raw_bytes = 8, .first_chunk = 0,
	                                 .nchunks = 1 };
	t[1] = (struct io_tensor_entry){ .name = "rng/cuda", .kind = CKPT_KIND_RNG,
	                                 .dtype = CKPT_U8, .policy = CKPT_RANK_BOUND,
	                                 .flags = IO_TENSOR_BLOB, .ndim = 1, .raw_bytes = 20,
	                                 .first_chunk = 1, .nchunks = 1 };
	t[1].global_shape[0] = t[1].extent[0] = 20;
	c[0] = (struct io_chunk_entry){ .tensor = 0, .raw_len = 8, .file_offset = 4096,
	                                .stored_len = 8 };
	c[1] = (struct io_chunk_entry){ .tensor = 1, .raw_len = 20, .file_offset = 8192,
	                                .stored_len = 20 };
	memset(c[1].hash, 0xab, sizeof c[1].hash);
	struct io_shard_index small = { .step = 100, .rank = 1, .world = 2, .data_end = 12288,
	                                .ntensors = 2, .nchunks = 2, .tensors = t, .chunks = c };
	bad |= emit(argv[1], "scalar_blob", &small);

	/* A sharded 2-D tensor in three chunks, one compressed, plus an empty one. */
	t[2] = (struct io_tensor_entry){ .name = "model/layers.0/w", .kind = CKPT_KIND_MODEL,
	                                 .dtype = CKPT_BF16, .policy = CKPT_SHARDED, .ndim = 2,
	                                 .raw_bytes = 2 * 64 * 100, .first_chunk = 0,
	                                 .nchunks = 3 };
	t[2].global_shape[0] = 256; t[2].global_shape[1] = 100;
	t[2].offset[0] = 64;        t[2].extent[0] = 64; t[2].extent[1] = 100;
	struct io_tensor_entry t2[2] = { t[2], { .name = "opt/empty", .kind = CKPT_KIND_OPTIMIZER,
	                                         .dtype = CKPT_F32, .policy = CKPT_SHARDED,
	                                         .ndim = 1, .first_chunk = 3 } };
	t2[1].global_shape[0] = 10;
	t2[1].offset[0] = 10;
	struct io_chunk_entry c2[3] = {
		{ .tensor = 0, .raw_offset = 0, .raw_len = 5000, .file_offset = 4096,
		  .stored_len = 5000 },
		{ .tensor = 0, .codec = IO_CODEC_ZSTD, .raw_offset = 5000, .raw_len = 5000,
		  .file_offset = 12288, .stored_len = 700 },
		{ .tensor = 0, .raw_offset = 10000, .raw_len = 2800, .file_offset = 16384,
		  .stored_len = 2800 },
	};
	for (int i = 0; i < 3; i++)
		memset(c2[i].hash, 0x10 + i, sizeof c2[i].hash);
	struct io_shard_index multi = { .step = 7, .rank = 1, .world = 4, .data_end = 20480,
	                                .ntensors = 2, .nchunks = 3, .tensors = t2, .chunks = c2 };
	bad |= emit(argv[1], "multi_chunk", &multi);

	/* 16-D */
	struct io_tensor_entry t3 = { .name = "deep", .kind = CKPT_KIND_EXTRA, .dtype = CKPT_I16,
	                              .policy = CKPT_REPLICATED, .ndim = CKPT_MAX_NDIM,
	                              .raw_bytes = 2 * 3, .nchunks = 1 };
	for (int d = 0; d < CKPT_MAX_NDIM; d++)
		t3.global_shape[d] = t3.extent[d] = d == 15 ? 3 : 1;
	struct io_chunk_entry c3 = { .tensor = 0, .raw_len = 6, .file_offset = 4096,
	                             .stored_len = 6 };
	struct io_shard_index deep = { .step = 1, .rank = 0, .world = 1, .data_end = 8192,
	                               .ntensors = 1, .nchunks = 1, .tensors = &t3, .chunks = &c3 };
	bad |= emit(argv[1], "ndim16", &deep);

	/* Version 2: a tensor in two raw chunks of 3 and 2 blocks of 4 KiB, the block
	 * table after them, then the footer at data_end. */
	struct io_tensor_entry t4 = { .name = "model/emb", .kind = CKPT_KIND_MODEL,
	                              .dtype = CKPT_U8, .policy = CKPT_SHARDED, .ndim = 1,
	                              .raw_bytes = 20000, .nchunks = 2 };
	t4.global_shape[0] = 40000;
	t4.offset[0] = 20000;
	t4.extent[0] = 20000;
	struct io_chunk_entry c4[2] = {
		{ .tensor = 0, .raw_len = 12000, .file_offset = 4096, .stored_len = 12000 },
		{ .tensor = 0, .raw_offset = 12000, .raw_len = 8000, .file_offset = 16384,
		  .stored_len = 8000 },
	};
	memset(c4[0].hash, 0x21, sizeof c4[0].hash);
	memset(c4[1].hash, 0x22, sizeof c4[1].hash);
	uint8_t hashes[5 * CKPT_HASH_BYTES];
	for (unsigned i = 0; i < sizeof hashes; i++)
		hashes[i] = (uint8_t)(i * 7);
	struct io_shard_index v2 = { .step = 12, .rank = 0, .world = 2, .data_end = 28672,
	                             .ntensors = 1, .nchunks = 2, .tensors = &t4, .chunks = c4,
	                             .block_bytes = 4096, .blocks_offset = 24576,
	                             .blocks_len = 32 + sizeof hashes };
	void *tb;
	size_t tl;
	if (io_blocks_encode(4096, hashes, 5, &tb, &tl))
		return 1;
	io_hash128(tb, tl, v2.blocks_hash);
	free(tb);
	bad |= emit(argv[1], "v2_blocks", &v2);
	bad |= emit_framed(argv[1], "v2_blocks_table", &v2, hashes, 5);
	/* Version 2 whose chunks all fit one block: no table, zeros for its place. */
	struct io_shard_index v2small = small;
	v2small.block_bytes = 1u << 18;
	bad |= emit(argv[1], "v2_no_table", &v2small);
	/* Version 4: the bf16 tensor's middle chunk stored bytegroup (a save id, and
	 * chunks of one block: no table). */
	struct io_chunk_entry c5[3];
	memcpy(c5, c2, sizeof c5);
	c5[1].codec = IO_CODEC_BYTEGROUP;
	struct io_shard_index v4 = multi;
	v4.chunks = c5;
	v4.block_bytes = 1u << 18;
	v4.save_id = 0x0123456789abcdefull;
	bad |= emit(argv[1], "v4_bytegroup", &v4);
	/* Version 5: tree hashes, with and without a bytegroup chunk, and the block
	 * table of version 2's chunks. */
	struct io_shard_index v5 = v4;
	v5.tree = true;
	bad |= emit(argv[1], "v5_bytegroup", &v5);
	struct io_shard_index v5raw = v2;
	v5raw.save_id = 0x1122334455667788ull;
	v5raw.tree = true;
	bad |= emit_framed(argv[1], "v5_blocks_table", &v5raw, hashes, 5);
	return bad;
}
