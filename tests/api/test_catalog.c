/*
 * test_catalog.c — the catalog and batch-load API end to end on one rank: the batch load
 * (one request per slice, per-request results, a bad request beside good ones),
 * the explicit saved rank for rank-bound items, the chunk listing, verify (clean,
 * then a flipped bit named precisely), gc with retention and a dry run, and
 * rebuild of a deleted manifest; a save whose step directory a collection in
 * another process removes before the shard file is made in it.
 */
#include <check.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/catalog.h"
#include "ckpt/ckpt.h"
#include "testutil.h"

static char *root;

static void setup(void)
{
	root = tu_tmpdir("catalog");
	unsetenv("CKPT_FAULT");
	unsetenv("RANK");
	unsetenv("WORLD_SIZE");
}

static void teardown(void)
{
	tu_rmtree(root);
	free(root);
	root = NULL;
}

static ckpt_ctx *open_as(int rank, int world, unsigned flags)
{
	struct ckpt_opts o;
	ckpt_opts_init(&o, sizeof o);
	o.root = root;
	o.rank = rank;
	o.world = world;
	o.flags = flags;
	o.chunk_bytes = 8192;     /* several chunks per tensor */
	o.pool_bytes = 16 * 8192;
	ckpt_ctx *c = NULL;
	ck_assert_msg(ckpt_open(&o, &c) == 0, "open: %s", ckpt_last_error());
	return c;
}

#define ROWS 300u
#define COLS 17u

/* The 2-d f32 tensor "w" and the i64 vector "opt/v" of w and v, into s. */
static void add_w_v(ckpt_save *s, float *w, int64_t *v)
{
	uint64_t ws[2] = { ROWS, COLS }, vs[1] = { 5000 };
	struct ckpt_tensor t1 = { .name = "w", .kind = CKPT_KIND_MODEL, .dtype = CKPT_F32,
		.policy = CKPT_SHARDED, .ndim = 2, .global_shape = ws, .data = w };
	struct ckpt_tensor t2 = { .name = "opt/v", .kind = CKPT_KIND_OPTIMIZER, .dtype = CKPT_I64,
		.policy = CKPT_SHARDED, .ndim = 1, .global_shape = vs, .data = v };
	ck_assert_int_eq(ckpt_save_add_tensor(s, &t1), 0);
	ck_assert_int_eq(ckpt_save_add_tensor(s, &t2), 0);
}

/* Step `step`: a 2-d f32 tensor "w", an i64 vector "v", a replicated blob and a
 * rank-bound blob. */
static void save_step(uint64_t step, float *w, int64_t *v, uint8_t *rb, size_t rblen)
{
	ckpt_ctx *c = open_as(0, 1, 0);
	ckpt_save *s;
	ck_assert_int_eq(ckpt_save_begin(c, step, &s), 0);
	add_w_v(s, w, v);
	ck_assert_int_eq(ckpt_save_add_blob(s, "sched", CKPT_KIND_SCHEDULER, CKPT_REPLICATED, "abc", 3), 0);
	ck_assert_int_eq(ckpt_save_add_blob(s, "rng", CKPT_KIND_RNG, CKPT_RANK_BOUND, rb, rblen), 0);
	/* Steps that reference no other step's file ("sched" is the same at every step):
	 * the counts of retention and rebuild below are those of whole steps; references
	 * are test_incremental.c's. */
	ck_assert_int_eq(ckpt_save_set_incremental(s, 0), 0);
	ck_assert_int_eq(ckpt_save_submit(s), 0);
	ck_assert_msg(ckpt_save_wait(s, -1) == 0, "%s", ckpt_last_error());
	ckpt_save_free(s);
	ckpt_close(c);
}

static void make_data(float *w, int64_t *v, uint8_t *rb, uint64_t stream)
{
	tu_fill(w, sizeof(float) * ROWS * COLS, tu_seed(), stream);
	tu_fill(v, sizeof(int64_t) * 5000, tu_seed(), stream + 1);
	tu_fill(rb, 100, tu_seed(), stream + 2);
}

START_TEST(batch_load_and_rank_map)
{
	static float w[ROWS * COLS];
	static int64_t v[5000];
	uint8_t rb[100];
	make_data(w, v, rb, 1);
	save_step(1, w, v, rb, sizeof rb);

	/* As rank 2 of a job of 3: sharded slices load, rank-bound only by explicit map. */
	ckpt_ctx *c = open_as(2, 3, CKPT_OPEN_READONLY);
	ckpt_load *l;
	ck_assert_int_eq(ckpt_load_open(c, CKPT_LATEST, &l), 0);
	enum { NQ = 6 };
	static float rows[3][100 * COLS];
	static int64_t tail[1000];
	uint64_t off[NQ][2] = { { 0, 0 }, { 100, 0 }, { 200, 0 }, { 4000 }, { 0 }, { 0 } };
	uint64_t ext[NQ][2] = { { 100, COLS }, { 100, COLS }, { 100, COLS }, { 1000 }, { 1 }, { 1 } };
	float dummy;
	struct ckpt_load_req q[NQ] = {
		{ .name = "w", .dtype = CKPT_F32, .ndim = 2, .offset = off[0], .extent = ext[0], .dst = rows[0], .saved_rank = -1 },
		{ .name = "w", .dtype = CKPT_F32, .ndim = 2, .offset = off[1], .extent = ext[1], .dst = rows[1], .saved_rank = -1 },
		{ .name = "w", .dtype = CKPT_F32, .ndim = 2, .offset = off[2], .extent = ext[2], .dst = rows[2], .saved_rank = -1 },
		{ .name = "opt/v", .dtype = CKPT_I64, .ndim = 1, .offset = off[3], .extent = ext[3], .dst = tail, .saved_rank = -1 },
		{ .name = "no/such", .dtype = CKPT_F32, .ndim = 1, .offset = off[4], .extent = ext[4], .dst = &dummy, .saved_rank = -1 },
		{ .name = "w", .dtype = CKPT_F64, .ndim = 2, .dst = &dummy, .saved_rank = -1 },
	};
	int res[NQ];
	int rc = ckpt_load_tensors(l, q, NQ, res);
	ck_assert_int_eq(rc, CKPT_ENOTFOUND);            /* the first failed request, in order */
	ck_assert_msg(strstr(ckpt_last_error(), "no/such"), "%s", ckpt_last_error());
	ck_assert_int_eq(res[0], 0);
	ck_assert_int_eq(res[1], 0);
	ck_assert_int_eq(res[2], 0);
	ck_assert_int_eq(res[3], 0);
	ck_assert_int_eq(res[4], CKPT_ENOTFOUND);
	ck_assert_int_eq(res[5], CKPT_EDTYPE);
	for (int k = 0; k < 3; k++)
		ck_assert(!memcmp(rows[k], w + (size_t)k * 100 * COLS, sizeof rows[k]));
	ck_assert(!memcmp(tail, v + 4000, sizeof tail));
	/* All good: 0; a batch of none: 0. */
	ck_assert_int_eq(ckpt_load_tensors(l, q, 4, NULL), 0);
	ck_assert_int_eq(ckpt_load_tensors(l, q, 0, NULL), 0);

	/* Rank-bound: refused by default with a message that says how to map... */
	uint8_t got[100];
	size_t len = 0;
	rc = ckpt_load_blob(l, "rng", got, sizeof got, &len);
	ck_assert_int_eq(rc, CKPT_ERANKBOUND);
	ck_assert_msg(strstr(ckpt_last_error(), "saved rank"), "%s", ckpt_last_error());
	/* ...and loaded when the caller names the saved rank. */
	ck_assert_int_eq(ckpt_load_blob_rank(l, "rng", 0, got, sizeof got, &len), 0);
	ck_assert_uint_eq(len, sizeof rb);
	ck_assert(!memcmp(got, rb, sizeof rb));
	ck_assert_int_eq(ckpt_load_blob_rank(l, "rng", 1, got, sizeof got, &len), CKPT_ENOTFOUND);
	ck_assert_int_eq(ckpt_load_blob_rank(l, "rng", -1, got, sizeof got, &len), -EINVAL);
	/* The same through a request: a blob is a u8 vector. */
	uint64_t n = sizeof rb;
	struct ckpt_load_req br = { .name = "rng", .dtype = CKPT_U8, .ndim = 1, .extent = &n,
		.dst = got, .saved_rank = 0 };
	memset(got, 0, sizeof got);
	ck_assert_int_eq(ckpt_load_tensors(l, &br, 1, NULL), 0);
	ck_assert(!memcmp(got, rb, sizeof rb));
	br.saved_rank = -1;
	ck_assert_int_eq(ckpt_load_tensors(l, &br, 1, NULL), CKPT_ERANKBOUND);
	/* Replicated blobs load on any rank. */
	char sched[8];
	ck_assert_int_eq(ckpt_load_blob(l, "sched", sched, sizeof sched, &len), 0);
	ck_assert(len == 3 && !memcmp(sched, "abc", 3));

	/* Chunk listing: w is 300*17*4 = 20400 bytes in 8 KiB chunks -> 3 chunks. */
	int count = ckpt_load_count(l);
	for (int i = 0; i < count; i++) {
		struct ckpt_tensor_info ti;
		ck_assert_int_eq(ckpt_load_info(l, (unsigned)i, &ti, sizeof ti), 0);
		struct ckpt_chunk_info ch[8];
		int nch = ckpt_load_chunks(l, (unsigned)i, ch, 8, sizeof(struct ckpt_chunk_info));
		ck_assert_int_eq(nch, (int)ti.nchunks);
		ck_assert_int_eq(ckpt_load_is_blob(l, (unsigned)i),
		                 !strcmp(ti.name, "rng") || !strcmp(ti.name, "sched"));
		if (!strcmp(ti.name, "w")) {
			ck_assert_int_eq(nch, 3);
			uint64_t at = 0;
			for (int k = 0; k < nch; k++) {
				ck_assert_uint_eq(ch[k].raw_offset, at);
				at += ch[k].raw_len;
				/* The file of rank 0's attempt: its name carries the save id. */
				ck_assert_msg(!strncmp(ch[k].file, "step-00000000000000000001/rank-000000-", 38) &&
				              strlen(ch[k].file) == 38 + 16 + 6, "%s", ch[k].file);
				ck_assert_str_eq(ckpt_codec_name(ch[k].codec), "raw");
				ck_assert_uint_eq(ch[k].box_extent[0], ROWS);
			}
			ck_assert_uint_eq(at, sizeof w);
		}
	}
	ck_assert_int_eq(ckpt_load_chunks(l, (unsigned)count, NULL, 0, sizeof(struct ckpt_chunk_info)), CKPT_ENOTFOUND);
	ckpt_load_close(l);
	ckpt_close(c);
}
END_TEST

static int progress_calls;
static int count_progress(void *arg, uint64_t done, uint64_t total)
{
	(void)arg;
	ck_assert_uint_le(done, total);
	progress_calls++;
	return 0;
}

START_TEST(verify_gc_rebuild)
{
	static float w[ROWS * COLS];
	static int64_t v[5000];
	uint8_t rb[100];
	for (uint64_t s = 1; s <= 4; s++) {
		make_data(w, v, rb, 10 * s);
		save_step(s, w, v, rb, sizeof rb);
	}
	ckpt_ctx *c = open_as(0, 1, CKPT_OPEN_NO_GC);
	struct ckpt_verify_opts o;
	ckpt_verify_opts_init(&o, sizeof o);
	o.progress = count_progress;
	struct ckpt_verify_result r = { .size = sizeof r };
	ck_assert_msg(ckpt_catalog_verify(c, 2, &o, &r) == 0, "%s", ckpt_last_error());
	ck_assert(r.marked && !r.bad && r.chunks >= 5 && progress_calls == (int)r.chunks);
	struct ckpt_step_info si;
	ck_assert_int_eq(ckpt_step_info(c, 2, &si, sizeof si), 0);
	ck_assert_int_eq(si.trust, CKPT_TRUST_VERIFIED);

	/* Flip a bit in the second chunk of "w" of step 3. */
	ckpt_load *l;
	ck_assert_int_eq(ckpt_load_open(c, 3, &l), 0);
	struct ckpt_chunk_info ch[8];
	int wi = -1;
	for (int i = 0; i < ckpt_load_count(l); i++) {
		struct ckpt_tensor_info ti;
		ckpt_load_info(l, (unsigned)i, &ti, sizeof ti);
		if (!strcmp(ti.name, "w"))
			wi = i;
	}
	ck_assert_int_eq(ckpt_load_chunks(l, (unsigned)wi, ch, 8, sizeof(struct ckpt_chunk_info)), 3);
	char path[4096], file[256];
	snprintf(path, sizeof path, "%s/%s", root, ch[1].file);
	snprintf(file, sizeof file, "%s", ch[1].file);    /* ch[].file lives until close */
	ck_assert_int_eq(tu_flip_bit(path, ch[1].file_offset + 7, 3), 0);
	ckpt_load_close(l);
	memset(&r, 0, sizeof r);
	r.size = sizeof r;
	int rc = ckpt_catalog_verify(c, 3, NULL, &r);
	ck_assert_int_eq(rc, CKPT_ECORRUPT);
	ck_assert(r.bad && !r.marked);
	ck_assert_str_eq(r.bad_tensor, "w");
	ck_assert_uint_eq(r.bad_chunk, ch[1].chunk);
	ck_assert_uint_eq(r.bad_offset, ch[1].file_offset);
	ck_assert_str_eq(r.bad_file, file);
	ck_assert_msg(strstr(ckpt_last_error(), "step 3") && strstr(ckpt_last_error(), "'w'"),
	              "%s", ckpt_last_error());

	/* Retention: keep the last 2 (3 and 4); step 4 stays whatever the rule says. */
	struct ckpt_gc_opts g;
	ckpt_gc_opts_init(&g, sizeof g);
	g.keep_last = 2;
	g.flags = CKPT_GC_DRY_RUN;
	struct ckpt_gc_result gr = { .size = sizeof gr };
	ck_assert_int_eq(ckpt_catalog_gc(c, &g, &gr), 0);
	ck_assert_uint_eq(gr.steps_removed, 2);
	ck_assert_int_eq(ckpt_steps(c, 0, NULL, 0, sizeof(struct ckpt_step_info)), 4);      /* a dry run removes nothing */
	g.flags = 0;
	ck_assert_int_eq(ckpt_catalog_gc(c, &g, &gr), 0);
	ck_assert(gr.steps_removed == 2 && gr.bytes_freed > 0 && gr.steps_kept == 2);
	struct ckpt_step_info steps[4];
	ck_assert_int_eq(ckpt_steps(c, 0, steps, 4, sizeof *steps), 2);
	ck_assert(steps[0].step == 3 && steps[1].step == 4);
	ckpt_close(c);

	/* Rebuild: lose the manifest; both steps come back committed, data intact. */
	char mdir[4200];
	snprintf(mdir, sizeof mdir, "%s/manifest", root);
	tu_rmtree(mdir);
	/* Opened as usual, the root is refused (GC would have removed both steps). */
	ckpt_ctx *refused = (ckpt_ctx *)1;
	struct ckpt_opts ro;
	ckpt_opts_init(&ro, sizeof ro);
	ro.root = root;
	ro.rank = 0;
	ro.world = 1;
	ck_assert_int_eq(ckpt_open(&ro, &refused), CKPT_ENOMANIFEST);
	ck_assert_ptr_null(refused);
	ck_assert_ptr_nonnull(strstr(ckpt_last_error(), "rebuild"));
	c = open_as(0, 1, CKPT_OPEN_RECOVER);
	struct ckpt_rebuild_result rr = { .size = sizeof rr };
	ck_assert_msg(ckpt_catalog_rebuild(c, 0, NULL, NULL, &rr) == 0, "%s", ckpt_last_error());
	ck_assert(rr.steps_committed == 2 && rr.steps_unproven == 0);
	ck_assert_int_eq(ckpt_catalog_rebuild(c, 0, NULL, NULL, NULL), -EEXIST);
	ck_assert_int_eq(ckpt_load_open(c, 4, &l), 0);
	static float got[ROWS * COLS];
	ck_assert_int_eq(ckpt_load_tensor(l, "w", CKPT_F32, 2, NULL, NULL, got, CKPT_MEM_HOST), 0);
	ck_assert(!memcmp(got, w, sizeof got));
	ckpt_load_close(l);
	/* A read-only context may verify but never gc or rebuild. */
	ckpt_close(c);
	c = open_as(0, 1, CKPT_OPEN_READONLY);
	ck_assert_int_eq(ckpt_catalog_gc(c, NULL, NULL), CKPT_ESTATE);
	ck_assert_int_eq(ckpt_catalog_rebuild(c, CKPT_REBUILD_MERGE, NULL, NULL, NULL), CKPT_ESTATE);
	memset(&r, 0, sizeof r);
	r.size = sizeof r;
	ck_assert_int_eq(ckpt_catalog_verify(c, 4, NULL, &r), 0);
	ck_assert(!r.marked);
	ckpt_close(c);
}
END_TEST

START_TEST(step_dir_removed_beneath_a_save)
{
	/* The save holds between its step directory and its file (a delay fault); the
	 * directory, empty, goes meanwhile, as another process's collection of an
	 * earlier attempt of the step removes it. The save makes it again. */
	setenv("CKPT_FAULT", "after_step_dir:1:delay:1000", 1);
	static float w[ROWS * COLS];
	static int64_t v[5000];
	tu_fill(w, sizeof w, tu_seed(), 70);
	tu_fill(v, sizeof v, tu_seed(), 71);
	ckpt_ctx *c = open_as(0, 1, 0);
	ckpt_save *s;
	ck_assert_int_eq(ckpt_save_begin(c, 7, &s), 0);
	add_w_v(s, w, v);
	ck_assert_int_eq(ckpt_save_submit(s), 0);
	char dir[4200];
	snprintf(dir, sizeof dir, "%s/step-%020u", root, 7u);
	int removed = -1;
	for (int i = 0; i < 80 && removed; i++) {
		usleep(10 * 1000);
		removed = rmdir(dir);
	}
	ck_assert_msg(removed == 0, "the save's step directory %s was never there, or not empty: "
	              "the fault did not hold the save", dir);
	ck_assert_msg(ckpt_save_wait(s, -1) == 0, "%s", ckpt_last_error());
	ckpt_save_free(s);
	ckpt_close(c);
	unsetenv("CKPT_FAULT");
	c = open_as(0, 1, CKPT_OPEN_READONLY);
	ckpt_load *l;
	ck_assert_int_eq(ckpt_load_open(c, 7, &l), 0);
	static float gw[ROWS * COLS];
	static int64_t gv[5000];
	ck_assert_int_eq(ckpt_load_tensor(l, "w", CKPT_F32, 2, NULL, NULL, gw, CKPT_MEM_HOST), 0);
	ck_assert_int_eq(ckpt_load_tensor(l, "opt/v", CKPT_I64, 1, NULL, NULL, gv, CKPT_MEM_HOST), 0);
	ck_assert(!memcmp(gw, w, sizeof w) && !memcmp(gv, v, sizeof v));
	ckpt_load_close(l);
	ckpt_close(c);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("catalog");
	TCase *t = tcase_create("catalog");
	tcase_add_checked_fixture(t, setup, teardown);
	tcase_set_timeout(t, 120);
	tcase_add_test(t, batch_load_and_rank_map);
	tcase_add_test(t, verify_gc_rebuild);
	tcase_add_test(t, step_dir_removed_beneath_a_save);
	suite_add_tcase(s, t);
	return s;
}

int main(void)
{
	tu_seed();
	SRunner *r = srunner_create(suite());
	srunner_run_all(r, CK_NORMAL);
	int failed = srunner_ntests_failed(r);
	srunner_free(r);
	return failed ? 1 : 0;
}
