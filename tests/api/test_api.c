/*
 * test_api.c — the public API end to end on one rank: save and load round trips of
 * every dtype and shape, slices, pool backpressure, compression, the snapshot
 * point, and the bad inputs of CONTRIBUTING.md. After every failure the previous
 * committed step must still load bit-exact.
 */
#include <check.h>
#include <errno.h>
#include <stdbool.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ckpt/catalog.h"
#include "ckpt/ckpt.h"
#include "testutil.h"

/* From the fault table (lib/base/fault.c): re-read CKPT_FAULT after setenv. */
void ckpt_fault_reload(void);

static char *root;

static void setup(void)
{
	root = tu_tmpdir("api");
	unsetenv("CKPT_FAULT");
	unsetenv("CKPT_COMPRESS");
	unsetenv("CKPT_COMPRESS_THREADS");
	unsetenv("CKPT_DEVICE_POOL_BYTES");
	unsetenv("RANK");
	unsetenv("WORLD_SIZE");
}

static void teardown(void)
{
	tu_rmtree(root);
	free(root);
	root = NULL;
}

/* Options of one rank (rank 0 of 1) on root r, the rest the library's defaults. */
static void opts_one(struct ckpt_opts *o, const char *r)
{
	ckpt_opts_init(o, sizeof *o);
	o->root = r;
	o->rank = 0;
	o->world = 1;
}

static ckpt_ctx *open_root(const char *r, unsigned flags, size_t chunk, size_t pool, int zstd)
{
	struct ckpt_opts o;
	opts_one(&o, r);
	o.flags = flags;
	o.chunk_bytes = chunk;
	o.pool_bytes = pool;
	o.zstd_level = zstd;
	ckpt_ctx *c = NULL;
	int rc = ckpt_open(&o, &c);
	ck_assert_msg(rc == 0, "open %s: %s", r, ckpt_last_error());
	return c;
}

/* A saved tensor and its expected bytes. */
struct tt {
	char name[64];
	int dtype;
	unsigned ndim;
	uint64_t shape[4];
	size_t bytes;
	uint8_t *data;
};

static void tt_make(struct tt *t, const char *name, int dtype, unsigned ndim, const uint64_t *shape,
                    uint64_t stream)
{
	memset(t, 0, sizeof *t);
	snprintf(t->name, sizeof t->name, "%s", name);
	t->dtype = dtype;
	t->ndim = ndim;
	t->bytes = ckpt_dtype_size(dtype);
	for (unsigned d = 0; d < ndim; d++) {
		t->shape[d] = shape[d];
		t->bytes *= shape[d];
	}
	t->data = malloc(t->bytes ? t->bytes : 1);
	tu_fill(t->data, t->bytes, tu_seed(), stream);
}

static int save_step(ckpt_ctx *c, uint64_t step, struct tt *ts, size_t n)
{
	ckpt_save *s;
	int rc = ckpt_save_begin(c, step, &s);
	if (rc)
		return rc;
	for (size_t i = 0; i < n && !rc; i++) {
		struct ckpt_tensor t = {
			.name = ts[i].name, .kind = CKPT_KIND_MODEL, .dtype = ts[i].dtype,
			.policy = CKPT_SHARDED, .ndim = ts[i].ndim, .global_shape = ts[i].shape,
			.data = ts[i].data, .mem = CKPT_MEM_HOST,
		};
		rc = ckpt_save_add_tensor(s, &t);
	}
	if (!rc)
		rc = ckpt_save_submit(s);
	if (!rc)
		rc = ckpt_save_wait(s, -1);
	ckpt_save_free(s);
	return rc;
}

static void check_step(ckpt_ctx *c, uint64_t step, struct tt *ts, size_t n)
{
	ckpt_load *l;
	ck_assert_msg(ckpt_load_open(c, step, &l) == 0, "%s", ckpt_last_error());
	ck_assert_int_eq(ckpt_load_count(l), (int)n);
	for (size_t i = 0; i < n; i++) {
		uint8_t *got = malloc(ts[i].bytes + 1);
		memset(got, 0x5A, ts[i].bytes + 1);
		int rc = ckpt_load_tensor(l, ts[i].name, ts[i].dtype, ts[i].ndim, NULL, NULL, got,
		                          CKPT_MEM_HOST);
		ck_assert_msg(rc == 0, "%s: %s", ts[i].name, ckpt_last_error());
		ck_assert_msg(!memcmp(got, ts[i].data, ts[i].bytes), "%s differs", ts[i].name);
		ck_assert_uint_eq(got[ts[i].bytes], 0x5A);   /* nothing written past the box */
		free(got);
	}
	ckpt_load_close(l);
}

static void tt_free(struct tt *ts, size_t n)
{
	for (size_t i = 0; i < n; i++)
		free(ts[i].data);
}

START_TEST(every_dtype)
{
	ckpt_ctx *c = open_root(root, 0, 0, 0, 0);
	struct tt ts[CKPT_DTYPE_MAX_];
	for (int d = 1; d <= CKPT_DTYPE_MAX_; d++) {
		char name[32];
		snprintf(name, sizeof name, "w/%s", ckpt_dtype_name(d));
		uint64_t shape[2] = { 37 + (uint64_t)d, 129 };
		tt_make(&ts[d - 1], name, d, 2, shape, (uint64_t)d);
	}
	ck_assert_int_eq(save_step(c, 1, ts, CKPT_DTYPE_MAX_), 0);
	check_step(c, 1, ts, CKPT_DTYPE_MAX_);
	struct ckpt_step_info steps[4];
	ck_assert_int_eq(ckpt_steps(c, 0, steps, 4, sizeof *steps), 1);
	ck_assert_uint_eq(steps[0].step, 1);
	struct ckpt_step_info info;
	ck_assert_int_eq(ckpt_step_info(c, CKPT_LATEST, &info, sizeof info), 0);
	ck_assert_uint_eq(info.step, 1);
	ck_assert_uint_eq(info.world, 1);
	ck_assert_uint_eq(info.ntensors, CKPT_DTYPE_MAX_);
	ck_assert_int_eq(info.state, CKPT_STATE_COMMITTED);
	ckpt_close(c);
	/* Reopen read-only: the same bytes. */
	c = open_root(root, CKPT_OPEN_READONLY, 0, 0, 0);
	check_step(c, CKPT_LATEST, ts, CKPT_DTYPE_MAX_);
	ckpt_close(c);
	tt_free(ts, CKPT_DTYPE_MAX_);
}
END_TEST

START_TEST(empty_scalar_and_one)
{
	ckpt_ctx *c = open_root(root, 0, 0, 0, 0);
	struct tt ts[4];
	uint64_t s0[2] = { 0, 5 }, s1[1] = { 1 }, s3[3] = { 1, 1, 1 };
	tt_make(&ts[0], "empty", CKPT_F32, 2, s0, 1);
	tt_make(&ts[1], "one", CKPT_BF16, 1, s1, 2);
	tt_make(&ts[2], "scalar", CKPT_I64, 0, NULL, 3);
	tt_make(&ts[3], "cube", CKPT_U8, 3, s3, 4);
	ck_assert_int_eq(save_step(c, 3, ts, 4), 0);
	check_step(c, 3, ts, 4);
	/* A zero-length blob and a regular one. */
	ckpt_save *s;
	ck_assert_int_eq(ckpt_save_begin(c, 4, &s), 0);
	ck_assert_int_eq(ckpt_save_add_blob(s, "nothing", CKPT_KIND_EXTRA, CKPT_REPLICATED, NULL, 0), 0);
	ck_assert_int_eq(ckpt_save_add_blob(s, "rng", CKPT_KIND_RNG, CKPT_RANK_BOUND, "abcdef", 6), 0);
	ck_assert_int_eq(ckpt_save_submit(s), 0);
	ck_assert_int_eq(ckpt_save_wait(s, -1), 0);
	ckpt_save_free(s);
	ckpt_load *l;
	ck_assert_int_eq(ckpt_load_open(c, 4, &l), 0);
	char buf[8];
	size_t len = 99;
	ck_assert_int_eq(ckpt_load_blob(l, "nothing", buf, sizeof buf, &len), 0);
	ck_assert_uint_eq(len, 0);
	ck_assert_int_eq(ckpt_load_blob(l, "rng", buf, sizeof buf, &len), 0);
	ck_assert_uint_eq(len, 6);
	ck_assert(!memcmp(buf, "abcdef", 6));
	ck_assert_int_eq(ckpt_load_blob(l, "rng", buf, 3, &len), -ENOSPC);
	ck_assert_uint_eq(len, 6);
	ck_assert_int_eq(ckpt_load_blob(l, "missing", buf, sizeof buf, &len), CKPT_ENOTFOUND);
	ckpt_load_close(l);
	ckpt_close(c);
	tt_free(ts, 4);
}
END_TEST

START_TEST(larger_than_pool_and_zstd)
{
	/* 64 KiB chunks, a pool of two: a 5 MiB tensor must cycle buffers through writes. */
	ckpt_ctx *c = open_root(root, 0, 64 << 10, 128 << 10, 0);
	struct tt ts[2];
	uint64_t big[2] = { 1311, 1000 }, odd[1] = { 100003 };
	tt_make(&ts[0], "big", CKPT_F32, 2, big, 7);
	tt_make(&ts[1], "odd", CKPT_U8, 1, odd, 8);
	ck_assert_int_eq(save_step(c, 10, ts, 2), 0);
	check_step(c, 10, ts, 2);
	ckpt_close(c);
	/* zstd on compressible data: stored bytes shrink, data round-trips. */
	c = open_root(root, 0, 64 << 10, 256 << 10, 3);
	for (size_t i = 0; i < ts[0].bytes; i += 4)
		ts[0].data[i] = ts[0].data[i + 1] = 0;     /* half the bytes are zero */
	ck_assert_int_eq(save_step(c, 11, ts, 2), 0);
	check_step(c, 11, ts, 2);
	struct ckpt_step_info info;
	ck_assert_int_eq(ckpt_step_info(c, 11, &info, sizeof info), 0);
	ck_assert_uint_lt(info.stored_bytes, info.logical_bytes);
	ck_assert_uint_eq(info.logical_bytes, ts[0].bytes + ts[1].bytes);
	ckpt_close(c);
	tt_free(ts, 2);
}
END_TEST

START_TEST(every_dtype_bytegroup)
{
	/* CKPT_COMPRESS=bytegroup: every dtype round-trips bit-exact through workers and
	 * a pool that cycles; the float tensors' chunks are stored bytegroup, the others
	 * zstd or raw, and the step is smaller than its data. */
	setenv("CKPT_COMPRESS", "bytegroup", 1);
	setenv("CKPT_COMPRESS_THREADS", "3", 1);
	ckpt_ctx *c = open_root(root, 0, 64 << 10, 512 << 10, -1);
	struct tt ts[CKPT_DTYPE_MAX_];
	for (int d = 1; d <= CKPT_DTYPE_MAX_; d++) {
		char name[32];
		snprintf(name, sizeof name, "w/%s", ckpt_dtype_name(d));
		uint64_t shape[2] = { 370 + (uint64_t)d, 129 };
		tt_make(&ts[d - 1], name, d, 2, shape, (uint64_t)d);
		/* Small values of one sign: the top byte of each element takes few values
		 * (NaN, Inf and denormal patterns among them), the rest stays random. */
		size_t es = ckpt_dtype_size(d);
		static const uint8_t top[] = { 0x3c, 0x3d, 0x7f, 0x00, 0xff, 0x80 };
		for (size_t i = 0; es > 1 && i < ts[d - 1].bytes; i += es)
			ts[d - 1].data[i + es - 1] = top[(i / es) % 97 % (sizeof top / sizeof top[0])];
	}
	ck_assert_int_eq(save_step(c, 1, ts, CKPT_DTYPE_MAX_), 0);
	check_step(c, 1, ts, CKPT_DTYPE_MAX_);
	struct ckpt_step_info info;
	ck_assert_int_eq(ckpt_step_info(c, 1, &info, sizeof info), 0);
	ck_assert_uint_lt(info.stored_bytes, info.logical_bytes);
	ckpt_load *l;
	ck_assert_int_eq(ckpt_load_open(c, 1, &l), 0);
	for (int i = 0; i < ckpt_load_count(l); i++) {
		struct ckpt_tensor_info ti;
		ck_assert_int_eq(ckpt_load_info(l, (unsigned)i, &ti, sizeof ti), 0);
		struct ckpt_chunk_info ch[64];
		int n = ckpt_load_chunks(l, (unsigned)i, ch, 64, sizeof *ch);
		ck_assert_int_ge(n, 1);
		bool planes = ti.dtype == CKPT_F64 || ti.dtype == CKPT_F32 || ti.dtype == CKPT_F16 ||
		              ti.dtype == CKPT_BF16;
		ck_assert_msg(ch[0].codec == (planes ? CKPT_CODEC_BYTEGROUP : CKPT_CODEC_ZSTD) ||
		              (!planes && ch[0].codec == CKPT_CODEC_RAW), "%s: codec %s", ti.name,
		              ckpt_codec_name(ch[0].codec));
		if (planes)
			ck_assert_str_eq(ckpt_codec_name(ch[0].codec), "bytegroup");
	}
	ckpt_load_close(l);
	ckpt_close(c);
	/* Read back by a context that does not compress. */
	unsetenv("CKPT_COMPRESS");
	c = open_root(root, CKPT_OPEN_READONLY, 0, 0, 0);
	check_step(c, 1, ts, CKPT_DTYPE_MAX_);
	ckpt_close(c);
	/* The codec in the options; bad choices named. */
	struct ckpt_opts o;
	opts_one(&o, root);
	o.zstd_level = 1;
	o.compress_codec = 7;
	ck_assert_int_eq(ckpt_open(&o, &c), -EINVAL);
	ck_assert_ptr_nonnull(strstr(ckpt_last_error(), "compress codec 7"));
	const char *bad[] = { "bytegroup:0", "bytegroup:23", "bytegroups", "bytegroup:", "zstd:x" };
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		setenv("CKPT_COMPRESS", bad[i], 1);
		opts_one(&o, root);
		o.zstd_level = -1;
		ck_assert_msg(ckpt_open(&o, &c) == -EINVAL, "%s", bad[i]);
		ck_assert_ptr_nonnull(strstr(ckpt_last_error(), bad[i]));
	}
	unsetenv("CKPT_COMPRESS");
	setenv("CKPT_COMPRESS_THREADS", "0", 1);
	opts_one(&o, root);
	ck_assert_int_eq(ckpt_open(&o, &c), -EINVAL);
	ck_assert_ptr_nonnull(strstr(ckpt_last_error(), "CKPT_COMPRESS_THREADS"));
	unsetenv("CKPT_COMPRESS_THREADS");
	/* bytegroup:LEVEL in the options' terms: saved, and read back. */
	opts_one(&o, root);
	o.zstd_level = 3;
	o.compress_codec = CKPT_CODEC_BYTEGROUP;
	o.compress_threads = 1;
	ck_assert_int_eq(ckpt_open(&o, &c), 0);
	ck_assert_int_eq(save_step(c, 2, ts, CKPT_DTYPE_MAX_), 0);
	check_step(c, 2, ts, CKPT_DTYPE_MAX_);
	ckpt_close(c);
	tt_free(ts, CKPT_DTYPE_MAX_);
}
END_TEST

/* The device staging pool asked for where no device is usable: saves take the
 * host path, bit-exact, and say nothing was staged; its option and variable are
 * checked (a pool smaller than a chunk, a size that is not one). */
START_TEST(device_pool_without_device)
{
	ckpt_ctx *c = NULL;
	struct ckpt_opts o;
	opts_one(&o, root);
	o.chunk_bytes = 64 << 10;
	o.device_pool_bytes = 32 << 10;
	ck_assert_int_eq(ckpt_open(&o, &c), -EINVAL);
	ck_assert_ptr_nonnull(strstr(ckpt_last_error(), "device pool of 32768 bytes"));
	setenv("CKPT_DEVICE_POOL_BYTES", "lots", 1);
	opts_one(&o, root);
	ck_assert_int_eq(ckpt_open(&o, &c), -EINVAL);
	ck_assert_ptr_nonnull(strstr(ckpt_last_error(), "CKPT_DEVICE_POOL_BYTES"));
	setenv("CKPT_DEVICE_POOL_BYTES", "64M", 1);
	opts_one(&o, root);
	o.chunk_bytes = 64 << 10;
	o.pool_bytes = 256 << 10;
	o.incremental = 1;
	ck_assert_int_eq(ckpt_open(&o, &c), 0);
	unsetenv("CKPT_DEVICE_POOL_BYTES");
	struct tt ts[2];
	uint64_t big[2] = { 700, 1000 }, odd[1] = { 100003 };
	tt_make(&ts[0], "big", CKPT_F32, 2, big, 17);
	tt_make(&ts[1], "odd", CKPT_U8, 1, odd, 18);
	for (uint64_t step = 1; step <= 2; step++) {
		ckpt_save *s;
		ck_assert_int_eq(ckpt_save_begin(c, step, &s), 0);
		for (size_t i = 0; i < 2; i++) {
			struct ckpt_tensor t = {
				.name = ts[i].name, .kind = CKPT_KIND_MODEL, .dtype = ts[i].dtype,
				.policy = CKPT_SHARDED, .ndim = ts[i].ndim, .global_shape = ts[i].shape,
				.data = ts[i].data, .mem = CKPT_MEM_AUTO,
			};
			ck_assert_int_eq(ckpt_save_add_tensor(s, &t), 0);
		}
		ck_assert_int_eq(ckpt_save_submit(s), 0);
		ck_assert_msg(ckpt_save_wait(s, -1) == 0, "%s", ckpt_last_error());
		struct ckpt_save_stats st = { .size = sizeof st };
		ck_assert_int_eq(ckpt_save_stats(s, &st), 0);
		ckpt_save_free(s);
		ck_assert_uint_eq(st.device_staged_bytes, 0);
		ck_assert_uint_eq(st.device_unchanged_bytes, 0);
		/* The second step changed nothing: every byte referenced, none written. */
		ck_assert_uint_eq(st.referenced_bytes, step == 2 ? ts[0].bytes + ts[1].bytes : 0);
		ck_assert_uint_eq(st.stored_bytes, step == 2 ? 0 : ts[0].bytes + ts[1].bytes);
		check_step(c, step, ts, 2);
	}
	/* A caller built against the options before the field: the field is not read. */
	ckpt_close(c);
	opts_one(&o, root);
	o.size = offsetof(struct ckpt_opts, device_pool_bytes);
	o.chunk_bytes = 64 << 10;
	o.pool_bytes = 256 << 10;
	ck_assert_int_eq(ckpt_open(&o, &c), 0);
	ckpt_close(c);
	tt_free(ts, 2);
}
END_TEST

/* Expected bytes of the box (o, e) of a row-major tensor t. */
static void box_expect(const struct tt *t, const uint64_t *o, const uint64_t *e, uint8_t *out)
{
	size_t es = ckpt_dtype_size(t->dtype);
	uint64_t idx[4] = { 0 }, n = 1;
	for (unsigned d = 0; d < t->ndim; d++)
		n *= e[d];
	for (uint64_t k = 0; k < n; k++) {
		uint64_t rem = k, src = 0;
		for (unsigned d = t->ndim; d-- > 0;) {
			idx[d] = rem % e[d];
			rem /= e[d];
		}
		for (unsigned d = 0; d < t->ndim; d++)
			src = src * t->shape[d] + o[d] + idx[d];
		memcpy(out + k * es, t->data + src * es, es);
	}
}

START_TEST(slices_of_every_shape)
{
	/* Small chunks so that slices cross chunk boundaries everywhere. */
	ckpt_ctx *c = open_root(root, 0, 8 << 10, 64 << 10, 0);
	struct tt ts[4];
	uint64_t s1[1] = { 10007 }, s2[2] = { 91, 77 }, s3[3] = { 13, 17, 19 }, s4[4] = { 5, 7, 3, 11 };
	tt_make(&ts[0], "d1", CKPT_F16, 1, s1, 11);
	tt_make(&ts[1], "d2", CKPT_F32, 2, s2, 12);
	tt_make(&ts[2], "d3", CKPT_I8, 3, s3, 13);
	tt_make(&ts[3], "d4", CKPT_F64, 4, s4, 14);
	ck_assert_int_eq(save_step(c, 5, ts, 4), 0);
	ckpt_load *l;
	ck_assert_int_eq(ckpt_load_open(c, 5, &l), 0);
	uint64_t rs = tu_seed() ^ 0x51ce;
	for (int iter = 0; iter < 400; iter++) {
		struct tt *t = &ts[iter % 4];
		uint64_t o[4], e[4], n = ckpt_dtype_size(t->dtype);
		for (unsigned d = 0; d < t->ndim; d++) {
			o[d] = tu_rand(&rs) % t->shape[d];
			e[d] = 1 + tu_rand(&rs) % (t->shape[d] - o[d]);
			n *= e[d];
		}
		uint8_t *got = malloc(n), *want = malloc(n);
		box_expect(t, o, e, want);
		int rc = ckpt_load_tensor(l, t->name, t->dtype, t->ndim, o, e, got, CKPT_MEM_HOST);
		ck_assert_msg(rc == 0, "%s: %s", t->name, ckpt_last_error());
		ck_assert_msg(!memcmp(got, want, n), "slice %d of %s differs", iter, t->name);
		free(got);
		free(want);
	}
	ckpt_load_close(l);
	ckpt_close(c);
	tt_free(ts, 4);
}
END_TEST

START_TEST(snapshot_point)
{
	ckpt_ctx *c = open_root(root, 0, 64 << 10, 1 << 20, 0);
	struct tt t;
	uint64_t shape[1] = { 3u << 20 };
	tt_make(&t, "w", CKPT_U8, 1, shape, 21);
	uint8_t *copy = malloc(t.bytes);
	memcpy(copy, t.data, t.bytes);
	ckpt_save *s;
	ck_assert_int_eq(ckpt_save_begin(c, 1, &s), 0);
	struct ckpt_tensor ct = { .name = "w", .kind = CKPT_KIND_MODEL, .dtype = CKPT_U8,
	                          .policy = CKPT_SHARDED, .ndim = 1, .global_shape = shape,
	                          .data = t.data };
	ck_assert_int_eq(ckpt_save_add_tensor(s, &ct), 0);
	ck_assert_int_eq(ckpt_save_submit(s), 0);
	ck_assert_int_eq(ckpt_save_add_tensor(s, &ct), CKPT_ESTATE);
	ck_assert_int_eq(ckpt_save_wait_snapshot(s, -1), 0);
	memset(t.data, 0xEE, t.bytes);           /* training goes on */
	ck_assert_int_eq(ckpt_save_wait(s, -1), 0);
	struct ckpt_save_stats st = { .size = sizeof st };
	ck_assert_int_eq(ckpt_save_stats(s, &st), 0);
	ck_assert_uint_eq(st.logical_bytes, t.bytes);
	ck_assert(st.snapshot_seconds <= st.durable_seconds);
	ck_assert(st.durable_seconds <= st.commit_seconds);
	ckpt_save_free(s);
	memcpy(t.data, copy, t.bytes);
	check_step(c, 1, &t, 1);
	ckpt_close(c);
	free(copy);
	tt_free(&t, 1);
}
END_TEST

START_TEST(bad_inputs)
{
	ckpt_ctx *c = open_root(root, 0, 0, 0, 0);
	struct tt t;
	uint64_t shape[2] = { 33, 65 };
	tt_make(&t, "good", CKPT_F32, 2, shape, 31);
	ck_assert_int_eq(save_step(c, 7, &t, 1), 0);
	ckpt_save *s;
	ck_assert_int_eq(ckpt_save_begin(c, 7, &s), -EEXIST);
	ck_assert_ptr_null(s);
	ck_assert_ptr_nonnull(strstr(ckpt_last_error(), "step 7"));
	ck_assert_int_eq(ckpt_save_begin(c, 8, &s), 0);
	struct ckpt_tensor ct = { .name = "a/../b", .kind = CKPT_KIND_MODEL, .dtype = CKPT_F32,
	                          .policy = CKPT_SHARDED, .ndim = 2, .global_shape = shape,
	                          .data = t.data };
	ck_assert_int_eq(ckpt_save_add_tensor(s, &ct), CKPT_ENAME);
	char *big = malloc(65537);
	memset(big, 'n', 65536);
	big[65536] = 0;
	ct.name = big;
	ck_assert_int_eq(ckpt_save_add_tensor(s, &ct), CKPT_ENAME);
	ck_assert_int_eq(ckpt_save_add_blob(s, "", CKPT_KIND_EXTRA, CKPT_REPLICATED, "x", 1), CKPT_ENAME);
	ck_assert_int_eq(ckpt_name_check("a\0b", 3), CKPT_ENAME);
	ct.name = "huge";
	uint64_t huge[2] = { 1ull << 40, 1ull << 40 };
	ct.global_shape = huge;
	ck_assert_int_eq(ckpt_save_add_tensor(s, &ct), CKPT_ESHAPE);
	uint64_t off[2] = { 30, 0 }, ext[2] = { 4, 65 };
	ct.global_shape = shape;
	ct.offset = off;
	ct.extent = ext;
	ck_assert_int_eq(ckpt_save_add_tensor(s, &ct), CKPT_ESHAPE);
	ct.offset = ct.extent = NULL;
	ct.dtype = 99;
	ck_assert_int_eq(ckpt_save_add_tensor(s, &ct), -EINVAL);
	ct.dtype = CKPT_F32;
	ct.ndim = CKPT_MAX_NDIM + 1;
	ck_assert_int_eq(ckpt_save_add_tensor(s, &ct), CKPT_ESHAPE);
	ct.ndim = 2;
	ck_assert_int_eq(ckpt_save_add_tensor(s, &ct), 0);
	ck_assert_int_eq(ckpt_save_add_tensor(s, &ct), -EEXIST);
	ck_assert_int_eq(ckpt_save_add_blob(s, "b", CKPT_KIND_EXTRA, CKPT_SHARDED, "x", 1), -EINVAL);
	ckpt_save_free(s);             /* never submitted: nothing written */
	free(big);

	ckpt_load *l;
	ck_assert_int_eq(ckpt_load_open(c, 999, &l), CKPT_ENOTFOUND);
	ck_assert_ptr_null(l);
	ck_assert_ptr_nonnull(strstr(ckpt_last_error(), "999"));
	ck_assert_int_eq(ckpt_load_open(c, 7, &l), 0);
	float buf[33 * 65];
	ck_assert_int_eq(ckpt_load_tensor(l, "nope", CKPT_F32, 2, NULL, NULL, buf, 0), CKPT_ENOTFOUND);
	ck_assert_int_eq(ckpt_load_tensor(l, "good", CKPT_BF16, 2, NULL, NULL, buf, 0), CKPT_EDTYPE);
	ck_assert_ptr_nonnull(strstr(ckpt_last_error(), "good"));
	ck_assert_int_eq(ckpt_load_tensor(l, "good", CKPT_F32, 1, NULL, NULL, buf, 0), CKPT_ESHAPE);
	uint64_t o2[2] = { 0, 60 }, e2[2] = { 1, 6 };
	ck_assert_int_eq(ckpt_load_tensor(l, "good", CKPT_F32, 2, o2, e2, buf, 0), CKPT_ESHAPE);
	uint64_t o3[2] = { UINT64_MAX, 0 }, e3[2] = { 2, 1 };
	ck_assert_int_eq(ckpt_load_tensor(l, "good", CKPT_F32, 2, o3, e3, buf, 0), CKPT_ESHAPE);
	ckpt_load_close(l);
	check_step(c, 7, &t, 1);
	ckpt_close(c);
	tt_free(&t, 1);
}
END_TEST

START_TEST(bad_roots)
{
	ckpt_ctx *c = NULL;
	struct ckpt_opts o;
	ckpt_opts_init(&o, sizeof o);
	o.rank = 0;
	o.world = 1;
	char path[4096];
	/* Missing root, read-only open. */
	snprintf(path, sizeof path, "%s/missing", root);
	o.root = path;
	o.flags = CKPT_OPEN_READONLY;
	ck_assert_int_eq(ckpt_open(&o, &c), -ENOENT);
	ck_assert_ptr_null(c);
	ck_assert_ptr_nonnull(strstr(ckpt_last_error(), "missing"));
	/* A directory with someone else's files. */
	snprintf(path, sizeof path, "%s/other", root);
	mkdir(path, 0755);
	char f[4200];
	snprintf(f, sizeof f, "%s/notes.txt", path);
	tu_write_file(f, "hello", 5);
	o.flags = 0;
	ck_assert_int_eq(ckpt_open(&o, &c), CKPT_ENOTROOT);
	/* ... and nothing was created in it: not even the coordinator's lock file. */
	char lockp[4300];
	snprintf(lockp, sizeof lockp, "%s/coordinator.lock", path);
	ck_assert_msg(access(lockp, F_OK) < 0, "%s left behind in a directory refused", lockp);
	o.flags = CKPT_OPEN_READONLY;
	ck_assert_int_eq(ckpt_open(&o, &c), CKPT_ENOTROOT);
	/* A regular file as root. */
	o.root = f;
	o.flags = 0;
	ck_assert_int_eq(ckpt_open(&o, &c), CKPT_ENOTROOT);
	/* An unwritable place: under a regular file (ENOTDIR), and a read-only fs (/proc). */
	snprintf(path, sizeof path, "%s/notes.txt/sub", root);
	snprintf(path, sizeof path, "%s/sub", f);
	o.root = path;
	int rc = ckpt_open(&o, &c);
	ck_assert_msg(rc == -ENOTDIR, "rc %d: %s", rc, ckpt_last_error());
	o.root = "/proc/ckpt-root";
	rc = ckpt_open(&o, &c);
	ck_assert_msg(rc < 0 && c == NULL, "rc %d", rc);
	ck_assert_ptr_nonnull(strstr(ckpt_last_error(), "/proc/ckpt-root"));
	/* Bad options. */
	o.root = root;
	o.chunk_bytes = 1000;
	ck_assert_int_eq(ckpt_open(&o, &c), -EINVAL);
	o.chunk_bytes = 0;
	o.rank = 3;
	ck_assert_int_eq(ckpt_open(&o, &c), -EINVAL);
	o.size = 0;
	ck_assert_int_eq(ckpt_open(&o, &c), -EINVAL);
}
END_TEST

/* GPUDirect Storage asked for where it cannot be used (no device, or no CUDA in this
 * build): the context opens, says so, and saves and loads through the pinned path;
 * a CKPT_GDS it cannot parse, or unknown bits, are refused. */
START_TEST(gds_fallback)
{
	setenv("CKPT_GDS", "load,save", 1);
	ckpt_ctx *c = open_root(root, 0, 64 << 10, 256 << 10, 0);
	struct ckpt_gds_stats gs = { .size = sizeof gs };
	ck_assert_int_eq(ckpt_gds_stats(c, &gs), 0);
	/* On a machine with a GPU and cuFile, GDS is rightly on: the fallback there is
	 * tests/gpu's (test_gpu_gds_refused); the host tensors below take the pinned
	 * path either way. */
	if (gs.active)
		fprintf(stderr, "note: GPUDirect Storage is usable here: its fallback is not "
		        "what this run checks\n");
	struct tt t;
	uint64_t shape[1] = { 300000 };
	tt_make(&t, "w", CKPT_U8, 1, shape, 17);
	ck_assert_int_eq(save_step(c, 1, &t, 1), 0);
	check_step(c, 1, &t, 1);
	ck_assert_int_eq(ckpt_gds_stats(c, &gs), 0);
	ck_assert(gs.chunks_read == 0 && gs.chunks_written == 0);
	gs.size = 1;
	ck_assert_int_eq(ckpt_gds_stats(c, &gs), -EINVAL);
	ckpt_close(c);
	tt_free(&t, 1);

	struct ckpt_opts o;
	opts_one(&o, root);
	c = NULL;
	setenv("CKPT_GDS", "load,sav", 1);
	ck_assert_int_eq(ckpt_open(&o, &c), -EINVAL);
	ck_assert_ptr_nonnull(strstr(ckpt_last_error(), "CKPT_GDS=load,sav"));
	unsetenv("CKPT_GDS");
	o.gds = 1u << 5;
	ck_assert_int_eq(ckpt_open(&o, &c), -EINVAL);
	ck_assert_ptr_null(c);
}
END_TEST

/* CKPT_QUEUE_DEPTH sets the depth when the options leave it 0; a value out of range
 * or not a number is refused, naming the variable. The depth does not change what
 * is saved or loaded. */
START_TEST(queue_depth_env)
{
	setenv("CKPT_QUEUE_DEPTH", "2", 1);
	ckpt_ctx *c = open_root(root, 0, 64 << 10, 512 << 10, 0);
	struct tt t;
	uint64_t shape[1] = { 300000 };
	tt_make(&t, "w", CKPT_U8, 1, shape, 23);
	ck_assert_int_eq(save_step(c, 1, &t, 1), 0);
	check_step(c, 1, &t, 1);
	ckpt_close(c);
	tt_free(&t, 1);

	struct ckpt_opts o;
	opts_one(&o, root);
	const char *bad[] = { "0", "4097", "deep", "-3" };
	for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
		c = NULL;
		setenv("CKPT_QUEUE_DEPTH", bad[i], 1);
		ck_assert_int_eq(ckpt_open(&o, &c), -EINVAL);
		ck_assert_ptr_null(c);
		ck_assert_msg(strstr(ckpt_last_error(), "CKPT_QUEUE_DEPTH"), "%s: %s", bad[i],
		              ckpt_last_error());
	}
	/* The option wins over the environment. */
	o.queue_depth = 4;
	ck_assert_int_eq(ckpt_open(&o, &c), 0);
	ckpt_close(c);
	unsetenv("CKPT_QUEUE_DEPTH");
}
END_TEST

/* A failure half-way (injected ENOSPC / EIO, or a crash) leaves the previous step
 * intact and the broken one invisible, with no file left behind after GC. */
static void fail_midway(const char *fault, bool crash)
{
	ckpt_ctx *c = open_root(root, 0, 64 << 10, 256 << 10, 0);
	struct tt t;
	uint64_t shape[1] = { 1u << 20 };
	tt_make(&t, "w", CKPT_U8, 1, shape, 41);
	ck_assert_int_eq(save_step(c, 1, &t, 1), 0);
	setenv("CKPT_FAULT", fault, 1);
	/* LMDB and io_uring do not survive fork: close first, work in a child. */
	ckpt_close(c);
	pid_t pid = fork();
	if (pid == 0) {
		ckpt_fault_reload();
		ckpt_ctx *cc = open_root(root, 0, 64 << 10, 256 << 10, 0);
		int rc = save_step(cc, 2, &t, 1);
		int ok = (rc == -ENOSPC || rc == -EIO) && strstr(ckpt_last_error(), "step 2");
		if (!ok)
			fprintf(stderr, "rc %d: %s\n", rc, ckpt_last_error());
		ckpt_close(cc);
		_exit(ok ? 0 : 1);
	}
	int st;
	waitpid(pid, &st, 0);
	if (crash)
		ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 86, "child did not crash at %s", fault);
	else
		ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "fault %s not reported", fault);
	unsetenv("CKPT_FAULT");
	c = open_root(root, 0, 64 << 10, 256 << 10, 0);   /* GC at open */
	ckpt_load *l;
	ck_assert_int_eq(ckpt_load_open(c, 2, &l), CKPT_ENOTFOUND);
	check_step(c, CKPT_LATEST, &t, 1);
	char dir[4200];
	snprintf(dir, sizeof dir, "%s/step-%020d", root, 2);
	ck_assert_msg(access(dir, F_OK) != 0, "%s left behind after %s", dir, fault);
	/* The step can be saved again afterwards. */
	ck_assert_int_eq(save_step(c, 2, &t, 1), 0);
	check_step(c, 2, &t, 1);
	ckpt_close(c);
	tt_free(&t, 1);
}

START_TEST(enospc_midway) { fail_midway("after_chunk_write:3:enospc", false); }
END_TEST
START_TEST(eio_before_fdatasync) { fail_midway("before_fdatasync:1:eio", false); }
END_TEST
START_TEST(crash_after_chunk) { fail_midway("after_chunk_write:5:crash", true); }
END_TEST
START_TEST(crash_before_commit_txn) { fail_midway("coord_before_commit_txn:1:crash", true); }
END_TEST

START_TEST(crash_after_commit_txn)
{
	/* Dying right after the commit txn: the step is committed and complete. */
	ckpt_ctx *c = open_root(root, 0, 64 << 10, 256 << 10, 0);
	struct tt t;
	uint64_t shape[1] = { 300000 };
	tt_make(&t, "w", CKPT_U8, 1, shape, 51);
	ckpt_close(c);
	setenv("CKPT_FAULT", "coord_after_commit_txn", 1);
	pid_t pid = fork();
	if (pid == 0) {
		ckpt_fault_reload();
		ckpt_ctx *cc = open_root(root, 0, 64 << 10, 256 << 10, 0);
		save_step(cc, 1, &t, 1);
		_exit(0);
	}
	int st;
	waitpid(pid, &st, 0);
	ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 86);
	unsetenv("CKPT_FAULT");
	c = open_root(root, 0, 64 << 10, 256 << 10, 0);
	check_step(c, 1, &t, 1);
	ckpt_close(c);
	tt_free(&t, 1);
}
END_TEST

START_TEST(corruption_found)
{
	ckpt_ctx *c = open_root(root, 0, 64 << 10, 256 << 10, 0);
	struct tt ts[2];
	uint64_t shape[1] = { 300000 };
	tt_make(&ts[0], "a", CKPT_U8, 1, shape, 61);
	tt_make(&ts[1], "b", CKPT_U8, 1, shape, 62);
	ck_assert_int_eq(save_step(c, 1, ts, 2), 0);
	ck_assert_int_eq(save_step(c, 2, ts, 2), 0);
	ckpt_close(c);
	char path[4200];
	/* Flip a bit inside the second chunk of 'b' in step 2 (chunks of 64 KiB from 4 KiB on;
	 * 'a' holds 5 chunks). */
	ck_assert_int_eq(tu_shard_path(root, 2, 0, path, sizeof path), 0);
	ck_assert_int_eq(tu_flip_bit(path, 4096 + 6 * 65536 + 100, 3), 0);
	c = open_root(root, CKPT_OPEN_READONLY, 64 << 10, 256 << 10, 0);
	ckpt_load *l;
	ck_assert_int_eq(ckpt_load_open(c, 2, &l), 0);
	uint8_t *buf = malloc(ts[0].bytes);
	ck_assert_int_eq(ckpt_load_tensor(l, "a", CKPT_U8, 1, NULL, NULL, buf, 0), 0);
	int rc = ckpt_load_tensor(l, "b", CKPT_U8, 1, NULL, NULL, buf, 0);
	ck_assert_int_eq(rc, CKPT_ECORRUPT);
	const char *msg = ckpt_last_error();
	ck_assert_msg(strstr(msg, "'b'") && strstr(msg, "chunk") && strstr(msg, "rank-000000-"),
	              "message does not name tensor, chunk and file: %s", msg);
	ckpt_load_close(l);
	check_step(c, 1, ts, 2);         /* the other step is untouched */
	/* Truncate step 2's shard: a specific error naming the file, not a crash. Its
	 * footer (the committed index) is gone, so the step no longer opens. */
	ck_assert_int_eq(truncate(path, 8192), 0);
	rc = ckpt_load_open(c, 2, &l);
	if (rc == 0) {
		rc = ckpt_load_tensor(l, "b", CKPT_U8, 1, NULL, NULL, buf, 0);
		ckpt_load_close(l);
	}
	ck_assert_msg(rc == CKPT_ECORRUPT || rc == CKPT_EFORMAT, "rc %d", rc);
	ck_assert_ptr_nonnull(strstr(ckpt_last_error(), "rank-000000-"));
	/* A shard file replaced by another step's file: caught by the committed hash. */
	char other[4200];
	ck_assert_int_eq(tu_shard_path(root, 1, 0, other, sizeof other), 0);
	void *bytes;
	size_t blen;
	ck_assert_int_eq(tu_read_file(other, &bytes, &blen), 0);
	ck_assert_int_eq(tu_write_file(path, bytes, blen), 0);
	free(bytes);
	ck_assert_int_eq(ckpt_load_open(c, 2, &l), CKPT_ECORRUPT);
	ck_assert_ptr_nonnull(strstr(ckpt_last_error(), "not the index committed"));
	free(buf);
	ckpt_close(c);
	tt_free(ts, 2);
}
END_TEST

START_TEST(many_steps_in_flight)
{
	struct ckpt_opts o;
	ckpt_opts_init(&o, sizeof o);
	o.root = root;
	o.rank = 0;
	o.world = 1;
	o.chunk_bytes = 64 << 10;
	o.pool_bytes = 512 << 10;
	o.max_inflight = 2;
	ckpt_ctx *c;
	ck_assert_int_eq(ckpt_open(&o, &c), 0);
	struct tt ts[10];
	ckpt_save *s[10];
	for (int i = 0; i < 10; i++) {
		uint64_t shape[1] = { 200000 + (uint64_t)i * 999 };
		char name[8];
		snprintf(name, sizeof name, "w");
		tt_make(&ts[i], name, CKPT_U8, 1, shape, 70 + (uint64_t)i);
	}
	/* Two in flight at a time: begin blocks until an older save is freed. */
	for (int i = 0; i < 10; i++) {
		if (i >= 2) {
			ck_assert_int_eq(ckpt_save_wait(s[i - 2], -1), 0);
			ckpt_save_free(s[i - 2]);
		}
		ck_assert_int_eq(ckpt_save_begin(c, 100 + (uint64_t)i, &s[i]), 0);
		struct ckpt_tensor ct = { .name = "w", .kind = CKPT_KIND_MODEL, .dtype = CKPT_U8,
		                          .policy = CKPT_SHARDED, .ndim = 1, .global_shape = ts[i].shape,
		                          .data = ts[i].data };
		ck_assert_int_eq(ckpt_save_add_tensor(s[i], &ct), 0);
		ck_assert_int_eq(ckpt_save_submit(s[i]), 0);
	}
	for (int i = 8; i < 10; i++) {
		ck_assert_int_eq(ckpt_save_wait(s[i], -1), 0);
		ckpt_save_free(s[i]);
	}
	for (int i = 0; i < 10; i++)
		check_step(c, 100 + (uint64_t)i, &ts[i], 1);
	struct ckpt_step_info steps[16];
	ck_assert_int_eq(ckpt_steps(c, 0, steps, 16, sizeof *steps), 10);
	ckpt_close(c);
	tt_free(ts, 10);
}
END_TEST

/* Rows [*o, *o + *e) of rank r of world w: the even split with the remainder spread
 * over the first ranks (ckpt-synth's). */
static void row_split(uint64_t rows, unsigned r, unsigned w, uint64_t *o, uint64_t *e)
{
	uint64_t q = rows / w, rem = rows % w;
	*o = r * q + (r < rem ? r : rem);
	*e = q + (r < rem ? 1 : 0);
}

/*
 * A checkpoint saved by one rank, loaded as 3 and as 7 ranks would load it: each
 * "rank" reads its rows of every tensor, which lie inside 4 MiB chunks of 256 KiB
 * blocks, so the loads read and verify blocks, not chunks. Bit-exact every time.
 * Then one flipped bit: the ranks whose rows need that block get CKPT_ECORRUPT
 * naming tensor, chunk, block and file; the others load as before; and verify,
 * which reads everything, reports it.
 */
START_TEST(resharded_rows_read_blocks)
{
	ckpt_ctx *c = open_root(root, 0, 4 << 20, 16 << 20, 0);
	struct tt ts[2];
	uint64_t s0[2] = { 1000, 2100 }, s1[2] = { 333, 1111 };
	tt_make(&ts[0], "w", CKPT_BF16, 2, s0, 81);      /* 4.2 MB: chunks of 4 MiB + rest */
	tt_make(&ts[1], "m", CKPT_F32, 2, s1, 82);       /* 1.5 MB: one chunk of 6 blocks */
	ck_assert_int_eq(save_step(c, 1, ts, 2), 0);
	ckpt_load *l;
	ck_assert_int_eq(ckpt_load_open(c, 1, &l), 0);
	const unsigned worlds[] = { 3, 7 };
	for (unsigned wi = 0; wi < 2; wi++)
		for (unsigned r = 0; r < worlds[wi]; r++)
			for (unsigned i = 0; i < 2; i++) {
				uint64_t o[2] = { 0, 0 }, e[2] = { 0, ts[i].shape[1] };
				row_split(ts[i].shape[0], r, worlds[wi], &o[0], &e[0]);
				size_t n = (size_t)(e[0] * e[1] * ckpt_dtype_size(ts[i].dtype));
				uint8_t *got = malloc(n + 1), *want = malloc(n);
				got[n] = 0x5A;
				box_expect(&ts[i], o, e, want);
				int rc = ckpt_load_tensor(l, ts[i].name, ts[i].dtype, 2, o, e, got,
				                          CKPT_MEM_HOST);
				ck_assert_msg(rc == 0, "%s as rank %u of %u: %s", ts[i].name, r, worlds[wi],
				              ckpt_last_error());
				ck_assert_msg(!memcmp(got, want, n), "%s as rank %u of %u differs",
				              ts[i].name, r, worlds[wi]);
				ck_assert_uint_eq(got[n], 0x5A);
				free(got);
				free(want);
			}
	ckpt_load_close(l);
	ckpt_close(c);
	/* Block 10 of chunk 0 of 'w' (the first chunk starts at 4096). */
	char path[4200];
	ck_assert_int_eq(tu_shard_path(root, 1, 0, path, sizeof path), 0);
	const uint64_t block = 256 << 10, row = 2100 * 2;
	ck_assert_int_eq(tu_flip_bit(path, 4096 + 10 * block + 1234, 6), 0);
	c = open_root(root, CKPT_OPEN_READONLY, 4 << 20, 16 << 20, 0);
	ck_assert_int_eq(ckpt_load_open(c, 1, &l), 0);
	unsigned bad = 0, good = 0;
	for (unsigned r = 0; r < 7; r++) {
		uint64_t o[2] = { 0, 0 }, e[2] = { 0, 2100 };
		row_split(1000, r, 7, &o[0], &e[0]);
		size_t n = (size_t)(e[0] * row);
		uint8_t *got = malloc(n), *want = malloc(n);
		box_expect(&ts[0], o, e, want);
		int rc = ckpt_load_tensor(l, "w", CKPT_BF16, 2, o, e, got, CKPT_MEM_HOST);
		/* Do its bytes [o*row, (o+e)*row) meet block 10's [10, 11) * block? */
		bool needs = o[0] * row < 11 * block && (o[0] + e[0]) * row > 10 * block;
		if (needs) {
			ck_assert_int_eq(rc, CKPT_ECORRUPT);
			const char *msg = ckpt_last_error();
			ck_assert_msg(strstr(msg, "tensor 'w' chunk 0 block 10") &&
			              strstr(msg, "rank-000000-") && strstr(msg, "step 1"),
			              "message does not name step, tensor, chunk, block and file: %s", msg);
			bad++;
		} else {
			ck_assert_msg(rc == 0, "rank %u of 7: %s", r, ckpt_last_error());
			ck_assert(!memcmp(got, want, n));
			good++;
		}
		free(got);
		free(want);
	}
	ck_assert_uint_ge(bad, 1);
	ck_assert_uint_ge(good, 5);
	ckpt_load_close(l);
	struct ckpt_verify_opts vo;
	ckpt_verify_opts_init(&vo, sizeof vo);
	vo.flags = CKPT_VERIFY_NO_MARK;
	struct ckpt_verify_result vr = { .size = sizeof vr };
	ck_assert_int_eq(ckpt_catalog_verify(c, 1, &vo, &vr), CKPT_ECORRUPT);
	ck_assert_int_eq(vr.bad, 1);
	ck_assert_uint_eq(vr.bad_chunk, 0);
	ck_assert_uint_eq(vr.bad_offset, 4096);
	ck_assert_str_eq(vr.bad_tensor, "w");
	ckpt_close(c);
	tt_free(ts, 2);
}
END_TEST

struct src_state {
	const uint8_t *bytes;
	uint64_t next;          /* the offset the next call must ask for */
	int calls, fail_at;     /* fail_at > 0: that call fails with -EIO */
	bool out_of_order;
};

static int src_fill(void *arg, uint64_t off, void *dst, size_t len)
{
	struct src_state *st = arg;
	st->calls++;
	if (off != st->next)
		st->out_of_order = true;
	st->next = off + len;
	if (st->fail_at && st->calls == st->fail_at)
		return -EIO;
	memcpy(dst, st->bytes + off, len);
	return 0;
}

START_TEST(source_tensors)
{
	/* A 3 MiB tensor pulled in 64 KiB chunks through a pool of four: memory stays
	 * bounded by the pool whatever the tensor's size. */
	ckpt_ctx *c = open_root(root, 0, 64 << 10, 256 << 10, 0);
	struct tt t;
	uint64_t shape[2] = { 3001, 1047 };
	tt_make(&t, "pulled", CKPT_U8, 2, shape, 91);
	struct src_state st = { .bytes = t.data };
	ckpt_save *s;
	ck_assert_int_eq(ckpt_save_begin(c, 1, &s), 0);
	struct ckpt_tensor ct = { .name = "pulled", .kind = CKPT_KIND_MODEL, .dtype = CKPT_U8,
	                          .policy = CKPT_SHARDED, .ndim = 2, .global_shape = shape };
	ck_assert_int_eq(ckpt_save_add_tensor_source(s, &ct, NULL, &st), -EINVAL);
	ct.mem = CKPT_MEM_DEVICE;
	ck_assert_int_eq(ckpt_save_add_tensor_source(s, &ct, src_fill, &st), -EINVAL);
	ct.mem = CKPT_MEM_AUTO;
	ck_assert_int_eq(ckpt_save_add_tensor_source(s, &ct, src_fill, &st), 0);
	ck_assert_int_eq(ckpt_save_submit(s), 0);
	ck_assert_int_eq(ckpt_save_wait(s, -1), 0);
	ckpt_save_free(s);
	ck_assert(!st.out_of_order);
	ck_assert_uint_eq(st.next, t.bytes);
	ck_assert_int_eq(st.calls, (int)((t.bytes + (64 << 10) - 1) / (64 << 10)));
	check_step(c, 1, &t, 1);
	/* A source that fails half-way fails the save with its error; nothing visible. */
	struct src_state bad = { .bytes = t.data, .fail_at = 20 };
	ck_assert_int_eq(ckpt_save_begin(c, 2, &s), 0);
	ck_assert_int_eq(ckpt_save_add_tensor_source(s, &ct, src_fill, &bad), 0);
	ck_assert_int_eq(ckpt_save_submit(s), 0);
	ck_assert_int_eq(ckpt_save_wait(s, -1), -EIO);
	ck_assert_ptr_nonnull(strstr(ckpt_last_error(), "pulled"));
	ckpt_save_free(s);
	ckpt_load *l;
	ck_assert_int_eq(ckpt_load_open(c, 2, &l), CKPT_ENOTFOUND);
	check_step(c, 1, &t, 1);
	ckpt_close(c);
	tt_free(&t, 1);
}
END_TEST

/* CKPT_RDMA_DEVICE and CKPT_RDMA_GID are resolved with the rest of the configuration:
 * with transport rdma, a malformed one is refused by ckpt_open, naming the variable;
 * well-formed ones open (one rank: no connection is made); tcp ignores them. */
START_TEST(rdma_env)
{
	struct ckpt_opts o;
	opts_one(&o, root);
	o.transport = CKPT_TRANSPORT_RDMA;
	ckpt_ctx *c = NULL;
	char longname[80];
	memset(longname, 'd', sizeof longname - 1);
	longname[sizeof longname - 1] = '\0';
	const struct { const char *var, *val; } bad[] = {
		{ "CKPT_RDMA_GID", "x" }, { "CKPT_RDMA_GID", "-1" }, { "CKPT_RDMA_GID", "65536" },
		{ "CKPT_RDMA_GID", "3 " }, { "CKPT_RDMA_DEVICE", longname },
	};
	for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
		setenv(bad[i].var, bad[i].val, 1);
		c = NULL;
		ck_assert_int_eq(ckpt_open(&o, &c), -EINVAL);
		ck_assert_ptr_null(c);
		ck_assert_msg(strstr(ckpt_last_error(), bad[i].var), "%s=%s: %s", bad[i].var,
		              bad[i].val, ckpt_last_error());
		/* The tcp transport does not read them. */
		o.transport = CKPT_TRANSPORT_TCP;
		ck_assert_int_eq(ckpt_open(&o, &c), 0);
		ckpt_close(c);
		o.transport = CKPT_TRANSPORT_RDMA;
		unsetenv(bad[i].var);
	}
	setenv("CKPT_RDMA_DEVICE", "rxe0", 1);
	setenv("CKPT_RDMA_GID", "1", 1);
	ck_assert_int_eq(ckpt_open(&o, &c), 0);
	ckpt_close(c);
	unsetenv("CKPT_RDMA_DEVICE");
	unsetenv("CKPT_RDMA_GID");
}
END_TEST

int main(void)
{
	Suite *s = suite_create("api");
	TCase *tc = tcase_create("api");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, every_dtype);
	tcase_add_test(tc, empty_scalar_and_one);
	tcase_add_test(tc, larger_than_pool_and_zstd);
	tcase_add_test(tc, every_dtype_bytegroup);
	tcase_add_test(tc, device_pool_without_device);
	tcase_add_test(tc, slices_of_every_shape);
	tcase_add_test(tc, snapshot_point);
	tcase_add_test(tc, bad_inputs);
	tcase_add_test(tc, bad_roots);
	tcase_add_test(tc, enospc_midway);
	tcase_add_test(tc, eio_before_fdatasync);
	tcase_add_test(tc, crash_after_chunk);
	tcase_add_test(tc, crash_before_commit_txn);
	tcase_add_test(tc, crash_after_commit_txn);
	tcase_add_test(tc, corruption_found);
	tcase_add_test(tc, many_steps_in_flight);
	tcase_add_test(tc, source_tensors);
	tcase_add_test(tc, resharded_rows_read_blocks);
	tcase_add_test(tc, gds_fallback);
	tcase_add_test(tc, queue_depth_env);
	tcase_add_test(tc, rdma_env);
	suite_add_tcase(s, tc);
	SRunner *sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
