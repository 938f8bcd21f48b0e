/*
 * test_shard.c — shard files end to end: writer -> file -> reader, with and
 * without zstd; damaged files (flipped bits, truncation, crafted trailers, newer
 * versions); write failures (injected ENOSPC/EIO at every chunk, a real EFBIG
 * half-way) that must return every pool buffer and remove the file; misuse.
 */
#include <check.h>
#include <errno.h>
#include <inttypes.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include "io/io_internal.h"
#include "testutil.h"

/* Every open() of this program and of the library linked into it comes here
 * (-Wl,--wrap=open, tests/io/CMakeLists.txt). With old_tmpfs set it plays tmpfs
 * before Linux 6.6: O_CREAT | O_DIRECT creates the file, then fails with EINVAL. */
int __real_open(const char *path, int flags, ...);
int __wrap_open(const char *path, int flags, ...);
static bool old_tmpfs;

int __wrap_open(const char *path, int flags, ...)
{
	int mode = 0;
	if ((flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE) {
		va_list ap;
		va_start(ap, flags);
		mode = va_arg(ap, int);
		va_end(ap);
	}
	if (old_tmpfs && (flags & O_CREAT) && (flags & O_DIRECT)) {
		int fd = __real_open(path, flags & ~O_DIRECT, mode);
		if (fd < 0)
			return -1;
		close(fd);
		errno = EINVAL;
		return -1;
	}
	return __real_open(path, flags, mode);
}

/* And every fallocate() (-Wl,--wrap=fallocate): with no_fallocate set it plays a
 * file system that has none (EOPNOTSUPP). */
int __real_fallocate(int fd, int mode, off_t off, off_t len);
int __wrap_fallocate(int fd, int mode, off_t off, off_t len);
static bool no_fallocate;

int __wrap_fallocate(int fd, int mode, off_t off, off_t len)
{
	if (no_fallocate) {
		errno = EOPNOTSUPP;
		return -1;
	}
	return __real_fallocate(fd, mode, off, len);
}

#define BUF_BYTES (64u * 1024)
#define NBUFS     6u
#define DEPTH     4u

struct fx {
	char            *dir;
	char             path[512];
	struct io_pool  *pool;
	struct io_engine *e;
	uint64_t         seed;
	uint32_t         block_bytes;     /* of the shards write_shard writes */
	bool             tree;            /* ... of format 5 (tree hashes), with a save id */
	unsigned         threads;         /* ... compressed by that many workers */
};

static void fx_init(struct fx *f, const char *tag)
{
	memset(f, 0, sizeof *f);
	f->seed = tu_seed();
	/* Smaller than the chunks: every round trip writes and checks a block table. */
	f->block_bytes = 8192;
	f->dir = tu_tmpdir(tag);
	snprintf(f->path, sizeof f->path, "%s/rank-000001.shard", f->dir);
	ck_assert_int_eq(io_pool_create(BUF_BYTES, NBUFS, NULL, &f->pool), 0);
	ck_assert_msg(io_engine_create(f->pool, DEPTH, &f->e) == 0, "%s", ckpt_err_msg());
}

static void fx_done(struct fx *f)
{
	/* Every path must give every buffer back. */
	ck_assert_uint_eq(io_pool_nfree(f->pool), NBUFS);
	io_engine_destroy(f->e);
	io_pool_destroy(f->pool);
	tu_rmtree(f->dir);
	free(f->dir);
}

static bool file_exists(const char *p)
{
	struct stat st;
	return stat(p, &st) == 0;
}

/* ------------------------------------------------------------------ shard contents */

struct shard_spec {
	unsigned  n;
	uint64_t *sizes;          /* raw bytes per tensor */
	bool      compressible;
};

static void tensor_name(char *out, size_t cap, unsigned i)
{
	snprintf(out, cap, "layers.%u/w", i);
}

/* Deterministic content of tensor i. */
static void tensor_bytes(uint8_t *p, uint64_t n, uint64_t seed, unsigned i, bool compressible)
{
	tu_fill(p, (size_t)n, seed, i);
	if (compressible)
		for (uint64_t k = 0; k < n; k++)
			p[k] = (uint8_t)("xyz"[p[k] % 3] + (k / 512) % 2);
}

/* A 1-D box: f32 when the size allows it, u8 otherwise; tensor 1 is a blob. */
static void tensor_desc(struct io_tensor_desc *d, uint64_t *shape, uint64_t *off, uint64_t *ext,
                        char *name, size_t cap, unsigned i, uint64_t bytes)
{
	tensor_name(name, cap, i);
	memset(d, 0, sizeof *d);
	d->name = name;
	d->kind = CKPT_KIND_MODEL;
	d->policy = CKPT_SHARDED;
	d->ndim = 1;
	d->dtype = (bytes % 4 == 0 && i != 1) ? CKPT_F32 : CKPT_U8;
	*ext = bytes / ckpt_dtype_size(d->dtype);
	*off = i == 1 ? 0 : i;
	*shape = *ext + *off + (i == 1 ? 0 : 7);
	if (i == 1) {
		d->flags = IO_TENSOR_BLOB;
		d->kind = CKPT_KIND_RNG;
		d->policy = CKPT_RANK_BOUND;
	}
	d->global_shape = shape;
	d->offset = off;
	d->extent = ext;
	d->raw_bytes = bytes;
}

/* An external writer (struct io_append's ext), as GPUDirect Storage is: it
 * writes the chunk's whole blocks from its own copy of the bytes, through a
 * descriptor of its own. When g_ext is set, write_shard appends through it. */
struct ext_test {
	const uint8_t *src;       /* the current chunk's bytes, in the "other" copy */
	int      fd;
	unsigned calls, fail_at;  /* fail_at > 0: that call returns -EIO */
	uint64_t bytes;
};
static struct ext_test *g_ext;
/* write_shard asks for preallocation, and checks that the blocks of size_hint were
 * allocated when open returned (where the file system can allocate them). */
static bool g_prealloc;
static uint64_t g_hint = 1u << 20;   /* write_shard's size_hint */

static int ext_write(void *arg, int fd, const char *path, uint64_t off, size_t n)
{
	struct ext_test *x = arg;
	(void)fd;
	ck_assert_uint_eq(off % CKPT_ALIGN, 0);
	ck_assert_uint_eq(n % CKPT_ALIGN, 0);
	ck_assert_uint_gt(n, 0);
	if (++x->calls == x->fail_at)
		return ckpt_err(-EIO, "%s: injected external write failure", path);
	if (x->fd < 0)
		ck_assert_int_ge(x->fd = open(path, O_WRONLY | O_CLOEXEC), 0);
	ck_assert_int_eq(pwrite(x->fd, x->src, n, (off_t)off), (ssize_t)n);
	x->bytes += n;
	return 0;
}

/* Whether the file system of dir allocates blocks on fallocate (tmpfs, ext4 and
 * XFS do; some do not). */
static bool can_fallocate(const char *dir)
{
	char p[512];
	snprintf(p, sizeof p, "%s/probe", dir);
	int fd = open(p, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0600);
	ck_assert_int_ge(fd, 0);
	bool ok = fallocate(fd, 0, 0, 1u << 20) == 0;
	close(fd);
	unlink(p);
	return ok;
}

/* Write spec into f->path with chunks of chunk bytes. Returns 0 with *res filled,
 * or the error of append (after abort) or finish. */
static int write_shard(struct fx *f, const struct shard_spec *s, size_t chunk, int zstd,
                       struct io_shard_result *res)
{
	struct io_shard_writer *w;
	memset(res, 0xee, sizeof *res);    /* finish must zero it on failure */
	unlink(f->path);                   /* the writer never replaces a file */
	int rc = io_shard_writer_open(f->e, f->path, &(struct io_writer_opts){
		.step = 9, .rank = 1, .world = 4, .size_hint = g_hint, .zstd_level = zstd,
		.block_bytes = f->block_bytes, .preallocate = g_prealloc,
		.save_id = f->tree ? 77 : 0, .tree = f->tree,
		.compress_threads = zstd ? f->threads : 0 }, &w);
	if (rc)
		return rc;
	struct stat sb;
	ck_assert_int_eq(stat(f->path, &sb), 0);
	ck_assert_uint_eq((uint64_t)sb.st_size, g_hint);
	if (g_prealloc && can_fallocate(f->dir))
		ck_assert_uint_ge((uint64_t)sb.st_blocks * 512, g_hint);
	else
		ck_assert_uint_lt((uint64_t)sb.st_blocks * 512, g_hint);   /* sized, sparse */
	for (unsigned i = 0; i < s->n; i++) {
		struct io_tensor_desc d;
		uint64_t sh, of, ex;
		char name[64];
		tensor_desc(&d, &sh, &of, &ex, name, sizeof name, i, s->sizes[i]);
		ck_assert_msg(io_shard_writer_add_tensor(w, &d) == (int)i, "%s", ckpt_err_msg());
	}
	for (unsigned i = 0; i < s->n; i++) {
		uint8_t *data = malloc(s->sizes[i] ? s->sizes[i] : 1);
		tensor_bytes(data, s->sizes[i], f->seed, i, s->compressible);
		for (uint64_t o = 0; o < s->sizes[i]; o += chunk) {
			size_t len = (size_t)(s->sizes[i] - o < chunk ? s->sizes[i] - o : chunk);
			/* A timeout, not forever: a buffer leak must fail, not hang. */
			int b = io_pool_get(f->pool, 10000);
			ck_assert_int_ge(b, 0);
			memcpy(io_pool_addr(f->pool, (unsigned)b), data + o, len);
			if (g_ext) {
				/* The caller's hashes, chunk and blocks, as the snapshot pipe gives
				 * them (so the writer takes its block hashes from here). */
				struct io_hashes h = { .block_bytes = f->block_bytes, .tree = f->tree };
				uint8_t *blocks = malloc(io_nblocks(len, f->block_bytes) * CKPT_HASH_BYTES + 1);
				io_copy_hash128_blocks(NULL, data + o, len, f->block_bytes, f->tree, h.chunk,
				                       blocks);
				h.blocks = blocks;
				g_ext->src = data + o;
				struct io_ext_write x = { .write = ext_write, .arg = g_ext };
				rc = io_shard_writer_append(w, i, (unsigned)b, len,
				                            &(struct io_append){ .hashes = &h, .ext = &x });
				free(blocks);
			} else {
				rc = io_shard_writer_append(w, i, (unsigned)b, len, NULL);
			}
			if (rc) {
				free(data);
				io_shard_writer_abort(w);
				memset(res, 0, sizeof *res);
				return rc;
			}
		}
		free(data);
	}
	return io_shard_writer_finish(w, res);
}

/* A chunk's hash as docs/format.md §5 defines it, from io_hash128 alone: a tree
 * (format 5) of more than one block hashes its block hashes one after another. */
static void want_chunk_hash(const uint8_t *p, size_t n, uint32_t bs, bool tree,
                            uint8_t out[CKPT_HASH_BYTES])
{
	uint64_t nb = io_nblocks(n, bs);
	if (!tree || !nb) {
		io_hash128(p, n, out);
		return;
	}
	uint8_t *row = malloc((size_t)nb * CKPT_HASH_BYTES);
	for (uint64_t j = 0; j < nb; j++) {
		size_t from = (size_t)j * bs;
		io_hash128(p + from, n - from < bs ? n - from : bs, row + j * CKPT_HASH_BYTES);
	}
	io_hash128(row, (size_t)nb * CKPT_HASH_BYTES, out);
	free(row);
}

struct verify_ctx {
	const struct shard_spec *s;
	uint8_t **data;
	uint64_t *seen;           /* bytes seen per tensor */
	unsigned  calls;
	int       stop_after;     /* > 0: return 42 at that call */
};

static int verify_cb(void *arg, const struct io_read_req *req, uint64_t off, const void *raw,
                     size_t len)
{
	struct verify_ctx *v = arg;
	const struct io_shard_index *ix = io_shard_reader_index(req->reader);
	const struct io_chunk_entry *c = &ix->chunks[req->chunk];
	ck_assert_uint_eq(off, 0);
	ck_assert_uint_eq(len, c->raw_len);
	ck_assert_mem_eq(raw, v->data[c->tensor] + c->raw_offset, len);
	/* The stored hash is the format's, taken here from the bytes block by block. */
	uint8_t want[CKPT_HASH_BYTES];
	want_chunk_hash(v->data[c->tensor] + c->raw_offset, len, ix->block_bytes, ix->tree, want);
	ck_assert_msg(!memcmp(c->hash, want, sizeof want), "chunk %u: not the hash of format %d",
	              req->chunk, ix->tree ? 5 : 2);
	v->seen[c->tensor] += len;
	if (++v->calls == (unsigned)v->stop_after)
		return 42;
	return 0;
}

/* Read every chunk back (from the file's footer, or from index) and compare. */
static int verify_shard(struct fx *f, const struct shard_spec *s,
                        const struct io_shard_index *index)
{
	struct io_shard_reader *r;
	int rc = io_shard_reader_open(f->e, f->path, index, &r);
	if (rc)
		return rc;
	const struct io_shard_index *ix = io_shard_reader_index(r);
	ck_assert_uint_eq(ix->ntensors, s->n);
	ck_assert_uint_eq(ix->step, 9);
	ck_assert_uint_eq(ix->rank, 1);
	ck_assert_uint_eq(ix->world, 4);
	struct verify_ctx v = { .s = s };
	v.data = calloc(s->n, sizeof *v.data);
	v.seen = calloc(s->n, sizeof *v.seen);
	for (unsigned i = 0; i < s->n; i++) {
		char name[64];
		tensor_name(name, sizeof name, i);
		ck_assert_int_eq(io_index_find(ix, name), (int)i);
		ck_assert_uint_eq(ix->tensors[i].raw_bytes, s->sizes[i]);
		v.data[i] = malloc(s->sizes[i] ? s->sizes[i] : 1);
		tensor_bytes(v.data[i], s->sizes[i], f->seed, i, s->compressible);
	}
	/* Read in reverse order: completion order must not matter. */
	struct io_read_req *reqs = calloc(ix->nchunks ? ix->nchunks : 1, sizeof *reqs);
	for (uint32_t k = 0; k < ix->nchunks; k++)
		reqs[k] = (struct io_read_req){ .reader = r, .chunk = ix->nchunks - 1 - k, .arg = &v,
		                                .flags = IO_READ_CHECK_BLOCKS };
	rc = io_read_batch(f->e, reqs, ix->nchunks, verify_cb);
	if (!rc) {
		ck_assert_uint_eq(v.calls, ix->nchunks);
		for (unsigned i = 0; i < s->n; i++)
			ck_assert_uint_eq(v.seen[i], s->sizes[i]);
	}
	for (unsigned i = 0; i < s->n; i++)
		free(v.data[i]);
	free(v.data);
	free(v.seen);
	free(reqs);
	io_shard_reader_close(r);
	return rc;
}

static void result_free(struct io_shard_result *res)
{
	io_index_free(res->index);
	free(res->footer);
}

/* Sizes around the interesting edges, plus random ones, plus one larger than the
 * whole pool so that buffers must cycle through write completions. */
static struct shard_spec make_spec(uint64_t seed, bool compressible)
{
	static uint64_t sizes[12];
	uint64_t s = seed;
	const uint64_t fixed[] = { 0, 1, 4095, 4096, 4097, 3 * (uint64_t)NBUFS * BUF_BYTES + 12 };
	unsigned n = 0;
	for (unsigned i = 0; i < CKPT_ARRAY_SIZE(fixed); i++)
		sizes[n++] = fixed[i];
	while (n < CKPT_ARRAY_SIZE(sizes))
		sizes[n++] = tu_rand(&s) % (3 * BUF_BYTES);
	return (struct shard_spec){ n, sizes, compressible };
}

/* ------------------------------------------------------------------ round trips */

/* Each chunk size, as format 2 (hashes of the bytes) and as format 5 (tree hashes),
 * this one also with compression workers. */
static void round_trip(int zstd, bool compressible)
{
	struct fx f;
	fx_init(&f, "shard-rt");
	struct shard_spec s = make_spec(f.seed, compressible);
	uint64_t st = f.seed;
	const size_t chunks[] = { BUF_BYTES, 40000, 4097, 4096, 1 + tu_rand(&st) % BUF_BYTES };
	for (unsigned c = 0; c < 3 * CKPT_ARRAY_SIZE(chunks); c++) {
		f.tree = c >= CKPT_ARRAY_SIZE(chunks);
		f.threads = c >= 2 * CKPT_ARRAY_SIZE(chunks) ? 2 : 0;
		if (f.threads && !zstd)
			break;
		size_t chunk = chunks[c % CKPT_ARRAY_SIZE(chunks)];
		struct io_shard_result res;
		int rc = write_shard(&f, &s, chunk, zstd, &res);
		ck_assert_msg(rc == 0, "chunk %zu: %s", chunk, ckpt_err_msg());
		struct stat sb;
		ck_assert_int_eq(stat(f.path, &sb), 0);
		ck_assert_uint_eq((uint64_t)sb.st_size, res.file_size);
		ck_assert_uint_eq(res.file_size % CKPT_ALIGN, 0);
		uint64_t logical = 0;
		for (unsigned i = 0; i < s.n; i++)
			logical += s.sizes[i];
		ck_assert_uint_eq(res.logical_bytes, logical);
		unsigned nzstd = 0;
		for (uint32_t k = 0; k < res.index->nchunks; k++)
			nzstd += res.index->chunks[k].codec == IO_CODEC_ZSTD;
		if (zstd && compressible && chunk < 4096) {
			/* Each append is a chunk of its own: a few hundred bytes may not
			 * beat zstd's frame and table overhead, and then it is stored raw,
			 * never larger. */
			ck_assert_msg(res.stored_bytes <= logical, "chunk %zu: stored %" PRIu64 " of %" PRIu64,
			              chunk, res.stored_bytes, logical);
		} else if (zstd && compressible) {
			ck_assert_msg(res.stored_bytes < logical / 2, "chunk %zu: stored %" PRIu64 " of %" PRIu64,
			              chunk, res.stored_bytes, logical);
			ck_assert_uint_gt(nzstd, 0);
		} else {
			/* Raw, or zstd that did not win: stored as is. */
			ck_assert_uint_eq(res.stored_bytes, logical);
			ck_assert_uint_eq(nzstd, 0);
		}
		uint8_t h[CKPT_HASH_BYTES];
		io_hash128(res.footer, res.footer_len, h);
		ck_assert_mem_eq(h, res.footer_hash, CKPT_HASH_BYTES);
		ck_assert(res.index->tree == f.tree);
		ck_assert_msg(verify_shard(&f, &s, NULL) == 0, "%s", ckpt_err_msg());
		/* As a reader given the manifest's copy of the index. */
		ck_assert_msg(verify_shard(&f, &s, res.index) == 0, "%s", ckpt_err_msg());
		result_free(&res);
	}
	fx_done(&f);
}

START_TEST(round_trip_raw) { round_trip(0, false); }
END_TEST
/* A file system that refuses O_DIRECT only after it created the file: the writer
 * takes the file it created (buffered), and still never one that was there. */
START_TEST(round_trip_odirect_refused_after_create)
{
	old_tmpfs = true;
	round_trip(0, false);
	struct fx f;
	fx_init(&f, "shard-oldtmpfs");
	struct io_shard_writer *w;
	ck_assert_int_eq(tu_write_file(f.path, "not yours", 9), 0);
	ck_assert_int_eq(io_shard_writer_open(f.e, f.path, &(struct io_writer_opts){ .step = 1, .rank = 0, .world = 1, .block_bytes = IO_BLOCK_BYTES, .save_id = 7 }, &w), -EEXIST);
	void *kept;
	size_t klen;
	ck_assert_int_eq(tu_read_file(f.path, &kept, &klen), 0);
	ck_assert(klen == 9 && !memcmp(kept, "not yours", 9));
	free(kept);
	ck_assert_int_eq(unlink(f.path), 0);
	ck_assert_int_eq(io_shard_writer_open(f.e, f.path, &(struct io_writer_opts){ .step = 1, .rank = 0, .world = 1, .block_bytes = IO_BLOCK_BYTES, .save_id = 7 }, &w), 0);
	struct stat ms;
	ck_assert_int_eq(stat(f.path, &ms), 0);
	ck_assert_uint_eq(ms.st_mode & 0777, 0600);
	io_shard_writer_abort(w);
	old_tmpfs = false;
	fx_done(&f);
}
END_TEST
/* Preallocated files through an engine whose requests its kernel workers issue:
 * the same shards, read back and verified (ckptd's writers). */
START_TEST(round_trip_preallocated_offloaded)
{
	struct fx f;
	fx_init(&f, "shard-prealloc");
	int rc = io_engine_offload(f.e, 2);
	ck_assert_msg(rc == 0 || rc == -EINVAL, "%d", rc);
	g_prealloc = true;
	struct shard_spec s = make_spec(f.seed, false);
	const size_t chunks[] = { BUF_BYTES, 40000, 4097 };
	/* A hint beyond the shard (cut off at finish) and one short of it (the writes
	 * past it extend the file). */
	const uint64_t hints[] = { 8u << 20, 256u << 10 };
	/* The last pass on a file system without fallocate: sized as without
	 * preallocation (write_shard checks it is sparse), the same shard. */
	for (unsigned c = 0; c < 2 * CKPT_ARRAY_SIZE(chunks) + 2; c++) {
		no_fallocate = c >= 2 * CKPT_ARRAY_SIZE(chunks);
		g_hint = hints[c % 2];
		struct io_shard_result res;
		size_t chunk = chunks[c / 2 % CKPT_ARRAY_SIZE(chunks)];
		ck_assert_msg(write_shard(&f, &s, chunk, 0, &res) == 0, "chunk %zu: %s", chunk,
		              ckpt_err_msg());
		struct stat sb;
		ck_assert_int_eq(stat(f.path, &sb), 0);
		ck_assert_uint_eq((uint64_t)sb.st_size, res.file_size);
		ck_assert(g_hint > res.file_size ? c % 2 == 0 : c % 2 == 1);
		ck_assert_msg(verify_shard(&f, &s, NULL) == 0, "%s", ckpt_err_msg());
		result_free(&res);
	}
	g_prealloc = false;
	no_fallocate = false;
	g_hint = 1u << 20;
	fx_done(&f);
}
END_TEST

static void count_done(void *owner, uint64_t cookie, int64_t res)
{
	(void)cookie;
	*(int *)owner += res != BUF_BYTES;
}

/* An offloaded engine's ring has the workers asked for and no more (without the
 * cap the kernel allows up to 4 per CPU), and its requests, all handed to them,
 * land: 64 O_DIRECT writes into a sparse file from a ring of 64. */
START_TEST(engine_offload_caps_workers)
{
	char *dir = tu_tmpdir("engine-offload"), path[512];
	snprintf(path, sizeof path, "%s/data", dir);
	struct io_pool *pool;
	struct io_engine *e;
	ck_assert_int_eq(io_pool_create(BUF_BYTES, 1, NULL, &pool), 0);
	ck_assert_int_eq(io_engine_create(pool, 64, &e), 0);
	unsigned cap[2];
	int rc = io_engine_workers(e, cap);
	if (rc) {
		/* Before Linux 5.15: offload hands the requests over, uncapped. */
		fprintf(stderr, "engine_offload_caps_workers: the kernel keeps no cap (%s); "
		        "checking the writes only\n", ckpt_strerror(rc));
		ck_assert_int_eq(io_engine_offload(e, 2), rc);
	} else {
		ck_assert_msg(cap[0] > 2 || cap[1] > 2, "caps %u/%u before offload", cap[0], cap[1]);
		ck_assert_int_eq(io_engine_offload(e, 2), 0);
		ck_assert_int_eq(io_engine_workers(e, cap), 0);
		ck_assert_uint_eq(cap[0], 2);
		ck_assert_uint_eq(cap[1], 2);
	}
	int fd = open(path, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC | O_DIRECT, 0600);
	if (fd < 0)   /* a file system without O_DIRECT (tmpfs before 6.6) */
		fd = open(path, O_RDWR | O_CLOEXEC);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(ftruncate(fd, 64 * (off_t)BUF_BYTES), 0);
	uint8_t *b = io_pool_addr(pool, 0);
	tu_fill(b, BUF_BYTES, tu_seed(), 1);
	int errs = 0;
	for (unsigned k = 0; k < 64; k++)
		ck_assert_int_eq(io_engine_queue(e, IO_OP_WRITE, fd, b, BUF_BYTES, k * (uint64_t)BUF_BYTES,
		                                 count_done, &errs, 0), 0);
	while (io_engine_inflight(e))
		ck_assert_int_ge(io_engine_reap(e, true), 0);
	ck_assert_int_eq(errs, 0);
	uint8_t *back = aligned_alloc(CKPT_ALIGN, BUF_BYTES);
	for (unsigned k = 0; k < 64; k++) {
		ck_assert_int_eq(pread(fd, back, BUF_BYTES, k * (off_t)BUF_BYTES), (ssize_t)BUF_BYTES);
		ck_assert_mem_eq(back, b, BUF_BYTES);
	}
	free(back);
	close(fd);
	io_engine_destroy(e);
	io_pool_destroy(pool);
	tu_rmtree(dir);
	free(dir);
}
END_TEST

START_TEST(round_trip_zstd_compressible) { round_trip(3, true); }
END_TEST
START_TEST(round_trip_zstd_incompressible) { round_trip(1, false); }
END_TEST

/* Chunks whose whole blocks an external writer puts in the file (zstd asked for but
 * never used on them), the partial last block from the pool: the same shard, read
 * back and verified; an external failure fails the writer, removes the file and
 * returns every buffer. */
START_TEST(external_writes)
{
	struct fx f;
	fx_init(&f, "shard-ext");
	struct shard_spec s = make_spec(f.seed, true);
	const size_t chunks[] = { BUF_BYTES, 40000, 4096, 4097 };
	for (unsigned c = 0; c < CKPT_ARRAY_SIZE(chunks); c++) {
		struct ext_test x = { .fd = -1 };
		f.tree = c % 2;       /* the caller's hashes: of formats 2 and 5 in turn */
		g_ext = &x;
		struct io_shard_result res;
		int rc = write_shard(&f, &s, chunks[c], 3, &res);
		g_ext = NULL;
		if (x.fd >= 0)
			close(x.fd);
		ck_assert_msg(rc == 0, "chunk %zu: %s", chunks[c], ckpt_err_msg());
		ck_assert_uint_gt(x.bytes, 0);
		ck_assert_uint_eq(res.stored_bytes, res.logical_bytes);   /* never compressed */
		ck_assert_msg(verify_shard(&f, &s, NULL) == 0, "%s", ckpt_err_msg());
		result_free(&res);
	}
	struct ext_test x = { .fd = -1, .fail_at = 3 };
	g_ext = &x;
	struct io_shard_result res;
	int rc = write_shard(&f, &s, 4097, 0, &res);
	g_ext = NULL;
	if (x.fd >= 0)
		close(x.fd);
	ck_assert_int_eq(rc, -EIO);
	ck_assert_ptr_nonnull(strstr(ckpt_err_msg(), "injected external write failure"));
	ck_assert(!file_exists(f.path));
	fx_done(&f);
}
END_TEST

/* io_shard_writer_pending: chunks appended and not yet written. It never counts
 * more than were appended nor more than the engine's depth (no compression ring
 * here); once the disk is done it is 0 before finish (the completions reaped by
 * io_shard_writer_ready), and a writer that compresses counts its ring too. */
START_TEST(pending_counts_unwritten_chunks)
{
	struct fx f;
	fx_init(&f, "shard-pending");
	for (int zstd = 0; zstd <= 1; zstd++) {
		unlink(f.path);
		struct io_shard_writer *w;
		ck_assert_int_eq(io_shard_writer_open(f.e, f.path, &(struct io_writer_opts){
		                 .step = 1, .rank = 0, .world = 1, .size_hint = 8u * BUF_BYTES,
		                 .zstd_level = zstd, .compress_threads = zstd ? 2 : 0,
		                 .block_bytes = f.block_bytes }, &w), 0);
		struct io_tensor_desc d;
		uint64_t sh, of, ex;
		char name[64];
		tensor_desc(&d, &sh, &of, &ex, name, sizeof name, 0, 6u * BUF_BYTES);
		ck_assert_int_eq(io_shard_writer_add_tensor(w, &d), 0);
		ck_assert_uint_eq(io_shard_writer_pending(w), 0);
		for (unsigned k = 0; k < 6; k++) {
			int b = io_pool_get(f.pool, 10000);
			ck_assert_int_ge(b, 0);
			tensor_bytes(io_pool_addr(f.pool, (unsigned)b), BUF_BYTES, f.seed, k, true);
			ck_assert_int_eq(io_shard_writer_append(w, 0, (unsigned)b, BUF_BYTES, NULL), 0);
			unsigned n = io_shard_writer_pending(w);
			ck_assert_uint_le(n, k + 1);
			if (!zstd)
				ck_assert_uint_le(n, DEPTH);
		}
		unsigned n = io_shard_writer_pending(w);
		for (int i = 0; i < 10000 && n; i++) {
			usleep(1000);
			io_shard_writer_ready(w);
			n = io_shard_writer_pending(w);
		}
		ck_assert_uint_eq(n, 0);
		struct io_shard_result res;
		ck_assert_int_eq(io_shard_writer_finish(w, &res), 0);
		ck_assert_uint_eq(res.index->nchunks, 6);
		result_free(&res);
	}
	fx_done(&f);
}
END_TEST

START_TEST(empty_shard)
{
	struct fx f;
	fx_init(&f, "shard-empty");
	struct shard_spec s = { 0, NULL, false };
	struct io_shard_result res;
	ck_assert_int_eq(write_shard(&f, &s, 4096, 0, &res), 0);
	ck_assert_uint_eq(res.file_size, 2 * CKPT_ALIGN);
	ck_assert_int_eq(verify_shard(&f, &s, NULL), 0);
	result_free(&res);
	fx_done(&f);
}
END_TEST

START_TEST(batch_across_files_and_callback_stop)
{
	struct fx f;
	fx_init(&f, "shard-multi");
	struct shard_spec s = make_spec(f.seed, false);
	struct io_shard_result res[2];
	char paths[2][512];
	for (int i = 0; i < 2; i++) {
		snprintf(f.path, sizeof f.path, "%s/rank-00000%d.shard", f.dir, i);
		snprintf(paths[i], sizeof paths[i], "%s", f.path);
		ck_assert_msg(write_shard(&f, &s, 30000, 0, &res[i]) == 0, "%s", ckpt_err_msg());
	}
	struct io_shard_reader *r[2];
	for (int i = 0; i < 2; i++)
		ck_assert_int_eq(io_shard_reader_open(f.e, paths[i], NULL, &r[i]), 0);
	ck_assert_str_eq(io_shard_reader_path(r[1]), paths[1]);
	struct verify_ctx v = { .s = &s };
	v.data = calloc(s.n, sizeof *v.data);
	v.seen = calloc(s.n, sizeof *v.seen);
	for (unsigned i = 0; i < s.n; i++) {
		v.data[i] = malloc(s.sizes[i] + 1);
		tensor_bytes(v.data[i], s.sizes[i], f.seed, i, false);
	}
	uint32_t nch = res[0].index->nchunks;
	struct io_read_req *reqs = calloc(2 * nch, sizeof *reqs);
	for (uint32_t k = 0; k < 2 * nch; k++)      /* interleave the two files */
		reqs[k] = (struct io_read_req){ .reader = r[k % 2], .chunk = k / 2, .arg = &v };
	ck_assert_int_eq(io_read_batch(f.e, reqs, 2 * nch, verify_cb), 0);
	ck_assert_uint_eq(v.calls, 2 * nch);
	for (unsigned i = 0; i < s.n; i++)
		ck_assert_uint_eq(v.seen[i], 2 * s.sizes[i]);
	/* A callback's non-zero return stops the batch and comes back; buffers return. */
	v.calls = 0;
	v.stop_after = 5;
	ck_assert_int_eq(io_read_batch(f.e, reqs, 2 * nch, verify_cb), 42);
	ck_assert_uint_eq(v.calls, 5);
	ck_assert_uint_eq(io_pool_nfree(f.pool), NBUFS);
	/* A bad chunk number is refused. */
	struct io_read_req bad = { .reader = r[0], .chunk = nch, .arg = &v };
	ck_assert_int_eq(io_read_batch(f.e, &bad, 1, verify_cb), -EINVAL);
	for (unsigned i = 0; i < s.n; i++)
		free(v.data[i]);
	free(v.data);
	free(v.seen);
	free(reqs);
	for (int i = 0; i < 2; i++) {
		io_shard_reader_close(r[i]);
		result_free(&res[i]);
	}
	fx_done(&f);
}
END_TEST

/* A reader whose pool buffers are smaller than the writer's chunks reads them
 * (and decompress them) through temporary aligned allocations. */
START_TEST(read_with_smaller_pool)
{
	struct fx f;
	fx_init(&f, "shard-small");
	struct shard_spec s = make_spec(f.seed, true);
	struct io_shard_result res;
	ck_assert_int_eq(write_shard(&f, &s, BUF_BYTES, 3, &res), 0);
	struct io_engine *big_e = f.e;
	struct io_pool *big_p = f.pool, *small;
	ck_assert_int_eq(io_pool_create(8192, 2, NULL, &small), 0);
	ck_assert_int_eq(io_engine_create(small, 3, &f.e), 0);
	f.pool = small;
	ck_assert_msg(verify_shard(&f, &s, NULL) == 0, "%s", ckpt_err_msg());
	ck_assert_uint_eq(io_pool_nfree(small), 2);
	io_engine_destroy(f.e);
	io_pool_destroy(small);
	f.e = big_e;
	f.pool = big_p;
	result_free(&res);
	fx_done(&f);
}
END_TEST

/* ------------------------------------------------------------------ damaged files */

static int open_only(struct fx *f, const struct io_shard_index *ix)
{
	struct io_shard_reader *r = (void *)1;
	int rc = io_shard_reader_open(f->e, f->path, ix, &r);
	if (rc)
		ck_assert_ptr_null(r);
	io_shard_reader_close(rc ? NULL : r);
	return rc;
}

static void expect_open_fails(struct fx *f, const struct io_shard_index *ix, int code,
                              const char *what)
{
	int rc = open_only(f, ix);
	ck_assert_msg(rc == code, "expected %d, got %d (%s)", code, rc, ckpt_err_msg());
	ck_assert_msg(strstr(ckpt_err_msg(), f->path), "message lacks the path: %s",
	              ckpt_err_msg());
	ck_assert_msg(strstr(ckpt_err_msg(), what), "message lacks '%s': %s", what,
	              ckpt_err_msg());
}

START_TEST(flipped_bit_in_chunk)
{
	for (int v = 0; v < 4; v++) {
		int zstd = v & 1 ? 3 : 0;
		struct fx f;
		fx_init(&f, "shard-flip");
		f.tree = v & 2;
		struct shard_spec s = make_spec(f.seed, zstd != 0);
		struct io_shard_result res;
		ck_assert_int_eq(write_shard(&f, &s, 20000, zstd, &res), 0);
		/* The second chunk of the large tensor (index 5). */
		const struct io_tensor_entry *t = &res.index->tensors[5];
		uint32_t k = t->first_chunk + 1;
		const struct io_chunk_entry *c = &res.index->chunks[k];
		uint64_t st = f.seed;
		uint64_t at = c->file_offset + tu_rand(&st) % c->stored_len;
		ck_assert_int_eq(tu_flip_bit(f.path, at, (int)(tu_rand(&st) % 8)), 0);
		/* The footer is intact: open succeeds, the read of that chunk fails. */
		ck_assert_int_eq(verify_shard(&f, &s, NULL), CKPT_ECORRUPT);
		char want[256];
		snprintf(want, sizeof want, "tensor 'layers.5/w' chunk %u (file %s, offset %llu)", k,
		         f.path, (unsigned long long)c->file_offset);
		ck_assert_msg(strstr(ckpt_err_msg(), want), "'%s' lacks '%s'", ckpt_err_msg(), want);
		if (!zstd)
			ck_assert_ptr_nonnull(strstr(ckpt_err_msg(), "hash mismatch"));
		result_free(&res);
		fx_done(&f);
	}
}
END_TEST

START_TEST(damaged_metadata)
{
	struct fx f;
	fx_init(&f, "shard-meta");
	struct shard_spec s = make_spec(f.seed, false);
	struct io_shard_result res;
	ck_assert_int_eq(write_shard(&f, &s, BUF_BYTES, 0, &res), 0);
	uint64_t size = res.file_size, foot = res.index->data_end;
	uint64_t trl = size - IO_TRAILER_BYTES;

	/* Trailer: a flip in a hashed field (footer length). */
	ck_assert_int_eq(tu_flip_bit(f.path, trl + IO_TRL_OFF_FLEN + 1, 3), 0);
	expect_open_fails(&f, NULL, CKPT_ECORRUPT, "trailer hash mismatch");
	ck_assert_int_eq(tu_flip_bit(f.path, trl + IO_TRL_OFF_FLEN + 1, 3), 0);
	/* Its own hash. */
	ck_assert_int_eq(tu_flip_bit(f.path, trl + IO_TRL_HASHED, 0), 0);
	expect_open_fails(&f, NULL, CKPT_ECORRUPT, "trailer hash mismatch");
	ck_assert_int_eq(tu_flip_bit(f.path, trl + IO_TRL_HASHED, 0), 0);
	/* Footer. */
	ck_assert_int_eq(tu_flip_bit(f.path, foot + res.footer_len / 2, 6), 0);
	expect_open_fails(&f, NULL, CKPT_ECORRUPT, "footer hash mismatch");
	ck_assert_int_eq(tu_flip_bit(f.path, foot + res.footer_len / 2, 6), 0);
	/* Header block. */
	ck_assert_int_eq(tu_flip_bit(f.path, IO_HDR_OFF_STEP, 1), 0);
	expect_open_fails(&f, NULL, CKPT_ECORRUPT, "header block hash mismatch");
	ck_assert_int_eq(tu_flip_bit(f.path, IO_HDR_OFF_STEP, 1), 0);
	ck_assert_int_eq(tu_flip_bit(f.path, 0, 1), 0);
	expect_open_fails(&f, NULL, CKPT_EFORMAT, "no shard header");
	ck_assert_int_eq(tu_flip_bit(f.path, 0, 1), 0);
	/* Undamaged again. */
	ck_assert_int_eq(open_only(&f, NULL), 0);
	result_free(&res);
	fx_done(&f);
}
END_TEST

/* Rewrite the trailer with new footer offset/length/version and a valid self-hash. */
static void craft_trailer(const char *path, uint64_t size, uint64_t foff, uint64_t flen,
                          uint32_t version)
{
	int fd = open(path, O_RDWR);
	ck_assert_int_ge(fd, 0);
	uint8_t t[IO_TRAILER_BYTES];
	ck_assert_int_eq(pread(fd, t, sizeof t, (off_t)(size - sizeof t)), (ssize_t)sizeof t);
	ckpt_put_le64(t + IO_TRL_OFF_FOOTER, foff);
	ckpt_put_le64(t + IO_TRL_OFF_FLEN, flen);
	ckpt_put_le32(t + IO_TRL_OFF_VERSION, version);
	ckpt_put_le64(t + IO_TRL_HASHED, XXH3_64bits(t, IO_TRL_HASHED));
	ck_assert_int_eq(pwrite(fd, t, sizeof t, (off_t)(size - sizeof t)), (ssize_t)sizeof t);
	close(fd);
}

START_TEST(crafted_trailers_and_versions)
{
	struct fx f;
	fx_init(&f, "shard-craft");
	struct shard_spec s = make_spec(f.seed, false);
	struct io_shard_result res;
	ck_assert_int_eq(write_shard(&f, &s, BUF_BYTES, 0, &res), 0);
	uint64_t size = res.file_size, foot = res.index->data_end, flen = res.footer_len;
	craft_trailer(f.path, size, size, flen, 1);                   /* past EOF */
	expect_open_fails(&f, NULL, CKPT_EFORMAT, "outside the file");
	craft_trailer(f.path, size, foot, size, 1);                   /* too long */
	expect_open_fails(&f, NULL, CKPT_EFORMAT, "outside the file");
	craft_trailer(f.path, size, UINT64_MAX - 4095, 8192, 1);      /* wraps */
	expect_open_fails(&f, NULL, CKPT_EFORMAT, "outside the file");
	craft_trailer(f.path, size, foot + 1, flen, 1);               /* misaligned */
	expect_open_fails(&f, NULL, CKPT_EFORMAT, "misaligned");
	craft_trailer(f.path, size, 0, flen, 1);                      /* inside the header */
	expect_open_fails(&f, NULL, CKPT_EFORMAT, "outside the file");
	craft_trailer(f.path, size, foot, 0, 1);
	expect_open_fails(&f, NULL, CKPT_EFORMAT, "footer");
	char newer[64];
	snprintf(newer, sizeof newer, "trailer version %u", IO_FORMAT_VERSION + 1);
	craft_trailer(f.path, size, foot, flen, IO_FORMAT_VERSION + 1);
	expect_open_fails(&f, NULL, CKPT_EVERSION, newer);
	craft_trailer(f.path, size, foot, flen, IO_FORMAT_VERSION);
	ck_assert_int_eq(open_only(&f, NULL), 0);
	/* A newer footer version behind a valid trailer and footer hash. */
	uint8_t *fb = malloc(flen);
	memcpy(fb, res.footer, flen);
	ckpt_put_le32(fb + 8, IO_FORMAT_VERSION + 1);
	uint8_t h[CKPT_HASH_BYTES];
	io_hash128(fb, flen, h);
	int fd = open(f.path, O_RDWR);
	ck_assert_int_eq(pwrite(fd, fb, flen, (off_t)foot), (ssize_t)flen);
	ck_assert_int_eq(pwrite(fd, h, sizeof h, (off_t)(size - IO_TRAILER_BYTES +
	                                                  IO_TRL_OFF_FHASH)), (ssize_t)sizeof h);
	close(fd);
	craft_trailer(f.path, size, foot, flen, IO_FORMAT_VERSION);
	snprintf(newer, sizeof newer, "version %u", IO_FORMAT_VERSION + 1);
	expect_open_fails(&f, NULL, CKPT_EVERSION, newer);
	free(fb);
	result_free(&res);
	fx_done(&f);
}
END_TEST

START_TEST(truncated_file)
{
	struct fx f;
	fx_init(&f, "shard-trunc");
	struct shard_spec s = make_spec(f.seed, false);
	struct io_shard_result res;
	ck_assert_int_eq(write_shard(&f, &s, BUF_BYTES, 0, &res), 0);
	ck_assert_int_eq(truncate(f.path, (off_t)res.file_size - 1), 0);
	expect_open_fails(&f, NULL, CKPT_EFORMAT, "truncated");
	ck_assert_int_eq(truncate(f.path, (off_t)res.file_size - CKPT_ALIGN), 0);
	expect_open_fails(&f, NULL, CKPT_EFORMAT, "truncated");
	/* The manifest's index still describes data the file no longer holds. */
	ck_assert_int_eq(truncate(f.path, (off_t)res.index->data_end - CKPT_ALIGN), 0);
	expect_open_fails(&f, res.index, CKPT_ECORRUPT, "truncated");
	ck_assert_int_eq(truncate(f.path, 100), 0);
	expect_open_fails(&f, NULL, CKPT_EFORMAT, "truncated");
	ck_assert_int_eq(truncate(f.path, 0), 0);
	expect_open_fails(&f, NULL, CKPT_EFORMAT, "truncated");
	unlink(f.path);
	ck_assert_int_eq(open_only(&f, NULL), -ENOENT);
	result_free(&res);
	fx_done(&f);
}
END_TEST

/* ------------------------------------------------------------------ write failures */

static void arm_fault(const char *spec)
{
	if (spec)
		setenv("CKPT_FAULT", spec, 1);
	else
		unsetenv("CKPT_FAULT");
	ckpt_fault_reload();
}

static void fsync_done(void *owner, uint64_t cookie, int64_t res)
{
	(void)cookie;
	int64_t *out = owner;
	*out = res;
}

/* open queues the header's write and its directory's fsync on the engine rather than
 * waiting for the disk: the engine's fsync reports 0, or the fd's error; open
 * returns with open's requests in flight or done but never counted as chunks; a
 * failure injected before the fsync fails open and leaves no file; and finish waits
 * for both (the file reads back with its header). */
START_TEST(open_queues_header_and_directory_sync)
{
	struct fx f;
	fx_init(&f, "shard-open");
	int dfd = open(f.dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	ck_assert_int_ge(dfd, 0);
	int64_t res = 1;
	ck_assert_int_eq(io_engine_queue(f.e, IO_OP_FSYNC, dfd, NULL, 0, 0, fsync_done, &res, 7), 0);
	while (io_engine_inflight(f.e))
		ck_assert_int_ge(io_engine_reap(f.e, true), 0);
	ck_assert_int_eq(res, 0);
	close(dfd);
	res = 1;
	ck_assert_int_eq(io_engine_queue(f.e, IO_OP_FSYNC, dfd, NULL, 0, 0, fsync_done, &res, 7), 0);
	while (io_engine_inflight(f.e))
		ck_assert_int_ge(io_engine_reap(f.e, true), 0);
	ck_assert_int_eq(res, -EBADF);

	struct io_writer_opts o = { .step = 3, .rank = 0, .world = 1, .size_hint = 4u * BUF_BYTES,
	                            .block_bytes = f.block_bytes };
	struct io_shard_writer *w;
	arm_fault("before_dir_fsync:1:eio");
	ck_assert_int_eq(io_shard_writer_open(f.e, f.path, &o, &w), -EIO);
	arm_fault(NULL);
	ck_assert(!file_exists(f.path));
	ck_assert_uint_eq(io_engine_inflight(f.e), 0);

	ck_assert_msg(io_shard_writer_open(f.e, f.path, &o, &w) == 0, "%s", ckpt_err_msg());
	ck_assert_uint_eq(io_shard_writer_pending(w), 0);
	int queued = 0;          /* open's two, reaped here: their callbacks are the writer's */
	while (io_engine_inflight(f.e))
		queued += io_engine_reap(f.e, true);
	ck_assert_int_eq(queued, 2);
	ck_assert_uint_eq(io_shard_writer_pending(w), 0);
	struct io_tensor_desc d;
	uint64_t sh, of, ex;
	char name[64];
	tensor_desc(&d, &sh, &of, &ex, name, sizeof name, 0, BUF_BYTES);
	ck_assert_int_eq(io_shard_writer_add_tensor(w, &d), 0);
	int b = io_pool_get(f.pool, 10000);
	ck_assert_int_ge(b, 0);
	tensor_bytes(io_pool_addr(f.pool, (unsigned)b), BUF_BYTES, f.seed, 0, true);
	ck_assert_int_eq(io_shard_writer_append(w, 0, (unsigned)b, BUF_BYTES, NULL), 0);
	struct io_shard_result r;
	ck_assert_msg(io_shard_writer_finish(w, &r) == 0, "%s", ckpt_err_msg());
	ck_assert_uint_eq(io_engine_inflight(f.e), 0);
	result_free(&r);
	struct io_shard_reader *rd;
	ck_assert_msg(io_shard_reader_open(f.e, f.path, NULL, &rd) == 0, "%s", ckpt_err_msg());
	ck_assert_uint_eq(io_shard_reader_index(rd)->step, 3);
	io_shard_reader_close(rd);
	fx_done(&f);
}
END_TEST

START_TEST(injected_chunk_write_errors)
{
	struct fx f;
	fx_init(&f, "shard-fault");
	uint64_t sizes[] = { 100000, 1, 250000, 0, 70000 };
	struct shard_spec s = { 5, sizes, false };
	size_t chunk = 30000;
	unsigned nchunks = 4 + 1 + 9 + 0 + 3;
	const char *actions[] = { "enospc", "eio" };
	for (unsigned a = 0; a < 2; a++) {
		for (unsigned nth = 1; nth <= nchunks; nth++) {
			char spec[64];
			snprintf(spec, sizeof spec, "after_chunk_write:%u:%s", nth, actions[a]);
			arm_fault(spec);
			struct io_shard_result res;
			int rc = write_shard(&f, &s, chunk, nth % 2 ? 0 : 2, &res);
			int want = a ? -EIO : -ENOSPC;
			ck_assert_msg(rc == want, "%s: rc %d (%s)", spec, rc, ckpt_err_msg());
			ck_assert_ptr_nonnull(strstr(ckpt_err_msg(), "after_chunk_write"));
			ck_assert_ptr_nonnull(strstr(ckpt_err_msg(), f.path));
			ck_assert_ptr_null(res.index);
			ck_assert(!file_exists(f.path));
			ck_assert_uint_eq(io_pool_nfree(f.pool), NBUFS);
		}
	}
	/* Past the last chunk: nothing fires, the save succeeds. */
	arm_fault("after_chunk_write:1000:eio");
	struct io_shard_result res;
	ck_assert_int_eq(write_shard(&f, &s, chunk, 0, &res), 0);
	ck_assert_uint_eq(res.index->nchunks, nchunks);
	result_free(&res);
	arm_fault(NULL);
	fx_done(&f);
}
END_TEST

START_TEST(injected_finish_errors)
{
	struct fx f;
	fx_init(&f, "shard-fault2");
	uint64_t sizes[] = { 100000, 5000 };
	struct shard_spec s = { 2, sizes, false };
	const char *specs[] = { "after_footer_write:1:eio", "before_fdatasync:1:enospc",
	                        "after_fdatasync:1:eio" };
	const int want[] = { -EIO, -ENOSPC, -EIO };
	for (unsigned i = 0; i < CKPT_ARRAY_SIZE(specs); i++) {
		arm_fault(specs[i]);
		struct io_shard_result res;
		ck_assert_int_eq(write_shard(&f, &s, 40000, 0, &res), want[i]);
		ck_assert_ptr_nonnull(strstr(ckpt_err_msg(), f.path));
		ck_assert(!file_exists(f.path));
		ck_assert_uint_eq(io_pool_nfree(f.pool), NBUFS);
	}
	arm_fault(NULL);
	fx_done(&f);
}
END_TEST

/* A real failure half-way: RLIMIT_FSIZE makes the kernel refuse the writes that
 * cross it (a short write, then -EFBIG), as ENOSPC would on a full disk. */
START_TEST(real_efbig_half_way)
{
	pid_t pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		signal(SIGXFSZ, SIG_IGN);
		/* A block multiple: the write that crosses it is cut short there (an
		 * O_DIRECT write cut at an odd length would be refused outright). */
		struct rlimit rl = { 73 * 4096, 73 * 4096 };
		if (setrlimit(RLIMIT_FSIZE, &rl))
			_exit(77);
		struct fx f;
		f.seed = tu_seed();
		f.dir = tu_tmpdir("shard-efbig");
		snprintf(f.path, sizeof f.path, "%s/rank-000001.shard", f.dir);
		if (io_pool_create(BUF_BYTES, NBUFS, NULL, &f.pool) ||
		    io_engine_create(f.pool, DEPTH, &f.e))
			_exit(2);
		uint64_t sizes[] = { 200000, 400000 };
		struct shard_spec s = { 2, sizes, false };
		struct io_shard_writer *w;
		/* No size hint: ftruncate past the limit would fail at open instead. */
		int rc = io_shard_writer_open(f.e, f.path, &(struct io_writer_opts){ .step = 9, .rank = 1, .world = 4, .size_hint = 0, .zstd_level = 0, .block_bytes = IO_BLOCK_BYTES }, &w);
		if (rc)
			_exit(3);
		for (unsigned i = 0; i < 2 && !rc; i++) {
			struct io_tensor_desc d;
			uint64_t sh, of, ex;
			char name[64];
			tensor_desc(&d, &sh, &of, &ex, name, sizeof name, i, s.sizes[i]);
			if (io_shard_writer_add_tensor(w, &d) != (int)i)
				_exit(4);
		}
		for (unsigned i = 0; i < 2 && !rc; i++)
			for (uint64_t o = 0; o < sizes[i] && !rc; o += 50000) {
				int b = io_pool_get(f.pool, 10000);
				if (b < 0)
					_exit(5);
				size_t len = (size_t)(sizes[i] - o < 50000 ? sizes[i] - o : 50000);
				tu_fill(io_pool_addr(f.pool, (unsigned)b), len, f.seed, o);
				rc = io_shard_writer_append(w, i, (unsigned)b, len, NULL);
			}
		if (rc) {
			io_shard_writer_abort(w);
		} else {
			struct io_shard_result res;
			rc = io_shard_writer_finish(w, &res);
		}
		fprintf(stderr, "efbig child: rc %d: %s\n", rc, ckpt_err_msg());
		if (rc != -EFBIG)
			_exit(6);
		if (!strstr(ckpt_err_msg(), f.path) || !strstr(ckpt_err_msg(), "offset"))
			_exit(7);
		if (io_pool_nfree(f.pool) != NBUFS)
			_exit(8);
		if (file_exists(f.path))
			_exit(9);
		io_engine_destroy(f.e);
		io_pool_destroy(f.pool);
		tu_rmtree(f.dir);
		_exit(0);
	}
	int st;
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	ck_assert_msg(WIFEXITED(st), "child died: status 0x%x", st);
	if (WEXITSTATUS(st) == 77) {
		fprintf(stderr, "SKIP real_efbig_half_way: setrlimit(RLIMIT_FSIZE) refused\n");
		return;
	}
	ck_assert_int_eq(WEXITSTATUS(st), 0);
}
END_TEST

/* ------------------------------------------------------------------ misuse */

START_TEST(writer_misuse)
{
	struct fx f;
	fx_init(&f, "shard-misuse");
	struct io_shard_writer *w;
	ck_assert_int_eq(io_shard_writer_open(f.e, f.path, &(struct io_writer_opts){ .step = 1, .rank = 4, .world = 4, .size_hint = 0, .zstd_level = 0, .block_bytes = IO_BLOCK_BYTES }, &w),
	                 -EINVAL);
	ck_assert_ptr_null(w);
	ck_assert_int_eq(io_shard_writer_open(f.e, f.path, &(struct io_writer_opts){ .step = 1, .rank = 0, .world = 1, .size_hint = 0, .zstd_level = 99, .block_bytes = IO_BLOCK_BYTES }, &w),
	                 -EINVAL);
	/* Block sizes: a power of two of at least 4 KiB, at most a chunk's limit. */
	const uint32_t bad_blocks[] = { 1, 2048, 12288, 3u << 20, 1u << 31 };
	for (unsigned i = 0; i < CKPT_ARRAY_SIZE(bad_blocks); i++) {
		ck_assert_int_eq(io_shard_writer_open(f.e, f.path, &(struct io_writer_opts){ .step = 1, .rank = 0, .world = 1, .size_hint = 0, .zstd_level = 0, .block_bytes = bad_blocks[i] }, &w),
		                 -EINVAL);
		ck_assert_ptr_nonnull(strstr(ckpt_err_msg(), "block size"));
	}
	char bad[600];
	snprintf(bad, sizeof bad, "%s/no/such/dir/x.shard", f.dir);
	ck_assert_int_eq(io_shard_writer_open(f.e, bad, &(struct io_writer_opts){ .step = 1, .rank = 0, .world = 1, .size_hint = 0, .zstd_level = 0, .block_bytes = 0 }, &w), -ENOENT);
	ck_assert_ptr_nonnull(strstr(ckpt_err_msg(), bad));
	/* A save id needs format 3, which has block hashes. */
	ck_assert_int_eq(io_shard_writer_open(f.e, f.path, &(struct io_writer_opts){ .step = 1, .world = 1, .save_id = 5 }, &w), -EINVAL);
	/* Tree hashes are format 5's, which has a save id. */
	ck_assert_int_eq(io_shard_writer_open(f.e, f.path, &(struct io_writer_opts){
	                 .step = 1, .world = 1, .block_bytes = IO_BLOCK_BYTES, .tree = true }, &w),
	                 -EINVAL);
	ck_assert_ptr_nonnull(strstr(ckpt_err_msg(), "tree hashes need format 5"));
	/* Never over an existing file (another process's attempt, or a committed shard):
	 * -EEXIST, and the file is left exactly as it was, open failures included. */
	ck_assert_int_eq(tu_write_file(f.path, "not yours", 9), 0);
	ck_assert_int_eq(io_shard_writer_open(f.e, f.path, &(struct io_writer_opts){ .step = 1, .rank = 0, .world = 1, .block_bytes = IO_BLOCK_BYTES, .save_id = 7 }, &w), -EEXIST);
	ck_assert_ptr_null(w);
	void *kept;
	size_t klen;
	ck_assert_int_eq(tu_read_file(f.path, &kept, &klen), 0);
	ck_assert(klen == 9 && !memcmp(kept, "not yours", 9));
	free(kept);
	ck_assert_int_eq(unlink(f.path), 0);
	/* The file's mode: private by default, what is asked otherwise. */
	ck_assert_int_eq(io_shard_writer_open(f.e, f.path, &(struct io_writer_opts){ .step = 1, .rank = 0, .world = 1, .block_bytes = IO_BLOCK_BYTES }, &w), 0);
	struct stat ms;
	ck_assert_int_eq(stat(f.path, &ms), 0);
	ck_assert_uint_eq(ms.st_mode & 0777, 0600);
	io_shard_writer_abort(w);
	mode_t um = umask(0);
	ck_assert_int_eq(io_shard_writer_open(f.e, f.path, &(struct io_writer_opts){ .step = 1, .rank = 0, .world = 1, .block_bytes = IO_BLOCK_BYTES, .mode = 0640 }, &w), 0);
	umask(um);
	ck_assert_int_eq(stat(f.path, &ms), 0);
	ck_assert_uint_eq(ms.st_mode & 0777, 0640);
	io_shard_writer_abort(w);
	ck_assert_int_eq(io_shard_writer_open(f.e, f.path, &(struct io_writer_opts){ .step = 1, .rank = 0, .world = 1, .size_hint = 0, .zstd_level = 0, .block_bytes = IO_BLOCK_BYTES }, &w), 0);
	uint64_t shape[2] = { 10, 10 }, off[2] = { 0, 0 }, ext[2] = { 10, 10 };
	struct io_tensor_desc d = { "a/b", CKPT_KIND_MODEL, CKPT_F32, CKPT_SHARDED, 0, 2,
	                            shape, off, ext, 400 };
	ck_assert_int_eq(io_shard_writer_add_tensor(w, &d), 0);
	ck_assert_int_eq(io_shard_writer_add_tensor(w, &d), -EEXIST);
	d.name = "a/../b";
	ck_assert_int_eq(io_shard_writer_add_tensor(w, &d), CKPT_ENAME);
	d.name = "c";
	d.raw_bytes = 401;
	ck_assert_int_eq(io_shard_writer_add_tensor(w, &d), CKPT_ESHAPE);
	d.raw_bytes = 400;
	off[1] = 1;
	ck_assert_int_eq(io_shard_writer_add_tensor(w, &d), CKPT_ESHAPE);
	off[1] = 0;
	d.dtype = 0;
	ck_assert_int_eq(io_shard_writer_add_tensor(w, &d), -EINVAL);
	d.dtype = CKPT_F32;
	d.flags = IO_TENSOR_BLOB;
	ck_assert_int_eq(io_shard_writer_add_tensor(w, &d), -EINVAL);
	d.flags = 0;
	ck_assert_int_eq(io_shard_writer_add_tensor(w, &d), 1);
	/* Appends: unknown tensor, too long, out of order; each returns the buffer. */
	int b = io_pool_get(f.pool, 0);
	ck_assert_int_eq(io_shard_writer_append(w, 7, (unsigned)b, 100, NULL), -EINVAL);
	b = io_pool_get(f.pool, 0);
	ck_assert_int_eq(io_shard_writer_append(w, 0, (unsigned)b, 401, NULL), -EINVAL);
	b = io_pool_get(f.pool, 0);
	ck_assert_int_eq(io_shard_writer_append(w, 0, (unsigned)b, 0, NULL), -EINVAL);
	/* An external write needs its write function and the caller's hashes. */
	struct io_hashes h = { .block_bytes = 0 };
	b = io_pool_get(f.pool, 0);
	ck_assert_int_eq(io_shard_writer_append(w, 0, (unsigned)b, 200,
	                 &(struct io_append){ .ext = &(struct io_ext_write){ .write = NULL },
	                                      .hashes = &h }), -EINVAL);
	b = io_pool_get(f.pool, 0);
	ck_assert_int_eq(io_shard_writer_append(w, 0, (unsigned)b, 200,
	                 &(struct io_append){ .ext = &(struct io_ext_write){ .write = ext_write } }),
	                 -EINVAL);
	ck_assert_ptr_nonnull(strstr(ckpt_err_msg(), "external chunk write without"));
	ck_assert_uint_eq(io_pool_nfree(f.pool), NBUFS);
	/* Hashes of the other kind than the file's (a tree for this version-2 file): the
	 * index would claim one kind and hold the other. */
	struct io_hashes th = { .tree = true };
	b = io_pool_get(f.pool, 0);
	ck_assert_int_eq(io_shard_writer_append(w, 0, (unsigned)b, 200,
	                 &(struct io_append){ .hashes = &th }), -EINVAL);
	ck_assert_ptr_nonnull(strstr(ckpt_err_msg(), "hashed as a tree for a file of version 2"));
	ck_assert_uint_eq(io_pool_nfree(f.pool), NBUFS);
	b = io_pool_get(f.pool, 0);
	ck_assert_int_eq(io_shard_writer_append(w, 0, (unsigned)b, 200, NULL), 0);
	b = io_pool_get(f.pool, 0);
	ck_assert_int_eq(io_shard_writer_append(w, 1, (unsigned)b, 200, NULL), -EINVAL);  /* 0 open */
	ck_assert_ptr_nonnull(strstr(ckpt_err_msg(), "before 'a/b' was complete"));
	/* Only the accepted chunk's buffer may still be out (its write in flight). */
	ck_assert_uint_ge(io_pool_nfree(f.pool), NBUFS - 1);
	/* Finish with tensors incomplete: refused, file removed, buffers back. */
	struct io_shard_result res;
	ck_assert_int_eq(io_shard_writer_finish(w, &res), -EINVAL);
	ck_assert_ptr_nonnull(strstr(ckpt_err_msg(), "'a/b' has 200 of 400 bytes"));
	ck_assert(!file_exists(f.path));
	ck_assert_uint_eq(io_pool_nfree(f.pool), NBUFS);
	/* Abort mid-way removes the file and returns buffers. */
	ck_assert_int_eq(io_shard_writer_open(f.e, f.path, &(struct io_writer_opts){ .step = 1, .rank = 0, .world = 1, .size_hint = 1u << 20, .zstd_level = 0, .block_bytes = IO_BLOCK_BYTES }, &w),
	                 0);
	d.name = "x";
	ck_assert_int_eq(io_shard_writer_add_tensor(w, &d), 0);
	b = io_pool_get(f.pool, 0);
	ck_assert_int_eq(io_shard_writer_append(w, 0, (unsigned)b, 300, NULL), 0);
	ck_assert(file_exists(f.path));
	io_shard_writer_abort(w);
	io_shard_writer_abort(NULL);
	ck_assert(!file_exists(f.path));
	fx_done(&f);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("io_shard");
	TCase *tc = tcase_create("shard");
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, round_trip_raw);
	tcase_add_test(tc, round_trip_odirect_refused_after_create);
	tcase_add_test(tc, round_trip_zstd_compressible);
	tcase_add_test(tc, round_trip_preallocated_offloaded);
	tcase_add_test(tc, engine_offload_caps_workers);
	tcase_add_test(tc, round_trip_zstd_incompressible);
	tcase_add_test(tc, empty_shard);
	tcase_add_test(tc, external_writes);
	tcase_add_test(tc, pending_counts_unwritten_chunks);
	tcase_add_test(tc, batch_across_files_and_callback_stop);
	tcase_add_test(tc, read_with_smaller_pool);
	tcase_add_test(tc, flipped_bit_in_chunk);
	tcase_add_test(tc, damaged_metadata);
	tcase_add_test(tc, crafted_trailers_and_versions);
	tcase_add_test(tc, truncated_file);
	tcase_add_test(tc, open_queues_header_and_directory_sync);
	tcase_add_test(tc, injected_chunk_write_errors);
	tcase_add_test(tc, injected_finish_errors);
	tcase_add_test(tc, real_efbig_half_way);
	tcase_add_test(tc, writer_misuse);
	suite_add_tcase(s, tc);
	SRunner *sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
