/*
 * bench_commit.c — commit latency of the two-phase commit at W ranks, and its
 * breakdown (issue: "Speed" of the distributed commit), flat and hierarchical.
 *
 *   bench_commit DIR [--node-size N] [--flat|--tree] [--pin] [W...]
 *                                                    (default W: 4 64 256, N 8)
 *
 * For each W: one coordinator and W participants vote on synthetic shard indexes of
 * a model of 128 tensors sharded along dimension 0, all at once (the worst case for
 * the coordinator). Flat: each participant has its own TCP connection to the
 * coordinator on 127.0.0.1. Tree: the participants are grouped into nodes of N,
 * each node's leader (leader.c) relays over one TCP connection, and the node's
 * participants reach it over a unix socket. The participants (and leaders) are
 * threads of this process, or of a child process at nice 19 (a cluster's ranks do
 * not share the coordinator's CPUs), or with --pin also of a child process on CPUs
 * of its own (the coordinator's process on CPU 0, the child on the others).
 * Medians over 20 steps:
 *   commit latency (the coordinator's clock): the last PREPARE read off its
 *     connection -> the decision sent on every link (to every rank, or every node
 *     leader); and its parts: decoding and checking that last vote, the final
 *     checks + durable LMDB commit, the decision's sends;
 *   burst: last PREPARE sent -> last rank has the decision (the participants'
 *     clock; includes every hop and waking W threads);
 * and, as the limits it is compared against, one bare durable LMDB commit of one
 * small record (back to back, and spaced at the steps' period, as the
 * coordinator's commits are), and one durable LMDB commit of W shard records like
 * the step's (at that period), in the same manifest; and the decision's sends
 * without the protocol (one small message on each link's worth of TCP connections
 * to receivers blocked as the leaders are, placed as the participants are, at that
 * period), so that latency - bare commit - bare sends is the protocol's own part.
 * Target: commit
 * latency <= 1 ms + one durable LMDB commit at W = 256 (the one at the step
 * period: the comparison is made at the same cadence).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "commit/commit.h"
#include "io/io.h"
#include "manifest/manifest.h"
#include "net/net.h"
#include "synth.h"

#define NTENSORS 128
#define STEPS    20
#define ROWS     (1u << 16)

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

static double median_us(uint64_t *v, size_t n)
{
	qsort(v, n, sizeof *v, cmp_u64);
	return (double)v[n / 2] / 1000.0;
}


struct rank_arg {
	struct commit_part *p;
	uint32_t rank, world;
	uint64_t step;
	pthread_barrier_t *bar;
	uint64_t sent_ns, decided_ns;
	int rc;
};

static void *rank_main(void *p)
{
	struct rank_arg *a = p;
	void *ix;
	size_t len;
	uint64_t save_id = 0;
	a->rc = commit_part_begin(a->p, a->step, &save_id);
	if (!a->rc)
		a->rc = synth_rows_encode(a->step, a->rank, a->world, save_id, NTENSORS, ROWS, 64, &ix, &len);
	pthread_barrier_wait(a->bar);   /* every rank ready: vote together */
	if (a->rc)
		return NULL;
	struct commit_vote v = { .rank = a->rank, .step = a->step, .save_id = save_id, .index = ix, .index_len = len,
	                         .file_size = 1 };
	a->rc = commit_part_prepare(a->p, &v);
	a->sent_ns = ckpt_now_ns();
	if (!a->rc)
		a->rc = commit_part_wait(a->p, a->step, 60000);
	a->decided_ns = ckpt_now_ns();
	free(ix);
	return NULL;
}

/* W participants vote on STEPS steps, all at once each time; e2e[s] gets the time
 * from the last PREPARE sent to the last decision received. ns > 0: through node
 * leaders of ns participants each. */
static int run_participants(unsigned port, uint32_t w, uint32_t ns, uint64_t *e2e)
{
	struct commit_part **parts = calloc(w, sizeof *parts);
	struct rank_arg *args = calloc(w, sizeof *args);
	pthread_t *th = calloc(w, sizeof *th);
	uint32_t nodes = ns ? (w + ns - 1) / ns : 0;
	struct commit_leader **leaders = calloc(nodes ? nodes : 1, sizeof *leaders);
	char (*addr)[108] = calloc(nodes ? nodes : 1, sizeof *addr);
	int rc = parts && args && th && leaders && addr ? 0 : -ENOMEM;
	for (uint32_t k = 0; k < nodes && !rc; k++) {
		uint32_t first = k * ns;
		commit_leader_addr(addr[k], sizeof addr[k], "bench", port, first);
		struct commit_leader_opts lo = {
			.transport = NET_TCP, .addr = "127.0.0.1", .port = port, .local_addr = addr[k],
			.job_id = "bench", .rank = first, .world = w, .node = k, .first = first,
			.nranks = w - first < ns ? w - first : ns, .timeout_ms = 30000 };
		if ((rc = commit_leader_start(&lo, &leaders[k])))
			fprintf(stderr, "leader of node %u: %s\n", k, ckpt_last_error());
	}
	for (uint32_t r = 0; r < w && !rc; r++) {
		struct commit_part_opts po = { .transport = NET_TCP, .addr = "127.0.0.1",
		                               .port = port, .job_id = "bench",
		                               .rank = r, .world = w, .timeout_ms = 30000 };
		if (ns) {
			po.transport = NET_UNIX;
			po.addr = addr[r / ns];
			po.port = 0;
		}
		rc = commit_part_connect(&po, &parts[r]);
	}
	for (int s = 0; s < STEPS && !rc; s++) {
		pthread_barrier_t bar;
		pthread_barrier_init(&bar, NULL, w);
		for (uint32_t r = 0; r < w; r++) {
			args[r] = (struct rank_arg){ .p = parts[r], .rank = r, .world = w,
			                             .step = (uint64_t)s + 1, .bar = &bar };
			pthread_create(&th[r], NULL, rank_main, &args[r]);
		}
		uint64_t last_sent = 0, last_dec = 0;
		for (uint32_t r = 0; r < w; r++) {
			pthread_join(th[r], NULL);
			if (args[r].rc && !rc) {
				rc = args[r].rc;
				fprintf(stderr, "rank %u: %s\n", r, ckpt_last_error());
			}
			if (args[r].sent_ns > last_sent) last_sent = args[r].sent_ns;
			if (args[r].decided_ns > last_dec) last_dec = args[r].decided_ns;
		}
		pthread_barrier_destroy(&bar);
		e2e[s] = last_dec - last_sent;
	}
	for (uint32_t r = 0; parts && r < w; r++)
		commit_part_close(parts[r]);
	for (uint32_t k = 0; k < nodes; k++)
		commit_leader_stop(leaders[k]);
	free(parts);
	free(args);
	free(th);
	free(leaders);
	free(addr);
	return rc;
}

struct part_run {
	unsigned port;
	uint32_t w, ns;
	uint64_t *e2e;
	int rc;
};

static void *part_run_main(void *p)
{
	struct part_run *pr = p;
	pr->rc = run_participants(pr->port, pr->w, pr->ns, pr->e2e);
	return NULL;
}

/* Sleep out the rest of period from t0. */
static void pace(uint64_t t0, uint64_t period)
{
	uint64_t now = ckpt_now_ns();
	if (now - t0 < period)
		usleep((useconds_t)((period - (now - t0)) / 1000));
}

/* One durable commit of w shard records shaped like the step's (the index stays in
 * the shard files: each record names its footer), on a step of its own. */
static int commit_records(struct manifest *m, uint64_t step, uint32_t w, uint64_t *ns_out)
{
	struct manifest_shard *sh = calloc(w, sizeof *sh);
	char (*paths)[80] = calloc(w, sizeof *paths);
	if (!sh || !paths) {
		free(sh);
		free(paths);
		return -ENOMEM;
	}
	uint64_t save_id = ckpt_random_id();     /* canonical paths: one table, as a job's */
	for (uint32_t r = 0; r < w; r++) {
		ckpt_path_shard_rel(paths[r], sizeof paths[r], step, r, save_id);
		sh[r] = (struct manifest_shard){ .rank = r, .path = paths[r], .file_size = 1u << 30,
		                                 .footer_offset = 1u << 29, .footer_len = 18000 };
		memset(sh[r].footer_hash, (int)r, sizeof sh[r].footer_hash);
	}
	struct manifest_step rec = { .step = step, .world = w, .save_id = save_id };
	uint64_t t = ckpt_now_ns();
	int rc = manifest_commit(m, &rec, sh, w);
	*ns_out = ckpt_now_ns() - t;
	free(sh);
	free(paths);
	return rc;
}

/* ------------------------------------------------------------------ bare sends */

/* The decision's sends without the protocol: one small message on each of `links`
 * TCP connections over 127.0.0.1, to receivers blocked in poll() as the node
 * leaders are, placed as the participants are (threads of this process, or of a
 * child at nice 19, or of a child on CPUs of their own). Each receiver answers
 * one byte, read after the clock stops, so that every round starts with every
 * receiver blocked again. Median of STEPS rounds at the steps' period. */
#define BARE_MSG 48   /* about a decision's frame: 16-byte header and status */

static void *bare_rx(void *p)
{
	int fd = (int)(intptr_t)p;
	char b[256];
	for (;;) {
		struct pollfd pf = { fd, POLLIN, 0 };
		if (poll(&pf, 1, -1) < 0 && errno != EINTR)
			return NULL;
		ssize_t n = recv(fd, b, sizeof b, 0);
		if (n <= 0 || send(fd, "k", 1, MSG_NOSIGNAL) != 1)
			return NULL;
	}
}

/* Connect n receivers to port and serve them until the other side closes. */
static int bare_receivers(unsigned port, uint32_t n)
{
	pthread_t *th = calloc(n, sizeof *th);
	int *fd = calloc(n, sizeof *fd);
	uint32_t started = 0;
	int rc = th && fd ? 0 : -ENOMEM;
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
	                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	for (uint32_t i = 0; i < n && !rc; i++) {
		int one = 1;
		fd[i] = socket(AF_INET, SOCK_STREAM, 0);
		if (fd[i] < 0 || connect(fd[i], (struct sockaddr *)&sa, sizeof sa) < 0 ||
		    setsockopt(fd[i], IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) < 0) {
			rc = -errno;
			break;
		}
		if (pthread_create(&th[i], NULL, bare_rx, (void *)(intptr_t)fd[i]) == 0)
			started++;
		else
			rc = -EAGAIN;
	}
	for (uint32_t i = 0; i < started; i++)
		pthread_join(th[i], NULL);
	for (uint32_t i = 0; fd && i < n; i++)
		if (fd[i] > 0)
			close(fd[i]);
	free(th);
	free(fd);
	return rc;
}

struct bare_rx_run { unsigned port; uint32_t n; int rc; };

static void *bare_rx_run_main(void *p)
{
	struct bare_rx_run *r = p;
	r->rc = bare_receivers(r->port, r->n);
	return NULL;
}

static void pin_to(int first, int last);

/* Returns the median in ns, 0 on failure (printed). */
static uint64_t bare_sends(uint32_t links, int where, uint64_t period)
{
	int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof sa;
	if (ls < 0 || setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0 ||
	    bind(ls, (struct sockaddr *)&sa, sizeof sa) < 0 ||
	    getsockname(ls, (struct sockaddr *)&sa, &len) < 0 || listen(ls, (int)links) < 0) {
		perror("bare sends: listen");
		if (ls >= 0)
			close(ls);
		return 0;
	}
	unsigned port = ntohs(sa.sin_port);
	struct bare_rx_run run = { .port = port, .n = links };
	pthread_t runner;
	pid_t pid = -1;
	if (where == 0) {
		if (pthread_create(&runner, NULL, bare_rx_run_main, &run)) {
			close(ls);
			return 0;
		}
	} else if ((pid = fork()) == 0) {
		close(ls);
		if (nice(19) < 0)
			perror("nice");
		if (where == 2)
			pin_to(1, (int)sysconf(_SC_NPROCESSORS_ONLN) - 1);
		_exit(bare_receivers(port, links) ? 1 : 0);
	}
	int *fd = calloc(links, sizeof *fd);
	uint64_t t[STEPS];
	uint32_t got = 0;
	bool ok = fd != NULL && (where == 0 || pid > 0);
	for (; ok && got < links; got++) {
		fd[got] = accept(ls, NULL, NULL);
		ok = fd[got] >= 0 &&
		     setsockopt(fd[got], IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) == 0;
	}
	char msg[BARE_MSG], ack;
	memset(msg, 0x5a, sizeof msg);
	for (int s = 0; s < STEPS && ok; s++) {
		usleep((useconds_t)(period / 2000));   /* receivers idle a while, as between steps */
		uint64_t t1 = ckpt_now_ns();
		for (uint32_t i = 0; i < links && ok; i++)
			ok = send(fd[i], msg, sizeof msg, MSG_NOSIGNAL) == (ssize_t)sizeof msg;
		t[s] = ckpt_now_ns() - t1;
		for (uint32_t i = 0; i < links && ok; i++)
			ok = recv(fd[i], &ack, 1, MSG_WAITALL) == 1;
	}
	for (uint32_t i = 0; fd && i < got; i++)
		if (fd[i] >= 0)
			close(fd[i]);
	close(ls);
	free(fd);
	if (where == 0) {
		pthread_join(runner, NULL);
	} else if (pid > 0) {
		int st;
		waitpid(pid, &st, 0);
	}
	if (!ok) {
		fprintf(stderr, "bare sends to %u receivers failed: %s\n", links, strerror(errno));
		return 0;
	}
	qsort(t, STEPS, sizeof t[0], cmp_u64);
	return t[STEPS / 2];
}

/* Participants: in this process (0), in a child at nice 19 (1), or in a child on
 * CPUs of their own (2: the coordinator's process on CPU 0, the child on the others,
 * as on a cluster where no rank shares the coordinator's CPUs). */
enum { SAME = 0, APART = 1, PINNED = 2 };

static void pin_to(int first, int last)
{
	cpu_set_t cs;
	CPU_ZERO(&cs);
	for (int c = first; c <= last; c++)
		CPU_SET(c, &cs);
	if (sched_setaffinity(0, sizeof cs, &cs))
		perror("sched_setaffinity");
}

static int bench_world(const char *dir, uint32_t w, uint32_t ns, int where)
{
	bool apart = where != SAME;
	cpu_set_t was;
	int ncpu = (int)sysconf(_SC_NPROCESSORS_ONLN);
	sched_getaffinity(0, sizeof was, &was);
	/* Threads created from here on (the coordinator's) inherit CPU 0. */
	if (where == PINNED)
		pin_to(0, 0);
	char root[4096];
	snprintf(root, sizeof root, "%s/bench-commit-%u", dir, w);
	struct manifest *m;
	int rc = manifest_open(root, MANIFEST_CREATE, &m);
	if (rc == -ENOENT) {
		char cmd[4200];
		snprintf(cmd, sizeof cmd, "mkdir -p %s", root);
		if (system(cmd) == 0)
			rc = manifest_open(root, MANIFEST_CREATE, &m);
	}
	if (rc) {
		fprintf(stderr, "manifest %s: %s\n", root, ckpt_last_error());
		return rc;
	}
	struct commit_coord *co;
	struct commit_coord_opts o = { .manifest = m, .job_id = "bench", .world = w,
	                               .transport = NET_TCP, .addr = "127.0.0.1", .port = 0,
	                               .timeout_ms = 60000 };
	if ((rc = commit_coord_start(&o, &co))) {
		fprintf(stderr, "coordinator: %s\n", ckpt_last_error());
		return rc;
	}
	uint64_t e2e[STEPS], lat[STEPS], last[STEPS], txn[STEPS], bc[STEPS], bare[STEPS], same[STEPS];
	uint32_t sends = 0;
	memset(e2e, 0, sizeof e2e);
	/* The participants: threads of this process, or of a child process at nice 19
	 * (apart: a cluster's ranks do not share the coordinator's CPUs). */
	int fds[2] = { -1, -1 };
	pid_t pid = 0;
	if (apart && pipe(fds) == 0)
		pid = fork();
	unsigned port = commit_coord_port(co);
	struct part_run pr = { .port = port, .w = w, .ns = ns, .e2e = e2e };
	pthread_t runner;
	if (apart && pid == 0) {
		close(fds[0]);
		if (nice(19) < 0)
			perror("nice");
		if (where == PINNED)
			pin_to(1, ncpu - 1);
		int prc = run_participants(port, w, ns, e2e);
		ssize_t k = write(fds[1], e2e, sizeof e2e);
		_exit(prc == 0 && k == (ssize_t)sizeof e2e ? 0 : 1);
	}
	if (!apart)
		pthread_create(&runner, NULL, part_run_main, &pr);
	/* Collect the coordinator's timing of each step as it is decided, and the
	 * steps' cadence. */
	int got = 0;
	uint64_t seen = 0, t_end = ckpt_now_ns() + 120ull * 1000000000ull, t_first = 0, t_last = 0;
	while (!rc && got < STEPS && ckpt_now_ns() < t_end) {
		struct commit_coord_stats st;
		if (commit_coord_last_stats(co, &st) == 0 && st.step != seen) {
			seen = st.step;
			lat[got] = st.total_ns;
			last[got] = st.last_vote_ns;
			txn[got] = st.commit_ns;
			bc[got] = st.broadcast_ns;
			sends = st.sends;
			t_last = ckpt_now_ns();
			if (!got++)
				t_first = t_last;
		}
		usleep(50);
	}
	if (!apart) {
		pthread_join(runner, NULL);
		rc = rc ? rc : pr.rc;
	}
	if (apart) {
		close(fds[1]);
		if (read(fds[0], e2e, sizeof e2e) != (ssize_t)sizeof e2e)
			rc = -EIO;
		close(fds[0]);
		int stt;
		waitpid(pid, &stt, 0);
		if (!WIFEXITED(stt) || WEXITSTATUS(stt))
			rc = rc ? rc : -EIO;
	}
	if (!rc && got < STEPS) {
		fprintf(stderr, "W %u: timing of %d of %d steps seen\n", w, got, STEPS);
		rc = -EIO;
	}
	/* The limits, in the same manifest: one bare durable commit of one small
	 * record, back to back (as earlier tables measured it) and at the cadence of
	 * the steps above; and the durable commit of as many records as a step has, at
	 * that cadence. On this virtual disk a synced commit that follows another at
	 * once costs a fraction of one that comes tens of milliseconds after the last
	 * (docs/perf.md §2): the coordinator commits once per step. */
	uint64_t period = got > 1 ? (t_last - t_first) / (uint64_t)(got - 1) : 0;
	if (period > 200000000ull)
		period = 200000000ull;
	uint64_t b2b[STEPS];
	for (int pass = 0; pass < 2; pass++) {
		for (int s = 0; s < STEPS && !rc; s++) {
			uint64_t t0 = ckpt_now_ns();
			char path[80];
			uint64_t step = (pass ? 2100000 : 2000000) + (uint64_t)s;
			ckpt_path_shard_rel(path, sizeof path, step, 0, 0);
			struct manifest_shard one = { .rank = 0, .path = path, .file_size = 1,
			                              .index = "x", .index_len = 1 };
			struct manifest_step rec1 = { .step = step, .world = 1 };
			uint64_t t4 = ckpt_now_ns();
			rc = manifest_commit(m, &rec1, &one, 1);
			(pass ? bare : b2b)[s] = ckpt_now_ns() - t4;
			if (pass)
				pace(t0, period);
		}
	}
	for (int s = 0; s < STEPS && !rc; s++) {
		uint64_t t0 = ckpt_now_ns();
		rc = commit_records(m, 3000000 + (uint64_t)s, w, &same[s]);
		pace(t0, period);
	}
	uint64_t bs = rc ? 0 : bare_sends(sends, where, period);
	if (!rc && !bs)
		rc = -EIO;
	if (!rc) {
		double b = median_us(bare, STEPS), l = median_us(lat, STEPS), bb = median_us(b2b, STEPS);
		char mode[48];
		if (ns)
			snprintf(mode, sizeof mode, "tree, nodes of %u", ns);
		else
			snprintf(mode, sizeof mode, "flat");
		double bsu = (double)bs / 1e3;
		printf("| %4u | %s | %s | %u | %6.0f | %6.0f | %6.0f | %6.0f | %6.0f | %6.0f | %6.0f | "
		       "%6.0f | %6.0f | %6.0f | %6.0f | %s | %s |\n",
		       w, mode, where == PINNED ? "other process, other CPUs" :
		       apart ? "other process, nice 19" : "same process", sends, l,
		       median_us(last, STEPS), median_us(txn, STEPS), median_us(bc, STEPS),
		       bb, b, median_us(same, STEPS), bsu, l - b - bsu, median_us(e2e, STEPS),
		       (double)period / 1e3, l <= 1000.0 + b ? "yes" : "no", l <= 1000.0 + bb ? "yes" : "no");
		fflush(stdout);
	}
	commit_coord_stop(co);
	manifest_close(m);
	if (where == PINNED)
		sched_setaffinity(0, sizeof was, &was);
	char cmd[4200];
	snprintf(cmd, sizeof cmd, "rm -rf %s", root);
	if (system(cmd))
		fprintf(stderr, "could not remove %s\n", root);
	return rc;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: bench_commit DIR [--node-size N] [--flat|--tree] [--pin] [W...]\n");
		return 2;
	}
	uint32_t ws[16] = { 4, 64, 256 }, ns = 8;
	int nw = 3, i = 2;
	bool flat = true, tree = true, pin = false;
	for (; i < argc && argv[i][0] == '-'; i++) {
		if (!strcmp(argv[i], "--node-size") && i + 1 < argc) {
			ns = (uint32_t)strtoul(argv[++i], NULL, 10);
		} else if (!strcmp(argv[i], "--flat")) {
			tree = false;
		} else if (!strcmp(argv[i], "--tree")) {
			flat = false;
		} else if (!strcmp(argv[i], "--pin")) {
			pin = true;
		} else {
			fprintf(stderr, "bench_commit: unknown option %s\n", argv[i]);
			return 2;
		}
	}
	if (ns == 0) {
		fprintf(stderr, "bench_commit: --node-size must be at least 1\n");
		return 2;
	}
	if (pin && sysconf(_SC_NPROCESSORS_ONLN) < 2) {
		fprintf(stderr, "bench_commit: --pin needs two CPUs or more; rows without it only\n");
		pin = false;
	}
	if (i < argc) {
		nw = 0;
		for (; i < argc && nw < 16; i++)
			ws[nw++] = (uint32_t)strtoul(argv[i], NULL, 10);
	}
	printf("commit latency, median of %d steps, %d tensors sharded over W ranks (microseconds)\n",
	       STEPS, NTENSORS);
	printf("| W | commit | participants | links | commit latency | last vote checks |"
	       " final checks + LMDB txn | decision sends | bare LMDB commit, back to back |"
	       " bare LMDB commit, at step cadence | LMDB commit of W records, at step cadence |"
	       " bare sends on the links, at step cadence |"
	       " latency - bare commit at cadence - bare sends |"
	       " burst, end to end | step period | latency <= 1 ms + bare at cadence |"
	       " latency <= 1 ms + bare back to back |\n");
	printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
	       " --- | --- | --- |\n");
	fflush(stdout);
	for (int k = 0; k < nw; k++)
		for (int t = 0; t < 2; t++)
			for (int where = SAME; where <= (pin ? PINNED : APART); where++)
				if (((t == 0 && flat) || (t == 1 && tree)) &&
				    bench_world(argv[1], ws[k], t ? ns : 0, where))
					return 1;
	return 0;
}
