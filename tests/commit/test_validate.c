/*
 * test_validate.c — commit_validate() and commit_decide() (lib/commit/validate.c,
 * decide.c) on synthetic shard indexes, without any network.
 *
 * Validation must accept every exact tiling (1, 2 and 7 ranks along either dim,
 * 2x2 block grids, uneven splits, empty pieces) and reject, with CKPT_EINVALID and
 * a message that names the tensor and the ranks, every way a gathered index can be
 * wrong: gaps, overlaps, missing ranks, another step or world, inconsistent
 * metadata, replicated items that differ. commit_decide() must commit exactly once
 * in one manifest transaction, record an aborted step on every failure, and obey
 * the fault points around the transaction (the manifest decides). Data comes from
 * the run's seed (CKPT_TEST_SEED).
 */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "synth.h"
#include "testutil.h"

/* ---------------------------------------------------------------- helpers */

/* Encode and decode every rank's index, then validate them (NULL where absent[r]). */
static int validate_synths(struct synth *s, uint32_t world, uint64_t step, const bool *absent)
{
	struct io_shard_index **ix = calloc(world, sizeof *ix);
	for (uint32_t r = 0; r < world; r++) {
		if (absent && absent[r])
			continue;
		void *buf;
		size_t len;
		synth_encode(&s[r], &buf, &len, &ix[r]);
		free(buf);
	}
	ckpt_err_clear();
	int rc = commit_validate((const struct io_shard_index *const *)ix, world, step);
	for (uint32_t r = 0; r < world; r++)
		io_index_free(ix[r]);
	free(ix);
	return rc;
}

static void free_synths(struct synth *s, uint32_t world)
{
	for (uint32_t r = 0; r < world; r++)
		synth_free(&s[r]);
	free(s);
}

/* W+1 sorted cut points of [0, n]: cuts[0] = 0, cuts[W] = n, uneven, and with an
 * empty piece (two equal cuts) whenever W >= 3. */
static void random_cuts(uint64_t n, uint32_t world, uint64_t *seed, uint64_t *cuts)
{
	cuts[0] = 0;
	cuts[world] = n;
	for (uint32_t i = 1; i < world; i++)
		cuts[i] = tu_rand(seed) % (n + 1);
	for (uint32_t i = 1; i < world; i++)          /* insertion sort of cuts[1..W-1] */
		for (uint32_t j = i; j > 1 && cuts[j - 1] > cuts[j]; j--) {
			uint64_t t = cuts[j];
			cuts[j] = cuts[j - 1];
			cuts[j - 1] = t;
		}
	if (world >= 3)
		cuts[2] = cuts[1];
}

static void assert_msg_has(const char *what, const char *const *needles)
{
	const char *msg = ckpt_err_msg();
	for (; *needles; needles++)
		ck_assert_msg(strstr(msg, *needles), "%s: message '%s' lacks '%s'", what, msg,
		              *needles);
}

/* ---------------------------------------------------------------- tilings accepted */

static const uint32_t worlds[] = { 1, 2, 7 };

START_TEST(tiling_along_one_dim)
{
	/* _i: world index x dim (0, 1) x two sizes. */
	uint32_t world = worlds[_i % 3];
	unsigned dim = (unsigned)(_i / 3) % 2;
	uint64_t rows = _i >= 6 ? 1000 : 13, cols = _i >= 6 ? 3 : 11;
	uint64_t seed = tu_seed() + (uint64_t)_i;
	uint64_t cuts[8], cuts1[8];
	random_cuts(dim ? cols : rows, world, &seed, cuts);
	random_cuts(257, world, &seed, cuts1);
	struct synth *s = calloc(world, sizeof *s);
	for (uint32_t r = 0; r < world; r++) {
		synth_typical(&s[r], 42, r, world);
		struct synth_item it = { .name = "m/split", .policy = CKPT_SHARDED, .ndim = 2,
		                         .shape = { rows, cols }, .extent = { rows, cols },
		                         .dtype = CKPT_BF16 };
		it.offset[dim] = cuts[r];
		it.extent[dim] = cuts[r + 1] - cuts[r];
		synth_add(&s[r], &it);
		synth_add(&s[r], &(struct synth_item){ .name = "m/vec", .policy = CKPT_SHARDED,
		          .ndim = 1, .shape = { 257 }, .offset = { cuts1[r] },
		          .extent = { cuts1[r + 1] - cuts1[r] }, .kind = CKPT_KIND_OPTIMIZER });
	}
	int rc = validate_synths(s, world, 42, NULL);
	ck_assert_msg(rc == 0, "W=%u dim %u: %s", world, dim, ckpt_err_msg());
	free_synths(s, world);
}
END_TEST

START_TEST(tiling_2x2_blocks)
{
	/* A 2x2 grid of [10, 6] cut at (row, col); cuts at 0 or the end make empty blocks. */
	static const uint64_t rc_cuts[][2] = { { 3, 4 }, { 5, 1 }, { 0, 4 }, { 10, 0 }, { 0, 0 } };
	for (size_t k = 0; k < CKPT_ARRAY_SIZE(rc_cuts); k++) {
		uint64_t a = rc_cuts[k][0], b = rc_cuts[k][1];
		struct synth *s = calloc(4, sizeof *s);
		for (uint32_t r = 0; r < 4; r++) {
			uint32_t i = r / 2, j = r % 2;
			synth_init(&s[r], 3, r, 4);
			synth_add(&s[r], &(struct synth_item){ .name = "grid", .policy = CKPT_SHARDED,
			          .ndim = 2, .shape = { 10, 6 }, .offset = { i ? a : 0, j ? b : 0 },
			          .extent = { i ? 10 - a : a, j ? 6 - b : b }, .dtype = CKPT_F64 });
		}
		int rc = validate_synths(s, 4, 3, NULL);
		ck_assert_msg(rc == 0, "cut (%llu, %llu): %s", (unsigned long long)a,
		              (unsigned long long)b, ckpt_err_msg());
		free_synths(s, 4);
	}
}
END_TEST

START_TEST(rank_bound_shapes_may_differ)
{
	struct synth s[3];
	for (uint32_t r = 0; r < 3; r++) {
		synth_init(&s[r], 1, r, 3);
		synth_add(&s[r], &(struct synth_item){ .name = "local", .policy = CKPT_RANK_BOUND,
		          .ndim = 2, .shape = { r + 1, 5 - r }, .extent = { r + 1, 5 - r },
		          .content = r + 1 });
	}
	struct io_shard_index *ix[3];
	for (uint32_t r = 0; r < 3; r++) {
		void *buf;
		size_t len;
		synth_encode(&s[r], &buf, &len, &ix[r]);
		free(buf);
	}
	ck_assert_msg(commit_validate((const struct io_shard_index *const *)ix, 3, 1) == 0, "%s",
	              ckpt_err_msg());
	for (uint32_t r = 0; r < 3; r++) {
		io_index_free(ix[r]);
		synth_free(&s[r]);
	}
}
END_TEST

/* ---------------------------------------------------------------- rejections */

enum bad_case {
	BAD_GAP, BAD_OVERLAP, BAD_OVERLAP_2D, BAD_MISSING_RANK, BAD_MISSING_PIECE,
	BAD_OTHER_STEP, BAD_OTHER_WORLD, BAD_WRONG_SLOT, BAD_DTYPE, BAD_KIND, BAD_POLICY,
	BAD_NDIM, BAD_SHAPE, BAD_REPL_HASH, BAD_REPL_LEN, BAD_REPL_PARTIAL, BAD_COUNT_
};

static const struct {
	const char *what;
	const char *needles[4];
} bad_cases[BAD_COUNT_] = {
	[BAD_GAP]           = { "gap",                  { "'w'", "gap", "ranks 0,1,2", NULL } },
	[BAD_OVERLAP]       = { "overlap",              { "'w'", "ranks 0 and 1", "overlap", NULL } },
	[BAD_OVERLAP_2D]    = { "2-D overlap",          { "'blk'", "ranks 1 and 2", "overlap", NULL } },
	[BAD_MISSING_RANK]  = { "missing rank",         { "no vote from rank 1", NULL } },
	[BAD_MISSING_PIECE] = { "rank without a piece", { "'w'", "gap", "ranks 0,1", NULL } },
	[BAD_OTHER_STEP]    = { "another step",         { "rank 2", "step 10", NULL } },
	[BAD_OTHER_WORLD]   = { "another world",        { "rank 2", "of 4", NULL } },
	[BAD_WRONG_SLOT]    = { "index in the wrong slot", { "rank 1", "rank 2 of 3", NULL } },
	[BAD_DTYPE]         = { "dtype",                { "'bias'", "ranks 0 and 1", NULL } },
	[BAD_KIND]          = { "kind",                 { "'w'", "ranks 0 and 2", NULL } },
	[BAD_POLICY]        = { "policy",               { "'bias'", "ranks 0 and 1", NULL } },
	[BAD_NDIM]          = { "ndim",                 { "'bias'", "ranks 0 and 2", NULL } },
	[BAD_SHAPE]         = { "global shape",         { "'w'", "global shape", "ranks 0 and 1", NULL } },
	[BAD_REPL_HASH]     = { "replicated hash",      { "'bias'", "ranks 0 and 2", NULL } },
	[BAD_REPL_LEN]      = { "replicated length",    { "'sched'", "ranks 0 and 1", NULL } },
	[BAD_REPL_PARTIAL]  = { "replicated sub-box",   { "'half'", "rank 0", "whole", NULL } },
};

/* Rank r's index for case k of a 3-rank job at step 9: synth_typical, deviating
 * where case k says. */
static void build_bad(struct synth *s, uint32_t r, enum bad_case k)
{
	const uint32_t W = 3;
	uint64_t step = k == BAD_OTHER_STEP && r == 2 ? 10 : 9;
	uint32_t world = k == BAD_OTHER_WORLD && r == 2 ? 4 : W;
	synth_init(s, step, r, world);
	struct synth_item w = { .name = "w", .policy = CKPT_SHARDED, .ndim = 2,
	                        .shape = { 4ull * W, 3 }, .offset = { 4ull * r, 0 },
	                        .extent = { 4, 3 } };
	if (k == BAD_GAP && r == 1)
		w.extent[0] = 3;
	if (k == BAD_OVERLAP && r == 1)
		w.offset[0] = 3;
	if (k == BAD_KIND && r == 2)
		w.kind = CKPT_KIND_OPTIMIZER;
	if (k == BAD_SHAPE && r == 1)
		w.shape[0] = 13;
	if (!(k == BAD_MISSING_PIECE && r == 2))
		synth_add(s, &w);

	struct synth_item bias = { .name = "bias", .policy = CKPT_REPLICATED, .ndim = 1,
	                           .shape = { 70 }, .extent = { 70 } };
	if (k == BAD_DTYPE && r == 1)
		bias.dtype = CKPT_F16;
	if (k == BAD_POLICY && r == 1)
		bias.policy = CKPT_RANK_BOUND;
	if (k == BAD_NDIM && r == 2) {
		bias.ndim = 2;
		bias.shape[1] = bias.extent[1] = 1;
	}
	if (k == BAD_REPL_HASH && r == 2)
		bias.content = 99;
	synth_add(s, &bias);

	struct synth_item sched = { .name = "sched", .policy = CKPT_REPLICATED, .ndim = 1,
	                            .blob = true, .shape = { 40 }, .extent = { 40 } };
	if (k == BAD_REPL_LEN && r == 1)
		sched.shape[0] = sched.extent[0] = 41;
	synth_add(s, &sched);

	if (k == BAD_OVERLAP_2D) {
		/* [4, 4]: rank 0 rows 0-1; rank 1 rows 2-3 cols 0-1; rank 2 rows 2-3 cols 1-3. */
		static const uint64_t off[3][2] = { { 0, 0 }, { 2, 0 }, { 2, 1 } };
		static const uint64_t ext[3][2] = { { 2, 4 }, { 2, 2 }, { 2, 3 } };
		synth_add(s, &(struct synth_item){ .name = "blk", .policy = CKPT_SHARDED, .ndim = 2,
		          .shape = { 4, 4 }, .offset = { off[r][0], off[r][1] },
		          .extent = { ext[r][0], ext[r][1] } });
	}
	if (k == BAD_REPL_PARTIAL)       /* the same first half everywhere: equal hashes */
		synth_add(s, &(struct synth_item){ .name = "half", .policy = CKPT_REPLICATED,
		          .ndim = 1, .shape = { 8 }, .extent = { 4 } });
}

START_TEST(rejections)
{
	enum bad_case k = (enum bad_case)_i;
	const uint32_t W = 3;
	struct synth *s = calloc(W, sizeof *s);
	for (uint32_t r = 0; r < W; r++)
		build_bad(&s[r], r, k);
	bool absent[3] = { false, k == BAD_MISSING_RANK, false };
	int rc;
	if (k == BAD_WRONG_SLOT) {
		/* Rank 2's (valid) index given in rank 1's slot. */
		synth_free(&s[1]);
		build_bad(&s[1], 2, k);
	}
	rc = validate_synths(s, W, 9, absent);
	ck_assert_msg(rc == CKPT_EINVALID, "%s: rc %d (%s)", bad_cases[k].what, rc, ckpt_err_msg());
	assert_msg_has(bad_cases[k].what, bad_cases[k].needles);
	free_synths(s, W);
}
END_TEST

/* The same errors must be found whichever rank is the odd one: rotate the roles. */
START_TEST(overlap_found_in_any_order)
{
	uint64_t seed = tu_seed();
	for (int round = 0; round < 50; round++) {
		uint32_t world = 2 + (uint32_t)(tu_rand(&seed) % 6);
		uint64_t n = 5 + tu_rand(&seed) % 50, cuts[8];
		random_cuts(n, world, &seed, cuts);
		/* Find a non-empty piece and stretch it by one element into a neighbour. */
		uint32_t victim = world;
		for (uint32_t r = 0; r < world; r++)
			if (cuts[r + 1] > cuts[r] && cuts[r + 1] < n)
				victim = r;
		if (victim == world)
			continue;
		struct synth *s = calloc(world, sizeof *s);
		for (uint32_t r = 0; r < world; r++) {
			synth_init(&s[r], 2, r, world);
			uint64_t off = cuts[r], ext = cuts[r + 1] - cuts[r];
			if (r == victim)
				ext++;
			synth_add(&s[r], &(struct synth_item){ .name = "v", .policy = CKPT_SHARDED,
			          .ndim = 1, .shape = { n }, .offset = { off }, .extent = { ext } });
		}
		int rc = validate_synths(s, world, 2, NULL);
		ck_assert_msg(rc == CKPT_EINVALID && strstr(ckpt_err_msg(), "overlap"),
		              "round %d W=%u victim %u: rc %d (%s)", round, world, victim, rc,
		              ckpt_err_msg());
		free_synths(s, world);
	}
}
END_TEST

/* ---------------------------------------------------------------- commit_decide */

/* The attempt a decision is for: job, step, world (no save id: the synthetic votes
 * name no files, and their indexes carry none). */
#define ID(job_, step_, world_) (&(struct manifest_step){ .job_id = job_, .step = (step_), \
                                                         .world = (world_) })

struct votes {
	uint32_t world;
	void **buf;
	size_t *len;
	struct commit_vote *v;
	uint64_t logical, stored;
	uint32_t distinct;
};

static void votes_make(struct votes *vs, uint64_t step, uint32_t world)
{
	vs->world = world;
	vs->buf = calloc(world, sizeof *vs->buf);
	vs->len = calloc(world, sizeof *vs->len);
	vs->v = calloc(world, sizeof *vs->v);
	vs->logical = vs->stored = 0;
	vs->distinct = 4;   /* w, bias, rng, sched */
	for (uint32_t r = 0; r < world; r++) {
		struct synth s;
		synth_typical(&s, step, r, world);
		for (uint32_t t = 0; t < s.ix.ntensors; t++)
			vs->logical += s.ix.tensors[t].raw_bytes;
		for (uint32_t c = 0; c < s.ix.nchunks; c++)
			vs->stored += s.ix.chunks[c].stored_len;
		synth_encode(&s, &vs->buf[r], &vs->len[r], NULL);
		vs->v[r] = synth_vote(step, r, vs->buf[r], vs->len[r]);
		synth_free(&s);
	}
}

static void votes_free(struct votes *vs)
{
	for (uint32_t r = 0; r < vs->world; r++)
		free(vs->buf[r]);
	free(vs->buf);
	free(vs->len);
	free(vs->v);
}

struct root {
	char *path;
	struct manifest *m;
};

static void root_open(struct root *rt)
{
	rt->path = tu_tmpdir("commit-decide");
	int rc = manifest_open(rt->path, MANIFEST_CREATE, &rt->m);
	ck_assert_msg(rc == 0, "manifest_open: %s", ckpt_err_msg());
}

static void root_close(struct root *rt)
{
	manifest_close(rt->m);
	tu_rmtree(rt->path);
	free(rt->path);
}

static bool in_list(struct manifest *m, bool all, uint64_t step)
{
	uint64_t steps[64];
	int n = manifest_steps_list(m, all, steps, 64);
	ck_assert_int_ge(n, 0);
	for (int i = 0; i < n; i++)
		if (steps[i] == step)
			return true;
	return false;
}

static void assert_aborted(struct manifest *m, uint64_t step)
{
	struct manifest_step rec;
	ck_assert_int_eq(manifest_step_get(m, step, &rec), 0);
	ck_assert_int_eq(rec.state, CKPT_STATE_ABORTED);
	ck_assert(in_list(m, true, step));
	ck_assert(!in_list(m, false, step));
	uint64_t latest = 0;
	int rc = manifest_step_latest(m, &latest);
	ck_assert(rc == CKPT_ENOTFOUND || (rc == 0 && latest != step));
}

START_TEST(decide_commits_once)
{
	struct root rt;
	root_open(&rt);
	struct votes vs;
	votes_make(&vs, 100, 3);
	int rc = commit_decide(rt.m, ID("job-a", 100, 3), &(struct commit_decision){ .votes = vs.v });
	ck_assert_msg(rc == 0, "%s", ckpt_err_msg());

	struct manifest_step rec, again;
	ck_assert_int_eq(manifest_step_get(rt.m, 100, &rec), 0);
	ck_assert_int_eq(rec.state, CKPT_STATE_COMMITTED);
	ck_assert_uint_eq(rec.world, 3);
	ck_assert_uint_eq(rec.ntensors, vs.distinct);
	ck_assert_uint_eq(rec.logical_bytes, vs.logical);
	ck_assert_uint_eq(rec.stored_bytes, vs.stored);
	ck_assert_str_eq(rec.job_id, "job-a");
	uint64_t latest;
	ck_assert_int_eq(manifest_step_latest(rt.m, &latest), 0);
	ck_assert_uint_eq(latest, 100);
	for (uint32_t r = 0; r < 3; r++) {
		struct manifest_shard sh;
		ck_assert_int_eq(manifest_shard_get(rt.m, 100, r, &sh), 0);
		ck_assert_uint_eq(sh.file_size, vs.v[r].file_size);
		/* The record names the footer; the index itself stays in the file. */
		ck_assert_uint_eq(sh.index_len, 0);
		ck_assert_uint_eq(sh.footer_len, vs.len[r]);
		struct io_shard_index *dix;
		ck_assert_int_eq(io_index_decode(vs.buf[r], vs.len[r], &dix), 0);
		ck_assert_uint_eq(sh.footer_offset, dix->data_end);
		io_index_free(dix);
		ck_assert(!memcmp(sh.footer_hash, vs.v[r].footer_hash, CKPT_HASH_BYTES));
		manifest_shard_free(&sh);
	}

	/* Again, with other votes for the same step: -EEXIST and nothing changes. */
	struct votes other;
	votes_make(&other, 100, 3);
	other.v[1].file_size = 5;
	rc = commit_decide(rt.m, ID("job-b", 100, 3), &(struct commit_decision){ .votes = other.v });
	ck_assert_msg(rc == -EEXIST, "rc %d (%s)", rc, ckpt_err_msg());
	ck_assert_int_eq(manifest_step_get(rt.m, 100, &again), 0);
	ck_assert(!memcmp(&rec, &again, sizeof rec));
	struct manifest_shard sh;
	ck_assert_int_eq(manifest_shard_get(rt.m, 100, 1, &sh), 0);
	ck_assert_uint_eq(sh.file_size, vs.v[1].file_size);
	manifest_shard_free(&sh);
	votes_free(&other);
	votes_free(&vs);
	root_close(&rt);
}
END_TEST

START_TEST(decide_invalid_records_abort)
{
	struct root rt;
	root_open(&rt);
	struct votes ok;
	votes_make(&ok, 1, 2);
	ck_assert_int_eq(commit_decide(rt.m, ID("j", 1, 2), &(struct commit_decision){ .votes = ok.v }), 0);

	/* Step 2: rank 1's replicated 'bias' differs. */
	struct synth s[2];
	void *buf[2];
	size_t len[2];
	struct commit_vote v[2];
	for (uint32_t r = 0; r < 2; r++) {
		synth_init(&s[r], 2, r, 2);
		synth_add(&s[r], &(struct synth_item){ .name = "bias", .policy = CKPT_REPLICATED,
		          .ndim = 1, .shape = { 9 }, .extent = { 9 }, .content = r + 1 });
		synth_encode(&s[r], &buf[r], &len[r], NULL);
		v[r] = synth_vote(2, r, buf[r], len[r]);
	}
	int rc = commit_decide(rt.m, ID("j", 2, 2), &(struct commit_decision){ .votes = v });
	ck_assert_msg(rc == CKPT_EINVALID, "rc %d (%s)", rc, ckpt_err_msg());
	ck_assert(strstr(ckpt_err_msg(), "'bias'"));
	assert_aborted(rt.m, 2);
	uint64_t latest;
	ck_assert_int_eq(manifest_step_latest(rt.m, &latest), 0);
	ck_assert_uint_eq(latest, 1);

	/* A vote in the wrong slot (rank 0's vote claims rank 1). */
	struct commit_vote swapped[2] = { v[1], v[0] };
	ck_assert_int_eq(commit_decide(rt.m, ID("j", 2, 2), &(struct commit_decision){ .votes = swapped }), CKPT_EINVALID);
	assert_aborted(rt.m, 2);

	/* An aborted step may be saved again, and then commits. */
	struct votes retry;
	votes_make(&retry, 2, 2);
	rc = commit_decide(rt.m, ID("j", 2, 2), &(struct commit_decision){ .votes = retry.v });
	ck_assert_msg(rc == 0, "%s", ckpt_err_msg());
	ck_assert(in_list(rt.m, false, 2));
	votes_free(&retry);
	for (uint32_t r = 0; r < 2; r++) {
		synth_free(&s[r]);
		free(buf[r]);
	}
	votes_free(&ok);
	root_close(&rt);
}
END_TEST

START_TEST(decide_garbage_index)
{
	struct root rt;
	root_open(&rt);
	struct votes vs;
	votes_make(&vs, 7, 3);
	uint64_t seed = tu_seed();
	uint8_t garbage[300];
	tu_fill(garbage, sizeof garbage, seed, 7);
	vs.v[2].index = garbage;
	vs.v[2].index_len = sizeof garbage;
	int rc = commit_decide(rt.m, ID("j", 7, 3), &(struct commit_decision){ .votes = vs.v });
	ck_assert_msg(rc == CKPT_EFORMAT, "rc %d (%s)", rc, ckpt_err_msg());
	ck_assert_msg(strstr(ckpt_err_msg(), "rank 2"), "%s", ckpt_err_msg());
	assert_aborted(rt.m, 7);
	/* A truncated valid index, too. */
	vs.v[2].index = vs.buf[2];
	vs.v[2].index_len = vs.len[2] - 1;
	ck_assert_int_eq(commit_decide(rt.m, ID("j", 7, 3), &(struct commit_decision){ .votes = vs.v }), CKPT_EFORMAT);
	assert_aborted(rt.m, 7);
	votes_free(&vs);
	root_close(&rt);
}
END_TEST

static void fault_arm(const char *spec)
{
	if (spec)
		setenv("CKPT_FAULT", spec, 1);
	else
		unsetenv("CKPT_FAULT");
	ckpt_fault_reload();
}

START_TEST(decide_fault_before_txn)
{
	struct root rt;
	root_open(&rt);
	struct votes vs;
	votes_make(&vs, 5, 2);
	fault_arm("coord_before_commit_txn:eio");
	int rc = commit_decide(rt.m, ID("j", 5, 2), &(struct commit_decision){ .votes = vs.v });
	fault_arm(NULL);
	ck_assert_msg(rc == -EIO, "rc %d (%s)", rc, ckpt_err_msg());
	ck_assert_msg(strstr(ckpt_err_msg(), "coord_before_commit_txn"), "%s", ckpt_err_msg());
	assert_aborted(rt.m, 5);
	votes_free(&vs);
	root_close(&rt);
}
END_TEST

START_TEST(decide_fault_after_txn)
{
	struct root rt;
	root_open(&rt);
	struct votes vs;
	votes_make(&vs, 6, 2);
	fault_arm("coord_after_commit_txn:eio");
	int rc = commit_decide(rt.m, ID("j", 6, 2), &(struct commit_decision){ .votes = vs.v });
	fault_arm(NULL);
	ck_assert_msg(rc == -EIO, "rc %d (%s)", rc, ckpt_err_msg());
	/* The transaction had committed: the manifest decides, the step is visible. */
	struct manifest_step rec;
	ck_assert_int_eq(manifest_step_get(rt.m, 6, &rec), 0);
	ck_assert_int_eq(rec.state, CKPT_STATE_COMMITTED);
	ck_assert(in_list(rt.m, false, 6));
	votes_free(&vs);
	root_close(&rt);
}
END_TEST

/* The callers that own a decision (the coordinator, a rank alone) let the manifest
 * decide: the same fault after the transaction is a commit for them. */
START_TEST(decide_fault_after_txn_manifest_decides)
{
	struct root rt;
	root_open(&rt);
	struct votes vs;
	votes_make(&vs, 8, 2);
	fault_arm("coord_after_commit_txn:eio");
	int rc = commit_decide(rt.m, ID("j", 8, 2),
	                       &(struct commit_decision){ .votes = vs.v, .trust_manifest = true });
	fault_arm(NULL);
	ck_assert_msg(rc == 0, "rc %d (%s)", rc, ckpt_err_msg());
	ck_assert_msg(strstr(ckpt_err_msg(), "coord_after_commit_txn"), "%s", ckpt_err_msg());
	ck_assert(in_list(rt.m, false, 8));
	/* Before the transaction, nothing is committed: the failure stands. */
	votes_free(&vs);
	votes_make(&vs, 9, 2);
	fault_arm("coord_before_commit_txn:eio");
	rc = commit_decide(rt.m, ID("j", 9, 2),
	                   &(struct commit_decision){ .votes = vs.v, .trust_manifest = true });
	fault_arm(NULL);
	ck_assert_msg(rc == -EIO, "rc %d (%s)", rc, ckpt_err_msg());
	ck_assert_msg(strstr(ckpt_err_msg(), "coord_before_commit_txn"), "%s", ckpt_err_msg());
	assert_aborted(rt.m, 9);
	votes_free(&vs);
	root_close(&rt);
}
END_TEST

/* An abort records the attempt's end and keeps the caller's message; a committed
 * step is left committed; a decision without votes is refused and records nothing. */
START_TEST(decide_abort_and_no_votes)
{
	struct root rt;
	root_open(&rt);
	ckpt_err(-EIO, "the caller's own failure");
	ck_assert_int_eq(commit_decide(rt.m, ID("j", 3, 2),
	                               &(struct commit_decision){ .abort = true, .why = "rank 1 failed" }),
	                 CKPT_EABORTED);
	ck_assert_msg(strstr(ckpt_err_msg(), "the caller's own failure"), "%s", ckpt_err_msg());
	assert_aborted(rt.m, 3);

	struct votes vs;
	votes_make(&vs, 4, 2);
	ck_assert_int_eq(commit_decide(rt.m, ID("j", 4, 2), &(struct commit_decision){ .votes = vs.v }),
	                 0);
	ck_assert_int_eq(commit_decide(rt.m, ID("j", 4, 2),
	                               &(struct commit_decision){ .abort = true, .why = "late" }),
	                 CKPT_EABORTED);
	struct manifest_step rec;
	ck_assert_int_eq(manifest_step_get(rt.m, 4, &rec), 0);
	ck_assert_int_eq(rec.state, CKPT_STATE_COMMITTED);

	ck_assert_int_eq(commit_decide(rt.m, ID("j", 5, 2), &(struct commit_decision){ .why = "x" }),
	                 -EINVAL);
	ck_assert_int_eq(manifest_step_get(rt.m, 5, &rec), CKPT_ENOTFOUND);
	votes_free(&vs);
	root_close(&rt);
}
END_TEST

/* ---------------------------------------------------------------- scale */

START_TEST(validate_256_ranks_100_tensors)
{
	/* 256 ranks x 100 tensors: 60 sharded along dim 0, 10 along dim 1 (the
	 * sweep's worst case), 20 replicated, 10 rank-bound. No timing asserted. */
	const uint32_t W = 256;
	struct io_shard_index **ix = calloc(W, sizeof *ix);
	struct synth s;
	char name[32];
	for (uint32_t r = 0; r < W; r++) {
		synth_init(&s, 77, r, W);
		for (unsigned t = 0; t < 100; t++) {
			snprintf(name, sizeof name, "layer.%u", t);
			struct synth_item it = { .name = name, .ndim = 2 };
			if (t < 60) {
				it.policy = CKPT_SHARDED;
				it.shape[0] = 2ull * W, it.shape[1] = 4;
				it.offset[0] = 2ull * r, it.extent[0] = 2, it.extent[1] = 4;
			} else if (t < 70) {
				it.policy = CKPT_SHARDED;
				it.shape[0] = 3, it.shape[1] = W;
				it.offset[1] = r, it.extent[0] = 3, it.extent[1] = 1;
			} else if (t < 90) {
				it.policy = CKPT_REPLICATED;
				it.shape[0] = it.extent[0] = 8, it.shape[1] = it.extent[1] = 2;
			} else {
				it.policy = CKPT_RANK_BOUND;
				it.shape[0] = it.extent[0] = 1 + r % 3, it.shape[1] = it.extent[1] = 2;
				it.content = r + 1;
			}
			synth_add(&s, &it);
		}
		void *buf;
		size_t len;
		synth_encode(&s, &buf, &len, &ix[r]);
		free(buf);
		synth_free(&s);
	}
	uint64_t t0 = ckpt_now_ns();
	int rc = commit_validate((const struct io_shard_index *const *)ix, W, 77);
	printf("validate W=256 x 100 tensors: %.1f ms\n", (double)(ckpt_now_ns() - t0) / 1e6);
	ck_assert_msg(rc == 0, "%s", ckpt_err_msg());
	/* And one wrong piece among 25600 is still found. */
	((struct io_tensor_entry *)&ix[200]->tensors[5])->offset[0] = 2ull * 199;
	ck_assert_int_eq(commit_validate((const struct io_shard_index *const *)ix, W, 77),
	                 CKPT_EINVALID);
	ck_assert_msg(strstr(ckpt_err_msg(), "ranks 199 and 200"), "%s", ckpt_err_msg());
	for (uint32_t r = 0; r < W; r++)
		io_index_free(ix[r]);
	free(ix);
}
END_TEST

int main(void)
{
	tu_seed();
	ckpt_fault_reload();
	Suite *s = suite_create("commit_validate");
	TCase *tc = tcase_create("validate");
	tcase_set_timeout(tc, 120);
	tcase_add_loop_test(tc, tiling_along_one_dim, 0, 12);
	tcase_add_test(tc, tiling_2x2_blocks);
	tcase_add_test(tc, rank_bound_shapes_may_differ);
	tcase_add_loop_test(tc, rejections, 0, BAD_COUNT_);
	tcase_add_test(tc, overlap_found_in_any_order);
	tcase_add_test(tc, validate_256_ranks_100_tensors);
	suite_add_tcase(s, tc);
	TCase *dc = tcase_create("decide");
	tcase_set_timeout(dc, 120);
	tcase_add_test(dc, decide_commits_once);
	tcase_add_test(dc, decide_invalid_records_abort);
	tcase_add_test(dc, decide_garbage_index);
	tcase_add_test(dc, decide_fault_before_txn);
	tcase_add_test(dc, decide_fault_after_txn);
	tcase_add_test(dc, decide_fault_after_txn_manifest_decides);
	tcase_add_test(dc, decide_abort_and_no_votes);
	suite_add_tcase(s, dc);
	SRunner *sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
