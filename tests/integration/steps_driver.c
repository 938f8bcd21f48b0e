/*
 * steps_driver.c — consecutive steps with two saves in flight, through the public
 * API only (include/ckpt/ckpt.h), as a training loop would drive it.
 *
 * Forks W rank processes (default 3). Each opens the root with max_inflight 2 and
 * runs STEPS consecutive steps (default 10): for step i it fills its state, then
 * begin / add / submit step i BEFORE waiting for step i-1, so that two saves of
 * each rank are in flight and the coordinator sees BEGIN of i while i-1 is still
 * being voted on. Every save must commit (ckpt_save_wait == 0).
 *
 * Then W fresh reader processes (read-only contexts, as rank r of W) load every
 * one of the steps and compare bit for bit: a sharded f32 matrix (split by rows),
 * a sharded bf16 matrix (split by columns: the boxes are not row-contiguous), a
 * replicated f64 vector, a replicated blob and a rank-bound blob, all of whose
 * contents depend on the step, so a load of the wrong step is caught. Rank 0 of
 * the readers also checks that exactly steps 1..STEPS are listed as committed and
 * reads every tensor whole.
 *
 * Usage: steps_driver [W] [STEPS]. The root is a fresh directory under /var/tmp,
 * removed on success (kept, and named, on failure). Seed: CKPT_TEST_SEED (printed).
 * Exit 0 ok, 1 failure, 2 usage.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <ftw.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ckpt/ckpt.h"

#define ROWS_PER_RANK 96u      /* "model/w": [W*96, 512] f32, split by rows */
#define WCOLS         512u
#define MROWS         64u      /* "optim/m": [64, W*200] bf16, split by columns */
#define MCOLS_PER_RANK 200u
#define BIAS          3000u    /* "model/bias": [3000] f64, replicated */
#define MAX_STEPS     1000u

static uint64_t seed;
static unsigned world, nsteps, port;
static char root[256];
static char job_id[64];

/* The byte at global linear position i of tensor t at step s: depends on all four. */
static uint8_t val(uint64_t s, unsigned t, uint64_t i)
{
	uint64_t x = seed ^ (s * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)t << 56) ^ (i * 0xBF58476D1CE4E5B9ull);
	x ^= x >> 31;
	x *= 0x94D049BB133111EBull;
	x ^= x >> 29;
	return (uint8_t)x;
}

/* Fill a row-major box [r0, r0+nr) x [c0, c0+nc) of a [*, cols] matrix of esize-byte
 * elements of tensor t at step s. */
static void fill_box(uint8_t *dst, uint64_t s, unsigned t, size_t esize, uint64_t cols,
                     uint64_t r0, uint64_t nr, uint64_t c0, uint64_t nc)
{
	for (uint64_t r = 0; r < nr; r++)
		for (uint64_t c = 0; c < nc; c++)
			for (size_t b = 0; b < esize; b++)
				dst[((r * nc) + c) * esize + b] = val(s, t, ((r0 + r) * cols + c0 + c) * esize + b);
}

struct state {                /* one rank's state for one step */
	uint8_t *w, *m, *bias;
	uint8_t  sched[64], rng[48];
};

static void state_fill(struct state *st, uint64_t s, unsigned rank)
{
	fill_box(st->w, s, 1, 4, WCOLS, (uint64_t)rank * ROWS_PER_RANK, ROWS_PER_RANK, 0, WCOLS);
	fill_box(st->m, s, 2, 2, (uint64_t)world * MCOLS_PER_RANK, 0, MROWS,
	         (uint64_t)rank * MCOLS_PER_RANK, MCOLS_PER_RANK);
	fill_box(st->bias, s, 3, 8, BIAS, 0, 1, 0, BIAS);
	for (unsigned i = 0; i < sizeof st->sched; i++)
		st->sched[i] = val(s, 4, i);
	for (unsigned i = 0; i < sizeof st->rng; i++)
		st->rng[i] = val(s, 5 + rank, i);
}

static void opts_for(struct ckpt_opts *o, unsigned rank, unsigned flags)
{
	ckpt_opts_init(o, sizeof *o);
	o->root = root;
	o->rank = (int)rank;
	o->world = (int)world;
	o->flags = flags;
	o->coord_addr = "127.0.0.1";
	o->coord_port = port;
	o->job_id = job_id;
	o->secret = job_id;         /* a job of several ranks authenticates its peers */
	o->secret_len = strlen(job_id);
	o->max_inflight = 2;
	o->timeout_ms = 60000;
	o->chunk_bytes = 64 * 1024;    /* several chunks per tensor */
	o->pool_bytes = 1024 * 1024;
}

#define FAIL(...) do { fprintf(stderr, "steps_driver: rank %u: ", rank); \
	fprintf(stderr, __VA_ARGS__); fprintf(stderr, "\n"); goto out; } while (0)

static int add_state(ckpt_save *s, const struct state *st, unsigned rank)
{
	uint64_t wshape[2] = { (uint64_t)world * ROWS_PER_RANK, WCOLS };
	uint64_t woff[2] = { (uint64_t)rank * ROWS_PER_RANK, 0 }, wext[2] = { ROWS_PER_RANK, WCOLS };
	uint64_t mshape[2] = { MROWS, (uint64_t)world * MCOLS_PER_RANK };
	uint64_t moff[2] = { 0, (uint64_t)rank * MCOLS_PER_RANK }, mext[2] = { MROWS, MCOLS_PER_RANK };
	uint64_t bshape[1] = { BIAS };
	struct ckpt_tensor t[3] = {
		{ .name = "model/w", .kind = CKPT_KIND_MODEL, .dtype = CKPT_F32, .policy = CKPT_SHARDED,
		  .ndim = 2, .global_shape = wshape, .offset = woff, .extent = wext, .data = st->w,
		  .mem = CKPT_MEM_HOST },
		{ .name = "optim/m", .kind = CKPT_KIND_OPTIMIZER, .dtype = CKPT_BF16,
		  .policy = CKPT_SHARDED, .ndim = 2, .global_shape = mshape, .offset = moff,
		  .extent = mext, .data = st->m, .mem = CKPT_MEM_HOST },
		{ .name = "model/bias", .kind = CKPT_KIND_MODEL, .dtype = CKPT_F64,
		  .policy = CKPT_REPLICATED, .ndim = 1, .global_shape = bshape, .data = st->bias,
		  .mem = CKPT_MEM_HOST },
	};
	int rc = 0;
	for (int i = 0; i < 3 && !rc; i++)
		rc = ckpt_save_add_tensor(s, &t[i]);
	if (!rc)
		rc = ckpt_save_add_blob(s, "scheduler", CKPT_KIND_SCHEDULER, CKPT_REPLICATED, st->sched,
		                        sizeof st->sched);
	if (!rc)
		rc = ckpt_save_add_blob(s, "rng", CKPT_KIND_RNG, CKPT_RANK_BOUND, st->rng, sizeof st->rng);
	return rc;
}

/* One rank of the training loop. Returns the process exit status. */
static int rank_save(unsigned rank)
{
	int ret = 1, rc;
	ckpt_ctx *c = NULL;
	ckpt_save *prev = NULL, *cur = NULL;
	struct state st[2];
	memset(st, 0, sizeof st);
	for (int k = 0; k < 2; k++) {
		st[k].w = malloc((size_t)ROWS_PER_RANK * WCOLS * 4);
		st[k].m = malloc((size_t)MROWS * MCOLS_PER_RANK * 2);
		st[k].bias = malloc((size_t)BIAS * 8);
		if (!st[k].w || !st[k].m || !st[k].bias)
			FAIL("out of memory");
	}
	struct ckpt_opts o;
	opts_for(&o, rank, 0);
	if ((rc = ckpt_open(&o, &c)))
		FAIL("open: %s", ckpt_last_error());
	unsigned overlapped = 0;
	for (unsigned i = 1; i <= nsteps; i++) {
		/* The buffers of step i-2 are free again: its save was waited for and freed. */
		struct state *s = &st[i % 2];
		state_fill(s, i, rank);
		if ((rc = ckpt_save_begin(c, i, &cur)))
			FAIL("begin step %u: %s", i, ckpt_last_error());
		if ((rc = add_state(cur, s, rank)))
			FAIL("add to step %u: %s", i, ckpt_last_error());
		if ((rc = ckpt_save_submit(cur)))
			FAIL("submit step %u: %s", i, ckpt_last_error());
		if (prev) {
			/* Still in flight when its successor was submitted? (Not required: it
			 * shows whether the overlap actually happened on this run.) */
			if (ckpt_save_wait(prev, 0) == -ETIMEDOUT)
				overlapped++;
			if ((rc = ckpt_save_wait(prev, -1)))
				FAIL("step %u: %s (%s)", i - 1, ckpt_strerror(rc), ckpt_last_error());
			ckpt_save_free(prev);
		}
		prev = cur;
		cur = NULL;
	}
	if (prev && (rc = ckpt_save_wait(prev, -1)))
		FAIL("step %u: %s (%s)", nsteps, ckpt_strerror(rc), ckpt_last_error());
	printf("rank %u: %u steps committed; step i-1 still in flight at submit of i: %u of %u\n",
	       rank, nsteps, overlapped, nsteps - 1);
	ret = 0;
out:
	ckpt_save_free(cur);
	ckpt_save_free(prev);
	ckpt_close(c);
	for (int k = 0; k < 2; k++) {
		free(st[k].w);
		free(st[k].m);
		free(st[k].bias);
	}
	return ret;
}

static int cmp(const char *what, unsigned step, unsigned rank, const uint8_t *got,
               const uint8_t *want, size_t n)
{
	if (!memcmp(got, want, n))
		return 0;
	size_t k = 0;
	while (got[k] == want[k])
		k++;
	fprintf(stderr, "steps_driver: rank %u: step %u: %s differs at byte %zu of %zu\n", rank,
	        step, what, k, n);
	return 1;
}

/* Read back every step as rank r of W, and (rank 0) every tensor whole. */
static int rank_verify(unsigned rank)
{
	int ret = 1, rc;
	ckpt_ctx *c = NULL;
	ckpt_load *l = NULL;
	unsigned bad = 0;
	size_t wbytes = (size_t)world * ROWS_PER_RANK * WCOLS * 4;
	size_t mbytes = (size_t)MROWS * world * MCOLS_PER_RANK * 2;
	uint8_t *got = malloc(wbytes > mbytes ? wbytes : mbytes);
	uint8_t *want = malloc(wbytes > mbytes ? wbytes : mbytes);
	struct state st;
	st.w = malloc((size_t)ROWS_PER_RANK * WCOLS * 4);
	st.m = malloc((size_t)MROWS * MCOLS_PER_RANK * 2);
	st.bias = malloc((size_t)BIAS * 8);
	if (!got || !want || !st.w || !st.m || !st.bias)
		FAIL("out of memory");
	struct ckpt_opts o;
	opts_for(&o, rank, CKPT_OPEN_READONLY);
	if ((rc = ckpt_open(&o, &c)))
		FAIL("open read-only: %s", ckpt_last_error());
	if (rank == 0) {
		struct ckpt_step_info steps[MAX_STEPS + 1];
		int n = ckpt_steps(c, 0, steps, MAX_STEPS + 1, sizeof *steps);
		if (n != (int)nsteps)
			FAIL("%d committed steps listed, want %u", n, nsteps);
		for (unsigned i = 0; i < nsteps; i++)
			if (steps[i].step != i + 1)
				FAIL("committed step #%u is %" PRIu64 ", want %u", i, steps[i].step, i + 1);
	}
	for (unsigned i = 1; i <= nsteps; i++) {
		if ((rc = ckpt_load_open(c, i, &l)))
			FAIL("load step %u: %s", i, ckpt_last_error());
		if (ckpt_load_step(l) != i)
			FAIL("load of step %u opened step %" PRIu64, i, ckpt_load_step(l));
		if (ckpt_load_count(l) != 5) {
			fprintf(stderr, "steps_driver: rank %u: step %u holds %d items, want 5\n", rank, i,
			        ckpt_load_count(l));
			bad++;
		}
		state_fill(&st, i, rank);
		uint64_t woff[2] = { (uint64_t)rank * ROWS_PER_RANK, 0 }, wext[2] = { ROWS_PER_RANK, WCOLS };
		uint64_t moff[2] = { 0, (uint64_t)rank * MCOLS_PER_RANK }, mext[2] = { MROWS, MCOLS_PER_RANK };
		if ((rc = ckpt_load_tensor(l, "model/w", CKPT_F32, 2, woff, wext, got, CKPT_MEM_HOST)))
			FAIL("step %u: load model/w: %s", i, ckpt_last_error());
		bad += (unsigned)cmp("model/w (own box)", i, rank, got, st.w, (size_t)ROWS_PER_RANK * WCOLS * 4);
		if ((rc = ckpt_load_tensor(l, "optim/m", CKPT_BF16, 2, moff, mext, got, CKPT_MEM_HOST)))
			FAIL("step %u: load optim/m: %s", i, ckpt_last_error());
		bad += (unsigned)cmp("optim/m (own box)", i, rank, got, st.m, (size_t)MROWS * MCOLS_PER_RANK * 2);
		if ((rc = ckpt_load_tensor(l, "model/bias", CKPT_F64, 1, NULL, NULL, got, CKPT_MEM_HOST)))
			FAIL("step %u: load model/bias: %s", i, ckpt_last_error());
		bad += (unsigned)cmp("model/bias", i, rank, got, st.bias, (size_t)BIAS * 8);
		size_t len = 0;
		if ((rc = ckpt_load_blob(l, "scheduler", got, 4096, &len)))
			FAIL("step %u: load scheduler: %s", i, ckpt_last_error());
		bad += len != sizeof st.sched || cmp("scheduler", i, rank, got, st.sched, sizeof st.sched);
		if ((rc = ckpt_load_blob(l, "rng", got, 4096, &len)))
			FAIL("step %u: load rng: %s", i, ckpt_last_error());
		bad += len != sizeof st.rng || cmp("rng", i, rank, got, st.rng, sizeof st.rng);
		if (rank == 0) {
			/* Whole tensors, across every rank's shard. */
			if ((rc = ckpt_load_tensor(l, "model/w", CKPT_F32, 2, NULL, NULL, got, CKPT_MEM_HOST)))
				FAIL("step %u: load model/w whole: %s", i, ckpt_last_error());
			fill_box(want, i, 1, 4, WCOLS, 0, (uint64_t)world * ROWS_PER_RANK, 0, WCOLS);
			bad += (unsigned)cmp("model/w (whole)", i, rank, got, want, wbytes);
			if ((rc = ckpt_load_tensor(l, "optim/m", CKPT_BF16, 2, NULL, NULL, got, CKPT_MEM_HOST)))
				FAIL("step %u: load optim/m whole: %s", i, ckpt_last_error());
			fill_box(want, i, 2, 2, (uint64_t)world * MCOLS_PER_RANK, 0, MROWS, 0,
			         (uint64_t)world * MCOLS_PER_RANK);
			bad += (unsigned)cmp("optim/m (whole)", i, rank, got, want, mbytes);
		}
		ckpt_load_close(l);
		l = NULL;
	}
	if (bad)
		FAIL("%u mismatches", bad);
	printf("rank %u: %u steps verified bit-exact\n", rank, nsteps);
	ret = 0;
out:
	ckpt_load_close(l);
	ckpt_close(c);
	free(got);
	free(want);
	free(st.w);
	free(st.m);
	free(st.bias);
	return ret;
}

/* A port nobody listens on now (the kernel's choice). */
static unsigned free_port(void)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof a;
	unsigned p = 0;
	if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
	    getsockname(fd, (struct sockaddr *)&a, &len) == 0)
		p = ntohs(a.sin_port);
	if (fd >= 0)
		close(fd);
	return p;
}

/* Run fn as W processes; 0 if every one exited 0. */
static int run_world(int (*fn)(unsigned), const char *what)
{
	pid_t *pids = calloc(world, sizeof *pids);
	int failed = 0;
	fflush(stdout);
	for (unsigned r = 0; r < world; r++) {
		pids[r] = fork();
		if (pids[r] < 0) {
			perror("fork");
			return 1;
		}
		if (pids[r] == 0) {
			int st = fn(r);
			fflush(stdout);
			_exit(st);
		}
	}
	for (unsigned r = 0; r < world; r++) {
		int st;
		if (waitpid(pids[r], &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st)) {
			fprintf(stderr, "steps_driver: %s: rank %u failed (%s %d)\n", what, r,
			        WIFSIGNALED(st) ? "signal" : "exit status",
			        WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
			failed = 1;
		}
	}
	free(pids);
	return failed;
}

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
	(void)sb; (void)flag; (void)ftw;
	return remove(path);
}

int main(int argc, char **argv)
{
	if (argc > 3) {
		fprintf(stderr, "usage: steps_driver [W] [STEPS]\n");
		return 2;
	}
	world = argc > 1 ? (unsigned)atoi(argv[1]) : 3;
	nsteps = argc > 2 ? (unsigned)atoi(argv[2]) : 10;
	if (world < 1 || world > 64 || nsteps < 1 || nsteps > MAX_STEPS) {
		fprintf(stderr, "steps_driver: W in 1..64, STEPS in 1..%u\n", MAX_STEPS);
		return 2;
	}
	const char *es = getenv("CKPT_TEST_SEED");
	seed = es ? strtoull(es, NULL, 0) : (uint64_t)time(NULL);
	snprintf(job_id, sizeof job_id, "steps-%d", (int)getpid());
	char tmp[] = "/var/tmp/ckpt-steps-XXXXXX";
	if (!mkdtemp(tmp)) {
		perror("steps_driver: mkdtemp");
		return 1;
	}
	snprintf(root, sizeof root, "%s/r", tmp);
	if (!(port = free_port())) {
		perror("steps_driver: no free port on 127.0.0.1");
		return 1;
	}
	printf("steps_driver: CKPT_TEST_SEED=%" PRIu64 " W=%u steps=%u root=%s port=%u\n", seed,
	       world, nsteps, root, port);
	if (run_world(rank_save, "save") || run_world(rank_verify, "verify")) {
		fprintf(stderr, "steps_driver: FAILED; root kept for inspection: %s\n", root);
		return 1;
	}
	nftw(tmp, rm_one, 16, FTW_DEPTH | FTW_PHYS);
	printf("steps_driver: ok\n");
	return 0;
}
