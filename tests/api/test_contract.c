/*
 * test_contract.c — the header's contract, error by error: each error code that
 * include/ckpt/ckpt.h and include/ckpt/catalog.h document for a function, provoked
 * through the public API alone and checked exactly (code and a message that names
 * the object). Then the element-size rule for output structs, and logging: the
 * callback's level, job, rank and step for a save's lines, and the default stderr
 * line format.
 *
 * Errors documented but not provoked here, and where they are: -EBUSY of a second
 * coordinator, -EACCES/-EROFS and CKPT_EAUTH of a peer (test_hostile.c),
 * CKPT_ECORRUPT of a flipped bit and CKPT_ERANKBOUND (test_api.c, test_catalog.c),
 * network errors (tests/commit, tests/net), -ENOMEM (test_alloc_fail.c).
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <regex.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ckpt/catalog.h"
#include "ckpt/ckpt.h"
#include "testutil.h"

static char *root;

static void setup(void)
{
	root = tu_tmpdir("contract");
	unsetenv("CKPT_FAULT");
	unsetenv("CKPT_ROOT");
	unsetenv("CKPT_LOG");
	unsetenv("RANK");
	unsetenv("WORLD_SIZE");
	unsetenv("CKPT_JOB_SECRET");
	unsetenv("CKPT_JOB_SECRET_FILE");
	unsetenv("CKPT_AUTH");
	unsetenv("CKPT_JOB_ID");
}

static void teardown(void)
{
	tu_rmtree(root);
	free(root);
	root = NULL;
}

static void opts_one(struct ckpt_opts *o, const char *r)
{
	ckpt_opts_init(o, sizeof *o);
	o->root = r;
	o->rank = 0;
	o->world = 1;
}

static ckpt_ctx *open_flags(unsigned flags)
{
	struct ckpt_opts o;
	opts_one(&o, root);
	o.flags = flags;
	ckpt_ctx *c = NULL;
	int rc = ckpt_open(&o, &c);
	ck_assert_msg(rc == 0, "open %s: %s", root, ckpt_last_error());
	return c;
}

/* The code, and a message that names what it is about. */
#define ASSERT_ERR(call, code, needle) do {                                          \
	int rc_ = (call);                                                            \
	ck_assert_msg(rc_ == (code), "%s: %d (%s), want %d (%s): %s", #call, rc_,    \
	              ckpt_strerror(rc_), (code), ckpt_strerror(code), ckpt_last_error()); \
	ck_assert_msg(strstr(ckpt_last_error(), (needle)), "%s: message '%s' lacks '%s'", \
	              #call, ckpt_last_error(), (needle));                           \
} while (0)

static const uint64_t SHAPE[2] = { 8, 16 };
static float tensor_data[8 * 16];

static struct ckpt_tensor tensor(const char *name)
{
	return (struct ckpt_tensor){
		.name = name, .kind = CKPT_KIND_MODEL, .dtype = CKPT_F32, .policy = CKPT_SHARDED,
		.ndim = 2, .global_shape = SHAPE, .data = tensor_data, .mem = CKPT_MEM_HOST };
}

/* Save step: tensors "w" and "v" and the blob "rng". */
static void save_step(ckpt_ctx *c, uint64_t step)
{
	tu_fill(tensor_data, sizeof tensor_data, tu_seed(), step);
	ckpt_save *s;
	ck_assert_int_eq(ckpt_save_begin(c, step, &s), 0);
	struct ckpt_tensor t = tensor("w");
	ck_assert_int_eq(ckpt_save_add_tensor(s, &t), 0);
	t = tensor("v");
	ck_assert_int_eq(ckpt_save_add_tensor(s, &t), 0);
	ck_assert_int_eq(ckpt_save_add_blob(s, "rng", CKPT_KIND_RNG, CKPT_RANK_BOUND, "abc", 3), 0);
	ck_assert_int_eq(ckpt_save_submit(s), 0);
	ck_assert_msg(ckpt_save_wait(s, -1) == 0, "%s", ckpt_last_error());
	ckpt_save_free(s);
}

/* ------------------------------------------------------------------ ckpt_open */

START_TEST(open_errors)
{
	struct ckpt_opts o;
	ckpt_ctx *c = (ckpt_ctx *)&o;

	opts_one(&o, root);
	o.size = 0;
	ASSERT_ERR(ckpt_open(&o, &c), -EINVAL, "size");
	ck_assert_ptr_null(c);

	opts_one(&o, NULL);
	ASSERT_ERR(ckpt_open(&o, &c), -EINVAL, "root");
	opts_one(&o, root);
	o.flags = 1u << 20;
	ASSERT_ERR(ckpt_open(&o, &c), -EINVAL, "flags");
	opts_one(&o, root);
	o.rank = 3;
	ASSERT_ERR(ckpt_open(&o, &c), -EINVAL, "rank 3");
	opts_one(&o, root);
	o.chunk_bytes = 4097;
	ASSERT_ERR(ckpt_open(&o, &c), -EINVAL, "chunk size");
	opts_one(&o, root);
	o.zstd_level = 23;
	ASSERT_ERR(ckpt_open(&o, &c), -EINVAL, "zstd level");
	opts_one(&o, root);
	o.queue_depth = 5000;
	ASSERT_ERR(ckpt_open(&o, &c), -EINVAL, "queue depth");
	opts_one(&o, root);
	o.gds = 1u << 5;
	ASSERT_ERR(ckpt_open(&o, &c), -EINVAL, "gds");
	opts_one(&o, root);
	char job[512];
	memset(job, 'j', sizeof job - 1);
	job[sizeof job - 1] = '\0';
	o.job_id = job;
	ASSERT_ERR(ckpt_open(&o, &c), -EINVAL, "job id");
	opts_one(&o, root);
	o.log_level = CKPT_LOG_DEBUG + 1;
	ASSERT_ERR(ckpt_open(&o, &c), -EINVAL, "log level");
	setenv("CKPT_QUEUE_DEPTH", "many", 1);
	opts_one(&o, root);
	ASSERT_ERR(ckpt_open(&o, &c), -EINVAL, "CKPT_QUEUE_DEPTH");
	unsetenv("CKPT_QUEUE_DEPTH");

	/* Read-only and missing. */
	char missing[PATH_MAX];
	snprintf(missing, sizeof missing, "%s/missing", root);
	opts_one(&o, missing);
	o.flags = CKPT_OPEN_READONLY;
	ASSERT_ERR(ckpt_open(&o, &c), -ENOENT, missing);
	ck_assert_ptr_null(c);

	/* A path longer than the system takes. */
	char *longp = malloc(PATH_MAX + 64);
	ck_assert_ptr_nonnull(longp);
	int n = snprintf(longp, PATH_MAX + 64, "%s/", root);
	memset(longp + n, 'x', PATH_MAX + 63 - (size_t)n);
	longp[PATH_MAX + 63] = '\0';
	opts_one(&o, longp);
	ASSERT_ERR(ckpt_open(&o, &c), -ENAMETOOLONG, root);
	free(longp);

	/* A non-empty directory that is not a root, and a file. */
	char other[PATH_MAX], file[PATH_MAX];
	snprintf(other, sizeof other, "%s/data", root);
	ck_assert_int_eq(mkdir(other, 0700), 0);
	snprintf(file, sizeof file, "%s/data/precious.txt", root);
	ck_assert_int_eq(tu_write_file(file, "x", 1), 0);
	opts_one(&o, other);
	ASSERT_ERR(ckpt_open(&o, &c), CKPT_ENOTROOT, other);
	opts_one(&o, file);
	ASSERT_ERR(ckpt_open(&o, &c), CKPT_ENOTROOT, file);

	/* Several ranks and no secret. */
	opts_one(&o, root);
	o.world = 2;
	ASSERT_ERR(ckpt_open(&o, &c), CKPT_EAUTH, "secret");
	ck_assert_ptr_null(c);
}
END_TEST

START_TEST(open_no_manifest)
{
	ckpt_ctx *c = open_flags(0);
	save_step(c, 1);
	ckpt_close(c);
	char cmd[PATH_MAX + 32];
	snprintf(cmd, sizeof cmd, "rm -rf '%s/manifest'", root);
	ck_assert_int_eq(system(cmd), 0);
	struct ckpt_opts o;
	opts_one(&o, root);
	ASSERT_ERR(ckpt_open(&o, &c), CKPT_ENOMANIFEST, root);
	ck_assert_ptr_null(c);
}
END_TEST

START_TEST(handle_errors)
{
	ck_assert_int_eq(ckpt_rank(NULL), -EINVAL);
	ck_assert_int_eq(ckpt_world(NULL), -EINVAL);
	ck_assert_int_eq(ckpt_name_check(NULL, 0), CKPT_ENAME);
	ck_assert_int_eq(ckpt_name_check("a/../b", 6), CKPT_ENAME);
	ckpt_ctx *c = open_flags(0);
	ck_assert_int_eq(ckpt_rank(c), 0);
	ck_assert_int_eq(ckpt_world(c), 1);
	struct ckpt_gds_stats gs;
	gs.size = sizeof gs.size;
	ASSERT_ERR(ckpt_gds_stats(c, &gs), -EINVAL, "size");
	ckpt_close(c);
}
END_TEST

/* ------------------------------------------------------------------ save */

START_TEST(save_begin_errors)
{
	ckpt_ctx *c = open_flags(0);
	ckpt_save *s = (ckpt_save *)c, *s2 = (ckpt_save *)c;
	ASSERT_ERR(ckpt_save_begin(c, CKPT_LATEST, &s), -EINVAL, "reserved");
	ck_assert_ptr_null(s);
	save_step(c, 1);
	ASSERT_ERR(ckpt_save_begin(c, 1, &s), -EEXIST, "step 1");

	/* One attempt of a step at a time: begun, then submitted, it is live. */
	ck_assert_int_eq(ckpt_save_begin(c, 2, &s), 0);
	ASSERT_ERR(ckpt_save_begin(c, 2, &s2), -EBUSY, "step 2");
	ck_assert_ptr_null(s2);
	struct ckpt_tensor t = tensor("w");
	ck_assert_int_eq(ckpt_save_add_tensor(s, &t), 0);
	ck_assert_int_eq(ckpt_save_submit(s), 0);
	ck_assert_int_eq(ckpt_save_wait(s, -1), 0);
	/* Finished, not yet freed: the step is committed, so -EEXIST, not -EBUSY. */
	ASSERT_ERR(ckpt_save_begin(c, 2, &s2), -EEXIST, "step 2");
	ckpt_save_free(s);
	ckpt_close(c);

	c = open_flags(CKPT_OPEN_READONLY);
	ASSERT_ERR(ckpt_save_begin(c, 3, &s), CKPT_ESTATE, "read-only");
	ck_assert_ptr_null(s);
	ckpt_close(c);
}
END_TEST

static int source_fill(void *arg, uint64_t off, void *dst, size_t len)
{
	(void)arg;
	memcpy(dst, (const char *)tensor_data + off, len);
	return 0;
}

START_TEST(save_add_errors)
{
	ckpt_ctx *c = open_flags(0);
	ckpt_save *s;
	ck_assert_int_eq(ckpt_save_begin(c, 5, &s), 0);
	struct ckpt_tensor t = tensor("a/../b");
	ASSERT_ERR(ckpt_save_add_tensor(s, &t), CKPT_ENAME, "a/../b");
	t = tensor("k");
	t.kind = 99;
	ASSERT_ERR(ckpt_save_add_tensor(s, &t), -EINVAL, "'k'");
	t = tensor("d");
	t.dtype = 99;
	ASSERT_ERR(ckpt_save_add_tensor(s, &t), -EINVAL, "dtype");
	t = tensor("n");
	t.ndim = CKPT_MAX_NDIM + 1;
	ASSERT_ERR(ckpt_save_add_tensor(s, &t), CKPT_ESHAPE, "'n'");
	uint64_t off[2] = { 4, 0 }, ext[2] = { 8, 16 };
	t = tensor("box");
	t.offset = off;
	t.extent = ext;
	ASSERT_ERR(ckpt_save_add_tensor(s, &t), CKPT_ESHAPE, "'box'");
	uint64_t huge[2] = { UINT64_MAX / 2, 8 };
	t = tensor("huge");
	t.global_shape = huge;
	ASSERT_ERR(ckpt_save_add_tensor(s, &t), CKPT_ESHAPE, "'huge'");
	t = tensor("nodata");
	t.data = NULL;
	ASSERT_ERR(ckpt_save_add_tensor(s, &t), -EINVAL, "'nodata'");
	t = tensor("w");
	ck_assert_int_eq(ckpt_save_add_tensor(s, &t), 0);
	ASSERT_ERR(ckpt_save_add_tensor(s, &t), -EEXIST, "'w'");
	t = tensor("src");
	ASSERT_ERR(ckpt_save_add_tensor_source(s, &t, NULL, NULL), -EINVAL, "callback");
	t.mem = CKPT_MEM_DEVICE;
	ASSERT_ERR(ckpt_save_add_tensor_source(s, &t, source_fill, NULL), -EINVAL, "'src'");
	ASSERT_ERR(ckpt_save_add_blob(s, "b", CKPT_KIND_RNG, CKPT_SHARDED, "x", 1), -EINVAL, "'b'");
	ASSERT_ERR(ckpt_save_add_blob(s, "b", 0, CKPT_REPLICATED, "x", 1), -EINVAL, "'b'");
	ASSERT_ERR(ckpt_save_add_blob(s, "", CKPT_KIND_RNG, CKPT_REPLICATED, "x", 1), CKPT_ENAME, "blob name");
	ASSERT_ERR(ckpt_save_add_blob(s, "b", CKPT_KIND_RNG, CKPT_REPLICATED, NULL, 1), -EINVAL, "'b'");
	ASSERT_ERR(ckpt_save_add_blob(s, "w", CKPT_KIND_RNG, CKPT_REPLICATED, "x", 1), -EEXIST, "'w'");

	ASSERT_ERR(ckpt_save_wait_snapshot(s, 0), CKPT_ESTATE, "step 5");
	ASSERT_ERR(ckpt_save_wait(s, 0), CKPT_ESTATE, "step 5");
	struct ckpt_save_stats st;
	st.size = 0;
	ASSERT_ERR(ckpt_save_stats(s, &st), -EINVAL, "ckpt_save_stats");
	ck_assert_int_eq(ckpt_save_submit(s), 0);
	ASSERT_ERR(ckpt_save_submit(s), CKPT_ESTATE, "step 5");
	t = tensor("late");
	ASSERT_ERR(ckpt_save_add_tensor(s, &t), CKPT_ESTATE, "step 5");
	ASSERT_ERR(ckpt_save_add_blob(s, "late", CKPT_KIND_RNG, CKPT_REPLICATED, "x", 1),
	           CKPT_ESTATE, "step 5");
	ck_assert_int_eq(ckpt_save_wait(s, -1), 0);
	ckpt_save_free(s);
	ckpt_close(c);
}
END_TEST

/* A source that holds the save until released, then fails with its own code. */
static atomic_int source_go;

static int source_held(void *arg, uint64_t off, void *dst, size_t len)
{
	(void)arg;
	(void)off;
	while (!atomic_load(&source_go))
		usleep(1000);
	memset(dst, 0, len);
	return -EMSGSIZE;
}

START_TEST(save_wait_errors)
{
	ckpt_ctx *c = open_flags(0);
	save_step(c, 1);
	ckpt_save *s;
	ck_assert_int_eq(ckpt_save_begin(c, 2, &s), 0);
	struct ckpt_tensor t = tensor("held");
	atomic_store(&source_go, 0);
	ck_assert_int_eq(ckpt_save_add_tensor_source(s, &t, source_held, NULL), 0);
	ck_assert_int_eq(ckpt_save_submit(s), 0);
	ASSERT_ERR(ckpt_save_wait_snapshot(s, 20), -ETIMEDOUT, "step 2");
	ASSERT_ERR(ckpt_save_wait(s, 20), -ETIMEDOUT, "step 2");
	atomic_store(&source_go, 1);
	/* The source's own code is the save's outcome, on both waits, every time. */
	ASSERT_ERR(ckpt_save_wait_snapshot(s, -1), -EMSGSIZE, "held");
	ASSERT_ERR(ckpt_save_wait(s, -1), -EMSGSIZE, "held");
	ASSERT_ERR(ckpt_save_wait(s, -1), -EMSGSIZE, "held");
	ckpt_save_free(s);
	/* Nothing of it is visible; the step before still is. */
	ckpt_load *l = (ckpt_load *)c;
	ASSERT_ERR(ckpt_load_open(c, 2, &l), CKPT_ENOTFOUND, "step 2");
	ck_assert_ptr_null(l);
	ck_assert_int_eq(ckpt_load_open(c, CKPT_LATEST, &l), 0);
	ck_assert_uint_eq(ckpt_load_step(l), 1);
	ckpt_load_close(l);
	ckpt_close(c);
}
END_TEST

/* ------------------------------------------------------------------ load, steps */

START_TEST(load_errors)
{
	ckpt_ctx *c = open_flags(0);
	ckpt_load *l = (ckpt_load *)c;
	ASSERT_ERR(ckpt_load_open(c, CKPT_LATEST, &l), CKPT_ENOTFOUND, root);
	ck_assert_ptr_null(l);
	struct ckpt_step_info si;
	ASSERT_ERR(ckpt_step_info(c, CKPT_LATEST, &si, sizeof si), CKPT_ENOTFOUND, root);
	save_step(c, 3);
	ASSERT_ERR(ckpt_load_open(c, 4, &l), CKPT_ENOTFOUND, "step 4");
	ASSERT_ERR(ckpt_step_info(c, 4, &si, sizeof si), CKPT_ENOTFOUND, "step 4");
	ASSERT_ERR(ckpt_step_info(c, 3, &si, sizeof si - 1), -EINVAL, "ckpt_step_info");
	ASSERT_ERR(ckpt_steps(c, 1u << 9, NULL, 0, sizeof si), -EINVAL, "flags");
	ASSERT_ERR(ckpt_steps(c, 0, NULL, 0, sizeof si - 1), -EINVAL, "ckpt_steps");
	ck_assert_int_eq(ckpt_load_open(c, 3, &l), 0);

	float dst[8 * 16];
	ASSERT_ERR(ckpt_load_tensor(l, "nope", CKPT_F32, 2, NULL, NULL, dst, CKPT_MEM_HOST),
	           CKPT_ENOTFOUND, "nope");
	ASSERT_ERR(ckpt_load_tensor(l, "w", CKPT_I32, 2, NULL, NULL, dst, CKPT_MEM_HOST),
	           CKPT_EDTYPE, "'w'");
	ASSERT_ERR(ckpt_load_tensor(l, "w", CKPT_F32, 3, NULL, NULL, dst, CKPT_MEM_HOST),
	           CKPT_ESHAPE, "'w'");
	uint64_t off[2] = { 6, 0 }, ext[2] = { 4, 16 };
	ASSERT_ERR(ckpt_load_tensor(l, "w", CKPT_F32, 2, off, ext, dst, CKPT_MEM_HOST),
	           CKPT_ESHAPE, "'w'");
	char b[8];
	size_t len = 0;
	ASSERT_ERR(ckpt_load_blob(l, "rng", b, 2, &len), -ENOSPC, "'rng'");
	ck_assert_uint_eq(len, 3);
	ASSERT_ERR(ckpt_load_blob(l, "none", b, sizeof b, &len), CKPT_ENOTFOUND, "none");
	ASSERT_ERR(ckpt_load_blob(l, "w", b, sizeof b, &len), CKPT_EDTYPE, "'w'");
	ASSERT_ERR(ckpt_load_blob(l, "rng", NULL, 8, &len), -EINVAL, "'rng'");
	ASSERT_ERR(ckpt_load_blob_rank(l, "rng", -2, b, sizeof b, &len), -EINVAL, "-2");
	ASSERT_ERR(ckpt_load_blob_rank(l, "rng", 5, b, sizeof b, &len), CKPT_ENOTFOUND, "rng");
	ck_assert_int_eq(ckpt_load_blob_rank(l, "rng", 0, b, sizeof b, &len), 0);
	ck_assert(len == 3 && !memcmp(b, "abc", 3));

	int count = ckpt_load_count(l);
	ck_assert_int_eq(count, 3);
	struct ckpt_tensor_info ti;
	ASSERT_ERR(ckpt_load_info(l, (unsigned)count, &ti, sizeof ti), CKPT_ENOTFOUND, "entry 3");
	ASSERT_ERR(ckpt_load_info(l, 0, &ti, sizeof ti - 1), -EINVAL, "ckpt_load_info");
	ASSERT_ERR(ckpt_load_is_blob(l, (unsigned)count), CKPT_ENOTFOUND, "entry 3");
	ASSERT_ERR(ckpt_load_chunks(l, (unsigned)count, NULL, 0, sizeof(struct ckpt_chunk_info)),
	           CKPT_ENOTFOUND, "entry 3");
	/* The size before hash_blocks was appended is what a caller built then passes:
	 * taken, and filled up to it. One byte less is not. */
	size_t old = offsetof(struct ckpt_chunk_info, hash_blocks);
	ASSERT_ERR(ckpt_load_chunks(l, 0, NULL, 0, old - 1), -EINVAL, "ckpt_load_chunks");
	union { struct ckpt_chunk_info ci[2]; uint8_t b[2 * sizeof(struct ckpt_chunk_info)]; } u;
	memset(&u, 0xEE, sizeof u);
	ck_assert_int_ge(ckpt_load_chunks(l, 0, u.ci, 1, old), 1);
	ck_assert_uint_ne(u.ci[0].raw_len, 0xEEEEEEEEEEEEEEEEull);
	for (size_t k = old; k < sizeof u.b; k++)
		ck_assert_uint_eq(u.b[k], 0xEE);
	ckpt_load_close(l);
	ckpt_close(c);
}
END_TEST

/* ------------------------------------------------------------------ catalog.h */

static int cancel_at_once(void *arg, uint64_t done, uint64_t total)
{
	(void)arg;
	(void)done;
	(void)total;
	return 1;
}

START_TEST(catalog_errors)
{
	ckpt_ctx *c = open_flags(CKPT_OPEN_NO_GC);
	save_step(c, 1);
	save_step(c, 2);
	struct ckpt_verify_opts vo;
	ckpt_verify_opts_init(&vo, sizeof vo);
	struct ckpt_verify_result vr;
	memset(&vr, 0, sizeof vr);
	vr.size = sizeof vr;
	ASSERT_ERR(ckpt_catalog_verify(c, 9, &vo, &vr), CKPT_ENOTFOUND, "step 9");
	vo.size = sizeof vo + 8;
	ASSERT_ERR(ckpt_catalog_verify(c, 1, &vo, &vr), -EINVAL, "options size");
	ckpt_verify_opts_init(&vo, sizeof vo);
	vo.progress = cancel_at_once;
	ASSERT_ERR(ckpt_catalog_verify(c, 1, &vo, &vr), -ECANCELED, "step 1");

	/* gc: a bad result size is refused before anything is removed. */
	struct ckpt_gc_opts go;
	ckpt_gc_opts_init(&go, sizeof go);
	go.keep_last = 1;
	struct ckpt_gc_result gr;
	gr.size = 0;
	ASSERT_ERR(ckpt_catalog_gc(c, &go, &gr), -EINVAL, "result size");
	ck_assert_int_eq(ckpt_steps(c, 0, NULL, 0, sizeof(struct ckpt_step_info)), 2);
	go.flags = 1u << 12;
	ASSERT_ERR(ckpt_catalog_gc(c, &go, NULL), -EINVAL, "flags");

	/* rebuild: records present and no merge. */
	ASSERT_ERR(ckpt_catalog_rebuild(c, 0, NULL, NULL, NULL), -EEXIST, root);
	ASSERT_ERR(ckpt_catalog_rebuild(c, 1u << 12, NULL, NULL, NULL), -EINVAL, "flags");
	ckpt_close(c);

	c = open_flags(CKPT_OPEN_READONLY);
	ckpt_gc_opts_init(&go, sizeof go);
	ASSERT_ERR(ckpt_catalog_gc(c, &go, NULL), CKPT_ESTATE, root);
	ASSERT_ERR(ckpt_catalog_rebuild(c, CKPT_REBUILD_MERGE, NULL, NULL, NULL), CKPT_ESTATE, root);
	ckpt_close(c);
}
END_TEST

/* ------------------------------------------------------------------ element sizes */

/* A caller compiled with a larger struct (fields appended later): each element is
 * written at its own stride, and what this library does not know is zero. */
#define PAD 24

START_TEST(elem_size_stride)
{
	ckpt_ctx *c = open_flags(0);
	save_step(c, 4);
	save_step(c, 9);
	size_t es = sizeof(struct ckpt_step_info) + PAD;
	unsigned char *buf = malloc(3 * es);
	ck_assert_ptr_nonnull(buf);
	memset(buf, 0xa5, 3 * es);
	ck_assert_int_eq(ckpt_steps(c, 0, (struct ckpt_step_info *)buf, 2, es), 2);
	for (unsigned i = 0; i < 2; i++) {
		struct ckpt_step_info si;
		memcpy(&si, buf + i * es, sizeof si);
		ck_assert_uint_eq(si.step, i ? 9 : 4);
		ck_assert_int_eq(si.state, CKPT_STATE_COMMITTED);
		ck_assert(si.has_record && si.has_dir && si.nfiles >= 1 && si.dir_bytes > 0);
		for (size_t k = sizeof si; k < es; k++)
			ck_assert_uint_eq(buf[i * es + k], 0);
	}
	for (size_t k = 2 * es; k < 3 * es; k++)     /* past cap: untouched */
		ck_assert_uint_eq(buf[k], 0xa5);
	free(buf);

	ckpt_load *l;
	ck_assert_int_eq(ckpt_load_open(c, 9, &l), 0);
	int n = ckpt_load_chunks(l, 2, NULL, 0, sizeof(struct ckpt_chunk_info));
	ck_assert_int_ge(n, 1);
	es = sizeof(struct ckpt_chunk_info) + PAD;
	buf = calloc((size_t)n, es);
	ck_assert_ptr_nonnull(buf);
	ck_assert_int_eq(ckpt_load_chunks(l, 2, (struct ckpt_chunk_info *)buf, (size_t)n, es), n);
	uint64_t raw = 0;
	for (int i = 0; i < n; i++) {
		struct ckpt_chunk_info ci;
		memcpy(&ci, buf + (size_t)i * es, sizeof ci);
		ck_assert_uint_eq(ci.raw_offset, raw);
		raw += ci.raw_len;
	}
	ck_assert_uint_eq(raw, sizeof tensor_data);
	free(buf);
	es = sizeof(struct ckpt_tensor_info) + PAD;
	buf = malloc(es);
	ck_assert_ptr_nonnull(buf);
	memset(buf, 0xa5, es);
	ck_assert_int_eq(ckpt_load_info(l, 2, (struct ckpt_tensor_info *)buf, es), 0);
	struct ckpt_tensor_info ti;
	memcpy(&ti, buf, sizeof ti);
	ck_assert_str_eq(ti.name, "w");
	ck_assert_uint_eq(ti.logical_bytes, sizeof tensor_data);
	for (size_t k = sizeof ti; k < es; k++)
		ck_assert_uint_eq(buf[k], 0);
	free(buf);
	ckpt_load_close(l);
	ckpt_close(c);
}
END_TEST

/* ------------------------------------------------------------------ logging */

struct log_rec {
	int level;
	char job[64];
	int rank;
	uint64_t step;
	char msg[256];
};

struct log_sink {
	pthread_mutex_t lock;
	struct log_rec rec[256];
	unsigned n;
};

static void log_collect(void *arg, int level, const struct ckpt_log_ctx *where, const char *msg)
{
	struct log_sink *k = arg;
	pthread_mutex_lock(&k->lock);
	if (k->n < sizeof k->rec / sizeof k->rec[0]) {
		struct log_rec *r = &k->rec[k->n++];
		r->level = level;
		snprintf(r->job, sizeof r->job, "%s", where->job_id ? where->job_id : "(null)");
		r->rank = where->rank;
		r->step = where->step;
		snprintf(r->msg, sizeof r->msg, "%s", msg);
	}
	pthread_mutex_unlock(&k->lock);
}

/* The lines of k that say "step <step>: worker starts": the save worker's, for it. */
static unsigned worker_lines(struct log_sink *k, uint64_t step, const char *job, int level)
{
	char want[64];
	snprintf(want, sizeof want, "step %llu: worker starts", (unsigned long long)step);
	unsigned found = 0;
	for (unsigned i = 0; i < k->n; i++) {
		const struct log_rec *r = &k->rec[i];
		if (!strstr(r->msg, want))
			continue;
		ck_assert_msg(r->level == level && r->rank == 0 && r->step == step &&
		              !strcmp(r->job, job), "line '%s': level %d job %s rank %d step %llu",
		              r->msg, r->level, r->job, r->rank, (unsigned long long)r->step);
		found++;
	}
	return found;
}

START_TEST(log_callback_of_a_save)
{
	static struct log_sink k = { .lock = PTHREAD_MUTEX_INITIALIZER };
	uint64_t seed = tu_seed();
	uint64_t step = 1 + seed % 1000;
	struct ckpt_opts o;
	opts_one(&o, root);
	o.job_id = "job-contract";
	o.log_fn = log_collect;
	o.log_arg = &k;
	o.log_level = CKPT_LOG_DEBUG;
	ckpt_ctx *c;
	ck_assert_int_eq(ckpt_open(&o, &c), 0);
	save_step(c, step);
	ck_assert_uint_eq(worker_lines(&k, step, "job-contract", CKPT_LOG_DEBUG), 1);
	/* Every line about this step carries it; the rest carry no step or it. */
	char prefix[32];
	snprintf(prefix, sizeof prefix, "step %llu:", (unsigned long long)step);
	for (unsigned i = 0; i < k.n; i++) {
		ck_assert_int_eq(k.rec[i].rank, 0);
		ck_assert_str_eq(k.rec[i].job, "job-contract");
		if (!strncmp(k.rec[i].msg, prefix, strlen(prefix)))
			ck_assert_uint_eq(k.rec[i].step, step);
	}
	ckpt_close(c);

	/* The level is a threshold: at WARN the debug lines do not come. */
	k.n = 0;
	opts_one(&o, root);
	o.log_fn = log_collect;
	o.log_arg = &k;
	o.log_level = CKPT_LOG_WARN;
	ck_assert_int_eq(ckpt_open(&o, &c), 0);
	save_step(c, step + 1);
	for (unsigned i = 0; i < k.n; i++)
		ck_assert_int_le(k.rec[i].level, CKPT_LOG_WARN);
	ck_assert_uint_eq(worker_lines(&k, step + 1, "default", CKPT_LOG_DEBUG), 0);
	ckpt_close(c);
}
END_TEST

START_TEST(log_process_callback)
{
	static struct log_sink k = { .lock = PTHREAD_MUTEX_INITIALIZER };
	ckpt_log_set(log_collect, &k);
	struct ckpt_opts o;
	opts_one(&o, root);
	o.log_level = CKPT_LOG_DEBUG;
	ckpt_ctx *c;
	ck_assert_int_eq(ckpt_open(&o, &c), 0);
	save_step(c, 12);
	ckpt_log_set(NULL, NULL);
	ck_assert_uint_eq(worker_lines(&k, 12, "default", CKPT_LOG_DEBUG), 1);
	/* Back on stderr: nothing more comes to the callback. */
	unsigned n = k.n;
	save_step(c, 13);
	ck_assert_uint_eq(k.n, n);
	ckpt_close(c);
}
END_TEST

START_TEST(log_default_line)
{
	char path[PATH_MAX];
	snprintf(path, sizeof path, "%s/stderr.txt", root);
	fflush(stderr);
	int saved = dup(2);
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	ck_assert(saved >= 0 && fd >= 0);
	ck_assert_int_eq(dup2(fd, 2), 2);
	close(fd);
	char r[PATH_MAX];
	snprintf(r, sizeof r, "%s/root", root);
	struct ckpt_opts o;
	opts_one(&o, r);
	o.log_level = CKPT_LOG_DEBUG;
	ckpt_ctx *c = NULL;
	int rc = ckpt_open(&o, &c);
	time_t t0 = time(NULL);
	if (!rc)
		save_step(c, 21);
	ckpt_close(c);
	dup2(saved, 2);
	close(saved);
	ck_assert_int_eq(rc, 0);
	void *text;
	size_t len;
	ck_assert_int_eq(tu_read_file(path, &text, &len), 0);
	char *log = realloc(text, len + 1);
	ck_assert_ptr_nonnull(log);
	log[len] = '\0';
	regex_t re;
	ck_assert_int_eq(regcomp(&re, "^([0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2})"
	                         "\\.[0-9]{3}Z libckpt\\[[0-9]+\\] rank 0 debug: step 21: "
	                         "worker starts", REG_EXTENDED | REG_NEWLINE), 0);
	regmatch_t m[2];
	ck_assert_msg(regexec(&re, log, 2, m, 0) == 0, "no timestamped worker line in:\n%s", log);
	/* The time is UTC and now. */
	struct tm tm;
	memset(&tm, 0, sizeof tm);
	ck_assert_ptr_nonnull(strptime(log + m[1].rm_so, "%Y-%m-%dT%H:%M:%S", &tm));
	time_t t = timegm(&tm);
	ck_assert_msg(t >= t0 - 120 && t <= t0 + 120, "line time %lld, now %lld",
	              (long long)t, (long long)t0);
	/* Every line has the same form. */
	regfree(&re);
	ck_assert_int_eq(regcomp(&re, "^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\\."
	                         "[0-9]{3}Z libckpt\\[[0-9]+\\] rank (0|-) (error|warn|info|debug): ",
	                         REG_EXTENDED), 0);
	unsigned lines = 0;
	for (char *p = log, *e; *p; p = e + 1) {
		e = strchr(p, '\n');
		ck_assert_ptr_nonnull(e);
		*e = '\0';
		ck_assert_msg(regexec(&re, p, 0, NULL, 0) == 0, "line '%s'", p);
		lines++;
	}
	ck_assert_uint_ge(lines, 1);
	regfree(&re);
	free(log);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("contract");
	TCase *t = tcase_create("errors");
	tcase_add_checked_fixture(t, setup, teardown);
	tcase_set_timeout(t, 120);
	tcase_add_test(t, open_errors);
	tcase_add_test(t, open_no_manifest);
	tcase_add_test(t, handle_errors);
	tcase_add_test(t, save_begin_errors);
	tcase_add_test(t, save_add_errors);
	tcase_add_test(t, save_wait_errors);
	tcase_add_test(t, load_errors);
	tcase_add_test(t, catalog_errors);
	suite_add_tcase(s, t);
	t = tcase_create("structs");
	tcase_add_checked_fixture(t, setup, teardown);
	tcase_add_test(t, elem_size_stride);
	suite_add_tcase(s, t);
	t = tcase_create("log");
	tcase_add_checked_fixture(t, setup, teardown);
	tcase_set_timeout(t, 120);
	tcase_add_test(t, log_callback_of_a_save);
	tcase_add_test(t, log_process_callback);
	tcase_add_test(t, log_default_line);
	suite_add_tcase(s, t);
	return s;
}

int main(void)
{
	tu_seed();          /* printed once, for a replay */
	SRunner *r = srunner_create(suite());
	srunner_run_all(r, CK_NORMAL);
	int failed = srunner_ntests_failed(r);
	srunner_free(r);
	return failed ? 1 : 0;
}
