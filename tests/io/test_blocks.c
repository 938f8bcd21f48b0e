/*
 * test_blocks.c — block hashes end to end (format version 2): a shard written with
 * a block table, then partial reads of chunks through the reader. A partial read
 * must read fewer bytes than the chunk (counted by the reader's stats), return the
 * exact bytes, and never hand over a byte it has not checked: a flipped bit in a
 * block it needs is CKPT_ECORRUPT naming tensor, chunk, block, file and offset; a
 * flipped bit in a block it does not need is not its business, but a whole-chunk
 * verify (IO_READ_CHECK_BLOCKS) finds it; a damaged table is an error; a table
 * whose hash is right but whose entries are wrong is found by verify. Version-1
 * shards and compressed chunks are read whole whatever range is asked for.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#include "io/io_internal.h"
#include "testutil.h"

#define BUF_BYTES  (256u << 10)
#define NBUFS      6u
#define DEPTH      4u
#define BLOCK      16384u
#define CHUNK      200000u          /* 13 blocks, the last one short */
#define BIG_BYTES  1000000u         /* tensor 0: 5 chunks (the last 200000 too) */
#define SMALL_BYTES 9000u           /* tensor 1: one chunk shorter than a block */

struct fx {
	char             *dir;
	char              path[512];
	struct io_pool   *pool;
	struct io_engine *e;
	uint64_t          seed;
	uint8_t          *data[2];      /* what the tensors hold */
	struct io_shard_result res;
};

static const uint64_t sizes[2] = { BIG_BYTES, SMALL_BYTES };

static void fx_write(struct fx *f, uint32_t block_bytes, int zstd, bool compressible)
{
	struct io_shard_writer *w;
	ck_assert_msg(io_shard_writer_open(f->e, f->path, &(struct io_writer_opts){ .step = 5, .rank = 0, .world = 1, .size_hint = 4u << 20, .zstd_level = zstd, .block_bytes = block_bytes }, &w) == 0, "%s", ckpt_err_msg());
	for (unsigned i = 0; i < 2; i++) {
		char name[32];
		snprintf(name, sizeof name, "layers.%u/w", i);
		uint64_t shape = sizes[i], zero = 0;
		struct io_tensor_desc d = { name, CKPT_KIND_MODEL, CKPT_U8, CKPT_SHARDED, 0, 1,
		                            &shape, &zero, &shape, sizes[i] };
		ck_assert_int_eq(io_shard_writer_add_tensor(w, &d), (int)i);
		f->data[i] = malloc(sizes[i]);
		tu_fill(f->data[i], sizes[i], f->seed, i);
		if (compressible)
			for (uint64_t k = 0; k < sizes[i]; k++)
				f->data[i][k] = (uint8_t)('a' + f->data[i][k] % 2);
	}
	for (unsigned i = 0; i < 2; i++)
		for (uint64_t o = 0; o < sizes[i]; o += CHUNK) {
			size_t len = (size_t)(sizes[i] - o < CHUNK ? sizes[i] - o : CHUNK);
			int b = io_pool_get(f->pool, 10000);
			ck_assert_int_ge(b, 0);
			memcpy(io_pool_addr(f->pool, (unsigned)b), f->data[i] + o, len);
			ck_assert_msg(io_shard_writer_append(w, i, (unsigned)b, len, NULL) == 0, "%s",
			              ckpt_err_msg());
		}
	ck_assert_msg(io_shard_writer_finish(w, &f->res) == 0, "%s", ckpt_err_msg());
}

static void fx_init(struct fx *f, const char *tag, uint32_t block_bytes)
{
	memset(f, 0, sizeof *f);
	f->seed = tu_seed();
	f->dir = tu_tmpdir(tag);
	snprintf(f->path, sizeof f->path, "%s/rank-000000.shard", f->dir);
	ck_assert_int_eq(io_pool_create(BUF_BYTES, NBUFS, NULL, &f->pool), 0);
	ck_assert_int_eq(io_engine_create(f->pool, DEPTH, &f->e), 0);
	fx_write(f, block_bytes, 0, false);
}

static void fx_done(struct fx *f)
{
	ck_assert_uint_eq(io_pool_nfree(f->pool), NBUFS);
	io_index_free(f->res.index);
	free(f->res.footer);
	free(f->data[0]);
	free(f->data[1]);
	io_engine_destroy(f->e);
	io_pool_destroy(f->pool);
	tu_rmtree(f->dir);
	free(f->dir);
}

static struct io_shard_reader *open_reader(struct fx *f)
{
	struct io_shard_reader *r;
	ck_assert_msg(io_shard_reader_open(f->e, f->path, NULL, &r) == 0, "%s", ckpt_err_msg());
	return r;
}

/* What the callback saw. */
struct seen {
	const struct fx *f;
	unsigned calls;
	uint64_t off, len;         /* of the last call */
};

static int check_cb(void *arg, const struct io_read_req *req, uint64_t off, const void *raw,
                    size_t len)
{
	struct seen *s = arg;
	const struct io_shard_index *ix = io_shard_reader_index(req->reader);
	const struct io_chunk_entry *c = &ix->chunks[req->chunk];
	/* Exact bytes, covering what was asked, inside the chunk. */
	ck_assert_uint_le(off + len, c->raw_len);
	ck_assert_mem_eq(raw, s->f->data[c->tensor] + c->raw_offset + off, len);
	if (req->hi) {
		ck_assert_uint_le(off, req->lo);
		ck_assert_uint_ge(off + len, req->hi);
	}
	s->calls++;
	s->off = off;
	s->len = len;
	return 0;
}

/* Read [lo, hi) of chunk k (hi 0: whole) with flags; the batch's return. */
static int read_range(struct fx *f, struct io_shard_reader *r, uint32_t k, uint64_t lo,
                      uint64_t hi, unsigned flags, struct seen *s)
{
	memset(s, 0, sizeof *s);
	s->f = f;
	struct io_read_req q = { .reader = r, .chunk = k, .arg = s, .lo = lo, .hi = hi,
	                         .flags = flags };
	return io_read_batch(f->e, &q, 1, check_cb);
}

/* ------------------------------------------------------------------ reads */

START_TEST(layout_of_a_v2_shard)
{
	struct fx f;
	fx_init(&f, "blocks-layout", BLOCK);
	const struct io_shard_index *ix = f.res.index;
	ck_assert_uint_eq(ix->block_bytes, BLOCK);
	ck_assert_uint_eq(ix->nchunks, 6);
	/* Five raw chunks of 13 blocks; the small tensor's chunk has none. */
	ck_assert_uint_eq(io_index_nblocks(ix), 5 * 13);
	ck_assert_uint_eq(io_chunk_nblocks(ix, &ix->chunks[5]), 0);
	/* The table: right after the last chunk, aligned, then the footer. */
	const struct io_chunk_entry *last = &ix->chunks[5];
	ck_assert_uint_eq(ix->blocks_offset,
	                  last->file_offset + ckpt_align_up(last->stored_len, CKPT_ALIGN));
	ck_assert_uint_eq(ix->blocks_len, IO_BLOCKS_HDR_BYTES + 65 * CKPT_HASH_BYTES);
	ck_assert_uint_eq(ix->data_end, ix->blocks_offset + ckpt_align_up(ix->blocks_len, CKPT_ALIGN));
	/* Version 2 in header and trailer too; the table's hashes are the blocks'. */
	void *file;
	size_t len;
	ck_assert_int_eq(tu_read_file(f.path, &file, &len), 0);
	const uint8_t *p = file;
	ck_assert_uint_eq(ckpt_get_le32(p + IO_HDR_OFF_VERSION), 2);
	ck_assert_uint_eq(ckpt_get_le32(p + len - IO_TRAILER_BYTES + IO_TRL_OFF_VERSION), 2);
	const uint8_t *t = p + ix->blocks_offset;
	ck_assert_mem_eq(t, IO_BLOCKS_MAGIC, IO_MAGIC_BYTES);
	uint8_t h[CKPT_HASH_BYTES];
	io_hash128(t, (size_t)ix->blocks_len, h);
	ck_assert_mem_eq(h, ix->blocks_hash, CKPT_HASH_BYTES);
	for (uint64_t b = 0; b < 65; b++) {
		uint64_t k = b / 13, j = b % 13, from = j * BLOCK;
		uint64_t n = CHUNK - from < BLOCK ? CHUNK - from : BLOCK;
		io_hash128(f.data[0] + k * CHUNK + from, (size_t)n, h);
		ck_assert_mem_eq(t + IO_BLOCKS_HDR_BYTES + b * CKPT_HASH_BYTES, h, CKPT_HASH_BYTES);
	}
	free(file);
	fx_done(&f);
}
END_TEST

START_TEST(partial_read_reads_fewer_bytes)
{
	struct fx f;
	fx_init(&f, "blocks-partial", BLOCK);
	struct io_shard_reader *r = open_reader(&f);
	const struct io_chunk_entry *c = &f.res.index->chunks[2];
	struct io_read_stats st;
	struct seen s;
	/* The whole chunk, for comparison: one read of its padded length, no table. */
	ck_assert_int_eq(read_range(&f, r, 2, 0, 0, 0, &s), 0);
	io_shard_reader_stats(r, &st);
	ck_assert_uint_eq(st.bytes, ckpt_align_up(c->raw_len, CKPT_ALIGN));
	ck_assert_uint_eq(st.partial_reads, 0);
	ck_assert_uint_eq(st.table_bytes, 0);
	ck_assert_uint_eq(s.len, c->raw_len);
	uint64_t whole = st.bytes;
	/* A middle range [50000, 90000): blocks 3..5, one read of 3 blocks. */
	ck_assert_msg(read_range(&f, r, 2, 50000, 90000, 0, &s) == 0, "%s", ckpt_err_msg());
	io_shard_reader_stats(r, &st);
	ck_assert_uint_eq(s.calls, 1);
	ck_assert_uint_eq(s.off, 3 * BLOCK);
	ck_assert_uint_eq(s.len, 3 * BLOCK);
	ck_assert_uint_eq(st.reads, 2);
	ck_assert_uint_eq(st.partial_reads, 1);
	ck_assert_uint_eq(st.bytes - whole, 3 * BLOCK);
	ck_assert_uint_lt(st.bytes - whole, whole / 4);
	ck_assert_uint_eq(st.blocks_checked, 3);
	uint64_t table = st.table_bytes;
	ck_assert_uint_eq(table, ckpt_align_up(f.res.index->blocks_len, CKPT_ALIGN));
	/* The last, short block: delivered up to the chunk's end. */
	ck_assert_int_eq(read_range(&f, r, 2, CHUNK - 10, CHUNK, 0, &s), 0);
	ck_assert_uint_eq(s.off, 12 * BLOCK);
	ck_assert_uint_eq(s.len, CHUNK - 12 * BLOCK);
	/* A range that needs every block is a whole read (the chunk's own hash). */
	uint64_t before = st.partial_reads;
	ck_assert_int_eq(read_range(&f, r, 2, 100, CHUNK - 100, 0, &s), 0);
	io_shard_reader_stats(r, &st);
	ck_assert_uint_eq(st.partial_reads, before + 1);   /* only the short-block read above */
	ck_assert_uint_eq(s.off, 0);
	ck_assert_uint_eq(s.len, CHUNK);
	/* The table was read once for all of them. */
	ck_assert_uint_eq(st.table_bytes, table);
	/* Random ranges of every chunk, in one batch: exact bytes each time. */
	uint64_t rs = f.seed;
	struct io_read_req q[40];
	struct seen ss[40];
	for (unsigned i = 0; i < 40; i++) {
		uint32_t k = (uint32_t)(tu_rand(&rs) % f.res.index->nchunks);
		uint64_t n = f.res.index->chunks[k].raw_len;
		uint64_t lo = tu_rand(&rs) % n, hi = lo + 1 + tu_rand(&rs) % (n - lo);
		memset(&ss[i], 0, sizeof ss[i]);
		ss[i].f = &f;
		q[i] = (struct io_read_req){ .reader = r, .chunk = k, .arg = &ss[i], .lo = lo, .hi = hi };
	}
	ck_assert_msg(io_read_batch(f.e, q, 40, check_cb) == 0, "%s", ckpt_err_msg());
	for (unsigned i = 0; i < 40; i++)
		ck_assert_uint_eq(ss[i].calls, 1);
	io_shard_reader_close(r);
	/* A reader given the index (as loads are) reads the same way. */
	ck_assert_int_eq(io_shard_reader_open(f.e, f.path, f.res.index, &r), 0);
	ck_assert_int_eq(read_range(&f, r, 0, 20000, 20001, 0, &s), 0);
	ck_assert_uint_eq(s.off, BLOCK);
	ck_assert_uint_eq(s.len, BLOCK);
	io_shard_reader_stats(r, &st);
	ck_assert_uint_eq(st.bytes, BLOCK);
	io_shard_reader_close(r);
	fx_done(&f);
}
END_TEST

START_TEST(bad_requests)
{
	struct fx f;
	fx_init(&f, "blocks-badreq", BLOCK);
	struct io_shard_reader *r = open_reader(&f);
	struct seen s;
	ck_assert_int_eq(read_range(&f, r, 0, 10, 10, 0, &s), -EINVAL);
	ck_assert_int_eq(read_range(&f, r, 0, 20, 10, 0, &s), -EINVAL);
	ck_assert_int_eq(read_range(&f, r, 0, 0, CHUNK + 1, 0, &s), -EINVAL);
	ck_assert_ptr_nonnull(strstr(ckpt_err_msg(), "outside its 200000 bytes"));
	ck_assert_int_eq(read_range(&f, r, 0, 0, 0, 0x80, &s), -EINVAL);
	ck_assert_uint_eq(s.calls, 0);
	io_shard_reader_close(r);
	fx_done(&f);
}
END_TEST

/* ------------------------------------------------------------------ damage */

static void expect_msg(const char *what)
{
	ck_assert_msg(strstr(ckpt_err_msg(), what), "'%s' lacks '%s'", ckpt_err_msg(), what);
}

START_TEST(flipped_bit_in_needed_block)
{
	struct fx f;
	fx_init(&f, "blocks-flip", BLOCK);
	const struct io_chunk_entry *c = &f.res.index->chunks[1];
	uint64_t rs = f.seed;
	uint64_t at = c->file_offset + 4 * BLOCK + tu_rand(&rs) % BLOCK;     /* block 4 */
	ck_assert_int_eq(tu_flip_bit(f.path, at, (int)(tu_rand(&rs) % 8)), 0);
	struct io_shard_reader *r = open_reader(&f);
	struct seen s;
	/* Blocks 3..5 include it: refused, nothing handed over. */
	ck_assert_int_eq(read_range(&f, r, 1, 3 * BLOCK + 5, 5 * BLOCK + 5, 0, &s), CKPT_ECORRUPT);
	ck_assert_uint_eq(s.calls, 0);
	char want[512];
	snprintf(want, sizeof want, "tensor 'layers.0/w' chunk 1 block 4 (file %s, offset %llu): "
	         "block hash mismatch", f.path,
	         (unsigned long long)(c->file_offset + 4 * BLOCK));
	expect_msg(want);
	/* Only that block: the same. */
	ck_assert_int_eq(read_range(&f, r, 1, 4 * BLOCK, 4 * BLOCK + 1, 0, &s), CKPT_ECORRUPT);
	expect_msg("block 4");
	/* The neighbours alone are fine: the damage is not in what they read. */
	ck_assert_int_eq(read_range(&f, r, 1, 0, 4 * BLOCK, 0, &s), 0);
	ck_assert_int_eq(read_range(&f, r, 1, 5 * BLOCK, 7 * BLOCK, 0, &s), 0);
	/* The whole chunk fails its own hash. */
	ck_assert_int_eq(read_range(&f, r, 1, 0, 0, 0, &s), CKPT_ECORRUPT);
	expect_msg("chunk 1 (file");
	io_shard_reader_close(r);
	fx_done(&f);
}
END_TEST

START_TEST(flipped_bit_in_unneeded_block_found_by_verify)
{
	struct fx f;
	fx_init(&f, "blocks-unneeded", BLOCK);
	const struct io_chunk_entry *c = &f.res.index->chunks[3];
	ck_assert_int_eq(tu_flip_bit(f.path, c->file_offset + 10 * BLOCK + 77, 2), 0);  /* block 10 */
	struct io_shard_reader *r = open_reader(&f);
	struct seen s;
	/* A partial read of blocks 0..2 neither reads nor reports block 10. */
	ck_assert_msg(read_range(&f, r, 3, 100, 3 * BLOCK - 1, 0, &s) == 0, "%s", ckpt_err_msg());
	ck_assert_uint_eq(s.calls, 1);
	/* A verify of the chunk (whole, with its blocks) reports it. */
	ck_assert_int_eq(read_range(&f, r, 3, 0, 0, IO_READ_CHECK_BLOCKS, &s), CKPT_ECORRUPT);
	char want[512];
	snprintf(want, sizeof want, "tensor 'layers.0/w' chunk 3 (file %s, offset %llu): hash "
	         "mismatch", f.path, (unsigned long long)c->file_offset);
	expect_msg(want);
	/* And the verify of the undamaged chunks passes, blocks checked. */
	struct io_read_stats st0, st1;
	io_shard_reader_stats(r, &st0);
	ck_assert_int_eq(read_range(&f, r, 2, 0, 0, IO_READ_CHECK_BLOCKS, &s), 0);
	io_shard_reader_stats(r, &st1);
	ck_assert_uint_eq(st1.blocks_checked - st0.blocks_checked, 13);
	io_shard_reader_close(r);
	fx_done(&f);
}
END_TEST

START_TEST(damaged_block_table)
{
	struct fx f;
	fx_init(&f, "blocks-table", BLOCK);
	const struct io_shard_index *ix = f.res.index;
	ck_assert_int_eq(tu_flip_bit(f.path, ix->blocks_offset + IO_BLOCKS_HDR_BYTES + 100, 5), 0);
	/* The footer is intact: the open does not read the table. */
	struct io_shard_reader *r = open_reader(&f);
	struct seen s;
	/* Whole reads need no table. */
	ck_assert_int_eq(read_range(&f, r, 0, 0, 0, 0, &s), 0);
	/* A partial read needs it: refused, naming the table, the chunk and the file. */
	ck_assert_int_eq(read_range(&f, r, 0, 5, 10, 0, &s), CKPT_ECORRUPT);
	ck_assert_uint_eq(s.calls, 0);
	char want[512];
	snprintf(want, sizeof want, "tensor 'layers.0/w' chunk 0: %s: block table at offset %llu",
	         f.path, (unsigned long long)ix->blocks_offset);
	expect_msg(want);
	expect_msg("hash mismatch");
	/* Every later request gets the same answer, without reading it again. */
	struct io_read_stats st;
	io_shard_reader_stats(r, &st);
	ck_assert_int_eq(read_range(&f, r, 4, 5, 10, 0, &s), CKPT_ECORRUPT);
	expect_msg("block table at offset");
	struct io_read_stats st2;
	io_shard_reader_stats(r, &st2);
	ck_assert_uint_eq(st2.table_bytes, st.table_bytes);
	/* Verify finds it too. */
	ck_assert_int_eq(read_range(&f, r, 0, 0, 0, IO_READ_CHECK_BLOCKS, &s), CKPT_ECORRUPT);
	expect_msg("block table");
	ck_assert_int_eq(io_shard_reader_load_blocks(r), CKPT_ECORRUPT);
	io_shard_reader_close(r);
	fx_done(&f);
}
END_TEST

/* The table's version is its layout's: 2, in a file of any version that has one.
 * Anything else is refused, so that what decodes re-encodes to the same bytes. */
START_TEST(block_table_versions)
{
	struct fx f;
	fx_init(&f, "blocks-version", BLOCK);
	const struct io_shard_index *ix = f.res.index;
	void *file;
	size_t flen;
	ck_assert_int_eq(tu_read_file(f.path, &file, &flen), 0);
	ck_assert_uint_le(ix->blocks_offset + ix->blocks_len, flen);
	uint8_t *t = (uint8_t *)file + ix->blocks_offset;
	const uint8_t *hashes;
	ck_assert_uint_eq(ckpt_get_le32(t + IO_BLOCKS_OFF_VERSION), IO_BLOCKS_VERSION);
	ck_assert_int_eq(io_blocks_decode(ix, t, ix->blocks_len, &hashes), 0);
	const struct { uint32_t v; int want; } cases[] = {
		{ IO_BLOCKS_VERSION + 1, CKPT_EVERSION }, { IO_FORMAT_VERSION, CKPT_EVERSION },
		{ 1, CKPT_EFORMAT }, { 0, CKPT_EFORMAT },
	};
	for (unsigned i = 0; i < CKPT_ARRAY_SIZE(cases); i++) {
		if (cases[i].v == IO_BLOCKS_VERSION)
			continue;
		ckpt_put_le32(t + IO_BLOCKS_OFF_VERSION, cases[i].v);
		ck_assert_msg(io_blocks_decode(ix, t, ix->blocks_len, &hashes) == cases[i].want,
		              "table version %u: %s", cases[i].v, ckpt_err_msg());
		ck_assert_ptr_null(hashes);
	}
	free(file);
	fx_done(&f);
}
END_TEST

/* Write ix as the file's footer (same length), with a consistent trailer. */
static void rewrite_footer(const char *path, uint64_t size, const struct io_shard_index *ix)
{
	void *fb;
	size_t flen;
	ck_assert_int_eq(io_index_encode(ix, &fb, &flen), 0);
	uint8_t h[CKPT_HASH_BYTES], t[IO_TRAILER_BYTES];
	io_hash128(fb, flen, h);
	int fd = open(path, O_RDWR);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(pwrite(fd, fb, flen, (off_t)ix->data_end), (ssize_t)flen);
	ck_assert_int_eq(pread(fd, t, sizeof t, (off_t)(size - sizeof t)), (ssize_t)sizeof t);
	ck_assert_uint_eq(ckpt_get_le64(t + IO_TRL_OFF_FLEN), flen);
	memcpy(t + IO_TRL_OFF_FHASH, h, sizeof h);
	ckpt_put_le64(t + IO_TRL_HASHED, XXH3_64bits(t, IO_TRL_HASHED));
	ck_assert_int_eq(pwrite(fd, t, sizeof t, (off_t)(size - sizeof t)), (ssize_t)sizeof t);
	close(fd);
	free(fb);
}

/* A table whose hash is right but whose entry is wrong (a writer's bug, or a table
 * rewritten with its hash): partial reads of that block fail, whole reads do not,
 * and verify names the table as the culprit. */
START_TEST(wrong_table_with_right_hash_found_by_verify)
{
	struct fx f;
	fx_init(&f, "blocks-wrongtable", BLOCK);
	struct io_shard_index *ix = f.res.index;
	/* Entry of chunk 4 block 7 = table entry 4 * 13 + 7. */
	void *file;
	size_t len;
	ck_assert_int_eq(tu_read_file(f.path, &file, &len), 0);
	uint8_t *tbl = (uint8_t *)file + ix->blocks_offset;
	tbl[IO_BLOCKS_HDR_BYTES + (4 * 13 + 7) * CKPT_HASH_BYTES] ^= 0x40;
	int fd = open(f.path, O_RDWR);
	ck_assert_int_eq(pwrite(fd, tbl, (size_t)ix->blocks_len, (off_t)ix->blocks_offset),
	                 (ssize_t)ix->blocks_len);
	close(fd);
	io_hash128(tbl, (size_t)ix->blocks_len, ix->blocks_hash);
	rewrite_footer(f.path, f.res.file_size, ix);
	free(file);
	struct io_shard_reader *r = open_reader(&f);
	struct seen s;
	ck_assert_int_eq(read_range(&f, r, 4, 0, 0, 0, &s), 0);
	ck_assert_int_eq(read_range(&f, r, 4, 6 * BLOCK, 6 * BLOCK + 1, 0, &s), 0);
	ck_assert_int_eq(read_range(&f, r, 4, 7 * BLOCK, 7 * BLOCK + 1, 0, &s), CKPT_ECORRUPT);
	expect_msg("chunk 4 block 7");
	ck_assert_int_eq(read_range(&f, r, 4, 0, 0, IO_READ_CHECK_BLOCKS, &s), CKPT_ECORRUPT);
	char want[512];
	snprintf(want, sizeof want, "tensor 'layers.0/w' chunk 4 block 7 (file %s, offset %llu): "
	         "the block table's hash does not match the chunk's bytes", f.path,
	         (unsigned long long)(ix->chunks[4].file_offset + 7 * BLOCK));
	expect_msg(want);
	ck_assert_int_eq(read_range(&f, r, 3, 0, 0, IO_READ_CHECK_BLOCKS, &s), 0);
	io_shard_reader_close(r);
	fx_done(&f);
}
END_TEST

/* ------------------------------------------------------------------ whole reads */

START_TEST(v1_shard_reads_whole_chunks)
{
	struct fx f;
	fx_init(&f, "blocks-v1", 0);
	const struct io_shard_index *ix = f.res.index;
	ck_assert_uint_eq(ix->block_bytes, 0);
	ck_assert_uint_eq(ix->blocks_len, 0);
	ck_assert_uint_eq(ckpt_get_le32((const uint8_t *)f.res.footer + 8), 1);
	/* Header and trailer say version 1: what a version-1 build wrote. */
	void *file;
	size_t len;
	ck_assert_int_eq(tu_read_file(f.path, &file, &len), 0);
	ck_assert_uint_eq(ckpt_get_le32((uint8_t *)file + IO_HDR_OFF_VERSION), 1);
	ck_assert_uint_eq(ckpt_get_le32((uint8_t *)file + len - IO_TRAILER_BYTES +
	                                IO_TRL_OFF_VERSION), 1);
	free(file);
	struct io_shard_reader *r = open_reader(&f);
	struct seen s;
	ck_assert_msg(read_range(&f, r, 2, 50000, 90000, IO_READ_CHECK_BLOCKS, &s) == 0, "%s",
	              ckpt_err_msg());
	ck_assert_uint_eq(s.off, 0);
	ck_assert_uint_eq(s.len, CHUNK);
	struct io_read_stats st;
	io_shard_reader_stats(r, &st);
	ck_assert_uint_eq(st.partial_reads, 0);
	ck_assert_uint_eq(st.table_bytes, 0);
	ck_assert_uint_eq(st.bytes, ckpt_align_up(CHUNK, CKPT_ALIGN));
	ck_assert_int_eq(io_shard_reader_load_blocks(r), 0);
	io_shard_reader_close(r);
	fx_done(&f);
}
END_TEST

START_TEST(compressed_chunks_read_whole)
{
	struct fx f;
	memset(&f, 0, sizeof f);
	f.seed = tu_seed();
	f.dir = tu_tmpdir("blocks-zstd");
	snprintf(f.path, sizeof f.path, "%s/rank-000000.shard", f.dir);
	ck_assert_int_eq(io_pool_create(BUF_BYTES, NBUFS, NULL, &f.pool), 0);
	ck_assert_int_eq(io_engine_create(f.pool, DEPTH, &f.e), 0);
	fx_write(&f, BLOCK, 3, true);
	const struct io_shard_index *ix = f.res.index;
	ck_assert_uint_eq(ix->chunks[0].codec, IO_CODEC_ZSTD);
	/* No chunk is raw and longer than a block: no table at all. */
	ck_assert_uint_eq(io_index_nblocks(ix), 0);
	ck_assert_uint_eq(ix->blocks_len, 0);
	struct io_shard_reader *r = open_reader(&f);
	struct seen s;
	ck_assert_int_eq(read_range(&f, r, 0, 50000, 60000, 0, &s), 0);
	ck_assert_uint_eq(s.off, 0);
	ck_assert_uint_eq(s.len, CHUNK);
	io_shard_reader_close(r);
	fx_done(&f);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("io_blocks");
	TCase *tc = tcase_create("blocks");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, layout_of_a_v2_shard);
	tcase_add_test(tc, partial_read_reads_fewer_bytes);
	tcase_add_test(tc, bad_requests);
	tcase_add_test(tc, flipped_bit_in_needed_block);
	tcase_add_test(tc, flipped_bit_in_unneeded_block_found_by_verify);
	tcase_add_test(tc, damaged_block_table);
	tcase_add_test(tc, block_table_versions);
	tcase_add_test(tc, wrong_table_with_right_hash_found_by_verify);
	tcase_add_test(tc, v1_shard_reads_whole_chunks);
	tcase_add_test(tc, compressed_chunks_read_whole);
	suite_add_tcase(s, tc);
	SRunner *sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
