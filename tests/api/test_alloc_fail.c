/*
 * test_alloc_fail.c — the allocation-failure loop (CONTRIBUTING.md), as SQLite runs
 * it: for N = 1, 2, ... the Nth allocation libckpt makes during a piece of work
 * fails (lib/base/alloc.c, ckpt_fault_alloc_arm), until the work completes without
 * reaching N (ckpt_fault_alloc_count says). The pieces of work, each from ckpt_open
 * to ckpt_close:
 *
 *   save_raw, save_zstd   a single-rank save of step k (a tensor of a few chunks,
 *                         a replicated one, two blobs) over the committed step k-1;
 *   load_rw, load_ro      the open of committed steps (raw, zstd, and one of three
 *                         ranks) and every kind of read, in a read-write and in a
 *                         read-only context;
 *   commit_flat,          a save of step k by a world of 3 ranks in this process (a
 *   commit_tree           context per rank, each saving on a thread of its own; rank
 *                         0's runs the coordinator), every rank joining the
 *                         coordinator, or through node leaders (nodes of 2 ranks).
 *
 * After each run: every call returned 0 or a clean error (a negative code with a
 * message), never a crash, nor a hang (nor a wait cut short by the commit timeout:
 * every peer lives in this process); no block of libckpt's is left allocated (the
 * wrappers' count, in every build; LeakSanitizer sees the rest in the ASan build);
 * and nothing is half-visible: the step is committed and loads bit-exact, or is
 * invisible; the previous committed step loads bit-exact; no rank was told
 * "committed" (0) about a step that is not, and none anything but 0 or "in doubt"
 * about one that is (docs/protocol.md §2.4, §2.5); the root, reopened, takes the
 * next save.
 *
 * Every N runs in every build: the time goes to fdatasync and to the network, not to
 * instrumentation, so the ASan build costs little more than the release one (some
 * 35 s and 90 s on two cores). To reproduce one run:
 * CKPT_TEST_ALLOC_N=<n> CK_RUN_CASE=<case>; CKPT_TEST_ALLOC_VERBOSE=1 prints every
 * run's outcome; CKPT_TEST_ALLOC_STRIDE=<s> takes every s-th N.
 */
#include <check.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/ckpt.h"
#include "ckpt_internal.h"
#include "testutil.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#define LEAK_REPORT() __lsan_do_recoverable_leak_check()
#else
#define LEAK_REPORT() 0
#endif

#define MAX_N    100000u   /* a guard: a loop that never ends is a failure */

#define CHUNK    8192u
#define ROWS     32u       /* rows of "w" per rank: 2 chunks of f32 */
#define COLS     128u
#define VLEN     300u      /* "opt/v": i64, replicated */
#define SCHED    24u
#define RNG      100u
#define WORLD    3u
#define TMO_MS   2000u     /* the commit timeout (see expect_clean, commit_loop) */

static char *root;
static char where[96];     /* the run being checked, for every message */

#if !defined(__SANITIZE_ADDRESS__)   /* AddressSanitizer's own handler says more */
/* A crash names the run it happened in (Check reports only the signal). */
static void on_fatal(int sig)
{
	char line[160];
	int n = snprintf(line, sizeof line, "test_alloc_fail: signal %d during: %s\n", sig, where);
	ssize_t w = write(2, line, n > 0 ? (size_t)n : 0);
	(void)w;
	signal(sig, SIG_DFL);
	raise(sig);
}
#endif

static void setup(void)
{
#if !defined(__SANITIZE_ADDRESS__)
	signal(SIGSEGV, on_fatal);
	signal(SIGBUS, on_fatal);
	signal(SIGABRT, on_fatal);
#endif
	root = tu_tmpdir("allocfail");
	unsetenv("CKPT_FAULT");
	unsetenv("CKPT_FAULT_RANK");
	unsetenv("RANK");
	unsetenv("WORLD_SIZE");
	ckpt_fault_reload();
}

static void teardown(void)
{
	ckpt_fault_alloc_arm(0);
	tu_rmtree(root);
	free(root);
	root = NULL;
}

/* ------------------------------------------------------------------ a step's state */

struct step_data {
	uint64_t step;
	uint32_t world;
	uint8_t *w;              /* [world * ROWS, COLS] f32: rank r holds rows r*ROWS.. */
	uint8_t  v[VLEN * 8];    /* replicated */
	uint8_t  sched[SCHED];   /* replicated blob */
	uint8_t  rng[WORLD][RNG];/* rank-bound blob */
};

/* Contents depend on the step, so that a load of the wrong step is caught; "w" is
 * compressible, so that zstd stores it compressed. */
static void step_make(struct step_data *d, uint64_t step, uint32_t world)
{
	size_t wb = (size_t)world * ROWS * COLS * 4;
	d->step = step;
	d->world = world;
	d->w = malloc(wb);
	ck_assert_ptr_nonnull(d->w);
	tu_fill(d->w, wb, tu_seed(), step * 8 + 1);
	for (size_t i = 0; i < wb; i++)
		d->w[i] &= 0x03;
	tu_fill(d->v, sizeof d->v, tu_seed(), step * 8 + 2);
	tu_fill(d->sched, sizeof d->sched, tu_seed(), step * 8 + 3);
	for (uint32_t r = 0; r < WORLD; r++)
		tu_fill(d->rng[r], RNG, tu_seed(), step * 8 + 4 + r);
}

static void step_free(struct step_data *d)
{
	free(d->w);
	d->w = NULL;
}

/* ------------------------------------------------------------------ outcomes */

/* Return codes seen, and how often. */
struct tally {
	int  code[32];
	unsigned count[32];
	unsigned n;
};

static void tally_add(struct tally *t, int rc)
{
	for (unsigned i = 0; i < t->n; i++)
		if (t->code[i] == rc) {
			t->count[i]++;
			return;
		}
	if (t->n < CKPT_ARRAY_SIZE(t->code)) {
		t->code[t->n] = rc;
		t->count[t->n++] = 1;
	}
}

static void tally_print(const struct tally *t, const char *what)
{
	printf("  %s:", what);
	for (unsigned i = 0; i < t->n; i++)
		printf(" %d (%s) x%u%s", t->code[i], t->code[i] ? ckpt_strerror(t->code[i]) : "ok",
		       t->count[i], i + 1 < t->n ? "," : "");
	printf("\n");
}

/* Did a wait run into the commit timeout? */
static bool timed_out(int rc, const char *msg)
{
	return rc == -ETIMEDOUT || strstr(msg, "timed out") || strstr(msg, "timeout");
}

/* rc is 0, or a clean error: negative, a known code, and a message. Never a
 * timeout: every peer lives in this process, so a wait that ran into the commit
 * timeout waited for a part that had stopped answering (a hang, cut short). The
 * commit loop has the one exception (commit_loop), and checks it itself. */
static void expect_clean_wait(int rc, const char *msg, const char *call, bool may_time_out)
{
	if (!rc)
		return;
	ck_assert_msg(rc < 0, "%s: %s returned %d", where, call, rc);
	ck_assert_msg(may_time_out || !timed_out(rc, msg), "%s: %s waited until the timeout: %s",
	              where, call, msg);
	ck_assert_msg(strcmp(ckpt_strerror(rc), "unknown error"), "%s: %s returned unknown code %d",
	              where, call, rc);
	ck_assert_msg(msg && msg[0], "%s: %s returned %d (%s) with no message", where, call, rc,
	              ckpt_strerror(rc));
}

static void expect_clean(int rc, const char *msg, const char *call)
{
	expect_clean_wait(rc, msg, call, false);
}

/* ------------------------------------------------------------------ contexts */

/* 0 or ckpt_open's clean error (its message in msg). */
static int ctx_try_open(uint32_t rank, uint32_t world, unsigned flags, int zstd, unsigned port,
                        ckpt_ctx **out, char *msg, size_t cap)
{
	struct ckpt_opts o;
	ckpt_opts_init(&o, sizeof o);
	o.root = root;
	o.rank = (int)rank;
	o.world = (int)world;
	o.flags = flags;
	o.chunk_bytes = CHUNK;
	o.pool_bytes = 16 * CHUNK;
	o.zstd_level = zstd;
	o.coord_addr = "127.0.0.1";
	o.coord_port = port;
	o.job_id = "allocfail";
	o.secret = "allocfail-job-secret";
	o.secret_len = strlen(o.secret);
	o.timeout_ms = TMO_MS;
	int rc = ckpt_open(&o, out);
	snprintf(msg, cap, "%s", rc ? ckpt_last_error() : "");
	expect_clean(rc, msg, "ckpt_open");
	ck_assert_msg(!rc == !!*out, "%s: ckpt_open returned %d and %s handle", where, rc,
	              *out ? "a" : "no");
	return rc;
}

static ckpt_ctx *ctx_open(uint32_t rank, uint32_t world, unsigned flags, int zstd,
                          unsigned port)
{
	ckpt_ctx *c = NULL;
	char msg[1024];
	int rc = ctx_try_open(rank, world, flags, zstd, port, &c, msg, sizeof msg);
	ck_assert_msg(rc == 0, "%s: open as rank %u of %u: %s", where, rank, world, msg);
	return c;
}

/* ------------------------------------------------------------------ save and check */

struct save_out {
	int  rc;
	char msg[1024];
	bool skipped;            /* the rank did not save: another could not open */
};

/* Rank's part of d: its rows of "w", "opt/v", "sched", and its "rng". */
static void rank_save(ckpt_ctx *c, const struct step_data *d, uint32_t rank,
                      struct save_out *out)
{
	uint64_t ws[2] = { (uint64_t)d->world * ROWS, COLS }, off[2] = { (uint64_t)rank * ROWS, 0 };
	uint64_t ext[2] = { ROWS, COLS }, vs[1] = { VLEN };
	struct ckpt_tensor tw = {
		.name = "w", .kind = CKPT_KIND_MODEL, .dtype = CKPT_F32, .policy = CKPT_SHARDED,
		.ndim = 2, .global_shape = ws, .offset = off, .extent = ext,
		.data = d->w + (size_t)rank * ROWS * COLS * 4, .mem = CKPT_MEM_HOST,
	};
	struct ckpt_tensor tv = {
		.name = "opt/v", .kind = CKPT_KIND_OPTIMIZER, .dtype = CKPT_I64,
		.policy = CKPT_REPLICATED, .ndim = 1, .global_shape = vs, .data = d->v,
		.mem = CKPT_MEM_HOST,
	};
	ckpt_save *s = NULL;
	const char *call = "ckpt_save_begin";
	int rc = ckpt_save_begin(c, d->step, &s);
	if (!rc && (rc = ckpt_save_add_tensor(s, &tw)))
		call = "ckpt_save_add_tensor";
	if (!rc && (rc = ckpt_save_add_tensor(s, &tv)))
		call = "ckpt_save_add_tensor";
	if (!rc && (rc = ckpt_save_add_blob(s, "sched", CKPT_KIND_SCHEDULER, CKPT_REPLICATED,
	                                    d->sched, SCHED)))
		call = "ckpt_save_add_blob";
	if (!rc && (rc = ckpt_save_add_blob(s, "rng", CKPT_KIND_RNG, CKPT_RANK_BOUND, d->rng[rank],
	                                    RNG)))
		call = "ckpt_save_add_blob";
	if (!rc && (rc = ckpt_save_submit(s)))
		call = "ckpt_save_submit";
	if (!rc) {
		/* A guard against hangs only: every outcome comes far sooner. */
		rc = ckpt_save_wait(s, 60000);
		call = "ckpt_save_wait";
		ck_assert_msg(rc != -ETIMEDOUT, "%s: rank %u: the save of step %" PRIu64 " hangs: %s",
		              where, rank, d->step, ckpt_last_error());
	}
	const char *err = rc ? ckpt_last_error() : "";
	expect_clean_wait(rc, err, call, d->world > 1);
	out->rc = rc;
	snprintf(out->msg, sizeof out->msg, "%s: %s", call, rc ? err : "0");
	ckpt_save_free(s);
}

/* Is step committed? A clean answer either way, and nothing in between. */
static bool step_visible(ckpt_ctx *c, uint64_t step)
{
	ckpt_load *l = NULL;
	int rc = ckpt_load_open(c, step, &l);
	ck_assert_msg(rc == 0 || rc == CKPT_ENOTFOUND, "%s: open step %" PRIu64 ": %d %s", where,
	              step, rc, ckpt_last_error());
	ckpt_load_close(l);
	struct ckpt_step_info info;
	int irc = ckpt_step_info(c, step, &info, sizeof info);
	ck_assert_msg(rc ? irc == CKPT_ENOTFOUND || (irc == 0 && info.state != CKPT_STATE_COMMITTED)
	                 : irc == 0 && info.state == CKPT_STATE_COMMITTED,
	              "%s: step %" PRIu64 ": load_open %d, step_info %d (state %d)", where, step,
	              rc, irc, irc ? 0 : info.state);
	return rc == 0;
}

/* Every item of step d loads bit-exact (c may be of any rank and world). */
static void step_check(ckpt_ctx *c, const struct step_data *d)
{
	ckpt_load *l = NULL;
	ck_assert_msg(ckpt_load_open(c, d->step, &l) == 0, "%s: step %" PRIu64 ": %s", where,
	              d->step, ckpt_last_error());
	size_t wb = (size_t)d->world * ROWS * COLS * 4;
	uint8_t *got = malloc(wb);
	ck_assert_ptr_nonnull(got);
	ck_assert_msg(ckpt_load_tensor(l, "w", CKPT_F32, 2, NULL, NULL, got, CKPT_MEM_HOST) == 0,
	              "%s: step %" PRIu64 " w: %s", where, d->step, ckpt_last_error());
	ck_assert_msg(!memcmp(got, d->w, wb), "%s: step %" PRIu64 ": w differs", where, d->step);
	uint8_t v[sizeof d->v];
	ck_assert_msg(ckpt_load_tensor(l, "opt/v", CKPT_I64, 1, NULL, NULL, v, CKPT_MEM_HOST) == 0,
	              "%s: step %" PRIu64 " opt/v: %s", where, d->step, ckpt_last_error());
	ck_assert_msg(!memcmp(v, d->v, sizeof v), "%s: step %" PRIu64 ": opt/v differs", where,
	              d->step);
	uint8_t b[RNG + 1];
	size_t len = 0;
	ck_assert_int_eq(ckpt_load_blob(l, "sched", b, sizeof b, &len), 0);
	ck_assert_msg(len == SCHED && !memcmp(b, d->sched, SCHED), "%s: sched differs", where);
	for (uint32_t r = 0; r < d->world; r++) {
		ck_assert_int_eq(ckpt_load_blob_rank(l, "rng", (int)r, b, sizeof b, &len), 0);
		ck_assert_msg(len == RNG && !memcmp(b, d->rng[r], RNG), "%s: rng of rank %u differs",
		              where, r);
	}
	ckpt_load_close(l);
	free(got);
}

/* ------------------------------------------------------------------ the loop */

/* Arm the Nth allocation; after the work, whether it was reached. */
static void arm(uint64_t n)
{
	ckpt_fault_alloc_arm(n);
}

static bool disarm(uint64_t n, uint64_t *count)
{
	*count = ckpt_fault_alloc_count();
	ckpt_fault_alloc_arm(0);
	return *count >= n;
}

static void expect_no_leak(int64_t live0)
{
	int64_t live = ckpt_fault_alloc_live();
	if (live != live0)
		(void)LEAK_REPORT();   /* where the block came from, under LeakSanitizer */
	ck_assert_msg(live == live0, "%s: %" PRId64 " block(s) of libckpt's leaked", where,
	              live - live0);
}

/* Which N a loop runs: 1, 2, ...; every stride-th with CKPT_TEST_ALLOC_STRIDE (from
 * an offset that changes with the seed); one alone with CKPT_TEST_ALLOC_N. */
struct loop {
	uint64_t first, stride;
	bool     one;
	bool     verbose;
};

static struct loop loop_conf(void)
{
	const char *e;
	struct loop lp = { .first = 1, .stride = 1 };
	if ((e = getenv("CKPT_TEST_ALLOC_STRIDE")) && strtoull(e, NULL, 10) > 0)
		lp.stride = strtoull(e, NULL, 10);
	if (lp.stride > 1)
		lp.first = 1 + tu_seed() % lp.stride;
	if ((e = getenv("CKPT_TEST_ALLOC_N")) && strtoull(e, NULL, 10) > 0) {
		lp.first = strtoull(e, NULL, 10);
		lp.one = true;
	}
	lp.verbose = (e = getenv("CKPT_TEST_ALLOC_VERBOSE")) && strcmp(e, "0");
	return lp;
}

/* The loop ends at the first run the failure did not reach (or after the one). */
static bool loop_done(const struct loop *lp, bool fired)
{
	return !fired || lp->one;
}

static void loop_log(const struct loop *lp, uint64_t t0, const char *fmt, ...)
	CKPT_PRINTF(3, 4);
static void loop_log(const struct loop *lp, uint64_t t0, const char *fmt, ...)
{
	if (!lp->verbose)
		return;
	char line[4096];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(line, sizeof line, fmt, ap);
	va_end(ap);
	fprintf(stderr, "%s (%.0f ms): %s\n", where, (double)(ckpt_now_ns() - t0) / 1e6, line);
}

/* Save loop: single rank, zstd off or on, each N saving the step after the last
 * committed one. */
static void save_loop(int zstd)
{
	uint64_t prev = 1;
	struct step_data cur, last;
	step_make(&last, prev, 1);
	ckpt_ctx *c = ctx_open(0, 1, 0, zstd, 0);
	struct save_out o;
	snprintf(where, sizeof where, "save zstd=%d, unarmed", zstd);
	rank_save(c, &last, 0, &o);
	ck_assert_int_eq(o.rc, 0);
	ckpt_close(c);
	struct tally t = { .n = 0 };
	struct loop lp = loop_conf();
	uint64_t n, count = 0, runs = 0;
	for (n = lp.first; n < MAX_N; n += lp.stride) {
		snprintf(where, sizeof where, "save zstd=%d, allocation %" PRIu64 " fails", zstd, n);
		step_make(&cur, prev + 1, 1);
		uint64_t t0 = ckpt_now_ns();
		int64_t live0 = ckpt_fault_alloc_live();
		arm(n);
		c = NULL;
		o.rc = ctx_try_open(0, 1, 0, zstd, 0, &c, o.msg, sizeof o.msg);
		if (!o.rc)
			rank_save(c, &cur, 0, &o);
		ckpt_close(c);
		bool fired = disarm(n, &count);
		loop_log(&lp, t0, "%d %s", o.rc, o.msg);
		expect_no_leak(live0);
		runs++;
		tally_add(&t, o.rc);
		ck_assert_msg(fired || o.rc == 0, "%s: %d (%s) without the failure", where, o.rc,
		              o.msg);
		c = ctx_open(0, 1, CKPT_OPEN_READONLY, 0, 0);
		bool vis = step_visible(c, cur.step);
		ck_assert_msg(vis == (o.rc == 0), "%s: save returned %d (%s) and the step is %s",
		              where, o.rc, o.msg, vis ? "committed" : "not committed");
		step_check(c, &last);
		if (vis)
			step_check(c, &cur);
		ckpt_close(c);
		if (vis) {
			step_free(&last);
			last = cur;
			prev = cur.step;
		} else {
			step_free(&cur);
		}
		if (loop_done(&lp, fired))
			break;
	}
	ck_assert_msg(n < MAX_N, "save: the loop did not end");
	printf("alloc_fail save zstd=%d: %" PRIu64 " runs (N = %" PRIu64 "..%" PRIu64 " by %" PRIu64
	       "; open, save and close make %" PRIu64 " allocations)\n", zstd, runs, lp.first, n,
	       lp.stride, count);
	tally_print(&t, "save returned");
	/* The root takes the next save. */
	snprintf(where, sizeof where, "save zstd=%d, after the loop", zstd);
	step_make(&cur, prev + 1, 1);
	c = ctx_open(0, 1, 0, zstd, 0);
	rank_save(c, &cur, 0, &o);
	ck_assert_msg(o.rc == 0, "%s: %s", where, o.msg);
	step_check(c, &cur);
	ckpt_close(c);
	step_free(&cur);
	step_free(&last);
}

START_TEST(save_raw)
{
	save_loop(0);
}
END_TEST

START_TEST(save_zstd)
{
	save_loop(3);
}
END_TEST

/* ------------------------------------------------------------------ a world in this process */

struct rank_job {
	ckpt_ctx *c;
	const struct step_data *d;
	uint32_t rank;
	struct save_out out;
	pthread_t th;
};

/* A rank whose save fails leaves the job, as a training process that gets an error
 * would: the others then learn it at once from its departure, instead of at the vote
 * timeout (a rank that did not begin is, to them, a slow one). */
static void *rank_main(void *arg)
{
	struct rank_job *j = arg;
	rank_save(j->c, j->d, j->rank, &j->out);
	if (j->out.rc) {
		ckpt_close(j->c);
		j->c = NULL;
	}
	return NULL;
}

/* Every open rank of c saves its part of d, each on a thread of its own; c[r] is
 * NULL after if the rank left. */
static void world_save(ckpt_ctx **c, struct rank_job *j, const struct step_data *d)
{
	for (uint32_t r = 0; r < WORLD; r++) {
		if (!c[r])
			continue;
		j[r].c = c[r];
		j[r].d = d;
		j[r].rank = r;
		ck_assert_int_eq(pthread_create(&j[r].th, NULL, rank_main, &j[r]), 0);
	}
	for (uint32_t r = 0; r < WORLD; r++) {
		if (!c[r])
			continue;
		pthread_join(j[r].th, NULL);
		c[r] = j[r].c;
	}
}

/* Open the world: rank 0 (and its coordinator) first. */
static void world_open(ckpt_ctx **c, unsigned port, int zstd)
{
	for (uint32_t r = 0; r < WORLD; r++)
		c[r] = ctx_open(r, WORLD, 0, zstd, port);
}

static void world_close(ckpt_ctx **c)
{
	for (uint32_t r = WORLD; r-- > 0;) {
		ckpt_close(c[r]);
		c[r] = NULL;
	}
}

/* ------------------------------------------------------------------ the load loop */

/* Every kind of read of step d, each 0 and bit-exact or a clean error. */
static void load_all(ckpt_ctx *c, const struct step_data *d, struct tally *t)
{
	ckpt_load *l = NULL;
	int rc = ckpt_load_open(c, d->step, &l);
	tally_add(t, rc);
	expect_clean(rc, ckpt_last_error(), "ckpt_load_open");
	if (rc) {
		ck_assert_ptr_null(l);
		return;
	}
	ck_assert_uint_eq(ckpt_load_step(l), d->step);
	size_t wb = (size_t)d->world * ROWS * COLS * 4;
	uint8_t *got = malloc(wb);
	ck_assert_ptr_nonnull(got);
	memset(got, 0x5A, wb);
	rc = ckpt_load_tensor(l, "w", CKPT_F32, 2, NULL, NULL, got, CKPT_MEM_HOST);
	tally_add(t, rc);
	expect_clean(rc, ckpt_last_error(), "ckpt_load_tensor");
	ck_assert_msg(rc || !memcmp(got, d->w, wb), "%s: w differs", where);
	/* A batch: a slice of w across its chunks (and, saved by several ranks, across
	 * two ranks' pieces), and a slice of opt/v. */
	uint8_t rows[10 * COLS * 4], vs[100 * 8];
	uint64_t r0 = d->world > 1 ? ROWS - 4 : 7;
	uint64_t o1[2] = { r0, 0 }, e1[2] = { 10, COLS }, o2[1] = { 150 }, e2[1] = { 100 };
	struct ckpt_load_req q[2] = {
		{ .name = "w", .dtype = CKPT_F32, .ndim = 2, .offset = o1, .extent = e1, .dst = rows,
		  .saved_rank = -1 },
		{ .name = "opt/v", .dtype = CKPT_I64, .ndim = 1, .offset = o2, .extent = e2, .dst = vs,
		  .saved_rank = -1 },
	};
	int res[2] = { 1, 1 };
	rc = ckpt_load_tensors(l, q, 2, res);
	tally_add(t, rc);
	expect_clean(rc, ckpt_last_error(), "ckpt_load_tensors");
	for (int i = 0; i < 2; i++)
		ck_assert_msg(res[i] <= 0 && (rc || !res[i]), "%s: request %d: %d (call %d)", where,
		              i, res[i], rc);
	ck_assert_msg(res[0] || !memcmp(rows, d->w + r0 * COLS * 4, sizeof rows),
	              "%s: rows of w differ", where);
	ck_assert_msg(res[1] || !memcmp(vs, d->v + 150 * 8, sizeof vs), "%s: opt/v differs", where);
	uint8_t b[RNG + 1];
	size_t len = 0;
	/* Rank-bound: this rank's own (rank 0 of 1), or the last rank's by its number. */
	uint32_t rr = d->world - 1;
	rc = d->world == 1 ? ckpt_load_blob(l, "rng", b, sizeof b, &len)
	                   : ckpt_load_blob_rank(l, "rng", (int)rr, b, sizeof b, &len);
	tally_add(t, rc);
	expect_clean(rc, ckpt_last_error(), "ckpt_load_blob");
	ck_assert_msg(rc || (len == RNG && !memcmp(b, d->rng[rr], RNG)), "%s: rng differs", where);
	rc = ckpt_load_blob(l, "sched", b, sizeof b, &len);
	tally_add(t, rc);
	expect_clean(rc, ckpt_last_error(), "ckpt_load_blob");
	ck_assert_msg(rc || (len == SCHED && !memcmp(b, d->sched, SCHED)), "%s: sched differs",
	              where);
	ckpt_load_close(l);
	free(got);
}

/* Load loop: a read-write context (a training job resuming) or a read-only one (a
 * tool). */
static void load_loop(unsigned flags)
{
	/* Steps 1 (raw) and 2 (compressed) of one rank, step 3 of three ranks. */
	struct step_data d[3];
	struct save_out o;
	snprintf(where, sizeof where, "load, unarmed");
	for (int i = 0; i < 2; i++) {
		step_make(&d[i], (uint64_t)i + 1, 1);
		ckpt_ctx *c = ctx_open(0, 1, 0, i ? 3 : 0, 0);
		rank_save(c, &d[i], 0, &o);
		ck_assert_int_eq(o.rc, 0);
		ckpt_close(c);
	}
	step_make(&d[2], 3, WORLD);
	ckpt_ctx *w[WORLD];
	struct rank_job j[WORLD];
	setenv("CKPT_COMMIT_TREE", "off", 1);
	world_open(w, tu_free_port(), 3);
	world_save(w, j, &d[2]);
	for (uint32_t r = 0; r < WORLD; r++)
		ck_assert_msg(j[r].out.rc == 0, "%s: rank %u: %s", where, r, j[r].out.msg);
	world_close(w);
	struct tally t = { .n = 0 };
	/* This thread's zstd context lives as long as the thread: made here, before the
	 * leak checks start counting. */
	ckpt_ctx *c = ctx_open(0, 1, 0, 0, 0);
	load_all(c, &d[1], &t);
	ckpt_close(c);
	t.n = 0;
	struct loop lp = loop_conf();
	uint64_t n, count = 0, runs = 0;
	for (n = lp.first; n < MAX_N; n += lp.stride) {
		snprintf(where, sizeof where, "load (%s), allocation %" PRIu64 " fails",
		         flags ? "read-only" : "read-write", n);
		uint64_t t0 = ckpt_now_ns();
		int64_t live0 = ckpt_fault_alloc_live();
		arm(n);
		c = NULL;
		char msg[1024];
		int rc = ctx_try_open(0, 1, flags, 0, 0, &c, msg, sizeof msg);
		tally_add(&t, rc);
		if (!rc)
			for (int i = 0; i < 3; i++)
				load_all(c, &d[i], &t);
		ckpt_close(c);
		bool fired = disarm(n, &count);
		loop_log(&lp, t0, "open %d", rc);
		expect_no_leak(live0);
		runs++;
		if (loop_done(&lp, fired))
			break;
	}
	ck_assert_msg(n < MAX_N, "load: the loop did not end");
	printf("alloc_fail load (%s): %" PRIu64 " runs (N = %" PRIu64 "..%" PRIu64 " by %" PRIu64
	       "; open, the loads and close make %" PRIu64 " allocations)\n",
	       flags ? "read-only" : "read-write", runs, lp.first, n, lp.stride, count);
	tally_print(&t, "calls returned");
	snprintf(where, sizeof where, "load, after the loop");
	c = ctx_open(0, 1, CKPT_OPEN_READONLY, 0, 0);
	for (int i = 0; i < 3; i++) {
		step_check(c, &d[i]);
		step_free(&d[i]);
	}
	ckpt_close(c);
}

START_TEST(load_rw)
{
	load_loop(0);
}
END_TEST

START_TEST(load_ro)
{
	load_loop(CKPT_OPEN_READONLY);
}
END_TEST

/* ------------------------------------------------------------------ the commit loop */

/* The one wait the commit loop lets reach the timeout: the coordinator's, for the
 * votes of ranks whose own save had already failed. A rank whose BEGIN never reached
 * the coordinator (never sent, or its link dropped and its departure seen before the
 * others' BEGIN opened the step), or whose attempt of the step was decided before
 * another rank's BEGIN opened a new one, is to the coordinator a rank that has not
 * voted yet: the step waits for it until the timeout (docs/protocol.md §2.4). rank
 * r's wait ended that way, or the test fails. */
static void expect_vote_timeout(const struct rank_job *j, uint32_t r)
{
	static const char key[] = "waiting for the votes of ranks ";
	const char *p = strstr(j[r].out.msg, key);
	ck_assert_msg(j[r].out.rc == CKPT_EABORTED && p, "%s: rank %u waited until the timeout: %s",
	              where, r, j[r].out.msg);
	p += strlen(key);
	do {
		char *end;
		unsigned long q = strtoul(p, &end, 10);
		ck_assert_msg(end != p && q < WORLD, "%s: rank %u: %s", where, r, j[r].out.msg);
		ck_assert_msg(j[q].out.rc && j[q].out.rc != CKPT_EINDOUBT,
		              "%s: rank %u waited until the timeout for rank %lu, which voted: %s / %s",
		              where, r, q, j[r].out.msg, j[q].out.msg);
		p = end;
	} while (*p++ == ',');
}

/* Commit loop: flat (every rank to the coordinator), or through node leaders (nodes
 * of 2 ranks: rank 0 leads ranks 0 and 1, rank 2 is a node of its own). */
static void commit_loop(bool tree)
{
	if (tree) {
		setenv("CKPT_NODE_SIZE", "2", 1);
		setenv("CKPT_COMMIT_TREE", "on", 1);
	} else {
		unsetenv("CKPT_NODE_SIZE");
		setenv("CKPT_COMMIT_TREE", "off", 1);
	}
	unsigned port = tu_free_port();
	uint64_t prev = 1;
	struct step_data cur, last;
	ckpt_ctx *c[WORLD];
	struct rank_job j[WORLD];
	snprintf(where, sizeof where, "commit, unarmed");
	step_make(&last, prev, WORLD);
	world_open(c, port, 0);
	world_save(c, j, &last);
	for (uint32_t r = 0; r < WORLD; r++)
		ck_assert_msg(j[r].out.rc == 0, "%s: rank %u: %s", where, r, j[r].out.msg);
	world_close(c);
	struct tally t = { .n = 0 };
	struct loop lp = loop_conf();
	uint64_t n, count = 0, runs = 0, committed = 0;
	for (n = lp.first; n < MAX_N; n += lp.stride) {
		int zstd = n % 2 ? 3 : 0;
		snprintf(where, sizeof where, "commit%s zstd=%d, allocation %" PRIu64 " fails",
		         tree ? " (tree)" : "", zstd, n);
		step_make(&cur, prev + 1, WORLD);
		uint64_t t0 = ckpt_now_ns();
		int64_t live0 = ckpt_fault_alloc_live();
		arm(n);
		/* The world forms, rank 0 first (its coordinator), then saves. A rank that
		 * cannot open ends the job: the ranks opened so far close without saving (they
		 * would only wait for it until the commit timeout, with no allocation of theirs
		 * left to fail), and the ranks after it are not started. */
		bool formed = true;
		for (uint32_t r = 0; r < WORLD; r++) {
			j[r] = (struct rank_job){ .d = &cur, .rank = r };
			c[r] = NULL;
			if (!formed) {
				j[r].out = (struct save_out){ .rc = CKPT_EABORTED, .skipped = true };
				snprintf(j[r].out.msg, sizeof j[r].out.msg, "not started: a rank did not open");
				continue;
			}
			j[r].out.rc = ctx_try_open(r, WORLD, 0, zstd, port, &c[r], j[r].out.msg,
			                           sizeof j[r].out.msg);
			formed = !j[r].out.rc;
		}
		for (uint32_t r = 0; r < WORLD && !formed; r++)
			if (c[r]) {
				j[r].out = (struct save_out){ .rc = CKPT_EABORTED, .skipped = true };
				snprintf(j[r].out.msg, sizeof j[r].out.msg, "not saved: a rank did not open");
			}
		if (formed)
			world_save(c, j, &cur);
		world_close(c);
		bool fired = disarm(n, &count);
		loop_log(&lp, t0, "%d %d %d | %s | %s | %s", j[0].out.rc, j[1].out.rc, j[2].out.rc,
		         j[0].out.msg, j[1].out.msg, j[2].out.msg);
		expect_no_leak(live0);
		runs++;
		ckpt_ctx *ro = ctx_open(0, 1, CKPT_OPEN_READONLY, 0, 0);
		bool vis = step_visible(ro, cur.step);
		for (uint32_t r = 0; r < WORLD; r++) {
			int rc = j[r].out.rc;
			if (!j[r].out.skipped)
				tally_add(&t, rc);
			if (timed_out(rc, j[r].out.msg))
				expect_vote_timeout(j, r);
			ck_assert_msg(fired || rc == 0, "%s: rank %u: %d (%s) without the failure", where,
			              r, rc, j[r].out.msg);
			/* Told committed: it is. Told aborted: it is not. In doubt: the manifest
			 * decides. Any other failure is the rank's own before the decision, which
			 * then cannot be a commit. */
			if (vis)
				ck_assert_msg(rc == 0 || rc == CKPT_EINDOUBT, "%s: step committed, rank %u "
				              "told %d (%s)", where, r, rc, j[r].out.msg);
			else
				ck_assert_msg(rc != 0, "%s: rank %u told committed, the step is not", where,
				              r);
		}
		step_check(ro, &last);
		if (vis)
			step_check(ro, &cur);
		ckpt_close(ro);
		if (vis) {
			committed++;
			step_free(&last);
			last = cur;
			prev = cur.step;
		} else {
			step_free(&cur);
		}
		if (loop_done(&lp, fired))
			break;
	}
	ck_assert_msg(n < MAX_N, "commit: the loop did not end");
	printf("alloc_fail commit (world %u%s): %" PRIu64 " runs (N = %" PRIu64 "..%" PRIu64
	       " by %" PRIu64 "; %" PRIu64 " committed; the opens, the commit and the closes make %"
	       PRIu64 " allocations)\n", WORLD, tree ? ", node leaders" : "", runs, lp.first, n,
	       lp.stride, committed, count);
	tally_print(&t, "ranks were told");
	/* The root and the job take the next save. */
	snprintf(where, sizeof where, "commit, after the loop");
	step_make(&cur, prev + 1, WORLD);
	world_open(c, port, 0);
	world_save(c, j, &cur);
	for (uint32_t r = 0; r < WORLD; r++)
		ck_assert_msg(j[r].out.rc == 0, "%s: rank %u: %s", where, r, j[r].out.msg);
	world_close(c);
	ckpt_ctx *ro = ctx_open(0, 1, CKPT_OPEN_READONLY, 0, 0);
	step_check(ro, &cur);
	step_check(ro, &last);
	ckpt_close(ro);
	step_free(&cur);
	step_free(&last);
}

START_TEST(commit_flat)
{
	commit_loop(false);
}
END_TEST

START_TEST(commit_tree)
{
	commit_loop(true);
}
END_TEST

/* One case per loop, so that CK_RUN_CASE=<name> runs one. */
static void add_case(Suite *s, const char *name, const TTest *test)
{
	TCase *tc = tcase_create(name);
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 600);
	tcase_add_test(tc, test);
	suite_add_tcase(s, tc);
}

int main(void)
{
	Suite *s = suite_create("alloc_fail");
	add_case(s, "save_raw", save_raw);
	add_case(s, "save_zstd", save_zstd);
	add_case(s, "load_rw", load_rw);
	add_case(s, "load_ro", load_ro);
	add_case(s, "commit_flat", commit_flat);
	add_case(s, "commit_tree", commit_tree);
	SRunner *sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
