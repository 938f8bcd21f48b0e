/*
 * test_flood.c — connection floods against the commit coordinator and the node
 * leader (lib/commit/accept.c): what anyone who can reach their listeners can do
 * without the job's secret.
 *
 * The flood: a coordinator of W = 3 ranks runs in this process under a limit of
 * 256 descriptors, while an attacker process opens 1,500 silent tcp connections to
 * it and holds them, then keeps opening more. The honest ranks (threads of this
 * process, ranks.c) must still connect, by fresh connections for each step and then
 * by the same ones, and commit every step; the process must never run out of
 * descriptors (sampled from /proc/self/fd, and no accept may fail); and the lines
 * the coordinator writes about the connections it rejects or drops must stay few
 * while still counting them all ("N similar messages suppressed").
 *
 * The herd: 512 honest ranks join at once (128 under a sanitizer), several times
 * the handshakes that may run together; they must wait their turn, none broken for
 * another (some are accepted long before their HELLO comes, on two cores shared by
 * 512 threads).
 *
 * Out of descriptors: accept failing with EMFILE is logged, does not spin the loop,
 * and the connection that waited is served once descriptors are back.
 *
 * Peer credentials (run as its own ctest, `test_commit_flood peercred`, since it
 * needs root to get a process of another user): the node leader's abstract unix
 * socket refuses a process of another uid before any handshake, and still serves
 * its own user.
 *
 * Waits are generous and only guard against hangs; no verdict depends on timing.
 * Threaded: also run under TSan (label tsan).
 */
#include <arpa/inet.h>
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "commit/commit_internal.h"
#include "ranks.h"
#include "synth.h"
#include "testutil.h"

#define JOB    "job-flood-test"
#define SECRET "the flood test's secret"
#define TMO    60000          /* ms: guards against hangs, never reached when passing */
#define GUARD  30000          /* ms: the coordinator's and the ranks' timeouts, likewise
                                 (hundreds of ranks joining under TSan take seconds) */
#define WORLD  3

#define COORD_FDS     256     /* this process's descriptor limit under the flood */
#define ATTACK_CONNS  1500    /* silent connections opened, then held */
#define ATTACK_CHURN  256     /* then more, each closed again once this many newer are open */
#define ATTACK_FDS    (ATTACK_CONNS + ATTACK_CHURN + 64)
/* What accept.c allows itself (HANDSHAKE_MAX): the connections the coordinator may
 * still hold in handshakes when it stops, and so never report. */
#define HANDSHAKES    64

static double ms_since(uint64_t t0) { return (double)(ckpt_now_ns() - t0) / 1e6; }

/* ---------------------------------------------------------------- stderr, read back */

struct capture {
	char path[512];
	int saved;
};

static void capture_begin(struct capture *c, const char *dir)
{
	snprintf(c->path, sizeof c->path, "%s/stderr.log", dir);
	int fd = open(c->path, O_CREAT | O_TRUNC | O_WRONLY | O_APPEND | O_CLOEXEC, 0600);
	ck_assert_int_ge(fd, 0);
	fflush(stderr);
	c->saved = dup(2);
	ck_assert_int_ge(c->saved, 0);
	ck_assert_int_ge(dup2(fd, 2), 0);
	close(fd);
}

/* Restores stderr (and echoes what was written to it); returns that text. */
static char *capture_end(struct capture *c)
{
	ck_assert_int_ge(dup2(c->saved, 2), 0);
	close(c->saved);
	void *p = NULL;
	size_t n = 0;
	ck_assert_int_eq(tu_read_file(c->path, &p, &n), 0);
	char *s = realloc(p, n + 1);
	ck_assert_ptr_nonnull(s);
	s[n] = '\0';
	ssize_t w = write(2, s, n);
	(void)w;
	return s;
}

/* ---------------------------------------------------------------- descriptors */

/* Samples how many descriptors this process holds, until stopped. */
struct fd_sampler {
	pthread_t  t;
	atomic_int stop;
	int        max;
	bool       ran_out;          /* opendir failed for want of a descriptor */
};

static void *sampler_main(void *p)
{
	struct fd_sampler *s = p;
	while (!atomic_load(&s->stop)) {
		DIR *d = opendir("/proc/self/fd");
		if (!d) {
			if (errno == EMFILE || errno == ENFILE)
				s->ran_out = true;
		} else {
			int n = 0;
			for (struct dirent *e; (e = readdir(d));)
				n += e->d_name[0] != '.';
			closedir(d);
			if (n > s->max)
				s->max = n;
		}
		struct timespec ts = { 0, 5 * 1000000L };
		nanosleep(&ts, NULL);
	}
	return NULL;
}

/* ---------------------------------------------------------------- the attacker */

static void sleep_us(long us)
{
	struct timespec ts = { us / 1000000, (us % 1000000) * 1000L };
	nanosleep(&ts, NULL);
}

/* Raise this process's descriptor limit to n (the hard limit too, where allowed:
 * root). 0, or -errno. */
static int raise_nofile(rlim_t n)
{
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl))
		return -errno;
	if (rl.rlim_cur >= n)
		return 0;
	if (rl.rlim_max < n)
		rl.rlim_max = n;
	rl.rlim_cur = n;
	return setrlimit(RLIMIT_NOFILE, &rl) ? -errno : 0;
}

static int silent_connect(unsigned port, bool wait)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | (wait ? 0 : SOCK_NONBLOCK), 0);
	if (fd < 0)
		return -1;
	struct timeval tv = { 5, 0 };    /* a connect the backlog cannot take fails, not hangs */
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (connect(fd, (struct sockaddr *)&sa, sizeof sa) && !(!wait && errno == EINPROGRESS)) {
		close(fd);
		return -1;
	}
	return fd;
}

/* The attacker (a child process): reads the port from ctl, opens ATTACK_CONNS silent
 * connections and holds them, reports how many on report, then opens more (each
 * closed again once ATTACK_CHURN newer ones are open) until ctl closes. Never says a
 * byte. Exits 77 when it cannot have the descriptors. */
static void attacker_main(int ctl, int report)
{
	static int held[ATTACK_CONNS], churn[ATTACK_CHURN];
	int rc = raise_nofile(ATTACK_FDS);
	if (rc) {
		dprintf(report, "77 cannot raise RLIMIT_NOFILE to %d: %s\n", ATTACK_FDS, strerror(-rc));
		_exit(77);
	}
	unsigned port;
	if (read(ctl, &port, sizeof port) != (ssize_t)sizeof port)
		_exit(2);
	int n = 0;
	while (n < ATTACK_CONNS && (held[n] = silent_connect(port, true)) >= 0)
		n++;
	dprintf(report, "%d connections\n", n);
	/* More, as long as the test runs: the coordinator's handshakes stay at their
	 * bound while the honest ranks connect. About 100 a second is enough for that
	 * (more would only measure how fast a sanitizer build starts threads). */
	for (unsigned k = 0;; k++) {
		struct pollfd pf = { .fd = ctl, .events = POLLIN };
		if (poll(&pf, 1, 0) != 0)
			break;                    /* closed: the test is over */
		int *slot = &churn[k % ATTACK_CHURN];
		if (k >= ATTACK_CHURN)
			close(*slot);
		*slot = silent_connect(port, false);
		sleep_us(10000);
	}
	_exit(0);
}

struct attacker {
	pid_t pid;
	int ctl, report;
};

static void attacker_start(struct attacker *at)
{
	int ctl[2], report[2];
	ck_assert_int_eq(pipe2(ctl, O_CLOEXEC), 0);
	ck_assert_int_eq(pipe2(report, O_CLOEXEC), 0);
	fflush(NULL);
	at->pid = fork();
	ck_assert_int_ge(at->pid, 0);
	if (at->pid == 0) {
		close(ctl[1]);
		close(report[0]);
		attacker_main(ctl[0], report[1]);
	}
	close(ctl[0]);
	close(report[1]);
	at->ctl = ctl[1];
	at->report = report[0];
}

/* The attacker's report: the number of connections it holds (it fails the test
 * if it could not run). */
static int attacker_ready(struct attacker *at, unsigned port)
{
	ck_assert_int_eq(write(at->ctl, &port, sizeof port), (ssize_t)sizeof port);
	char line[256] = "";
	size_t got = 0;
	while (got < sizeof line - 1 && !memchr(line, '\n', got)) {
		struct pollfd pf = { .fd = at->report, .events = POLLIN };
		ck_assert_msg(poll(&pf, 1, 60000) == 1, "the attacker did not report");
		ssize_t r = read(at->report, line + got, sizeof line - 1 - got);
		ck_assert_msg(r > 0, "the attacker exited without a report");
		got += (size_t)r;
	}
	ck_assert_msg(strncmp(line, "77 ", 3) != 0, "the attacker: %s", line + 3);
	return atoi(line);
}

static void attacker_stop(struct attacker *at)
{
	close(at->ctl);
	int st = 0;
	ck_assert_int_eq(waitpid(at->pid, &st, 0), at->pid);
	ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the attacker ended with status %d",
	              st);
	close(at->report);
}

/* ---------------------------------------------------------------- the job */

struct env {
	char *root;
	struct manifest *m;
	struct commit_coord *c;
	unsigned port;
	struct ranks_env r;
};

static int part_open(const void *env, uint32_t rank, struct commit_part **out)
{
	const struct env *e = env;
	struct commit_part_opts o = { .transport = NET_TCP, .addr = "127.0.0.1", .port = e->port,
	                              .job_id = JOB, .rank = rank, .world = e->r.world,
	                              .secret = SECRET, .secret_len = strlen(SECRET),
	                              .timeout_ms = GUARD };
	return commit_part_connect(&o, out);
}

/* The coordinator of a job of world ranks on e's manifest, on an ephemeral port, and
 * the ranks' environment that joins it. */
static void env_coord_start(struct env *e, uint32_t world)
{
	struct commit_coord_opts o = { .manifest = e->m, .job_id = JOB, .world = world,
	                               .secret = SECRET, .secret_len = strlen(SECRET),
	                               .transport = NET_TCP, .addr = "127.0.0.1", .port = 0,
	                               .timeout_ms = GUARD };
	ck_assert_msg(commit_coord_start(&o, &e->c) == 0, "commit_coord_start: %s", ckpt_err_msg());
	e->port = commit_coord_port(e->c);
	e->r = (struct ranks_env){ .m = e->m, .c = e->c, .world = world, .tmo_ms = TMO,
	                           .open = part_open, .env = e };
}

START_TEST(flood_of_silent_connections)
{
	struct env e = { 0 };
	e.root = tu_tmpdir("commit-flood");
	struct capture cap;
	capture_begin(&cap, e.root);
	/* Forked before any thread runs or the manifest opens, with this process's
	 * limit: it raises its own. */
	struct attacker at;
	attacker_start(&at);
	ck_assert_msg(manifest_open(e.root, MANIFEST_CREATE, &e.m) == 0, "%s", ckpt_err_msg());
	struct rlimit rl;
	ck_assert_int_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
	rl.rlim_cur = COORD_FDS;
	ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);

	env_coord_start(&e, WORLD);
	struct fd_sampler fs = { 0 };
	atomic_init(&fs.stop, 0);
	ck_assert_int_eq(pthread_create(&fs.t, NULL, sampler_main, &fs), 0);

	uint64_t t0 = ckpt_now_ns();
	int held = attacker_ready(&at, e.port);
	double flood_ms = ms_since(t0);
	ck_assert_msg(held == ATTACK_CONNS, "the attacker opened %d connections of %d", held,
	              ATTACK_CONNS);
	/* The honest ranks, while the attacker goes on: fresh connections for each of
	 * three steps (a handshake each under the flood), then three more steps on
	 * connections kept. */
	uint64_t t1 = ckpt_now_ns();
	for (uint64_t step = 1; step <= 3; step++)
		ranks_honest_commit(&e.r, step);
	struct commit_part *p[WORLD] = { 0 };
	for (uint64_t step = 4; step <= 6; step++)
		ranks_commit_all(&e.r, p, step);
	ranks_close(p, WORLD);
	double honest_ms = ms_since(t1);

	attacker_stop(&at);
	atomic_store(&fs.stop, 1);
	pthread_join(fs.t, NULL);
	commit_coord_stop(e.c);            /* writes the counts still held back */
	double total_s = ms_since(t0) / 1000;
	char *log = capture_end(&cap);
	manifest_close(e.m);

	unsigned rejected = tu_count_lines(log, "coordinator: rejected tcp");
	unsigned dropped = tu_count_lines(log, "coordinator: dropped tcp");
	unsigned summaries = tu_count_lines(log, "similar messages suppressed") +
	                     tu_count_lines(log, "similar message suppressed");
	unsigned long long counted = rejected + dropped +
	    tu_sum_suppressed(log, "coordinator: rejected connections") +
	    tu_sum_suppressed(log, "coordinator: connections dropped to make room");
	printf("flood: %d connections held in %.0f ms; 6 steps committed in %.0f ms; at most %d "
	       "descriptors; %u lines about %llu rejected or dropped connections (%u of them "
	       "counts)\n", held, flood_ms, honest_ms, fs.max, rejected + dropped + summaries,
	       counted, summaries);

	ck_assert_msg(!fs.ran_out, "this process ran out of descriptors");
	ck_assert_msg(fs.max < COORD_FDS, "%d descriptors in use, the limit is %d", fs.max,
	              COORD_FDS);
	ck_assert_msg(!strstr(log, "accept failures") && !strstr(log, "cannot accept") &&
	              !strstr(log, "Too many open files"), "out of descriptors:\n%s", log);
	/* Two kinds of line (rejected, dropped), each at most 10 per 5 s interval and a
	 * count per interval, and one more count each at the stop. */
	unsigned intervals = (unsigned)(total_s / 5) + 1;
	unsigned bound = 2 * (11 * intervals + 1);
	ck_assert_msg(rejected + dropped + summaries <= bound, "%u lines about rejected or dropped "
	              "connections in %.1f s (at most %u)", rejected + dropped + summaries,
	              total_s, bound);
	/* And they still account for the flood: every connection held was dropped or
	 * rejected, except those still in a handshake at the stop. */
	ck_assert_msg(counted >= ATTACK_CONNS - HANDSHAKES, "only %llu of %d connections are "
	              "accounted for in the log", counted, ATTACK_CONNS);
	free(log);
	tu_rmtree(e.root);
	free(e.root);
}
END_TEST

/* ---------------------------------------------------------------- many honest ranks */

START_TEST(many_ranks_join_at_once)
{
	/* Eight times as many ranks as handshakes may run at once connect together: the
	 * bound must make them wait their turn, never break one's handshake for
	 * another's. Under a sanitizer, two times: there 512 rank threads on two cores
	 * stay silent for seconds after connecting (measured: 2.5 s with ASan), longer
	 * than a joining rank ever does and than accept.c lets a silent peer be before
	 * it takes it for a flood. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
	enum { W = 2 * HANDSHAKES };
#else
	enum { W = 8 * HANDSHAKES };
#endif
	struct env e = { 0 };
	e.root = tu_tmpdir("commit-herd");
	ck_assert_msg(manifest_open(e.root, MANIFEST_CREATE, &e.m) == 0, "%s", ckpt_err_msg());
	env_coord_start(&e, W);
	uint64_t t0 = ckpt_now_ns();
	ranks_honest_commit(&e.r, 1);
	ranks_honest_commit(&e.r, 2);
	printf("%d ranks joined at once and committed, twice, in %.0f ms\n", W, ms_since(t0));
	commit_coord_stop(e.c);
	manifest_close(e.m);
	tu_rmtree(e.root);
	free(e.root);
}
END_TEST

/* ---------------------------------------------------------------- out of descriptors */

static double cpu_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

START_TEST(accept_out_of_descriptors)
{
	/* This process has no descriptor left when a connection arrives: accept fails
	 * (EMFILE) while the connection waits in the backlog and the listener stays
	 * readable. The coordinator must say so (rate-limited), must not spin on the
	 * listener meanwhile, and must serve that connection once descriptors are back. */
	struct env e = { 0 };
	e.root = tu_tmpdir("commit-emfile");
	struct capture cap;
	capture_begin(&cap, e.root);
	ck_assert_msg(manifest_open(e.root, MANIFEST_CREATE, &e.m) == 0, "%s", ckpt_err_msg());
	struct rlimit rl;
	ck_assert_int_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
	rl.rlim_cur = 128;                 /* fewer to fill */
	ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);
	env_coord_start(&e, WORLD);

	/* The client's socket first, then every descriptor left taken. */
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	ck_assert_int_ge(fd, 0);
	int fill[128], nfill = 0;
	while (nfill < 128 && (fill[nfill] = dup(0)) >= 0)
		nfill++;
	ck_assert_int_eq(errno, EMFILE);
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)e.port) };
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	ck_assert_int_eq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
	/* A HELLO that is junk, waiting in the socket: once accepted, it earns a REJECT. */
	uint8_t f[NET_HEADER_BYTES + 4] = { 0 };
	ckpt_put_le32(f, 0x4D4E4B43u);
	ckpt_put_le16(f + 4, NET_PROTO_VERSION);
	ckpt_put_le16(f + 6, NET_MSG_HELLO);
	ckpt_put_le32(f + 12, 4);
	ck_assert_int_eq(send(fd, f, sizeof f, MSG_NOSIGNAL), (ssize_t)sizeof f);
	/* Half a second out of descriptors: a loop that spins on the listener burns
	 * most of it; one that pauses, next to nothing. */
	double cpu0 = cpu_ms();
	struct timespec ts = { 0, 500 * 1000000L };
	nanosleep(&ts, NULL);
	double cpu = cpu_ms() - cpu0;
	for (int i = 0; i < nfill; i++)
		close(fill[i]);
	struct pollfd pf = { .fd = fd, .events = POLLIN };
	int answered = poll(&pf, 1, 10000);
	uint8_t b[64];
	ssize_t r = answered == 1 ? recv(fd, b, sizeof b, 0) : -1;
	close(fd);
	ranks_honest_commit(&e.r, 1);
	commit_coord_stop(e.c);
	char *log = capture_end(&cap);
	manifest_close(e.m);
	printf("out of descriptors: %.0f ms of CPU in 500 ms\n", cpu);
	unsigned said = tu_count_lines(log, "coordinator: cannot accept a connection");
	ck_assert_msg(said >= 1 && strstr(log, "Too many open files"), "accept failing was not "
	              "logged:\n%s", log);
	ck_assert_msg(said <= 10, "%u lines about accept failing in half a second", said);
	ck_assert_msg(cpu < 100, "%.0f ms of CPU in 500 ms out of descriptors: spinning", cpu);
	ck_assert_msg(r > 0, "the connection that waited was not served after (poll %d, recv %zd)",
	              answered, r);
	free(log);
	tu_rmtree(e.root);
	free(e.root);
}
END_TEST

/* ---------------------------------------------------------------- peer credentials */

#define CKNM 0x4D4E4B43u          /* the frame magic (docs/protocol.md §1.1) */
#define OTHER_UID 65534u          /* nobody */

/* Connect to the abstract unix socket addr ("@name"), send a HELLO frame whose
 * payload is junk, and say what came back: 0 nothing (closed at once, before any
 * handshake), 1 bytes (a REJECT: the handshake ran), 2 no answer, 3 no connection.
 * Only async-signal-safe calls: it runs in a child of a threaded process. */
static int probe_leader(const char *addr)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	size_t n = strlen(addr);
	if (n >= sizeof sa.sun_path)
		return 3;
	memcpy(sa.sun_path, addr, n);
	sa.sun_path[0] = '\0';
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0 || connect(fd, (struct sockaddr *)&sa,
	                      (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n)))
		return 3;
	uint8_t f[NET_HEADER_BYTES + 4] = { 0 };
	ckpt_put_le32(f, CKNM);
	ckpt_put_le16(f + 4, NET_PROTO_VERSION);
	ckpt_put_le16(f + 6, NET_MSG_HELLO);
	ckpt_put_le32(f + 12, 4);
	if (send(fd, f, sizeof f, MSG_NOSIGNAL) != (ssize_t)sizeof f) {
		close(fd);
		return 0;                 /* already closed by the leader */
	}
	struct pollfd pf = { .fd = fd, .events = POLLIN };
	if (poll(&pf, 1, 10000) != 1) {
		close(fd);
		return 2;
	}
	uint8_t b[64];
	ssize_t r = recv(fd, b, sizeof b, 0);
	close(fd);
	return r > 0 ? 1 : 0;
}

START_TEST(leader_refuses_other_users)
{
	/* A node of 2 ranks behind its leader (rank 0). */
	struct env e = { 0 };
	e.root = tu_tmpdir("commit-peercred");
	ck_assert_msg(manifest_open(e.root, MANIFEST_CREATE, &e.m) == 0, "%s", ckpt_err_msg());
	struct capture cap;
	capture_begin(&cap, e.root);
	env_coord_start(&e, 2);
	char addr[108];
	commit_leader_addr(addr, sizeof addr, JOB, e.port, 0);
	struct commit_leader_opts lo = {
		.transport = NET_TCP, .addr = "127.0.0.1", .port = e.port, .local_addr = addr,
		.job_id = JOB, .rank = 0, .world = 2, .node = 0, .first = 0, .nranks = 2,
		.secret = SECRET, .secret_len = strlen(SECRET), .timeout_ms = GUARD };
	struct commit_leader *l;
	ck_assert_msg(commit_leader_start(&lo, &l) == 0, "leader: %s", ckpt_err_msg());

	/* Our own user reaches the handshake: the junk HELLO earns a REJECT. */
	ck_assert_int_eq(probe_leader(addr), 1);
	/* Another user does not: closed before a byte is read. */
	fflush(NULL);
	pid_t pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		if (setgid(OTHER_UID) || setuid(OTHER_UID))
			_exit(4);
		_exit(probe_leader(addr));
	}
	int st = 0;
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	ck_assert_msg(WIFEXITED(st), "the other user's probe ended with status %d", st);
	static const char *const what[] = { "closed before the handshake", "answered by the "
	                                    "handshake", "not answered", "not connected",
	                                    "could not change its uid" };
	int got = WEXITSTATUS(st);
	ck_assert_msg(got == 0, "uid %u's connection to the leader was %s", OTHER_UID,
	              got < 5 ? what[got] : "?");

	/* The node's ranks, of our user, still commit through their leader. */
	struct commit_part *p[2] = { 0 };
	for (uint32_t r = 0; r < 2; r++) {
		struct commit_part_opts po = { .transport = NET_UNIX, .addr = addr, .job_id = JOB,
		                               .rank = r, .world = 2, .secret = SECRET,
		                               .secret_len = strlen(SECRET), .timeout_ms = GUARD };
		ck_assert_msg(commit_part_connect(&po, &p[r]) == 0, "rank %u: %s", r, ckpt_err_msg());
	}
	e.r = (struct ranks_env){ .m = e.m, .c = e.c, .world = 2, .tmo_ms = TMO };
	ranks_commit_all(&e.r, p, 1);
	ranks_close(p, 2);
	commit_leader_stop(l);
	commit_coord_stop(e.c);
	char *log = capture_end(&cap);
	manifest_close(e.m);
	char want[128];
	snprintf(want, sizeof want, "refused a local connection of uid %u", OTHER_UID);
	ck_assert_msg(tu_count_lines(log, want) == 1, "no line '%s' in:\n%s", want, log);
	free(log);
	tu_rmtree(e.root);
	free(e.root);
}
END_TEST

/* ---------------------------------------------------------------- main */

/* Can a child of this process have ATTACK_FDS descriptors? 0, or 77 with the reason
 * printed. */
static int probe_descriptors(void)
{
	fflush(NULL);
	pid_t pid = fork();
	if (pid == 0)
		_exit(raise_nofile(ATTACK_FDS) ? 77 : 0);
	int st = 0;
	if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st))
		return 1;
	if (WEXITSTATUS(st) == 77) {
		struct rlimit rl;
		getrlimit(RLIMIT_NOFILE, &rl);
		printf("SKIP: the attacker needs %d descriptors; RLIMIT_NOFILE's hard limit is %llu "
		       "and only root may raise it\n", ATTACK_FDS, (unsigned long long)rl.rlim_max);
	}
	return WEXITSTATUS(st);
}

int main(int argc, char **argv)
{
	bool peercred = argc > 1 && !strcmp(argv[1], "peercred");
	if (peercred && geteuid() != 0) {
		printf("SKIP: a process of another user needs root to set up (setuid)\n");
		return 77;
	}
	if (!peercred) {
		int rc = probe_descriptors();
		if (rc)
			return rc;
	}
	tu_seed();
	/* Read the (empty) fault table before any thread starts. */
	ckpt_fault_reload();
	Suite *s = suite_create("commit_flood");
	TCase *tc = tcase_create(peercred ? "peercred" : "flood");
	tcase_set_timeout(tc, 120);
	if (peercred)
		tcase_add_test(tc, leader_refuses_other_users);
	else {
		tcase_add_test(tc, flood_of_silent_connections);
		tcase_add_test(tc, many_ranks_join_at_once);
		tcase_add_test(tc, accept_out_of_descriptors);
	}
	suite_add_tcase(s, tc);
	SRunner *sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
