/*
 * test_index.c — the shard index codec (lib/io/index.c): round trips, and one test
 * per validation rule of the decoder, which reads untrusted bytes; version 2's
 * block-table fields and the block table's own codec likewise.
 */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/io_internal.h"
#include "testutil.h"

/* A valid index: tensors of assorted ndim (0, 1, 3, 16), a blob and an empty
 * tensor, chunked in chunk-byte pieces laid out one after another from 4096. */
static struct io_shard_index *make_index(uint64_t seed, uint64_t chunk)
{
	struct io_shard_index *ix = calloc(1, sizeof *ix);
	ix->step = 77;
	ix->rank = 3;
	ix->world = 8;
	ix->ntensors = 6;
	ix->tensors = calloc(ix->ntensors, sizeof *ix->tensors);
	static const char *names[] = { "scalar", "model/w", "opt/m.0", "deep", "rng", "empty" };
	uint64_t s = seed;
	for (uint32_t i = 0; i < ix->ntensors; i++) {
		struct io_tensor_entry *t = &ix->tensors[i];
		t->name = strdup(names[i]);
		t->name_len = (uint16_t)strlen(names[i]);
		t->kind = (uint8_t)(1 + i % CKPT_KIND_MAX_);
		t->policy = (uint8_t)(1 + i % CKPT_POLICY_MAX_);
		t->dtype = CKPT_F32;
	}
	/* scalar: ndim 0 */
	ix->tensors[0].ndim = 0;
	/* model/w: 1-D box [10, 10+n) of 1000 */
	ix->tensors[1].ndim = 1;
	ix->tensors[1].dtype = CKPT_BF16;
	ix->tensors[1].global_shape[0] = 1000;
	ix->tensors[1].offset[0] = 10;
	ix->tensors[1].extent[0] = 100 + tu_rand(&s) % 800;
	/* opt/m.0: 3-D */
	ix->tensors[2].ndim = 3;
	ix->tensors[2].dtype = CKPT_F64;
	for (int d = 0; d < 3; d++) {
		ix->tensors[2].global_shape[d] = 8 + (uint64_t)d;
		ix->tensors[2].offset[d] = 1;
		ix->tensors[2].extent[d] = 3 + (uint64_t)d;
	}
	/* deep: 16-D of ones except one dimension */
	ix->tensors[3].ndim = CKPT_MAX_NDIM;
	ix->tensors[3].dtype = CKPT_U8;
	for (int d = 0; d < CKPT_MAX_NDIM; d++) {
		ix->tensors[3].global_shape[d] = d == 5 ? 9000 : 1;
		ix->tensors[3].extent[d] = d == 5 ? 9000 : 1;
	}
	/* rng: a blob */
	ix->tensors[4].ndim = 1;
	ix->tensors[4].dtype = CKPT_U8;
	ix->tensors[4].flags = IO_TENSOR_BLOB;
	ix->tensors[4].global_shape[0] = ix->tensors[4].extent[0] = 5000;
	/* empty: zero extent */
	ix->tensors[5].ndim = 2;
	ix->tensors[5].global_shape[0] = 4;
	ix->tensors[5].global_shape[1] = 4;
	ix->tensors[5].extent[0] = 0;
	ix->tensors[5].extent[1] = 4;
	uint64_t nch = 0;
	for (uint32_t i = 0; i < ix->ntensors; i++) {
		struct io_tensor_entry *t = &ix->tensors[i];
		uint64_t e;
		ckpt_shape_elems(t->ndim, t->extent, &e);
		t->raw_bytes = e * ckpt_dtype_size(t->dtype);
		nch += (t->raw_bytes + chunk - 1) / chunk;
	}
	ix->chunks = calloc(nch ? nch : 1, sizeof *ix->chunks);
	uint64_t off = IO_HEADER_BYTES;
	for (uint32_t i = 0; i < ix->ntensors; i++) {
		struct io_tensor_entry *t = &ix->tensors[i];
		t->first_chunk = ix->nchunks;
		for (uint64_t r = 0; r < t->raw_bytes; r += chunk) {
			struct io_chunk_entry *c = &ix->chunks[ix->nchunks++];
			c->tensor = i;
			c->raw_offset = r;
			c->raw_len = t->raw_bytes - r < chunk ? t->raw_bytes - r : chunk;
			c->codec = (tu_rand(&s) & 1) ? IO_CODEC_ZSTD : IO_CODEC_RAW;
			c->stored_len = c->codec == IO_CODEC_RAW ? c->raw_len : 1 + c->raw_len / 2;
			c->file_offset = off;
			off += ckpt_align_up(c->stored_len, CKPT_ALIGN);
			tu_fill(c->hash, sizeof c->hash, s, ix->nchunks);
			t->nchunks++;
		}
	}
	ix->data_end = off;
	return ix;
}

static void index_eq(const struct io_shard_index *a, const struct io_shard_index *b)
{
	ck_assert_uint_eq(a->step, b->step);
	ck_assert_uint_eq(a->rank, b->rank);
	ck_assert_uint_eq(a->world, b->world);
	ck_assert_uint_eq(a->data_end, b->data_end);
	ck_assert_uint_eq(a->ntensors, b->ntensors);
	ck_assert_uint_eq(a->nchunks, b->nchunks);
	for (uint32_t i = 0; i < a->ntensors; i++) {
		const struct io_tensor_entry *x = &a->tensors[i], *y = &b->tensors[i];
		ck_assert_str_eq(x->name, y->name);
		ck_assert_uint_eq(x->name_len, y->name_len);
		ck_assert_uint_eq(x->kind, y->kind);
		ck_assert_uint_eq(x->dtype, y->dtype);
		ck_assert_uint_eq(x->policy, y->policy);
		ck_assert_uint_eq(x->flags, y->flags);
		ck_assert_uint_eq(x->ndim, y->ndim);
		for (unsigned d = 0; d < x->ndim; d++) {
			ck_assert_uint_eq(x->global_shape[d], y->global_shape[d]);
			ck_assert_uint_eq(x->offset[d], y->offset[d]);
			ck_assert_uint_eq(x->extent[d], y->extent[d]);
		}
		ck_assert_uint_eq(x->raw_bytes, y->raw_bytes);
		ck_assert_uint_eq(x->first_chunk, y->first_chunk);
		ck_assert_uint_eq(x->nchunks, y->nchunks);
	}
	for (uint32_t i = 0; i < a->nchunks; i++) {
		const struct io_chunk_entry *x = &a->chunks[i], *y = &b->chunks[i];
		ck_assert_uint_eq(x->tensor, y->tensor);
		ck_assert_uint_eq(x->codec, y->codec);
		ck_assert_uint_eq(x->raw_offset, y->raw_offset);
		ck_assert_uint_eq(x->raw_len, y->raw_len);
		ck_assert_uint_eq(x->file_offset, y->file_offset);
		ck_assert_uint_eq(x->stored_len, y->stored_len);
		ck_assert_mem_eq(x->hash, y->hash, CKPT_HASH_BYTES);
	}
}

START_TEST(round_trip)
{
	uint64_t seed = tu_seed();
	static const uint64_t chunks[] = { 1, 1000, 4096, 1u << 20 };
	for (unsigned k = 0; k < CKPT_ARRAY_SIZE(chunks); k++) {
		struct io_shard_index *ix = make_index(seed + k, chunks[k]), *back = NULL;
		void *buf, *buf2;
		size_t len, len2;
		ck_assert_int_eq(io_index_encode(ix, &buf, &len), 0);
		ck_assert_msg(io_index_decode(buf, len, &back) == 0, "%s", ckpt_err_msg());
		index_eq(ix, back);
		/* Encoding is canonical: the same index gives the same bytes. */
		ck_assert_int_eq(io_index_encode(back, &buf2, &len2), 0);
		ck_assert_uint_eq(len, len2);
		ck_assert_mem_eq(buf, buf2, len);
		ck_assert_int_eq(io_index_find(back, "rng"), 4);
		ck_assert_int_eq(io_index_find(back, "scalar"), 0);
		ck_assert_int_eq(io_index_find(back, "nope"), -1);
		ck_assert_uint_eq(back->tensors[5].nchunks, 0);
		ck_assert_uint_eq(back->tensors[0].raw_bytes, 4);
		free(buf);
		free(buf2);
		io_index_free(ix);
		io_index_free(back);
	}
	/* An empty shard is valid. */
	struct io_shard_index e = { .step = 1, .world = 1, .data_end = IO_HEADER_BYTES }, *back;
	void *buf;
	size_t len;
	ck_assert_int_eq(io_index_encode(&e, &buf, &len), 0);
	ck_assert_uint_eq(len, IO_INDEX_HDR_BYTES);
	ck_assert_int_eq(io_index_decode(buf, len, &back), 0);
	ck_assert_uint_eq(back->ntensors, 0);
	io_index_free(back);
	free(buf);
	io_index_free(NULL);
}
END_TEST

/* Encode ix, decode: must fail with code, and the message must contain what. */
static void expect_bad_bytes(const void *buf, size_t len, int code, const char *what)
{
	struct io_shard_index *out = (void *)1;
	int rc = io_index_decode(buf, len, &out);
	ck_assert_msg(rc == code, "expected %d for '%s', got %d (%s)", code, what, rc,
	              ckpt_err_msg());
	ck_assert_ptr_null(out);
	ck_assert_msg(strstr(ckpt_err_msg(), what), "message '%s' lacks '%s'", ckpt_err_msg(),
	              what);
}

static void expect_bad(struct io_shard_index *ix, const char *what)
{
	void *buf;
	size_t len;
	ck_assert_int_eq(io_index_encode(ix, &buf, &len), 0);
	expect_bad_bytes(buf, len, CKPT_EFORMAT, what);
	free(buf);
	io_index_free(ix);
}

#define MUT(field_stmt, what) do {                         \
		struct io_shard_index *ix = make_index(seed, 3000); \
		field_stmt;                                          \
		expect_bad(ix, what);                                \
	} while (0)

START_TEST(truncated_everywhere)
{
	struct io_shard_index *ix = make_index(tu_seed(), 3000);
	void *buf;
	size_t len;
	ck_assert_int_eq(io_index_encode(ix, &buf, &len), 0);
	for (size_t n = 0; n < len; n++) {
		/* A fresh copy of exactly n bytes so that ASan sees any overread. */
		void *p = malloc(n ? n : 1);
		memcpy(p, buf, n);
		struct io_shard_index *out;
		int rc = io_index_decode(p, n, &out);
		ck_assert_msg(rc == CKPT_EFORMAT, "length %zu of %zu: rc %d", n, len, rc);
		free(p);
	}
	/* One byte more is trailing garbage. */
	void *p = malloc(len + 1);
	memcpy(p, buf, len);
	((uint8_t *)p)[len] = 0;
	expect_bad_bytes(p, len + 1, CKPT_EFORMAT, "trailing garbage");
	free(p);
	free(buf);
	io_index_free(ix);
}
END_TEST

START_TEST(huge_counts)
{
	struct io_shard_index *ix = make_index(tu_seed(), 3000);
	void *buf;
	size_t len;
	ck_assert_int_eq(io_index_encode(ix, &buf, &len), 0);
	uint8_t *b = buf;
	uint8_t small[100];
	memcpy(small, b, sizeof small);
	ckpt_put_le32(small + 40, UINT32_MAX);          /* ntensors */
	expect_bad_bytes(small, sizeof small, CKPT_EFORMAT, "4294967295 tensors");
	memcpy(small, b, sizeof small);
	ckpt_put_le32(small + 44, UINT32_MAX);          /* nchunks */
	expect_bad_bytes(small, sizeof small, CKPT_EFORMAT, "4294967295 chunks");
	/* Counts one too large for the real buffer. */
	ckpt_put_le32(b + 44, ix->nchunks + 1);
	expect_bad_bytes(b, len, CKPT_EFORMAT, "chunk");
	free(buf);
	io_index_free(ix);
}
END_TEST

START_TEST(header_fields)
{
	struct io_shard_index *ix = make_index(tu_seed(), 3000);
	void *buf;
	size_t len;
	ck_assert_int_eq(io_index_encode(ix, &buf, &len), 0);
	uint8_t *b = buf;
	b[0] ^= 1;
	expect_bad_bytes(b, len, CKPT_EFORMAT, "magic");
	b[0] ^= 1;
	char newer[32];
	snprintf(newer, sizeof newer, "version %u", IO_FORMAT_VERSION + 1);
	ckpt_put_le32(b + 8, IO_FORMAT_VERSION + 1);
	expect_bad_bytes(b, len, CKPT_EVERSION, newer);
	ckpt_put_le32(b + 8, 0);
	expect_bad_bytes(b, len, CKPT_EFORMAT, "version 0");
	ckpt_put_le32(b + 8, 1);
	ckpt_put_le32(b + 12, 4);
	expect_bad_bytes(b, len, CKPT_EFORMAT, "flags");
	ckpt_put_le32(b + 12, 0);
	ckpt_put_le32(b + 24, 8);                    /* rank == world */
	expect_bad_bytes(b, len, CKPT_EFORMAT, "rank 8 outside world 8");
	ckpt_put_le32(b + 24, 3);
	ckpt_put_le64(b + 32, ix->data_end + 1);      /* misaligned data_end */
	expect_bad_bytes(b, len, CKPT_EFORMAT, "data_end");
	ckpt_put_le64(b + 32, 0);
	expect_bad_bytes(b, len, CKPT_EFORMAT, "data_end");
	ckpt_put_le64(b + 32, ix->data_end);
	struct io_shard_index *ok;
	ck_assert_int_eq(io_index_decode(b, len, &ok), 0);
	io_index_free(ok);
	/* Reserved pad bytes of chunk 0 (right after the tensor table). */
	size_t chunk0 = len - (size_t)ix->nchunks * IO_INDEX_CHUNK_BYTES;
	b[chunk0 + 5] = 1;
	expect_bad_bytes(b, len, CKPT_EFORMAT, "chunk 0: reserved");
	free(buf);
	io_index_free(ix);
}
END_TEST

/* A version-3 index (save id, block size past every chunk: no table) whose chunk 0
 * (tensor 'scalar', f32) is stored with codec. */
static struct io_shard_index *make_index_v3(uint64_t seed, uint8_t codec)
{
	struct io_shard_index *ix = make_index(seed, 3000);
	ix->block_bytes = 1u << 20;
	ix->save_id = 0x5eed;
	ix->chunks[0].codec = codec;
	ix->chunks[0].stored_len = codec == IO_CODEC_RAW ? ix->chunks[0].raw_len : 1;
	return ix;
}

START_TEST(bytegroup_version)
{
	/* A bytegroup chunk makes the index version 4, and only that: the encoding stays
	 * canonical, and a version-3 reader refuses it as newer (CKPT_EVERSION). */
	uint64_t seed = tu_seed();
	struct io_shard_index *ix = make_index_v3(seed, IO_CODEC_BYTEGROUP), *back;
	void *buf, *again;
	size_t len, alen;
	ck_assert(io_index_has_bytegroup(ix));
	ck_assert_int_eq(io_index_encode(ix, &buf, &len), 0);
	ck_assert_uint_eq(ckpt_get_le32((uint8_t *)buf + 8), IO_BYTEGROUP_VERSION);
	ck_assert_int_eq(io_index_decode(buf, len, &back), 0);
	ck_assert_uint_eq(back->chunks[0].codec, IO_CODEC_BYTEGROUP);
	ck_assert_int_eq(io_index_encode(back, &again, &alen), 0);
	ck_assert_uint_eq(alen, len);
	ck_assert_mem_eq(again, buf, len);
	io_index_free(back);
	free(again);
	/* Version 4 carries the counts of referenced files and references, here 0 and
	 * 0. The same bytes called version 3, without them: a bytegroup chunk it
	 * cannot have. */
	ck_assert_uint_eq(ckpt_get_le32((uint8_t *)buf + IO_INDEX_HDR3_BYTES), 0);
	ck_assert_uint_eq(ckpt_get_le32((uint8_t *)buf + IO_INDEX_HDR3_BYTES + 4), 0);
	memmove((uint8_t *)buf + IO_INDEX_HDR3_BYTES, (uint8_t *)buf + IO_INDEX_HDR4_BYTES,
	        len - IO_INDEX_HDR4_BYTES);
	ckpt_put_le32((uint8_t *)buf + 8, 3);
	expect_bad_bytes(buf, len - 8, CKPT_EFORMAT,
	                 "chunk 0: bytegroup codec in a version-3 index");
	free(buf);
	/* Version 4 with no bytegroup chunk and no reference is not the lowest
	 * version: malformed. */
	ix->chunks[0].codec = IO_CODEC_ZSTD;
	ck_assert(!io_index_has_bytegroup(ix));
	ck_assert_int_eq(io_index_encode(ix, &buf, &len), 0);
	ck_assert_uint_eq(ckpt_get_le32((uint8_t *)buf + 8), 3);
	uint8_t *v4 = calloc(1, len + 8);
	ck_assert_ptr_nonnull(v4);
	memcpy(v4, buf, IO_INDEX_HDR3_BYTES);
	memcpy(v4 + IO_INDEX_HDR4_BYTES, (uint8_t *)buf + IO_INDEX_HDR3_BYTES,
	       len - IO_INDEX_HDR3_BYTES);
	ckpt_put_le32(v4 + 8, IO_BYTEGROUP_VERSION);
	expect_bad_bytes(v4, len + 8, CKPT_EFORMAT,
	                 "version 4 without a bytegroup chunk or a reference");
	free(v4);
	free(buf);
	io_index_free(ix);
	/* Only dtypes with byte planes: tensor 3 is u8. */
	ix = make_index_v3(seed, IO_CODEC_BYTEGROUP);
	uint32_t k = ix->tensors[3].first_chunk;
	ix->chunks[k].codec = IO_CODEC_BYTEGROUP;
	ix->chunks[k].stored_len = 1;
	expect_bad(ix, "bytegroup codec for tensor 'deep' of dtype u8");
	/* Stored no larger than raw, as zstd. */
	ix = make_index_v3(seed, IO_CODEC_BYTEGROUP);
	ix->chunks[0].stored_len = ix->chunks[0].raw_len + 1;
	expect_bad(ix, "bytegroup stored_len");
	/* Without a save id there is no version 4 to write. */
	ix = make_index_v3(seed, IO_CODEC_BYTEGROUP);
	ix->save_id = 0;
	ck_assert_int_eq(io_index_encode(ix, &buf, &len), -EINVAL);
	io_index_free(ix);
}
END_TEST

START_TEST(bad_enums)
{
	uint64_t seed = tu_seed();
	MUT(ix->tensors[1].kind = 0, "tensor 1 ('model/w'): kind 0");
	MUT(ix->tensors[1].kind = CKPT_KIND_MAX_ + 1, "kind 6");
	MUT(ix->tensors[2].dtype = 0, "tensor 2 ('opt/m.0'): dtype 0");
	MUT(ix->tensors[2].dtype = CKPT_DTYPE_MAX_ + 1, "dtype 13");
	MUT(ix->tensors[0].policy = 0, "policy 0");
	MUT(ix->tensors[0].policy = CKPT_POLICY_MAX_ + 1, "policy 4");
	MUT(ix->tensors[0].flags = 2, "flags 0x2");
	MUT(ix->chunks[0].codec = IO_CODEC_BYTEGROUP + 1, "chunk 0: codec 3");
	/* ndim 17 cannot be encoded (the encoder refuses); patch the byte. */
	struct io_shard_index *ix = make_index(seed, 3000);
	void *buf;
	size_t len;
	ck_assert_int_eq(io_index_encode(ix, &buf, &len), 0);
	uint8_t *ndim = (uint8_t *)buf + IO_INDEX_HDR_BYTES + 2 + strlen("scalar") + 4;
	ck_assert_uint_eq(*ndim, 0);
	*ndim = CKPT_MAX_NDIM + 1;
	expect_bad_bytes(buf, len, CKPT_EFORMAT, "ndim 17");
	free(buf);
	io_index_free(ix);
}
END_TEST

START_TEST(bad_shapes)
{
	uint64_t seed = tu_seed();
	MUT(ix->tensors[1].offset[0] = 901, "offset 901 + extent");
	MUT(ix->tensors[2].extent[2] = 99, "dim 2");
	/* offset + extent wraps around 2^64: must not pass as "inside". */
	MUT((ix->tensors[1].offset[0] = UINT64_MAX, ix->tensors[1].extent[0] = 2), "dim 0");
	/* Elements overflow 64 bits. */
	MUT({
		for (int d = 0; d < 3; d++)
			ix->tensors[2].global_shape[d] = ix->tensors[2].extent[d] = 1ull << 22;
		ix->tensors[2].offset[0] = ix->tensors[2].offset[1] = ix->tensors[2].offset[2] = 0;
	}, "overflows");
	/* Bytes overflow (elements fit, times 8 does not). */
	MUT({
		ix->tensors[2].global_shape[0] = ix->tensors[2].extent[0] = 1ull << 62;
		ix->tensors[2].offset[0] = 0;
	}, "overflows");
	MUT(ix->tensors[1].raw_bytes += 2, "raw_bytes");
	MUT(ix->tensors[4].dtype = CKPT_F32, "blob must be u8");
	MUT(ix->tensors[4].ndim = 2, "blob");
}
END_TEST

START_TEST(bad_names)
{
	uint64_t seed = tu_seed();
	static const char *bad[] = { "", "a/../b", "/abs", "a//b", "x/.", "tab\tname" };
	for (unsigned i = 0; i < CKPT_ARRAY_SIZE(bad); i++) {
		struct io_shard_index *ix = make_index(seed, 3000);
		free((char *)ix->tensors[2].name);
		ix->tensors[2].name = strdup(bad[i]);
		expect_bad(ix, "tensor 2: invalid name");
	}
	/* Embedded NUL: the length field says 3, the bytes are "a\0b". */
	struct io_shard_index *nul = make_index(seed, 3000);
	free((char *)nul->tensors[0].name);
	nul->tensors[0].name = strdup("aXb");
	void *buf;
	size_t len;
	ck_assert_int_eq(io_index_encode(nul, &buf, &len), 0);
	uint8_t *p = memmem(buf, len, "aXb", 3);
	p[1] = 0;
	expect_bad_bytes(buf, len, CKPT_EFORMAT, "invalid name");
	free(buf);
	io_index_free(nul);
	/* Duplicates. */
	MUT((free((char *)ix->tensors[3].name), ix->tensors[3].name = strdup("model/w")),
	    "duplicate name 'model/w'");
}
END_TEST

START_TEST(bad_chunk_runs)
{
	uint64_t seed = tu_seed();
	/* Tensor 1 has several 3000-byte chunks (>= 200 bytes of bf16 ... at least one). */
	MUT(ix->tensors[2].first_chunk = ix->nchunks, "outside");
	MUT(ix->tensors[2].nchunks += 1, "chunk");
	MUT(ix->tensors[3].nchunks -= 1, "cover");
	MUT(ix->chunks[ix->tensors[3].first_chunk + 1].raw_offset += 1, "raw_offset");
	/* A gap: the second chunk of 'deep' starts later, the last one covers the end. */
	MUT({
		struct io_chunk_entry *c = &ix->chunks[ix->tensors[3].first_chunk];
		c->raw_len -= 1;
		c->stored_len = c->codec == IO_CODEC_RAW ? c->raw_len : c->stored_len;
	}, "raw_offset");
	MUT(ix->chunks[ix->tensors[3].first_chunk].tensor = 2, "belongs to tensor 2");
	MUT(ix->chunks[0].tensor = 99, "tensor");
	/* A chunk outside every run: drop one from the end of the last run. */
	MUT({
		ix->tensors[4].nchunks--;
		ix->tensors[4].raw_bytes = ix->tensors[4].extent[0] = ix->tensors[4].global_shape[0] =
			ix->tensors[4].raw_bytes - ix->chunks[ix->nchunks - 1].raw_len;
	}, "outside the run");
	/* Empty tensor claims a chunk. */
	MUT(ix->tensors[5].nchunks = 1, "chunk");
}
END_TEST

START_TEST(bad_chunk_fields)
{
	uint64_t seed = tu_seed();
	MUT(ix->chunks[1].raw_len = 0, "chunk 1: raw_len 0");
	MUT((ix->chunks[1].raw_len = IO_MAX_CHUNK_BYTES + 1, ix->chunks[1].stored_len = 1),
	    "raw_len");
	MUT((ix->chunks[1].codec = IO_CODEC_RAW, ix->chunks[1].stored_len = ix->chunks[1].raw_len - 1),
	    "raw chunk with stored_len");
	MUT((ix->chunks[1].codec = IO_CODEC_ZSTD, ix->chunks[1].stored_len = ix->chunks[1].raw_len + 1),
	    "zstd stored_len");
	MUT(ix->chunks[2].file_offset += 1, "not a multiple");
	MUT(ix->chunks[0].file_offset = 0, "outside");
	MUT(ix->chunks[ix->nchunks - 1].file_offset = ix->data_end, "outside");
	MUT(ix->data_end -= CKPT_ALIGN, "outside");
	/* Overlap: two chunks at the same offset. */
	MUT(ix->chunks[3].file_offset = ix->chunks[2].file_offset, "overlap");
	/* Overlap in the middle of a previous chunk's stored range (chunks > 4 KiB). */
	struct io_shard_index *big = make_index(seed, 10000);
	uint32_t k = 0;
	while (k + 1 < big->nchunks && big->chunks[k].stored_len <= CKPT_ALIGN)
		k++;
	ck_assert_uint_gt(big->chunks[k].stored_len, CKPT_ALIGN);
	big->chunks[k + 1].file_offset = big->chunks[k].file_offset + CKPT_ALIGN;
	expect_bad(big, "overlap");
}
END_TEST

/* ------------------------------------------------------------------ version 2 */

/* make_index with block hashes of block bytes: the table right after the chunks,
 * data_end after it (what the writer does). */
static struct io_shard_index *make_index_v2(uint64_t seed, uint64_t chunk, uint32_t block)
{
	struct io_shard_index *ix = make_index(seed, chunk);
	/* 'deep' (9000 bytes) and 'rng' (5000) stored raw, so that some chunks have
	 * blocks whatever the random codecs; then lay the chunks out again. */
	uint64_t off = IO_HEADER_BYTES;
	for (uint32_t k = 0; k < ix->nchunks; k++) {
		struct io_chunk_entry *c = &ix->chunks[k];
		if (c->tensor == 3 || c->tensor == 4) {
			c->codec = IO_CODEC_RAW;
			c->stored_len = c->raw_len;
		}
		c->file_offset = off;
		off += ckpt_align_up(c->stored_len, CKPT_ALIGN);
	}
	ix->data_end = off;
	ix->block_bytes = block;
	uint64_t n = io_index_nblocks(ix);
	if (n) {
		ix->blocks_offset = ix->data_end;
		ix->blocks_len = IO_BLOCKS_HDR_BYTES + n * CKPT_HASH_BYTES;
		tu_fill(ix->blocks_hash, sizeof ix->blocks_hash, seed, 99);
		ix->data_end += ckpt_align_up(ix->blocks_len, CKPT_ALIGN);
	}
	return ix;
}

static uint64_t raw_chunks_over(const struct io_shard_index *ix, uint64_t block)
{
	uint64_t n = 0;
	for (uint32_t k = 0; k < ix->nchunks; k++)
		if (ix->chunks[k].codec == IO_CODEC_RAW && ix->chunks[k].raw_len > block)
			n += (ix->chunks[k].raw_len + block - 1) / block;
	return n;
}

START_TEST(round_trip_v2)
{
	uint64_t seed = tu_seed();
	static const uint64_t chunks[] = { 1000, 4096, 20000, 1u << 20 };
	for (unsigned k = 0; k < CKPT_ARRAY_SIZE(chunks); k++) {
		struct io_shard_index *ix = make_index_v2(seed + k, chunks[k], 4096), *back = NULL;
		/* The count the decoder derives: raw chunks longer than a block, rounded up. */
		ck_assert_uint_eq(io_index_nblocks(ix), raw_chunks_over(ix, 4096));
		void *buf, *buf2;
		size_t len, len2;
		ck_assert_int_eq(io_index_encode(ix, &buf, &len), 0);
		ck_assert_uint_eq(ckpt_get_le32((uint8_t *)buf + 8), 2);
		ck_assert_msg(io_index_decode(buf, len, &back) == 0, "%s", ckpt_err_msg());
		index_eq(ix, back);
		ck_assert_uint_eq(back->block_bytes, 4096);
		ck_assert_uint_eq(back->blocks_offset, ix->blocks_offset);
		ck_assert_uint_eq(back->blocks_len, ix->blocks_len);
		ck_assert_mem_eq(back->blocks_hash, ix->blocks_hash, CKPT_HASH_BYTES);
		ck_assert_int_eq(io_index_encode(back, &buf2, &len2), 0);
		ck_assert_uint_eq(len, len2);
		ck_assert_mem_eq(buf, buf2, len);
		free(buf);
		free(buf2);
		io_index_free(back);
		/* A version-1 index of the same chunks is 40 bytes shorter, has no block
		 * fields, and is still read. */
		ix->block_bytes = 0;
		ix->blocks_offset = ix->blocks_len = 0;
		memset(ix->blocks_hash, 0, CKPT_HASH_BYTES);
		size_t len1;
		ck_assert_int_eq(io_index_encode(ix, &buf, &len1), 0);
		ck_assert_uint_eq(ckpt_get_le32((uint8_t *)buf + 8), 1);
		ck_assert_uint_eq(len1 + (IO_INDEX_HDR2_BYTES - IO_INDEX_HDR_BYTES), len);
		ck_assert_msg(io_index_decode(buf, len1, &back) == 0, "%s", ckpt_err_msg());
		ck_assert_uint_eq(back->block_bytes, 0);
		ck_assert_uint_eq(io_index_nblocks(back), 0);
		free(buf);
		io_index_free(back);
		io_index_free(ix);
	}
	/* Block hashes of compressed chunks and of one-block chunks: none; so a v2 index
	 * whose chunks all fit a block has no table, and says so with zeros. */
	struct io_shard_index *ix = make_index_v2(seed, 3000, 4096), *back;
	ck_assert_uint_eq(io_index_nblocks(ix), 0);
	ck_assert_uint_eq(ix->blocks_len, 0);
	void *buf;
	size_t len;
	ck_assert_int_eq(io_index_encode(ix, &buf, &len), 0);
	ck_assert_int_eq(io_index_decode(buf, len, &back), 0);
	ck_assert_uint_eq(back->block_bytes, 4096);
	free(buf);
	io_index_free(back);
	io_index_free(ix);
	/* The size of PREPARE's index does not depend on the number of blocks: the
	 * table's place takes 40 bytes, however long the table. */
	struct io_shard_index *small = make_index_v2(seed, 1u << 20, 1u << 16);
	struct io_shard_index *large = make_index_v2(seed, 1u << 20, 4096);
	ck_assert_uint_lt(io_index_nblocks(small), io_index_nblocks(large));
	size_t ls, ll;
	void *bs, *bl;
	ck_assert_int_eq(io_index_encode(small, &bs, &ls), 0);
	ck_assert_int_eq(io_index_encode(large, &bl, &ll), 0);
	ck_assert_uint_eq(ls, ll);
	free(bs);
	free(bl);
	io_index_free(small);
	io_index_free(large);
}
END_TEST

START_TEST(truncated_everywhere_v2)
{
	struct io_shard_index *ix = make_index_v2(tu_seed(), 20000, 4096);
	void *buf;
	size_t len;
	ck_assert_int_eq(io_index_encode(ix, &buf, &len), 0);
	for (size_t n = 0; n < len; n++) {
		void *p = malloc(n ? n : 1);
		memcpy(p, buf, n);
		struct io_shard_index *out;
		int rc = io_index_decode(p, n, &out);
		ck_assert_msg(rc == CKPT_EFORMAT, "length %zu of %zu: rc %d", n, len, rc);
		free(p);
	}
	free(buf);
	io_index_free(ix);
}
END_TEST

#define MUT2(field_stmt, what) do {                               		struct io_shard_index *ix = make_index_v2(seed, 20000, 8192); 		ck_assert_uint_gt(ix->blocks_len, 0);                      		field_stmt;                                                		expect_bad(ix, what);                                      	} while (0)

START_TEST(bad_block_fields)
{
	uint64_t seed = tu_seed();
	MUT2(ix->block_bytes = 2048, "block_bytes 2048");
	MUT2(ix->block_bytes = 12288, "block_bytes 12288");
	MUT2(ix->block_bytes = 1u << 31, "block_bytes");
	/* The length must be exactly what the chunks imply. */
	MUT2(ix->blocks_len += CKPT_HASH_BYTES, "block table of");
	MUT2(ix->blocks_len -= CKPT_HASH_BYTES, "block table of");
	MUT2(ix->blocks_len = 0, "block table of");
	MUT2(ix->blocks_len = UINT64_MAX, "block table of");
	/* A different block size implies a different count. */
	MUT2(ix->block_bytes = 4096, "block table of");
	/* Place: aligned, after the header, inside data_end, off the chunks. */
	MUT2(ix->blocks_offset += 512, "misaligned or outside");
	MUT2(ix->blocks_offset = 0, "misaligned or outside");
	MUT2(ix->blocks_offset = ix->data_end, "misaligned or outside");
	MUT2(ix->blocks_offset = UINT64_MAX - 4095, "misaligned or outside");
	MUT2(ix->data_end -= CKPT_ALIGN, "outside");
	MUT2(ix->blocks_offset = ix->chunks[ix->nchunks - 1].file_offset, "overlaps chunk");
	MUT2(ix->blocks_offset = IO_HEADER_BYTES, "overlaps chunk 0");
	/* No blocks: no table, and zeros say so. */
	{
		struct io_shard_index *ix = make_index_v2(seed, 3000, 4096);
		ix->blocks_offset = IO_HEADER_BYTES;
		expect_bad(ix, "no chunk has blocks");
	}
	{
		struct io_shard_index *ix = make_index_v2(seed, 3000, 4096);
		ix->blocks_hash[3] = 1;
		expect_bad(ix, "no chunk has blocks");
	}
	/* Reserved word after block_bytes. */
	struct io_shard_index *ix = make_index_v2(seed, 20000, 8192);
	void *buf;
	size_t len;
	ck_assert_int_eq(io_index_encode(ix, &buf, &len), 0);
	ckpt_put_le32((uint8_t *)buf + 52, 1);
	expect_bad_bytes(buf, len, CKPT_EFORMAT, "reserved header bytes");
	free(buf);
	io_index_free(ix);
}
END_TEST

START_TEST(block_table_codec)
{
	uint64_t seed = tu_seed();
	struct io_shard_index *ix = make_index_v2(seed, 20000, 4096);
	uint64_t n = io_index_nblocks(ix);
	ck_assert_uint_ge(n, 5);
	uint8_t *hashes = malloc(n * CKPT_HASH_BYTES);
	tu_fill(hashes, n * CKPT_HASH_BYTES, seed, 5);
	void *buf;
	size_t len;
	ck_assert_int_eq(io_blocks_encode(4096, hashes, n, &buf, &len), 0);
	ck_assert_uint_eq(len, ix->blocks_len);
	uint8_t *b = buf;
	ck_assert_mem_eq(b, "CKPTBLKS", 8);
	ck_assert_uint_eq(ckpt_get_le32(b + 8), 2);
	ck_assert_uint_eq(ckpt_get_le32(b + 12), 4096);
	ck_assert_uint_eq(ckpt_get_le64(b + 16), n);
	ck_assert_uint_eq(ckpt_get_le64(b + 24), 0);
	const uint8_t *got;
	ck_assert_msg(io_blocks_decode(ix, buf, len, &got) == 0, "%s", ckpt_err_msg());
	ck_assert_ptr_eq(got, b + IO_BLOCKS_HDR_BYTES);
	ck_assert_mem_eq(got, hashes, n * CKPT_HASH_BYTES);
	/* Every shorter length fails, on a copy of exactly that length (ASan). */
	for (size_t k = 0; k < len; k++) {
		void *p = malloc(k ? k : 1);
		memcpy(p, buf, k);
		ck_assert_int_eq(io_blocks_decode(ix, p, k, &got), CKPT_EFORMAT);
		ck_assert_ptr_null(got);
		free(p);
	}
	struct { size_t at, width; uint64_t v; int code; const char *what; } bad[] = {
		{ 0, 1, 'X', CKPT_EFORMAT, "bad magic" },
		{ 8, 4, IO_FORMAT_VERSION + 1, CKPT_EVERSION, "this build reads" },
		{ 8, 4, 1, CKPT_EFORMAT, "version 1" },
		{ 12, 4, 8192, CKPT_EFORMAT, "block size 8192, the index says 4096" },
		{ 16, 8, n + 1, CKPT_EFORMAT, "blocks, the index's chunks have" },
		{ 16, 8, UINT64_MAX, CKPT_EFORMAT, "blocks, the index's chunks have" },
		{ 24, 8, 1, CKPT_EFORMAT, "reserved" },
	};
	for (unsigned i = 0; i < CKPT_ARRAY_SIZE(bad); i++) {
		uint8_t *p = malloc(len);
		memcpy(p, buf, len);
		if (bad[i].width == 1)
			p[bad[i].at] = (uint8_t)bad[i].v;
		else if (bad[i].width == 4)
			ckpt_put_le32(p + bad[i].at, (uint32_t)bad[i].v);
		else
			ckpt_put_le64(p + bad[i].at, bad[i].v);
		int rc = io_blocks_decode(ix, p, len, &got);
		ck_assert_msg(rc == bad[i].code && strstr(ckpt_err_msg(), bad[i].what),
		              "case %u: rc %d, '%s' (want '%s')", i, rc, ckpt_err_msg(), bad[i].what);
		free(p);
	}
	/* One byte too many. */
	uint8_t *p = malloc(len + 1);
	memcpy(p, buf, len);
	p[len] = 0;
	ck_assert_int_eq(io_blocks_decode(ix, p, len + 1, &got), CKPT_EFORMAT);
	free(p);
	/* Against an index of another shape, or one without blocks. */
	struct io_shard_index *other = make_index_v2(seed + 1, 1000, 4096);
	if (io_index_nblocks(other) != n)
		ck_assert_int_eq(io_blocks_decode(other, buf, len, &got), CKPT_EFORMAT);
	other->block_bytes = 0;
	ck_assert_int_eq(io_blocks_decode(other, buf, len, &got), CKPT_EFORMAT);
	io_index_free(other);
	free(buf);
	/* An empty table encodes to the header alone. */
	ck_assert_int_eq(io_blocks_encode(4096, NULL, 0, &buf, &len), 0);
	ck_assert_uint_eq(len, IO_BLOCKS_HDR_BYTES);
	free(buf);
	free(hashes);
	io_index_free(ix);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("io_index");
	TCase *tc = tcase_create("index");
	tcase_add_test(tc, round_trip);
	tcase_add_test(tc, truncated_everywhere);
	tcase_add_test(tc, huge_counts);
	tcase_add_test(tc, header_fields);
	tcase_add_test(tc, bad_enums);
	tcase_add_test(tc, bad_shapes);
	tcase_add_test(tc, bad_names);
	tcase_add_test(tc, bad_chunk_runs);
	tcase_add_test(tc, bad_chunk_fields);
	tcase_add_test(tc, round_trip_v2);
	tcase_add_test(tc, truncated_everywhere_v2);
	tcase_add_test(tc, bad_block_fields);
	tcase_add_test(tc, block_table_codec);
	tcase_add_test(tc, bytegroup_version);
	suite_add_tcase(s, tc);
	SRunner *sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
