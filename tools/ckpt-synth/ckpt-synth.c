/*
 * ckpt-synth — a synthetic training job for demos, tests and benchmarks.
 *
 *   ckpt-synth save   --root DIR --step N --bytes SIZE --seed S [--world W] [--meta JSON]
 *                     [--compress zstd[:L]|bytegroup[:L]] [--chunk SIZE] [--pool SIZE]
 *                     [--json]
 *   ckpt-synth verify --root DIR --step N|latest --bytes SIZE --seed S [--world W]
 *                     [--json]
 *
 * save forks W rank processes with the environment torchrun would give them
 * (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), or runs as one rank
 * when RANK and WORLD_SIZE are already set (started by torchrun, srun, mpirun).
 * verify reads every tensor back as W ranks would (any W) and compares bit for bit.
 * Forked rank processes are named ckpt-rank-R (the process name: pgrep -x).
 * Every option value is parsed strictly (toolutil.h); under --json stdout holds one
 * JSON object whatever happens. Uses the public API only.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/prctl.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ckpt/ckpt.h"
#include "model.h"
#include "toolutil.h"

/* A barrier in shared memory for forked rank processes. It polls, so that a rank that
 * died cannot hang the others (a pthread barrier would): the parent, which sees its
 * children die, breaks it, and a waiter gives up after a minute in any case. */
struct shared_barrier {
	atomic_uint count, generation;
	atomic_bool broken;         /* a rank died before it reported: wait no more */
	unsigned    n;
};

static void shared_barrier_wait(struct shared_barrier *b)
{
	unsigned gen = atomic_load(&b->generation);
	if (atomic_fetch_add(&b->count, 1) + 1 == b->n) {
		atomic_store(&b->count, 0);
		atomic_fetch_add(&b->generation, 1);
		return;
	}
	for (int i = 0; i < 120000 && atomic_load(&b->generation) == gen &&
	                !atomic_load(&b->broken); i++)
		usleep(500);
}

struct args {
	const char *cmd, *root;
	uint64_t    step, bytes, seed, chunk, pool;
	bool        latest, json, have_step, have_bytes;
	bool        no_rng;        /* verify: the rank-bound RNG state must be absent */
	const char *meta;          /* save: the step's metadata (a JSON object), or NULL */
	struct shared_barrier *barrier; /* forked ranks: save begins together; verify loads
	                                  * together, then compares */
	unsigned    world;
	int         zstd_level;
	int         compress_codec;
	bool        launched;      /* RANK and WORLD_SIZE set by a launcher: run as that rank */
	uint64_t    env_rank, env_world;
};

/* What each rank reports to the parent through a pipe. */
struct rank_result {
	int      rc;
	int      rank;
	uint64_t bytes, stored, tensors, verified_bytes, mismatches, skipped;
	double   seconds, stall, durable;
	int64_t  rss_before, rss_peak;
	uint64_t step;
	char     msg[512];
};

static void usage(FILE *f)
{
	fprintf(f,
	"usage: ckpt-synth save   --root DIR --step N --bytes SIZE --seed S [--world W]\n"
	"                         [--compress zstd[:L]|bytegroup[:L]] [--chunk SIZE] [--pool SIZE]\n"
	"                         [--meta JSON] [--json]\n"
	"       ckpt-synth verify --root DIR --step N|latest --bytes SIZE --seed S [--world W]\n"
	"                         [--no-rng] [--json]\n"
	"       ckpt-synth --help | --version\n"
	"\n"
	"A deterministic synthetic model (a few dozen tensors of mixed dtypes, fp32 optimizer\n"
	"moments, a rank-bound RNG blob per rank, a replicated scheduler blob) of about SIZE\n"
	"bytes, sharded along the first dimension over W ranks. Contents depend only on the\n"
	"seed, so verify may read as any number of ranks.\n"
	"SIZE takes K, M, G, T suffixes; S is decimal or 0x-hex; W is 1 to 4096; L is 1 to 22.\n"
	"Exit: 0 ok, 1 failure or mismatch, 2 usage (see docs/ckpt-synth.md).\n"
	"Each failing rank prints one line to stderr: 'ckpt-synth: save failed on rank R: why'\n"
	"(a rank process that died says how: exit status or signal); then the ranks that\n"
	"succeeded say so: 'ckpt-synth: save succeeded on rank R'.\n");
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}


/* VmRSS / VmHWM of this process in bytes; "5" to clear_refs resets the peak. */
static int64_t proc_status_kb(const char *key)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	int64_t v = -1;
	size_t n = strlen(key);
	while (f && fgets(line, sizeof line, f))
		if (!strncmp(line, key, n))
			v = strtoll(line + n + 1, NULL, 10) * 1024;
	if (f)
		fclose(f);
	return v;
}

static void reset_peak_rss(void)
{
	FILE *f = fopen("/proc/self/clear_refs", "w");
	if (f) {
		fputs("5", f);
		fclose(f);
	}
}

static int open_ctx(const struct args *a, int rank, int world, unsigned flags, ckpt_ctx **c)
{
	struct ckpt_opts o;
	ckpt_opts_init(&o, sizeof o);
	o.root = a->root;
	o.rank = rank;
	o.world = world;
	o.flags = flags;
	o.zstd_level = a->zstd_level;
	o.compress_codec = a->compress_codec;
	o.chunk_bytes = a->chunk;
	o.pool_bytes = a->pool;
	return ckpt_open(&o, c);
}

/* Forked ranks wait for each other: save's ranks begin together, verify's load at
 * the same time and compare only once all have loaded, so that the timed phase is
 * the save, or the resharded restore, and nothing else. Every rank passes each
 * barrier on every path (passes counts them). */
static void rank_barrier(const struct args *a, int *passes)
{
	if (a->barrier)
		shared_barrier_wait(a->barrier);
	(*passes)++;
}

/* ------------------------------------------------------------------ save */

static int save_rank(const struct args *a, int rank, int world, struct rank_result *res)
{
	struct synth_model m;
	ckpt_ctx *c = NULL;
	ckpt_save *s = NULL;
	void **bufs = NULL;
	int passes = 0;
	int rc = synth_model_build(&m, a->bytes, a->seed);
	if (rc) {
		snprintf(res->msg, sizeof res->msg, "the model's tensor list: out of memory");
		rank_barrier(a, &passes);
		return rc;
	}
	/* This rank's state, generated before the clock starts and before the library
	 * allocates anything, so that RSS growth counts all of the library's memory. */
	bufs = calloc(m.n, sizeof *bufs);
	uint64_t (*off)[2] = calloc(m.n, sizeof *off), (*ext)[2] = calloc(m.n, sizeof *ext);
	if (!bufs || !off || !ext) {
		rc = -ENOMEM;
		snprintf(res->msg, sizeof res->msg, "the model's tensor list: out of memory");
		goto out_free;
	}
	for (size_t i = 0; i < m.n; i++) {
		const struct synth_tensor *t = &m.t[i];
		off[i][1] = 0;
		ext[i][1] = t->shape[1];
		if (t->ndim)
			synth_split(t->shape[0], (unsigned)rank, (unsigned)world, &off[i][0], &ext[i][0]);
		uint64_t n = ckpt_dtype_size(t->dtype) * (t->ndim ? ext[i][0] : 1) *
		             (t->ndim == 2 ? ext[i][1] : 1);
		bufs[i] = n <= SIZE_MAX ? malloc(n ? (size_t)n : 1) : NULL;
		if (!bufs[i]) {
			/* Say so: the library has no message for memory the tool could not get. */
			rc = -ENOMEM;
			snprintf(res->msg, sizeof res->msg, "out of memory for '%s' (%" PRIu64 " bytes "
			         "of this rank's share of a %" PRIu64 "-byte model; --bytes %" PRIu64 ")",
			         t->name, n, m.total_bytes, a->bytes);
			goto out_free;
		}
		synth_fill_box(&m, t, off[i], ext[i], bufs[i]);
		res->bytes += n;
	}
	uint8_t sched[SYNTH_BLOB_MAX], rng[SYNTH_BLOB_MAX];
	size_t sched_len = synth_blob_scheduler(&m, sched, sizeof sched);
	size_t rng_len = synth_blob_rng(&m, (unsigned)rank, rng, sizeof rng);

	reset_peak_rss();
	res->rss_before = proc_status_kb("VmRSS:");
	if ((rc = open_ctx(a, rank, world, 0, &c)))
		goto out_free;
	/* The ranks of a job reach a checkpoint together (after the same training step);
	 * forked ranks built their state at different speeds, so they start here. */
	rank_barrier(a, &passes);
	double t0 = now_s();
	if ((rc = ckpt_save_begin(c, a->step, &s)))
		goto out_free;
	for (size_t i = 0; i < m.n && !rc; i++) {
		const struct synth_tensor *t = &m.t[i];
		struct ckpt_tensor ct = {
			.name = t->name, .kind = t->kind, .dtype = t->dtype, .policy = t->policy,
			.ndim = t->ndim, .global_shape = t->shape, .offset = off[i], .extent = ext[i],
			.data = bufs[i], .mem = CKPT_MEM_HOST,
		};
		rc = ckpt_save_add_tensor(s, &ct);
	}
	if (!rc)
		rc = ckpt_save_add_blob(s, "scheduler", CKPT_KIND_SCHEDULER, CKPT_REPLICATED, sched, sched_len);
	if (!rc)
		rc = ckpt_save_add_blob(s, "rng", CKPT_KIND_RNG, CKPT_RANK_BOUND, rng, rng_len);
	if (!rc && a->meta)
		rc = ckpt_save_set_meta(s, a->meta, strlen(a->meta));
	if (!rc)
		rc = ckpt_save_submit(s);
	if (!rc)
		rc = ckpt_save_wait_snapshot(s, -1);
	double t1 = now_s();
	if (!rc)
		rc = ckpt_save_wait(s, -1);
	double t2 = now_s();
	res->stall = t1 - t0;
	res->seconds = t2 - t0;
	res->rss_peak = proc_status_kb("VmHWM:");
	struct ckpt_save_stats st = { .size = sizeof st };
	if (!ckpt_save_stats(s, &st)) {
		res->stored = st.stored_bytes;
		res->durable = st.durable_seconds;
	}
	res->tensors = m.n + 2;
out_free:
	if (!passes)
		rank_barrier(a, &passes);
	if (rc && !res->msg[0])
		snprintf(res->msg, sizeof res->msg, "%s", ckpt_last_error());
	ckpt_save_free(s);
	for (size_t i = 0; bufs && i < m.n; i++)
		free(bufs[i]);
	free(bufs);
	free(off);
	free(ext);
	if (rc && !res->msg[0])
		snprintf(res->msg, sizeof res->msg, "%s", ckpt_strerror(rc));
	ckpt_close(c);
	synth_model_free(&m);
	return rc;
}

/* ------------------------------------------------------------------ verify */

static int verify_rank(const struct args *a, int rank, int world, struct rank_result *res)
{
	struct synth_model m;
	ckpt_ctx *c = NULL;
	ckpt_load *l = NULL;
	int passes = 0;
	int rc = synth_model_build(&m, a->bytes, a->seed);
	if (rc) {
		snprintf(res->msg, sizeof res->msg, "the model's tensor list: out of memory");
		while (passes < 2)
			rank_barrier(a, &passes);
		return rc;
	}
	if ((rc = open_ctx(a, rank, world, CKPT_OPEN_READONLY, &c)))
		goto out;
	if ((rc = ckpt_load_open(c, a->latest ? CKPT_LATEST : a->step, &l)))
		goto out;
	res->step = ckpt_load_step(l);
	int count = ckpt_load_count(l);
	int expect = (int)m.n + (a->no_rng ? 1 : 2);
	if (count != expect) {
		fprintf(stderr, "ckpt-synth: rank %d: step holds %d items, the model has %d\n", rank,
		        count, expect);
		res->mismatches++;
	}
	/* This rank's boxes of every tensor in ONE batch, as a restore loads them: the
	 * reads of all tensors are in flight together. Then compare, tensor by tensor. */
	struct ckpt_load_req *reqs = calloc(m.n, sizeof *reqs);
	uint64_t (*off)[2] = calloc(m.n, sizeof *off), (*ext)[2] = calloc(m.n, sizeof *ext);
	size_t *blen = calloc(m.n, sizeof *blen);
	int *results = calloc(m.n, sizeof *results);
	rc = reqs && off && ext && blen && results ? 0 : -ENOMEM;
	for (size_t i = 0; i < m.n && !rc; i++) {
		const struct synth_tensor *t = &m.t[i];
		ext[i][0] = 1;
		ext[i][1] = t->shape[1];
		if (t->ndim)
			synth_split(t->shape[0], (unsigned)rank, (unsigned)world, &off[i][0], &ext[i][0]);
		blen[i] = ckpt_dtype_size(t->dtype) * (t->ndim ? ext[i][0] : 1) *
		         (t->ndim == 2 ? ext[i][1] : 1);
		void *dst = malloc(blen[i] ? blen[i] : 1);
		if (!dst) {
			rc = -ENOMEM;
			snprintf(res->msg, sizeof res->msg, "out of memory for '%s' (%zu bytes of this "
			         "rank's share)", t->name, blen[i]);
			break;
		}
		memset(dst, 0xA5, blen[i]);
		reqs[i] = (struct ckpt_load_req){ .name = t->name, .dtype = t->dtype, .ndim = t->ndim,
		                                  .offset = off[i], .extent = ext[i], .dst = dst,
		                                  .mem = CKPT_MEM_HOST, .saved_rank = -1 };
	}
	rank_barrier(a, &passes);
	if (!rc) {
		double t0 = now_s();
		rc = ckpt_load_tensors(l, reqs, m.n, results);
		res->seconds += now_s() - t0;
	}
	rank_barrier(a, &passes);
	for (size_t i = 0; i < m.n && !rc; i++) {
		const struct synth_tensor *t = &m.t[i];
		uint8_t *want = malloc(blen[i] ? blen[i] : 1);
		if (!want) {
			rc = -ENOMEM;
			snprintf(res->msg, sizeof res->msg, "out of memory for the expected bytes of '%s' "
			         "(%zu)", t->name, blen[i]);
			break;
		}
		synth_fill_box(&m, t, off[i], ext[i], want);
		const uint8_t *got = reqs[i].dst;
		if (memcmp(got, want, blen[i])) {
			size_t k = 0;
			while (got[k] == want[k])
				k++;
			fprintf(stderr, "ckpt-synth: rank %d: '%s' differs at byte %zu of its box\n", rank,
			        t->name, k);
			res->mismatches++;
		}
		free(want);
		res->tensors++;
		res->verified_bytes += blen[i];
	}
	for (size_t i = 0; reqs && i < m.n; i++)
		free(reqs[i].dst);
	free(reqs);
	free(off);
	free(ext);
	free(blen);
	free(results);
	if (rc)
		goto out;
	uint8_t got[SYNTH_BLOB_MAX], want[SYNTH_BLOB_MAX];
	size_t len = 0, wlen = synth_blob_scheduler(&m, want, sizeof want);
	if ((rc = ckpt_load_blob(l, "scheduler", got, sizeof got, &len)))
		goto out;
	if (len != wlen || memcmp(got, want, len)) {
		fprintf(stderr, "ckpt-synth: rank %d: blob 'scheduler' differs\n", rank);
		res->mismatches++;
	}
	res->tensors++;
	res->verified_bytes += len;
	struct ckpt_step_info info;
	if ((rc = ckpt_step_info(c, res->step, &info, sizeof info)))
		goto out;
	wlen = synth_blob_rng(&m, (unsigned)rank, want, sizeof want);
	rc = ckpt_load_blob(l, "rng", got, sizeof got, &len);
	if (a->no_rng) {
		/* Resharded with the RNG state left out: it must be absent, not just skipped. */
		if (rc != CKPT_ENOTFOUND) {
			fprintf(stderr, "ckpt-synth: rank %d: 'rng' should be absent (--no-rng)\n", rank);
			res->mismatches++;
		}
		res->skipped++;
		rc = 0;
	} else if (info.world == (uint32_t)world) {
		if (rc)
			goto out;
		if (len != wlen || memcmp(got, want, len)) {
			fprintf(stderr, "ckpt-synth: rank %d: blob 'rng' differs\n", rank);
			res->mismatches++;
		}
		res->tensors++;
		res->verified_bytes += len;
	} else if (rc == CKPT_ERANKBOUND) {
		/* Rank-bound state does not carry over to another world size: by design. */
		res->skipped++;
		rc = 0;
	} else {
		fprintf(stderr, "ckpt-synth: rank %d: rank-bound 'rng' loaded across world sizes\n", rank);
		res->mismatches++;
		rc = 0;
	}
out:
	while (passes < 2)
		rank_barrier(a, &passes);
	if (rc && !res->msg[0])
		snprintf(res->msg, sizeof res->msg, "%s", ckpt_last_error());
	if (rc && !res->msg[0])
		snprintf(res->msg, sizeof res->msg, "%s", ckpt_strerror(rc));
	ckpt_load_close(l);
	ckpt_close(c);
	synth_model_free(&m);
	return rc;
}

/* ------------------------------------------------------------------ ranks */

typedef int (*rank_fn)(const struct args *, int, int, struct rank_result *);

/* Whether a rank process that has not reported has exited (it stays waitable). */
static bool rank_died(const pid_t *pids, const bool *reported, unsigned w)
{
	for (unsigned r = 0; r < w; r++) {
		siginfo_t si;
		memset(&si, 0, sizeof si);
		if ((!reported || !reported[r]) &&
		    waitid(P_PID, (id_t)pids[r], &si, WEXITED | WNOHANG | WNOWAIT) == 0 &&
		    si.si_pid == pids[r])
			return true;
	}
	return false;
}

/* Run fn as every rank: in this process if a launcher already made us one rank,
 * else as W forked processes with a launcher's environment. */
static int run_ranks(const struct args *a, rank_fn fn, struct rank_result *res, unsigned *nres)
{
	if (a->launched) {
		*nres = 1;
		memset(res, 0, sizeof *res);
		res->rank = (int)a->env_rank;
		res->rc = fn(a, res->rank, (int)a->env_world, res);
		return 0;
	}
	unsigned w = a->world;
	/* The ranks are ours: they share a secret no other process knows. */
	int src = w > 1 ? tool_job_secret() : 0;
	if (src)
		return src;
	int fds[2];
	if (pipe(fds) < 0)
		return -errno;
	char port[16];
	snprintf(port, sizeof port, "%u", 20000u + (unsigned)(getpid() % 20000) * 2u);
	pid_t *pids = calloc(w, sizeof *pids);
	if (!pids) {
		close(fds[0]);
		close(fds[1]);
		return -ENOMEM;
	}
	for (unsigned r = 0; r < w; r++) {
		pids[r] = fork();
		if (pids[r] < 0) {
			/* The ranks already started would wait for this one until they time
			 * out: stop them now (they are ours). */
			int e = -errno;
			for (unsigned k = 0; k < r; k++) {
				kill(pids[k], SIGKILL);
				waitpid(pids[k], NULL, 0);
			}
			close(fds[0]);
			close(fds[1]);
			free(pids);
			return e;
		}
		if (pids[r] == 0) {
			/* Named for operators and tests: pgrep -x ckpt-rank-3 finds rank 3. */
			char comm[16];
			snprintf(comm, sizeof comm, "ckpt-rank-%u", r);
			prctl(PR_SET_NAME, comm, 0, 0, 0);
			char rs[16], ws[16];
			snprintf(rs, sizeof rs, "%u", r);
			snprintf(ws, sizeof ws, "%u", w);
			setenv("RANK", rs, 1);
			setenv("LOCAL_RANK", rs, 1);
			setenv("WORLD_SIZE", ws, 1);
			setenv("LOCAL_WORLD_SIZE", ws, 1);
			if (!getenv("MASTER_ADDR"))
				setenv("MASTER_ADDR", "127.0.0.1", 1);
			if (!getenv("MASTER_PORT"))
				setenv("MASTER_PORT", port, 1);
			close(fds[0]);
			struct rank_result rr;
			memset(&rr, 0, sizeof rr);
			rr.rank = (int)r;
			rr.rc = fn(a, (int)r, (int)w, &rr);
			ssize_t n = write(fds[1], &rr, sizeof rr);
			_exit(n == (ssize_t)sizeof rr && rr.rc == 0 ? 0 : 1);
		}
	}
	close(fds[1]);
	unsigned got = 0;
	bool *reported = calloc(w, sizeof *reported);
	struct rank_result rr;
	while (got < w) {
		/* While ranks may wait at the barrier, look for one that died without a
		 * report (kill -9, a crash fault): it will never arrive, so release them. */
		if (a->barrier && !atomic_load(&a->barrier->broken)) {
			struct pollfd pf = { .fd = fds[0], .events = POLLIN };
			if (poll(&pf, 1, 100) == 0) {
				if (rank_died(pids, reported, w))
					atomic_store(&a->barrier->broken, true);
				continue;
			}
		}
		if (read(fds[0], &rr, sizeof rr) != (ssize_t)sizeof rr)
			break;
		if (rr.rank >= 0 && (unsigned)rr.rank < w && reported && !reported[rr.rank]) {
			reported[rr.rank] = true;
			res[rr.rank] = rr;
			got++;
		}
	}
	close(fds[0]);
	int failed = 0;
	for (unsigned r = 0; r < w; r++) {
		int st;
		waitpid(pids[r], &st, 0);
		if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
			failed++;
		/* A rank that died without reporting still counts as a failure; say how it
		 * died (a crash fault exits with its own status, kill -9 is a signal). */
		if (!reported || !reported[r]) {
			memset(&res[r], 0, sizeof res[r]);
			res[r].rank = (int)r;
			res[r].rc = -ECHILD;
			if (WIFSIGNALED(st))
				snprintf(res[r].msg, sizeof res[r].msg, "rank process %d died without a "
				         "report (killed by signal %d)", (int)pids[r], WTERMSIG(st));
			else
				snprintf(res[r].msg, sizeof res[r].msg, "rank process %d died without a "
				         "report (exit status %d)", (int)pids[r],
				         WIFEXITED(st) ? WEXITSTATUS(st) : -1);
		}
	}
	free(reported);
	free(pids);
	*nres = w;
	return failed ? 1 : 0;
}

/* A barrier shared by the forked ranks (none under an outside launcher, or for one
 * rank; nor when the mapping fails: the ranks then run unsynchronised). */
static struct shared_barrier *barrier_create(const struct args *a)
{
	if (a->launched || a->world < 2)
		return NULL;
	struct shared_barrier *b = mmap(NULL, sizeof *b, PROT_READ | PROT_WRITE,
	                                MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (b == MAP_FAILED)
		return NULL;
	b->n = a->world;
	return b;
}

static void barrier_free(struct shared_barrier *b)
{
	if (b)
		munmap(b, sizeof *b);
}

/* The JSON document of save and verify: on failure it carries the error fields. */
static void json_end(int rc, const char *msg, int exit)
{
	if (rc)
		tool_json_fail_fields(stdout, msg, rc, exit);
	printf("}\n");
}

static int cmd_save(const struct args *a)
{
	struct rank_result *res = calloc(a->world, sizeof *res);
	if (!res)
		return tool_fail(1, -ENOMEM, "save: out of memory");
	unsigned n = 0;
	struct args sa = *a;
	sa.barrier = barrier_create(a);
	int failed = run_ranks(&sa, save_rank, res, &n);
	barrier_free(sa.barrier);
	if (failed < 0) {
		free(res);
		return tool_fail(1, failed, "save: cannot start %u rank process(es): %s", a->world,
		                 strerror(-failed));
	}
	uint64_t bytes = 0, stored = 0;
	double secs = 0, stall = 0, durable = 0;
	int64_t rss = 0;
	int rc = 0;
	char msg[640] = "";
	for (unsigned i = 0; i < n; i++) {
		/* Every failing rank says why: the faulting one names the fault, the others
		 * the coordinator's reason or that they are in doubt. */
		if (res[i].rc) {
			if (!rc)
				snprintf(msg, sizeof msg, "save failed on rank %d: %s", res[i].rank, res[i].msg);
			rc = rc ? rc : res[i].rc;
			fprintf(stderr, "ckpt-synth: save failed on rank %d: %s\n", res[i].rank, res[i].msg);
		}
		else if (a->world > 1 && failed)
			/* Some failed: say which ranks were told the step committed. */
			fprintf(stderr, "ckpt-synth: save succeeded on rank %d\n", res[i].rank);
		bytes += res[i].bytes;
		stored += res[i].stored;
		if (res[i].seconds > secs) secs = res[i].seconds;
		if (res[i].stall > stall) stall = res[i].stall;
		if (res[i].durable > durable) durable = res[i].durable;
		if (res[i].rss_peak - res[i].rss_before > rss) rss = res[i].rss_peak - res[i].rss_before;
	}
	if (a->json) {
		printf("{\"op\":\"save\",\"ok\":%s,\"step\":%" PRIu64 ",\"world\":%u,\"bytes\":%" PRIu64
		       ",\"stored_bytes\":%" PRIu64 ",\"seconds\":%.6f,\"stall_seconds\":%.6f"
		       ",\"durable_seconds\":%.6f,\"throughput_bytes_per_s\":%.0f"
		       ",\"compression_ratio\":%.4f,\"peak_rss_growth_bytes\":%" PRId64,
		       rc ? "false" : "true", a->step, n, bytes, stored, secs, stall, durable,
		       secs > 0 ? (double)bytes / secs : 0.0,
		       stored ? (double)bytes / (double)stored : 0.0, rss);
		json_end(rc, msg, 1);
	} else if (!rc) {
		printf("saved step %" PRIu64 ": %u rank(s), %.1f MiB in %.3f s (%.0f MiB/s), "
		       "caller stalled %.3f s, stored %.1f MiB (ratio %.3f)\n",
		       a->step, n, (double)bytes / 1048576.0, secs,
		       secs > 0 ? (double)bytes / 1048576.0 / secs : 0.0, stall,
		       (double)stored / 1048576.0, stored ? (double)bytes / (double)stored : 0.0);
	}
	free(res);
	return rc ? 1 : 0;
}

static int cmd_verify(const struct args *a)
{
	struct rank_result *res = calloc(a->world, sizeof *res);
	if (!res)
		return tool_fail(1, -ENOMEM, "verify: out of memory");
	unsigned n = 0;
	struct args va = *a;
	va.barrier = barrier_create(a);
	int started = run_ranks(&va, verify_rank, res, &n);
	barrier_free(va.barrier);
	if (started < 0) {
		free(res);
		return tool_fail(1, started, "verify: cannot start %u rank process(es): %s", a->world,
		                 strerror(-started));
	}
	uint64_t tensors = 0, bytes = 0, mism = 0, skipped = 0, step = 0;
	double load_s = 0;
	int rc = 0;
	char msg[640] = "";
	for (unsigned i = 0; i < n; i++) {
		if (res[i].rc) {
			if (!rc)
				snprintf(msg, sizeof msg, "verify failed on rank %d: %s", res[i].rank,
				         res[i].msg);
			rc = rc ? rc : res[i].rc;
			fprintf(stderr, "ckpt-synth: verify failed on rank %d: %s\n", res[i].rank, res[i].msg);
		}
		tensors += res[i].tensors;
		bytes += res[i].verified_bytes;
		mism += res[i].mismatches;
		skipped += res[i].skipped;
		step = res[i].step;
		if (res[i].seconds > load_s)
			load_s = res[i].seconds;
	}
	/* Bytes that differ from the model are damage the library did not see: reported
	 * as CKPT_ECORRUPT, with the count. */
	if (!rc && mism)
		snprintf(msg, sizeof msg, "%" PRIu64 " mismatch(es): the bytes read back differ from "
		         "the model (stderr names each)", mism);
	int code = rc ? rc : mism ? CKPT_ECORRUPT : 0;
	if (a->json) {
		printf("{\"op\":\"verify\",\"ok\":%s,\"step\":%" PRIu64 ",\"world\":%u,\"tensors\":%"
		       PRIu64 ",\"bytes\":%" PRIu64 ",\"mismatches\":%" PRIu64 ",\"rank_bound_skipped\":%"
		       PRIu64 ",\"load_seconds\":%.6f", code ? "false" : "true", step, n, tensors,
		       bytes, mism, skipped, load_s);
		json_end(code, msg, 1);
	} else
		printf("verified %" PRIu64 " tensors, %" PRIu64 " bytes, %" PRIu64 " mismatches"
		       " (step %" PRIu64 ", as %u rank(s)%s)\n", tensors, bytes, mism, step, n,
		       !skipped ? "" : a->no_rng ? "; no RNG state, as expected (--no-rng)"
		       : "; rank-bound RNG state not carried to a new world size");
	free(res);
	return (rc || mism) ? 1 : 0;
}

/* RANK and WORLD_SIZE from a launcher: both or neither, whole numbers, rank < world. */
static int parse_launcher(struct args *a)
{
	const char *er = getenv("RANK"), *ew = getenv("WORLD_SIZE");
	if (!er || !ew)
		return 0;
	if (tool_parse_u64_range(ew, 1, 65536, &a->env_world) ||
	    tool_parse_u64_range(er, 0, a->env_world - 1, &a->env_rank)) {
		tool_usage("RANK='%s' and WORLD_SIZE='%s' from the launcher: a rank from 0 to "
		           "WORLD_SIZE-1 of a world of 1 to 65536", er, ew);
		return -1;
	}
	a->launched = true;
	return 0;
}

int main(int argc, char **argv)
{
	struct args a = { .world = 1, .zstd_level = 0 };
	static const struct option opts[] = {
		{ "root", required_argument, 0, 'r' }, { "step", required_argument, 0, 's' },
		{ "bytes", required_argument, 0, 'b' }, { "seed", required_argument, 0, 'S' },
		{ "world", required_argument, 0, 'w' }, { "compress", required_argument, 0, 'c' },
		{ "chunk", required_argument, 0, 'C' }, { "pool", required_argument, 0, 'P' },
		{ "json", no_argument, 0, 'j' }, { "help", no_argument, 0, 'h' },
		{ "no-rng", no_argument, 0, 'N' }, { "meta", required_argument, 0, 'M' },
		{ 0, 0, 0, 0 },
	};
	tool_init("ckpt-synth", NULL);
	tool_version(argc, argv);
	if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
		usage(argc < 2 ? stderr : stdout);
		return argc < 2 ? 2 : 0;
	}
	a.cmd = argv[1];
	/* --json anywhere: every error, usage errors included, is then a JSON object. */
	a.json = tool_scan_has(argc, argv, 2, opts, 'j') || !strcmp(a.cmd, "--json");
	tool_set_json(a.json);
	bool save = !strcmp(a.cmd, "save");
	if (!save && strcmp(a.cmd, "verify")) {
		char q[256];
		usage(stderr);
		return tool_usage("unknown command '%s' (save or verify)", tool_quote(a.cmd, q, sizeof q));
	}
	tool_set_op(a.cmd);
	/* The options after the command: argv[1] stands for the program name, as in
	 * tool_scan_has. */
	int sargc = argc - 1;
	char **sargv = argv + 1;
	optind = 0;
	opterr = 0;
	int ch;
	uint64_t v;
	bool have_chunk = false, have_pool = false;
	const char *bytes_arg = "";
	while ((ch = getopt_long(sargc, sargv, ":", opts, NULL)) != -1) {
		switch (ch) {
		case 'r': a.root = optarg; break;
		case 's':
			if (!strcmp(optarg, "latest")) {
				a.latest = true;
			} else if (tool_parse_u64_range(optarg, 0, CKPT_LATEST - 1, &a.step)) {
				return tool_usage("--step '%s': a step number from 0 to %" PRIu64 "%s", optarg,
				                  (uint64_t)CKPT_LATEST - 1, save ? "" : ", or latest");
			} else {
				a.latest = false;
			}
			a.have_step = true;
			break;
		case 'b':
			if (tool_parse_size_opt("--bytes", optarg, 1, UINT64_MAX, 0, &a.bytes))
				return 2;
			bytes_arg = optarg;
			a.have_bytes = true;
			break;
		case 'S':
			if (tool_parse_u64_hex(optarg, &a.seed))
				return tool_usage("--seed '%s': a number, decimal or 0x-hex, below 2^64", optarg);
			break;
		case 'w':
			if (tool_parse_u64_range(optarg, 1, 4096, &v))
				return tool_usage("--world '%s': a number of ranks from 1 to 4096", optarg);
			a.world = (unsigned)v;
			break;
		case 'c':
			if (tool_parse_compress(optarg, &a.zstd_level, &a.compress_codec))
				return tool_usage("--compress '%s': none, zstd[:LEVEL] or bytegroup[:LEVEL] "
				                  "with LEVEL 1 to 22",
				                  optarg);
			break;
		case 'C':
			if (tool_parse_size_opt("--chunk", optarg, TOOL_CHUNK_UNIT, TOOL_MAX_CHUNK,
			                   TOOL_CHUNK_UNIT, &a.chunk))
				return 2;
			have_chunk = true;
			break;
		case 'P':
			/* At least two chunks of the smallest size: the library's own floor. */
			if (tool_parse_size_opt("--pool", optarg, 2 * TOOL_CHUNK_UNIT, SIZE_MAX, 0, &a.pool))
				return 2;
			have_pool = true;
			break;
		case 'j': a.json = true; break;
		case 'N': a.no_rng = true; break;
		case 'M': a.meta = optarg; break;
		case 'h': usage(stdout); return 0;
		case '?':
		case ':':
			return tool_getopt_error(ch, sargv, opts);
		}
	}
	if (optind < sargc) {
		char q[256];
		return tool_usage("unexpected argument '%s'", tool_quote(sargv[optind], q, sizeof q));
	}
	if (!a.root || !a.have_step || !a.have_bytes) {
		usage(stderr);
		return tool_usage("--root, --step and --bytes are required");
	}
	if (have_chunk && have_pool && a.pool < 2 * a.chunk)
		return tool_usage("--pool %" PRIu64 " is smaller than two chunks of --chunk %" PRIu64,
		                  a.pool, a.chunk);
	/* The layout stops growing at its largest model: a larger budget would be met
	 * silently with a smaller model. */
	uint64_t max = synth_model_max_bytes();
	if (max && a.bytes > max)
		return tool_usage("--bytes '%s' (%" PRIu64 " bytes): larger than the largest synthetic "
		                  "model (%" PRIu64 " bytes)", bytes_arg, a.bytes, max);
	if (parse_launcher(&a))
		return 2;
	if (save) {
		if (a.latest)
			return tool_usage("save needs a step number (not latest)");
		if (a.no_rng)
			return tool_usage("save does not take --no-rng (a verify option)");
		return cmd_save(&a);
	}
	if (a.meta)
		return tool_usage("verify does not take --meta (a save option)");
	return cmd_verify(&a);
}
