/*
 * test_bytegroup.c — the bytegroup chunk codec (lib/io/codec.c) and the writer's
 * compression workers (lib/io/writer.c): round trips of every dtype with trained-like,
 * random, zero and NaN/Inf/denormal data at lengths that end inside an element;
 * stored bytes damaged in every field of their header, in a plane and cut short;
 * shards written with workers laid out exactly as inline, read back bit-exact, a
 * flipped bit in a compressed plane on disk found; write failures and aborts that
 * must give every pool buffer back.
 */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/io_internal.h"
#include "testutil.h"

#define BUF_BYTES (64u * 1024)
#define NBUFS     8u
#define DEPTH     4u

/* ------------------------------------------------------------------ data */

enum kind { K_TRAINED, K_MOMENT, K_RANDOM, K_ZEROS, K_SPECIAL, K_NKINDS };
static const char *const kind_names[] = { "trained", "moment", "random", "zeros", "special" };

static double gauss(uint64_t *s)
{
	double u1 = ((double)(tu_rand(s) >> 11) + 1.0) / 9007199254740993.0;
	double u2 = (double)(tu_rand(s) >> 11) / 9007199254740992.0;
	return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* One value of kind k as f64; K_SPECIAL cycles through the values that must survive
 * bit for bit. */
static double value(enum kind k, uint64_t *s, size_t i)
{
	static const double special[] = { 0.0, -0.0, INFINITY, -INFINITY, NAN, 1e-310, -4e-320,
	                                  1.0, 65504.0, 3.4e38 };
	switch (k) {
	case K_TRAINED: return 0.02 * gauss(s);
	case K_MOMENT:  { double g = 1e-3 * gauss(s); return g * g; }
	case K_SPECIAL: return special[i % CKPT_ARRAY_SIZE(special)];
	default:        return 0;
	}
}

static uint16_t f32_to_bf16(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	return (uint16_t)(u >> 16);
}

/* f16 bits from an f32: exponent re-biased and clamped, mantissa truncated (enough
 * for data shaped like f16 values; NaN keeps a payload, denormals flush to the
 * smallest exponent). */
static uint16_t f32_to_f16(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	uint32_t sign = (u >> 16) & 0x8000, e = (u >> 23) & 0xff, m = (u >> 13) & 0x3ff;
	int e16 = e == 0xff ? 31 : (int)e - 127 + 15;
	if (e16 <= 0)
		e16 = 0, m >>= 3;
	if (e16 > 31)
		e16 = 31, m = 0;
	return (uint16_t)(sign | (uint32_t)e16 << 10 | m);
}

/* n bytes of dtype elements of kind k (n need not be a multiple of the size). */
static void fill(uint8_t *p, size_t n, int dtype, enum kind k, uint64_t seed)
{
	uint64_t s = seed;
	size_t es = ckpt_dtype_size(dtype);
	if (k == K_RANDOM || es == 1 || dtype == CKPT_I16 || dtype == CKPT_I32 || dtype == CKPT_I64) {
		tu_fill(p, n, seed, (uint64_t)dtype);
		if (k == K_ZEROS)
			memset(p, 0, n);
		else if (k != K_RANDOM)  /* integers and bytes: small values, compressible */
			for (size_t i = 0; i < n; i++)
				p[i] = (i % es) ? 0 : (uint8_t)(p[i] % 7);
		return;
	}
	for (size_t i = 0; i * es < n; i++) {
		double v = value(k, &s, i);
		uint8_t e[8];
		if (dtype == CKPT_F64) {
			memcpy(e, &v, 8);
		} else if (dtype == CKPT_F32) {
			float f = (float)v;
			memcpy(e, &f, 4);
		} else {
			uint16_t h = dtype == CKPT_BF16 ? f32_to_bf16((float)v) : f32_to_f16((float)v);
			memcpy(e, &h, 2);
		}
		size_t take = n - i * es < es ? n - i * es : es;
		memcpy(p + i * es, e, take);
	}
}

/* ------------------------------------------------------------------ codec */

/* Encode with bytegroup, decode, compare; returns the stored size (0: raw). */
static size_t round_trip(const uint8_t *src, size_t n, int dtype, int level, const char *what)
{
	uint8_t *z = malloc(n + 1), *back = malloc(n + 1);
	uint8_t used = 0xee;
	size_t zn = io_chunk_encode(IO_CODEC_BYTEGROUP, level, dtype, z, n ? n - 1 : 0, src, n,
	                            &used);
	ck_assert_uint_eq(used, io_bytegroup_width(dtype) ? IO_CODEC_BYTEGROUP : IO_CODEC_ZSTD);
	ck_assert_msg(zn < n || zn == 0, "%s: %zu stored of %zu", what, zn, n);
	if (zn) {
		back[n] = 0xa5;
		int rc = io_chunk_decode(used, dtype, back, n, z, zn);
		ck_assert_msg(rc == 0, "%s: decode %d (%s)", what, rc, ckpt_err_msg());
		ck_assert_msg(!memcmp(back, src, n), "%s: bytes differ", what);
		ck_assert_uint_eq(back[n], 0xa5);     /* nothing past raw_len */
	}
	free(z);
	free(back);
	return zn;
}

START_TEST(round_trip_every_dtype)
{
	uint64_t seed = tu_seed();
	/* Lengths that end on and inside an element, around plane sizes of one. */
	const size_t lens[] = { 1, 2, 3, 5, 7, 9, 4096, 4099, 65536, 65541, 200003 };
	for (int dt = 1; dt <= CKPT_DTYPE_MAX_; dt++)
		for (int k = 0; k < K_NKINDS; k++)
			for (unsigned l = 0; l < CKPT_ARRAY_SIZE(lens); l++) {
				size_t n = lens[l];
				uint8_t *p = malloc(n);
				fill(p, n, dt, (enum kind)k, seed + l);
				char what[96];
				snprintf(what, sizeof what, "%s %s %zu bytes", ckpt_dtype_name(dt),
				         kind_names[k], n);
				size_t zn = round_trip(p, n, dt, 1, what);
				/* Large chunks of zeros always pay, whatever the codec. */
				if (k == K_ZEROS && n >= 4096)
					ck_assert_msg(zn > 0 && zn < n / 8, "%s: %zu", what, zn);
				free(p);
			}
}
END_TEST

START_TEST(planes_that_pay)
{
	/* Trained-like f32: the exponent plane (byte 3) and the one below it pay, the
	 * low mantissa byte does not; the chunk as a whole does, and better than zstd
	 * over the interleaved bytes. */
	uint64_t seed = tu_seed();
	size_t n = 1u << 20;
	uint8_t *p = malloc(n), *z = malloc(n), *zz = malloc(n);
	fill(p, n, CKPT_F32, K_TRAINED, seed);
	uint8_t used;
	size_t zn = io_chunk_encode(IO_CODEC_BYTEGROUP, 1, CKPT_F32, z, n - 1, p, n, &used);
	ck_assert_uint_eq(used, IO_CODEC_BYTEGROUP);
	ck_assert_uint_gt(zn, 0);
	ck_assert_uint_eq(z[0], IO_BG_LAYOUT);
	ck_assert_uint_eq(z[1], 4);
	const uint8_t *plane = z + IO_BG_HDR_BYTES;
	ck_assert_uint_eq(plane[0 * IO_BG_PLANE_BYTES], IO_BG_STORED);
	ck_assert_uint_eq(ckpt_get_le32(plane + 4), n / 4);
	ck_assert_uint_eq(plane[3 * IO_BG_PLANE_BYTES], IO_BG_ZSTD);
	ck_assert_uint_lt(ckpt_get_le32(plane + 3 * IO_BG_PLANE_BYTES + 4), n / 4 / 2);
	size_t plain = io_codec_compress(zz, n - 1, p, n, 1);
	ck_assert_msg(plain == 0 || zn < plain, "bytegroup %zu, zstd %zu", zn, plain);
	/* Random bytes pay nowhere: the chunk is stored raw (0), as zstd's. */
	tu_fill(p, n, seed, 77);
	ck_assert_uint_eq(io_chunk_encode(IO_CODEC_BYTEGROUP, 1, CKPT_BF16, z, n - 1, p, n, &used),
	                  0);
	ck_assert_uint_eq(io_chunk_encode(IO_CODEC_BYTEGROUP, 3, CKPT_F64, z, n - 1, p, n, &used),
	                  0);
	/* Too small a destination is "store raw", not an error. */
	fill(p, n, CKPT_BF16, K_TRAINED, seed);
	ck_assert_uint_eq(io_bytegroup_compress(z, 10, p, n, 2, 1), 0);
	ck_assert_uint_eq(io_bytegroup_compress(z, 1000, p, n, 2, 1), 0);
	/* Dtypes without planes go to zstd. */
	ck_assert_uint_eq(io_bytegroup_width(CKPT_F8_E4M3), 0);
	ck_assert_uint_eq(io_bytegroup_width(CKPT_I32), 0);
	ck_assert_uint_eq(io_bytegroup_width(CKPT_BF16), 2);
	ck_assert_uint_eq(io_bytegroup_width(CKPT_F16), 2);
	ck_assert_uint_eq(io_bytegroup_width(CKPT_F64), 8);
	free(p);
	free(z);
	free(zz);
}
END_TEST

/* Level 1 entropy-codes a plane that does not repeat: the exponent plane of bf16
 * weights comes out smaller than zstd's level 1 makes it (whose short matches cost
 * more than the literals they replace); a plane that repeats is still found to
 * (the first bytes decide), and compressed with level 1's search: far smaller than
 * entropy coding could make it. Both decode to the same bytes. */
START_TEST(level_one_entropy_codes_unless_planes_repeat)
{
	uint64_t seed = tu_seed();
	size_t n = 1u << 20, m = n / 2;
	uint8_t *p = malloc(n), *z = malloc(n), *zz = malloc(n), *plane = malloc(m);
	uint8_t *back = malloc(n);
	uint8_t used;
	fill(p, n, CKPT_BF16, K_TRAINED, seed);
	size_t zn = io_chunk_encode(IO_CODEC_BYTEGROUP, 1, CKPT_BF16, z, n - 1, p, n, &used);
	ck_assert_uint_gt(zn, 0);
	const uint8_t *e = z + IO_BG_HDR_BYTES + IO_BG_PLANE_BYTES;   /* plane 1: the exponent */
	ck_assert_uint_eq(e[0], IO_BG_ZSTD);
	for (size_t i = 0; i < m; i++)
		plane[i] = p[2 * i + 1];
	size_t l1 = io_codec_compress(zz, m, plane, m, 1);
	ck_assert_uint_gt(l1, 0);
	ck_assert_msg(ckpt_get_le32(e + 4) < l1, "exponent plane %u bytes, zstd level 1 %zu",
	              ckpt_get_le32(e + 4), l1);
	ck_assert_int_eq(io_chunk_decode(IO_CODEC_BYTEGROUP, CKPT_BF16, back, n, z, zn), 0);
	ck_assert(!memcmp(back, p, n));
	/* The high bytes: 4 KiB of 16 values, over and over; the low bytes random. */
	tu_fill(p, n, seed, 5);
	for (size_t i = 0; i < m; i++)
		p[2 * i + 1] = i < 4096 ? p[2 * i + 1] & 15 : p[2 * (i % 4096) + 1];
	zn = io_chunk_encode(IO_CODEC_BYTEGROUP, 1, CKPT_BF16, z, n - 1, p, n, &used);
	ck_assert_uint_gt(zn, 0);
	ck_assert_uint_eq(e[0], IO_BG_ZSTD);
	ck_assert_msg(ckpt_get_le32(e + 4) < m / 64, "repeating plane: %u bytes of %zu",
	              ckpt_get_le32(e + 4), m);
	ck_assert_int_eq(io_chunk_decode(IO_CODEC_BYTEGROUP, CKPT_BF16, back, n, z, zn), 0);
	ck_assert(!memcmp(back, p, n));
	free(p);
	free(z);
	free(zz);
	free(plane);
	free(back);
}
END_TEST

static void expect_corrupt(const uint8_t *z, size_t zn, size_t n, int dtype, const char *what,
                           const char *msg)
{
	uint8_t *back = malloc(n);
	int rc = io_chunk_decode(IO_CODEC_BYTEGROUP, dtype, back, n, z, zn);
	ck_assert_msg(rc == CKPT_ECORRUPT, "%s: rc %d (%s)", what, rc, ckpt_err_msg());
	ck_assert_msg(strstr(ckpt_err_msg(), msg), "%s: message '%s' lacks '%s'", what,
	              ckpt_err_msg(), msg);
	free(back);
}

START_TEST(damaged_stored_bytes)
{
	uint64_t seed = tu_seed();
	size_t n = 100001;          /* ends inside an element: planes of two sizes */
	uint8_t *p = malloc(n), *z = malloc(n), *m = malloc(n + 8), *back = malloc(n);
	fill(p, n, CKPT_BF16, K_TRAINED, seed);
	uint8_t used;
	size_t zn = io_chunk_encode(IO_CODEC_BYTEGROUP, 1, CKPT_BF16, z, n - 1, p, n, &used);
	ck_assert_uint_gt(zn, 0);
	uint8_t *e1 = z + IO_BG_HDR_BYTES + IO_BG_PLANE_BYTES;     /* plane 1: the exponent */
	ck_assert_uint_eq(e1[0], IO_BG_ZSTD);
	size_t hdr = IO_BG_HDR_BYTES + 2 * IO_BG_PLANE_BYTES;
	uint32_t len0 = ckpt_get_le32(z + IO_BG_HDR_BYTES + 4);
	ck_assert_uint_eq(len0, n / 2 + 1);                        /* plane 0 stored whole */

#define MUTATE(stmt, size, what, msg) do {                                  \
		memcpy(m, z, zn);                                           \
		stmt;                                                       \
		expect_corrupt(m, (size), n, CKPT_BF16, what, msg);         \
	} while (0)
	MUTATE(m[0] = 2, zn, "layout", "layout 2 unknown");
	MUTATE(m[1] = 4, zn, "width", "element width 4");
	MUTATE(m[3] = 1, zn, "reserved", "reserved");
	MUTATE(m[IO_BG_HDR_BYTES + 2] = 1, zn, "plane reserved", "plane 0: reserved");
	MUTATE(m[IO_BG_HDR_BYTES + IO_BG_PLANE_BYTES] = 9, zn, "method", "plane 1: method 9");
	MUTATE(ckpt_put_le32(m + IO_BG_HDR_BYTES + 4, len0 - 1), zn, "stored plane short",
	       "plane 0: method 0");
	MUTATE(ckpt_put_le32(m + IO_BG_HDR_BYTES + IO_BG_PLANE_BYTES + 4,
	                     ckpt_get_le32(e1 + 4) + 1), zn, "plane length past the end",
	       "planes and header take");
	MUTATE(ckpt_put_le32(m + IO_BG_HDR_BYTES + IO_BG_PLANE_BYTES + 4, 0), zn,
	       "empty zstd plane", "plane 1: method 1 with 0 bytes");
	MUTATE(ckpt_put_le32(m + IO_BG_HDR_BYTES + IO_BG_PLANE_BYTES + 4, 0xffffffffu), zn,
	       "huge plane length", "planes and header take");
	MUTATE((void)0, zn - 1, "truncated", "planes and header take");
	MUTATE((void)0, hdr - 1, "truncated header", "shorter than the header");
	MUTATE((void)0, 3, "shorter than 4 bytes", "shorter than its header");
	MUTATE((m[zn] = 0, (void)0), zn + 1, "trailing byte", "planes and header take");
	/* Inside the compressed plane: its frame header, then the end of its frame. */
	MUTATE(m[hdr + len0] ^= 0x40, zn, "zstd magic", "bytegroup: plane 1: zstd");
	MUTATE((m[hdr + len0 + 4] ^= 0xff, (void)0), zn, "zstd frame descriptor", "plane 1");
	/* The raw length the index gives decides the plane sizes: one byte less moves
	 * the stored plane's size. */
	ck_assert_int_eq(io_chunk_decode(IO_CODEC_BYTEGROUP, CKPT_BF16, back, n - 1, z, zn),
	                 CKPT_ECORRUPT);
	/* A dtype of another width, or none. */
	expect_corrupt(z, zn, n, CKPT_F32, "dtype f32", "expected 4");
	ck_assert_int_eq(io_chunk_decode(IO_CODEC_BYTEGROUP, CKPT_U8, back, n, z, zn),
	                 CKPT_ECORRUPT);
	ck_assert_ptr_nonnull(strstr(ckpt_err_msg(), "dtype u8"));
	/* Random damage anywhere, a few bytes at a time: decoded or CKPT_ECORRUPT, never
	 * a read or a write outside the buffers (the ASan build checks that). */
	uint64_t r = seed;
	for (unsigned it = 0; it < 3000; it++) {
		size_t cut = it % 7 ? zn : (size_t)(tu_rand(&r) % (zn + 1));
		memcpy(m, z, zn);
		for (unsigned k = 0; k < 1 + it % 3; k++) {
			/* the header and the start of plane 1's frame get most of them */
			size_t at = tu_rand(&r) % (it % 2 ? hdr + len0 + 16 : zn);
			m[at] ^= (uint8_t)(1u << (tu_rand(&r) % 8));
		}
		int rc = io_chunk_decode(IO_CODEC_BYTEGROUP, CKPT_BF16, back, n, m, cut);
		ck_assert_msg(rc == 0 || rc == CKPT_ECORRUPT, "damage %u: rc %d (%s)", it, rc,
		              ckpt_err_msg());
	}
	/* And the bytes as written still decode. */
	ck_assert_int_eq(io_chunk_decode(IO_CODEC_BYTEGROUP, CKPT_BF16, back, n, z, zn), 0);
	ck_assert_mem_eq(back, p, n);
#undef MUTATE
	free(p);
	free(z);
	free(m);
	free(back);
}
END_TEST

/* ------------------------------------------------------------------ shards */

struct fx {
	char             *dir;
	char              path[512];
	struct io_pool   *pool;
	struct io_engine *e;
	uint64_t          seed;
};

static void fx_init(struct fx *f, const char *tag, unsigned nbufs)
{
	f->seed = tu_seed();
	f->dir = tu_tmpdir(tag);
	snprintf(f->path, sizeof f->path, "%s/rank-000000.shard", f->dir);
	ck_assert_int_eq(io_pool_create(BUF_BYTES, nbufs, NULL, &f->pool), 0);
	ck_assert_msg(io_engine_create(f->pool, DEPTH, &f->e) == 0, "%s", ckpt_err_msg());
}

static void fx_done(struct fx *f, unsigned nbufs)
{
	ck_assert_uint_eq(io_pool_nfree(f->pool), nbufs);
	io_engine_destroy(f->e);
	io_pool_destroy(f->pool);
	tu_rmtree(f->dir);
	free(f->dir);
}

/* The shard's tensors: every dtype of a save that compresses, in kinds that go
 * bytegroup, zstd and raw. */
static const struct { int dtype; enum kind kind; uint64_t bytes; } tensors[] = {
	{ CKPT_BF16, K_TRAINED, 300000 }, { CKPT_F32, K_MOMENT, 200000 },
	{ CKPT_F64, K_TRAINED, 150000 },  { CKPT_F16, K_SPECIAL, 70002 },
	{ CKPT_F32, K_RANDOM, 131072 },   { CKPT_I32, K_TRAINED, 100000 },
	{ CKPT_U8, K_RANDOM, 5 },         { CKPT_BF16, K_ZEROS, 8192 },
};
#define NT CKPT_ARRAY_SIZE(tensors)

static uint8_t *tensor_data(const struct fx *f, unsigned i)
{
	uint8_t *p = malloc(tensors[i].bytes);
	fill(p, tensors[i].bytes, tensors[i].dtype, tensors[i].kind, f->seed + i);
	return p;
}

/* Write the shard with threads workers (0: inline); stop after stop_after chunks
 * with an abort (0: never). */
static int write_shard(struct fx *f, unsigned threads, unsigned stop_after,
                       struct io_shard_result *res)
{
	struct io_shard_writer *w;
	memset(res, 0, sizeof *res);
	unlink(f->path);
	struct io_writer_opts o = {
		.step = 3, .rank = 0, .world = 1, .save_id = 0xb17e, .zstd_level = 1,
		.codec = IO_CODEC_BYTEGROUP, .compress_threads = threads, .block_bytes = 8192,
	};
	int rc = io_shard_writer_open(f->e, f->path, &o, &w);
	if (rc)
		return rc;
	for (unsigned i = 0; i < NT; i++) {
		uint64_t ext = tensors[i].bytes / ckpt_dtype_size(tensors[i].dtype), off = 0;
		char name[32];
		snprintf(name, sizeof name, "t%u", i);
		struct io_tensor_desc d = {
			.name = name, .kind = CKPT_KIND_MODEL, .dtype = (uint8_t)tensors[i].dtype,
			.policy = CKPT_SHARDED, .ndim = 1, .global_shape = &ext, .offset = &off,
			.extent = &ext, .raw_bytes = tensors[i].bytes,
		};
		ck_assert_msg(io_shard_writer_add_tensor(w, &d) == (int)i, "%s", ckpt_err_msg());
	}
	unsigned appended = 0;
	for (unsigned i = 0; i < NT; i++) {
		uint8_t *data = tensor_data(f, i);
		/* Chunks of 60000 bytes: not a multiple of 4 KiB, nor of 8 bytes. */
		for (uint64_t o2 = 0; o2 < tensors[i].bytes; o2 += 60000) {
			size_t len = (size_t)(tensors[i].bytes - o2 < 60000 ? tensors[i].bytes - o2 : 60000);
			int b = io_pool_get(f->pool, 10000);
			ck_assert_int_ge(b, 0);
			memcpy(io_pool_addr(f->pool, (unsigned)b), data + o2, len);
			rc = io_shard_writer_append(w, i, (unsigned)b, len, NULL);
			if (!rc && stop_after && ++appended == stop_after)
				rc = -ECANCELED;
			if (rc) {
				free(data);
				io_shard_writer_abort(w);
				return rc;
			}
		}
		free(data);
	}
	return io_shard_writer_finish(w, res);
}

struct check_ctx { const struct fx *f; uint8_t *data[NT]; unsigned calls; };

static int check_cb(void *arg, const struct io_read_req *req, uint64_t off, const void *raw,
                    size_t len)
{
	struct check_ctx *v = arg;
	const struct io_chunk_entry *c = &io_shard_reader_index(req->reader)->chunks[req->chunk];
	ck_assert_uint_eq(off, 0);
	ck_assert_uint_eq(len, c->raw_len);
	ck_assert_msg(!memcmp(raw, v->data[c->tensor] + c->raw_offset, len), "chunk %u differs",
	              req->chunk);
	v->calls++;
	return 0;
}

/* Read every chunk of the file back; 0 or the batch's error. */
static int read_back(struct fx *f)
{
	struct io_shard_reader *r;
	int rc = io_shard_reader_open(f->e, f->path, NULL, &r);
	if (rc)
		return rc;
	const struct io_shard_index *ix = io_shard_reader_index(r);
	struct check_ctx v = { .f = f };
	for (unsigned i = 0; i < NT; i++)
		v.data[i] = tensor_data(f, i);
	struct io_read_req *reqs = calloc(ix->nchunks, sizeof *reqs);
	for (uint32_t k = 0; k < ix->nchunks; k++)
		reqs[k] = (struct io_read_req){ .reader = r, .chunk = k, .arg = &v,
		                                .flags = IO_READ_CHECK_BLOCKS };
	rc = io_read_batch(f->e, reqs, ix->nchunks, check_cb);
	if (!rc)
		ck_assert_uint_eq(v.calls, ix->nchunks);
	for (unsigned i = 0; i < NT; i++)
		free(v.data[i]);
	free(reqs);
	io_shard_reader_close(r);
	return rc;
}

static uint32_t file_u32(const char *path, uint64_t off)
{
	void *b;
	size_t len;
	ck_assert_int_eq(tu_read_file(path, &b, &len), 0);
	ck_assert_uint_le(off + 4, len);
	uint32_t v = ckpt_get_le32((uint8_t *)b + off);
	free(b);
	return v;
}

START_TEST(shard_round_trip_with_workers)
{
	struct fx f;
	fx_init(&f, "bytegroup-rt", NBUFS);
	struct io_shard_result inl, par;
	ck_assert_msg(write_shard(&f, 0, 0, &inl) == 0, "%s", ckpt_err_msg());
	ck_assert_int_eq(read_back(&f), 0);
	/* Every kind of chunk: bytegroup (floats), zstd (i32), raw (random). */
	unsigned n[3] = { 0 };
	for (uint32_t k = 0; k < inl.index->nchunks; k++)
		n[inl.index->chunks[k].codec]++;
	ck_assert_msg(n[IO_CODEC_RAW] && n[IO_CODEC_ZSTD] && n[IO_CODEC_BYTEGROUP],
	              "raw %u, zstd %u, bytegroup %u", n[0], n[1], n[2]);
	ck_assert_uint_lt(inl.stored_bytes, inl.logical_bytes);
	/* Version 4 in header, trailer and index. */
	ck_assert_uint_eq(file_u32(f.path, IO_HDR_OFF_VERSION), IO_BYTEGROUP_VERSION);
	ck_assert_uint_eq(file_u32(f.path, inl.file_size - IO_TRAILER_BYTES + IO_TRL_OFF_VERSION),
	                  IO_BYTEGROUP_VERSION);
	ck_assert_uint_eq(ckpt_get_le32((uint8_t *)inl.footer + 8), IO_BYTEGROUP_VERSION);
	/* Workers lay the file out exactly as inline compression does: the same
	 * footer (offsets, lengths, codecs, hashes), whatever their number, also with
	 * a pool too small for all of them to hold a chunk each. */
	for (unsigned threads = 1; threads <= 5; threads += 2) {
		ck_assert_msg(write_shard(&f, threads, 0, &par) == 0, "%s", ckpt_err_msg());
		ck_assert_uint_eq(par.footer_len, inl.footer_len);
		ck_assert_msg(!memcmp(par.footer, inl.footer, inl.footer_len), "%u threads", threads);
		ck_assert_uint_eq(par.file_size, inl.file_size);
		ck_assert_int_eq(read_back(&f), 0);
		io_index_free(par.index);
		free(par.footer);
	}
	io_index_free(inl.index);
	free(inl.footer);
	fx_done(&f, NBUFS);
	/* Four buffers, five workers: the ring waits for the pool, never for ever. */
	fx_init(&f, "bytegroup-small", 4);
	ck_assert_msg(write_shard(&f, 5, 0, &par) == 0, "%s", ckpt_err_msg());
	ck_assert_int_eq(read_back(&f), 0);
	io_index_free(par.index);
	free(par.footer);
	fx_done(&f, 4);
}
END_TEST

START_TEST(flipped_bit_in_plane)
{
	struct fx f;
	fx_init(&f, "bytegroup-flip", NBUFS);
	struct io_shard_result res;
	ck_assert_msg(write_shard(&f, 2, 0, &res) == 0, "%s", ckpt_err_msg());
	/* The first bytegroup chunk of tensor t0 (bf16), and its compressed plane. */
	const struct io_chunk_entry *c = NULL;
	for (uint32_t k = 0; k < res.index->nchunks && !c; k++)
		if (res.index->chunks[k].codec == IO_CODEC_BYTEGROUP)
			c = &res.index->chunks[k];
	ck_assert_ptr_nonnull(c);
	uint64_t at = c->file_offset;
	uint32_t len0 = file_u32(f.path, at + IO_BG_HDR_BYTES + 4);
	uint32_t len1 = file_u32(f.path, at + IO_BG_HDR_BYTES + IO_BG_PLANE_BYTES + 4);
	ck_assert_uint_eq(file_u32(f.path, at + IO_BG_HDR_BYTES + IO_BG_PLANE_BYTES) & 0xff,
	                  IO_BG_ZSTD);
	uint64_t plane1 = at + IO_BG_HDR_BYTES + 2 * IO_BG_PLANE_BYTES + len0;
	/* A bit in the middle of the compressed plane: zstd's frame or, where zstd
	 * decodes it anyway, the chunk's hash finds it. */
	for (int bit = 0; bit < 8; bit += 3) {
		ck_assert_int_eq(tu_flip_bit(f.path, plane1 + len1 / 2, bit), 0);
		int rc = read_back(&f);
		ck_assert_msg(rc == CKPT_ECORRUPT, "bit %d: rc %d (%s)", bit, rc, ckpt_err_msg());
		ck_assert_ptr_nonnull(strstr(ckpt_err_msg(), "tensor 't0' chunk"));
		ck_assert_ptr_nonnull(strstr(ckpt_err_msg(), f.path));
		ck_assert_int_eq(tu_flip_bit(f.path, plane1 + len1 / 2, bit), 0);
		ck_assert_int_eq(read_back(&f), 0);
	}
	/* A plane length in the stored header. */
	ck_assert_int_eq(tu_flip_bit(f.path, at + IO_BG_HDR_BYTES + IO_BG_PLANE_BYTES + 4, 0), 0);
	ck_assert_int_eq(read_back(&f), CKPT_ECORRUPT);
	ck_assert_ptr_nonnull(strstr(ckpt_err_msg(), "bytegroup: planes and header take"));
	ck_assert_ptr_nonnull(strstr(ckpt_err_msg(), "tensor 't0' chunk"));
	io_index_free(res.index);
	free(res.footer);
	fx_done(&f, NBUFS);
}
END_TEST

static void arm_fault(const char *spec)
{
	if (spec)
		setenv("CKPT_FAULT", spec, 1);
	else
		unsetenv("CKPT_FAULT");
	ckpt_fault_reload();
}

START_TEST(failures_return_every_buffer)
{
	struct fx f;
	fx_init(&f, "bytegroup-fail", NBUFS);
	struct io_shard_result res;
	/* A write fails at the nth chunk, while workers hold others. */
	for (unsigned nth = 1; nth <= 16; nth += 3) {
		char spec[64];
		snprintf(spec, sizeof spec, "after_chunk_write:%u:eio", nth);
		arm_fault(spec);
		int rc = write_shard(&f, 3, 0, &res);
		ck_assert_msg(rc == -EIO, "%s: rc %d (%s)", spec, rc, ckpt_err_msg());
		ck_assert_ptr_nonnull(strstr(ckpt_err_msg(), f.path));
		ck_assert_ptr_null(res.index);
		ck_assert_int_ne(access(f.path, F_OK), 0);
		ck_assert_uint_eq(io_pool_nfree(f.pool), NBUFS);
	}
	arm_fault(NULL);
	/* Aborted with chunks in the ring. */
	for (unsigned stop = 1; stop <= 13; stop += 4) {
		ck_assert_int_eq(write_shard(&f, 2, stop, &res), -ECANCELED);
		ck_assert_int_ne(access(f.path, F_OK), 0);
		ck_assert_uint_eq(io_pool_nfree(f.pool), NBUFS);
	}
	/* Bytegroup needs format 4, which has a save id. */
	struct io_shard_writer *w;
	unlink(f.path);
	ck_assert_int_eq(io_shard_writer_open(f.e, f.path, &(struct io_writer_opts){
		.step = 1, .world = 1, .zstd_level = 1, .codec = IO_CODEC_BYTEGROUP,
		.block_bytes = 8192 }, &w), -EINVAL);
	ck_assert_ptr_nonnull(strstr(ckpt_err_msg(), "save id"));
	fx_done(&f, NBUFS);
}
END_TEST

START_TEST(encoded_chunks_from_a_peer)
{
	/* ckptd's writer takes chunks encoded by the rank: bytegroup only for a dtype
	 * with planes and no larger than raw; its header says version 3 (it was opened
	 * without a codec), the trailer and index the 4 that the chunk needs. */
	struct fx f;
	fx_init(&f, "bytegroup-enc", NBUFS);
	size_t n = 60000;
	uint8_t *data = malloc(n);
	fill(data, n, CKPT_BF16, K_TRAINED, f.seed);
	struct io_shard_writer *w;
	ck_assert_int_eq(io_shard_writer_open(f.e, f.path, &(struct io_writer_opts){
		.step = 1, .world = 1, .save_id = 5, .block_bytes = 8192 }, &w), 0);
	uint64_t ext = n / 2, off = 0, ext8 = n;
	struct io_tensor_desc d = { .name = "w", .kind = CKPT_KIND_MODEL, .dtype = CKPT_BF16,
		.policy = CKPT_SHARDED, .ndim = 1, .global_shape = &ext, .offset = &off,
		.extent = &ext, .raw_bytes = n };
	ck_assert_int_eq(io_shard_writer_add_tensor(w, &d), 0);
	d.name = "b";
	d.dtype = CKPT_U8;
	d.global_shape = d.extent = &ext8;
	ck_assert_int_eq(io_shard_writer_add_tensor(w, &d), 1);
	struct io_hashes h = { 0 };
	io_hash128(data, n, h.chunk);
	int b = io_pool_get(f.pool, 0);
	uint8_t used;
	size_t zn = io_chunk_encode(IO_CODEC_BYTEGROUP, 1, CKPT_BF16, io_pool_addr(f.pool, (unsigned)b),
	                            n - 1, data, n, &used);
	ck_assert_uint_gt(zn, 0);
	ck_assert_int_eq(io_shard_writer_append(w, 0, (unsigned)b, n, &(struct io_append){
		.hashes = &h, .codec = IO_CODEC_BYTEGROUP, .stored_len = zn }), 0);
	/* Bytegroup for a u8 tensor, or longer than raw: refused, the buffer back. */
	b = io_pool_get(f.pool, 0);
	ck_assert_int_eq(io_shard_writer_append(w, 1, (unsigned)b, n, &(struct io_append){
		.hashes = &h, .codec = IO_CODEC_BYTEGROUP, .stored_len = 100 }), -EINVAL);
	ck_assert_ptr_nonnull(strstr(ckpt_err_msg(), "dtype u8"));
	b = io_pool_get(f.pool, 0);
	ck_assert_int_eq(io_shard_writer_append(w, 1, (unsigned)b, n, &(struct io_append){
		.hashes = &h, .codec = IO_CODEC_BYTEGROUP, .stored_len = n + 1 }), -EINVAL);
	memset(&h, 0, sizeof h);
	b = io_pool_get(f.pool, 0);
	memcpy(io_pool_addr(f.pool, (unsigned)b), data, n);
	ck_assert_int_eq(io_shard_writer_append(w, 1, (unsigned)b, n, NULL), 0);
	struct io_shard_result res;
	ck_assert_msg(io_shard_writer_finish(w, &res) == 0, "%s", ckpt_err_msg());
	ck_assert_uint_eq(res.index->chunks[0].codec, IO_CODEC_BYTEGROUP);
	ck_assert_uint_eq(file_u32(f.path, IO_HDR_OFF_VERSION), 3);
	ck_assert_uint_eq(file_u32(f.path, res.file_size - IO_TRAILER_BYTES + IO_TRL_OFF_VERSION),
	                  IO_BYTEGROUP_VERSION);
	/* It reads back as written. */
	struct io_shard_reader *r;
	ck_assert_msg(io_shard_reader_open(f.e, f.path, NULL, &r) == 0, "%s", ckpt_err_msg());
	io_shard_reader_close(r);
	io_index_free(res.index);
	free(res.footer);
	free(data);
	fx_done(&f, NBUFS);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("bytegroup");
	TCase *tc = tcase_create("bytegroup");
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, round_trip_every_dtype);
	tcase_add_test(tc, planes_that_pay);
	tcase_add_test(tc, level_one_entropy_codes_unless_planes_repeat);
	tcase_add_test(tc, damaged_stored_bytes);
	tcase_add_test(tc, shard_round_trip_with_workers);
	tcase_add_test(tc, flipped_bit_in_plane);
	tcase_add_test(tc, failures_return_every_buffer);
	tcase_add_test(tc, encoded_chunks_from_a_peer);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(suite());
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
