/*
 * test_coordinator.c — the two-phase commit over tcp on 127.0.0.1
 * (lib/commit/coordinator.c, participant.c): a coordinator started on an
 * ephemeral port over a manifest in a temp root, and W participants in threads
 * of this process.
 *
 * The honest protocol: commits, step ordering with two saves in flight, -EEXIST
 * for a committed step, aborts by a rank, by a disconnect and by the timeout, and
 * the in-doubt outcome. Then bad peers — raw sockets with garbage, truncated and
 * oversized frames, failed handshakes, duplicate ranks, authenticated ranks that
 * forge, replay or mangle messages, silent clients — after each of which the
 * coordinator must still commit a new step for the honest ranks, and no forged or
 * malformed vote may have been committed. Waits are generous and only guard
 * against hangs; no test depends on timing for its verdict. Threaded: also run
 * under TSan (label tsan).
 */
#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "commit/commit_internal.h"
#include "ranks.h"
#include "synth.h"
#include "testutil.h"

#define JOB    "job-commit-test"
#define SECRET "a secret shared by the job"
#define TMO    20000          /* ms: a guard against hangs, never reached when passing */

static double ms_since(uint64_t t0) { return (double)(ckpt_now_ns() - t0) / 1e6; }

static void sleep_ms(int ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
	nanosleep(&ts, NULL);
}

/* ---------------------------------------------------------------- the job */

struct env {
	char *root;
	struct manifest *m;
	struct commit_coord *c;
	unsigned port;
	uint32_t world;
	unsigned timeout_ms;
	struct ranks_env r;      /* the honest ranks of ranks.c, each with its own connection */
};

static int part_open(const void *env, uint32_t rank, struct commit_part **out);

/* files: the coordinator holds each vote to the shard file it names (the ranks of
 * ranks.c vote with synthetic indexes and no file: those tests run without). */
static void env_start_files(struct env *e, uint32_t world, unsigned timeout_ms, bool files)
{
	memset(e, 0, sizeof *e);
	e->world = world;
	e->timeout_ms = timeout_ms;
	e->root = tu_tmpdir("commit-coord");
	ck_assert_msg(manifest_open(e->root, MANIFEST_CREATE, &e->m) == 0, "%s", ckpt_err_msg());
	struct commit_coord_opts o = { .manifest = e->m, .job_id = JOB, .world = world,
	                               .secret = SECRET, .secret_len = strlen(SECRET),
	                               .transport = NET_TCP, .addr = "127.0.0.1", .port = 0,
	                               .timeout_ms = timeout_ms, .root = files ? e->root : NULL,
	                               .incarnation = 0x1c0ffee };
	int rc = commit_coord_start(&o, &e->c);
	ck_assert_msg(rc == 0, "commit_coord_start: %s", ckpt_err_msg());
	e->port = commit_coord_port(e->c);
	ck_assert_uint_ne(e->port, 0);
	e->r = (struct ranks_env){ .m = e->m, .c = e->c, .world = world, .tmo_ms = TMO,
	                           .open = part_open, .env = e };
}

static void env_start(struct env *e, uint32_t world, unsigned timeout_ms)
{
	env_start_files(e, world, timeout_ms, false);
}

static void env_stop(struct env *e)
{
	commit_coord_stop(e->c);
	manifest_close(e->m);
	tu_rmtree(e->root);
	free(e->root);
	memset(e, 0, sizeof *e);
}

static struct commit_part_opts part_opts(const struct env *e, uint32_t rank)
{
	return (struct commit_part_opts){ .transport = NET_TCP, .addr = "127.0.0.1",
	                                  .port = e->port, .job_id = JOB, .rank = rank,
	                                  .world = e->world, .secret = SECRET,
	                                  .secret_len = strlen(SECRET), .timeout_ms = 10000 };
}

static struct commit_part *part_connect(const struct env *e, uint32_t rank)
{
	struct commit_part_opts o = part_opts(e, rank);
	struct commit_part *p = NULL;
	int rc = commit_part_connect(&o, &p);
	ck_assert_msg(rc == 0, "rank %u connect: %s", rank, ckpt_err_msg());
	return p;
}

static int part_open(const void *env, uint32_t rank, struct commit_part **out)
{
	struct commit_part_opts o = part_opts(env, rank);
	return commit_part_connect(&o, out);
}


static void expect_wait(struct commit_part *p, uint64_t step, int want, const char *const *needles)
{
	ranks_expect_wait(p, step, want, needles, TMO);
}

/* ================================================================ honest protocol */

START_TEST(commit_and_again)
{
	struct env e;
	env_start(&e, 4, 5000);
	struct commit_part *p[4] = { 0 };
	ranks_commit_all(&e.r, p, 1);
	ranks_commit_all(&e.r, p, 2);             /* the same connections, the next step */
	for (uint32_t r = 0; r < 4; r++) {
		struct manifest_shard sh;
		ck_assert_int_eq(manifest_shard_get(e.m, 1, r, &sh), 0);
		ck_assert_uint_eq(sh.file_size, 1000000u + r);
		manifest_shard_free(&sh);
	}
	uint64_t latest;
	ck_assert_int_eq(manifest_step_latest(e.m, &latest), 0);
	ck_assert_uint_eq(latest, 2);
	/* The coordinator keeps written space past LMDB's pages for the next commits
	 * (manifest_reserve): at least 1 MiB. */
	uint64_t used, size;
	ck_assert_int_eq(manifest_file_space(e.m, &used, &size), 0);
	ck_assert_msg(size >= used + (1u << 20), "data.mdb: %llu bytes used of %llu",
	              (unsigned long long)used, (unsigned long long)size);
	ranks_close(p, 4);
	env_stop(&e);
}
END_TEST

START_TEST(commits_ordered_by_step)
{
	/* Two saves in flight; the higher step's votes are all in first. It must wait
	 * for the lower one — also past the vote timeout, which is for missing votes,
	 * not for a lower step's. */
	struct env e;
	env_start(&e, 2, 500);
	struct commit_part *p[2] = { part_connect(&e, 0), part_connect(&e, 1) };
	for (uint32_t r = 0; r < 2; r++) {
		ck_assert_int_eq(ranks_begin(p[r], 10), 0);
		ck_assert_int_eq(ranks_begin(p[r], 11), 0);
	}
	for (uint32_t r = 0; r < 2; r++)
		ck_assert_int_eq(ranks_prepare(p[r], 11, r, 2), 0);
	sleep_ms(1500);
	struct manifest_step rec10, rec11;
	ck_assert_int_eq(manifest_step_get(e.m, 11, &rec11), 0);
	ck_assert_msg(rec11.state == CKPT_STATE_INFLIGHT,
	              "step 11 was decided (state %u) before step 10", rec11.state);
	for (uint32_t r = 0; r < 2; r++)
		ck_assert_int_eq(ranks_prepare(p[r], 10, r, 2), 0);
	for (uint32_t r = 0; r < 2; r++) {
		expect_wait(p[r], 10, 0, NULL);
		expect_wait(p[r], 11, 0, NULL);
	}
	ranks_assert_committed(&e.r, 10);
	ranks_assert_committed(&e.r, 11);
	ck_assert_int_eq(manifest_step_get(e.m, 10, &rec10), 0);
	ck_assert_int_eq(manifest_step_get(e.m, 11, &rec11), 0);
	ck_assert_uint_le(rec10.commit_time_ns, rec11.commit_time_ns);
	ranks_close(p, 2);
	env_stop(&e);
}
END_TEST

START_TEST(begin_committed_step)
{
	struct env e;
	env_start(&e, 2, 5000);
	struct commit_part *p[2] = { 0 };
	ranks_commit_all(&e.r, p, 3);
	int rc = ranks_begin(p[1], 3);
	ck_assert_msg(rc == -EEXIST, "rc %d (%s)", rc, ckpt_err_msg());
	ck_assert_msg(strstr(ckpt_err_msg(), "already committed"), "%s", ckpt_err_msg());
	ranks_commit_all(&e.r, p, 4);
	ranks_close(p, 2);
	env_stop(&e);
}
END_TEST

START_TEST(rank_abort)
{
	struct env e;
	env_start(&e, 3, 10000);
	struct commit_part *p[3] = { part_connect(&e, 0), part_connect(&e, 1), part_connect(&e, 2) };
	for (uint32_t r = 0; r < 3; r++)
		ck_assert_int_eq(ranks_begin(p[r], 7), 0);
	ck_assert_int_eq(ranks_prepare(p[0], 7, 0, 3), 0);
	ck_assert_int_eq(commit_part_abort(p[1], 7, -ENOSPC, "disk full writing the shard"), 0);
	ck_assert_int_eq(ranks_prepare(p[2], 7, 2, 3), 0);
	const char *const why[] = { "rank 1", "disk full writing the shard", NULL };
	expect_wait(p[0], 7, CKPT_EABORTED, why);
	expect_wait(p[2], 7, CKPT_EABORTED, why);
	struct manifest_step rec;
	ck_assert_int_eq(manifest_step_get(e.m, 7, &rec), 0);
	ck_assert_int_eq(rec.state, CKPT_STATE_ABORTED);
	ranks_commit_all(&e.r, p, 8);
	ranks_commit_all(&e.r, p, 7);             /* an aborted step may be saved again */
	ranks_close(p, 3);
	env_stop(&e);
}
END_TEST

START_TEST(late_vote_does_not_revive_a_step)
{
	/* Rank 1 fails step 1; rank 0 finishes writing and votes after the abort. The
	 * late vote must not re-open step 1 — with a 30 s vote timeout, a revived step
	 * would hold step 2 behind it past every wait here. */
	struct env e;
	env_start(&e, 2, 30000);
	struct commit_part *p[2] = { part_connect(&e, 0), part_connect(&e, 1) };
	ck_assert_int_eq(ranks_begin(p[0], 1), 0);
	ck_assert_int_eq(ranks_begin(p[1], 1), 0);
	ck_assert_int_eq(commit_part_abort(p[1], 1, -EIO, "write error"), 0);
	expect_wait(p[0], 1, CKPT_EABORTED, (const char *const[]){ "write error", NULL });
	ck_assert_int_eq(ranks_prepare(p[0], 1, 0, 2), 0);
	expect_wait(p[0], 1, CKPT_EABORTED, (const char *const[]){ "no save in flight", NULL });
	ranks_commit_all(&e.r, p, 2);
	ranks_assert_not_committed(&e.r, 1);
	struct manifest_step rec;
	ck_assert_int_eq(manifest_step_get(e.m, 1, &rec), 0);
	ck_assert_int_eq(rec.state, CKPT_STATE_ABORTED);
	ranks_close(p, 2);
	env_stop(&e);
}
END_TEST

START_TEST(disconnect_before_vote)
{
	/* A vote timeout far beyond the wait: only the disconnect can end it. */
	struct env e;
	env_start(&e, 3, 60000);
	struct commit_part *p[3] = { part_connect(&e, 0), part_connect(&e, 1), part_connect(&e, 2) };
	for (uint32_t r = 0; r < 3; r++)
		ck_assert_int_eq(ranks_begin(p[r], 5), 0);
	ck_assert_int_eq(ranks_prepare(p[0], 5, 0, 3), 0);
	ck_assert_int_eq(ranks_prepare(p[1], 5, 1, 3), 0);
	uint64_t t0 = ckpt_now_ns();
	commit_part_close(p[2]);
	p[2] = NULL;
	const char *const why[] = { "rank 2", "disconnected", NULL };
	expect_wait(p[0], 5, CKPT_EABORTED, why);
	expect_wait(p[1], 5, CKPT_EABORTED, why);
	ck_assert_msg(ms_since(t0) < 30000, "abort took %.0f ms", ms_since(t0));
	ranks_assert_not_committed(&e.r, 5);
	ranks_commit_all(&e.r, p, 6);             /* rank 2 comes back */
	ranks_close(p, 3);
	env_stop(&e);
}
END_TEST

START_TEST(timeout_one_rank_silent)
{
	struct env e;
	env_start(&e, 2, 500);
	struct commit_part *p[2] = { part_connect(&e, 0), part_connect(&e, 1) };
	ck_assert_int_eq(ranks_begin(p[0], 1), 0);
	ck_assert_int_eq(ranks_begin(p[1], 1), 0);
	uint64_t t0 = ckpt_now_ns();
	ck_assert_int_eq(ranks_prepare(p[0], 1, 0, 2), 0);
	const char *const why[] = { "timed out", "ranks 1", NULL };
	expect_wait(p[0], 1, CKPT_EABORTED, why);
	/* The deadline runs from the vote, which was sent after t0. */
	ck_assert_msg(ms_since(t0) >= 400, "aborted after %.0f ms, before the timeout",
	              ms_since(t0));
	expect_wait(p[1], 1, CKPT_EABORTED, NULL);
	ranks_assert_not_committed(&e.r, 1);
	ranks_commit_all(&e.r, p, 2);             /* both still connected and served */
	ranks_commit_all(&e.r, p, 1);
	ranks_close(p, 2);
	env_stop(&e);
}
END_TEST

START_TEST(in_doubt_when_coordinator_stops)
{
	struct env e;
	env_start(&e, 2, 5000);
	struct commit_part *p[2] = { part_connect(&e, 0), part_connect(&e, 1) };
	ck_assert_int_eq(ranks_begin(p[0], 9), 0);
	ck_assert_int_eq(ranks_begin(p[1], 9), 0);
	ck_assert_int_eq(ranks_prepare(p[0], 9, 0, 2), 0);
	commit_coord_stop(e.c);
	e.c = e.r.c = NULL;
	expect_wait(p[0], 9, CKPT_EINDOUBT, (const char *const[]){ "the manifest decides", NULL });
	expect_wait(p[1], 9, CKPT_EABORTED, (const char *const[]){ "before voting", NULL });
	ranks_assert_not_committed(&e.r, 9);      /* presumed abort */
	ranks_close(p, 2);
	env_stop(&e);
}
END_TEST

START_TEST(in_doubt_when_decision_lost)
{
	/* The commit happens, the decision is dropped: the ranks are in doubt, and the
	 * manifest says committed. The fault table is armed before any thread runs
	 * (ckpt_fault_reload races with fault points in running threads); it fires on
	 * the first decision only. */
	setenv("CKPT_FAULT", "before_decision_send:1:drop", 1);
	ckpt_fault_reload();
	struct env e;
	env_start(&e, 2, 5000);
	struct commit_part *p[2] = { part_connect(&e, 0), part_connect(&e, 1) };
	for (uint32_t r = 0; r < 2; r++)
		ck_assert_int_eq(ranks_begin(p[r], 4), 0);
	for (uint32_t r = 0; r < 2; r++)
		ck_assert_int_eq(ranks_prepare(p[r], 4, r, 2), 0);
	for (uint32_t r = 0; r < 2; r++) {
		int rc = commit_part_wait(p[r], 4, 1500);
		ck_assert_msg(rc == CKPT_EINDOUBT, "rank %u: %d (%s)", r, rc, ckpt_err_msg());
	}
	ranks_assert_committed(&e.r, 4);
	ranks_commit_all(&e.r, p, 5);             /* the next decision goes out */
	ranks_close(p, 2);
	env_stop(&e);
	unsetenv("CKPT_FAULT");
	ckpt_fault_reload();
}
END_TEST

START_TEST(start_rejects_bad_options)
{
	struct env e;
	env_start(&e, 1, 1000);
	struct commit_coord_opts ok = { .manifest = e.m, .job_id = JOB, .world = 2,
	                                .transport = NET_TCP, .addr = "127.0.0.1" };
	struct commit_coord_opts bad[4] = { ok, ok, ok, ok };
	bad[0].world = 0;
	bad[1].job_id = NULL;
	bad[2].manifest = NULL;
	bad[3].secret_len = 8;            /* and no secret */
	for (int k = 0; k < 4; k++) {
		struct commit_coord *c = (struct commit_coord *)1;
		ck_assert_int_eq(commit_coord_start(&bad[k], &c), -EINVAL);
		ck_assert_ptr_null(c);
	}
	/* The port in use: the listener's error, nothing left behind. */
	ok.port = e.port;
	struct commit_coord *c = (struct commit_coord *)1;
	ck_assert_int_eq(commit_coord_start(&ok, &c), -EADDRINUSE);
	ck_assert_ptr_null(c);
	commit_coord_stop(NULL);
	env_stop(&e);
}
END_TEST

/* ================================================================ bad peers */

static int raw_connect(unsigned port)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	ck_assert_int_ge(fd, 0);
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	ck_assert_int_eq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
	struct timeval tv = { 15, 0 };   /* no raw read may hang the test */
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	return fd;
}

static void raw_write(int fd, const void *p, size_t n)
{
	const uint8_t *b = p;
	while (n) {
		ssize_t w = send(fd, b, n, MSG_NOSIGNAL);
		ck_assert_msg(w > 0, "send: %s", strerror(errno));
		b += w;
		n -= (size_t)w;
	}
}

/* Read until the peer closes (true) or the receive timeout passes (false). */
static bool raw_wait_closed(int fd)
{
	uint8_t buf[512];
	for (;;) {
		ssize_t n = recv(fd, buf, sizeof buf, 0);
		if (n == 0 || (n < 0 && errno == ECONNRESET))
			return true;
		if (n < 0)
			return false;
	}
}

#define CKNM 0x4D4E4B43u
static void frame_header(uint8_t h[NET_HEADER_BYTES], uint16_t type, uint32_t len)
{
	ckpt_put_le32(h, CKNM);
	ckpt_put_le16(h + 4, NET_PROTO_VERSION);
	ckpt_put_le16(h + 6, type);
	ckpt_put_le16(h + 8, 0);
	ckpt_put_le16(h + 10, 0);
	ckpt_put_le32(h + 12, len);
}

/* An authenticated rank that speaks raw messages (net.h directly). */
static struct net_conn *bad_rank_connect(const struct env *e, uint32_t rank)
{
	struct net_conn *c;
	ck_assert_int_eq(net_connect(NET_TCP, NULL, "127.0.0.1", e->port, 10000, &c), 0);
	struct net_auth a = { .job_id = JOB, .rank = rank, .world = e->world, .secret = SECRET,
	                      .secret_len = strlen(SECRET) };
	int rc = net_handshake_client(c, &a, 10000);
	ck_assert_msg(rc == 0, "handshake: %s", ckpt_err_msg());
	return c;
}


START_TEST(raw_garbage_truncated_oversized)
{
	/* _i: 0 garbage, 1 truncated frame then close, 2 a 4 GiB length field, 3 an
	 * unauthenticated PREPARE with a well-formed vote. */
	struct env e;
	env_start(&e, 2, 5000);
	uint64_t seed = tu_seed() + (uint64_t)_i;
	int fd = raw_connect(e.port);
	uint8_t h[NET_HEADER_BYTES];
	switch (_i) {
	case 0: {
		uint8_t junk[4096];
		tu_fill(junk, sizeof junk, seed, 1);
		raw_write(fd, junk, sizeof junk);
		ck_assert(raw_wait_closed(fd));
		break;
	}
	case 1: {
		frame_header(h, NET_MSG_HELLO, 100);
		raw_write(fd, h, sizeof h);
		raw_write(fd, "0123456789", 10);
		close(fd);
		fd = -1;
		break;
	}
	case 2:
		frame_header(h, NET_MSG_HELLO, 0xFFFFFFFFu);
		raw_write(fd, h, sizeof h);
		ck_assert(raw_wait_closed(fd));
		break;
	default: {
		struct rank_vote rv;
		ranks_vote_make(&rv, 50, 0, 2, 0);
		struct ckpt_buf b;
		ckpt_buf_init(&b);
		ck_assert_int_eq(commit_prepare_encode(&rv.v, &b), 0);
		frame_header(h, COMMIT_MSG_PREPARE, (uint32_t)b.len);
		raw_write(fd, h, sizeof h);
		raw_write(fd, b.p, b.len);
		ckpt_buf_free(&b);
		ranks_vote_free(&rv);
		ck_assert(raw_wait_closed(fd));
		break;
	}
	}
	if (fd >= 0)
		close(fd);
	ranks_honest_commit(&e.r, 51);
	ranks_assert_not_committed(&e.r, 50);
	env_stop(&e);
}
END_TEST

START_TEST(handshake_rejections)
{
	struct env e;
	env_start(&e, 3, 5000);
	static const struct {
		const char *what, *job, *secret;
		uint32_t rank, world;
		int want;
		const char *needle;
	} cases[] = {
		{ "wrong secret", JOB, "not the secret", 0, 3, CKPT_EAUTH, "authentication" },
		{ "empty secret", JOB, "", 1, 3, CKPT_EAUTH, "authentication" },
		{ "wrong job", "another-job", SECRET, 0, 3, CKPT_EPEER, "wrong job" },
		{ "wrong world", JOB, SECRET, 0, 4, CKPT_EPEER, "world" },
		{ "rank out of range", JOB, SECRET, 3, 3, CKPT_EPEER, "out of range" },
	};
	for (size_t k = 0; k < CKPT_ARRAY_SIZE(cases); k++) {
		struct commit_part_opts o = part_opts(&e, cases[k].rank);
		o.job_id = cases[k].job;
		o.secret = cases[k].secret;
		o.secret_len = strlen(cases[k].secret);
		o.world = cases[k].world;
		struct commit_part *p = (struct commit_part *)1;
		int rc = commit_part_connect(&o, &p);
		ck_assert_msg(rc == cases[k].want, "%s: rc %d (%s)", cases[k].what, rc, ckpt_err_msg());
		ck_assert_msg(strstr(ckpt_err_msg(), cases[k].needle), "%s: '%s'", cases[k].what,
		              ckpt_err_msg());
		ck_assert_ptr_null(p);
	}
	ranks_honest_commit(&e.r, 1);
	env_stop(&e);
}
END_TEST

START_TEST(duplicate_rank)
{
	struct env e;
	env_start(&e, 2, 5000);
	struct commit_part *p[2] = { part_connect(&e, 0), part_connect(&e, 1) };
	struct commit_part_opts o = part_opts(&e, 0);
	struct commit_part *dup = NULL;
	int rc = commit_part_connect(&o, &dup);
	ck_assert_msg(rc == CKPT_EPEER, "rc %d (%s)", rc, ckpt_err_msg());
	ck_assert_msg(strstr(ckpt_err_msg(), "already connected"), "%s", ckpt_err_msg());
	ranks_commit_all(&e.r, p, 1);             /* the first rank 0 is untouched */
	ranks_close(p, 2);
	env_stop(&e);
}
END_TEST

START_TEST(forged_vote_for_another_rank)
{
	struct env e;
	env_start(&e, 3, 10000);
	struct commit_part *p[3] = { part_connect(&e, 0), part_connect(&e, 1), part_connect(&e, 2) };
	for (uint32_t r = 0; r < 3; r++)
		ck_assert_int_eq(ranks_begin(p[r], 20), 0);
	/* Rank 1 votes in rank 0's name, before rank 0 does. */
	struct rank_vote forged;
	ranks_vote_make(&forged, 20, 0, 3, commit_part_attempt(p[1], 20));
	forged.v.file_size = 666;
	ck_assert_int_eq(commit_part_prepare(p[1], &forged.v), 0);
	ranks_vote_free(&forged);
	ck_assert_int_eq(ranks_prepare(p[0], 20, 0, 3), 0);
	ck_assert_int_eq(ranks_prepare(p[2], 20, 2, 3), 0);
	const char *const why[] = { "rank 1", NULL };
	expect_wait(p[0], 20, CKPT_EABORTED, why);
	expect_wait(p[2], 20, CKPT_EABORTED, why);
	int rc = commit_part_wait(p[1], 20, TMO);   /* dropped after "voting": either */
	ck_assert_msg(rc == CKPT_EINDOUBT || rc == CKPT_EABORTED, "rank 1: %d", rc);
	ranks_assert_not_committed(&e.r, 20);
	commit_part_close(p[1]);
	p[1] = NULL;
	ranks_commit_all(&e.r, p, 21);
	struct manifest_shard sh;
	ck_assert_int_eq(manifest_shard_get(e.m, 21, 0, &sh), 0);
	ck_assert_uint_eq(sh.file_size, 1000000u);
	manifest_shard_free(&sh);
	ranks_close(p, 3);
	env_stop(&e);
}
END_TEST

START_TEST(replayed_prepare)
{
	struct env e;
	env_start(&e, 2, 5000);
	struct commit_part *p[2] = { part_connect(&e, 0), part_connect(&e, 1) };
	for (uint32_t r = 0; r < 2; r++)
		ck_assert_int_eq(ranks_begin(p[r], 30), 0);
	struct rank_vote rv;
	ranks_vote_make(&rv, 30, 0, 2, commit_part_attempt(p[0], 30));
	rv.v.file_size = 1111;
	ck_assert_int_eq(commit_part_prepare(p[0], &rv.v), 0);
	rv.v.file_size = 2222;            /* the replay differs: it must not replace */
	ck_assert_int_eq(commit_part_prepare(p[0], &rv.v), 0);
	ck_assert_int_eq(commit_part_prepare(p[0], &rv.v), 0);
	ck_assert_int_eq(ranks_prepare(p[1], 30, 1, 2), 0);
	expect_wait(p[0], 30, 0, NULL);
	expect_wait(p[1], 30, 0, NULL);
	struct manifest_step rec, again;
	ck_assert_int_eq(manifest_step_get(e.m, 30, &rec), 0);
	struct manifest_shard sh;
	ck_assert_int_eq(manifest_shard_get(e.m, 30, 0, &sh), 0);
	ck_assert_uint_eq(sh.file_size, 1111);
	manifest_shard_free(&sh);

	/* Replayed after the commit: ignored; the step stays as it was. */
	rv.v.file_size = 3333;
	ck_assert_int_eq(commit_part_prepare(p[0], &rv.v), 0);
	ranks_vote_free(&rv);
	ranks_commit_all(&e.r, p, 31);
	ck_assert_int_eq(manifest_step_get(e.m, 30, &again), 0);
	ck_assert(!memcmp(&rec, &again, sizeof rec));
	ck_assert_int_eq(manifest_shard_get(e.m, 30, 0, &sh), 0);
	ck_assert_uint_eq(sh.file_size, 1111);
	manifest_shard_free(&sh);
	ranks_close(p, 2);
	env_stop(&e);
}
END_TEST

/* Messages an authenticated rank may not send: each closes its connection. */
enum bad_msg {
	BM_BEGIN_SHORT, BM_BEGIN_LONG, BM_BEGIN_VERSION, BM_BEGIN_EMPTY, BM_PREPARE_SHORT,
	BM_PREPARE_LEN_MISMATCH, BM_PREPARE_LEN_ZERO, BM_PREPARE_LEN_HUGE, BM_PREPARE_VERSION,
	BM_ABORT_REASON_LONG, BM_ABORT_CODE_POSITIVE, BM_ABORT_TRAILING, BM_UNKNOWN_TYPE,
	BM_HANDSHAKE_TYPE, BM_DECISION_FROM_RANK, BM_LENGTH_4GIB, BM_GARBAGE, BM_COUNT_
};

static void bad_msg_send(struct net_conn *c, enum bad_msg k, uint64_t step, uint64_t seed)
{
	uint8_t b[2048];
	size_t n = 0;
	uint16_t type = COMMIT_MSG_BEGIN;
	memset(b, 0, sizeof b);
	ckpt_put_le16(b, 2);                       /* the version (2), where it stays so */
	ckpt_put_le64(b + 2, step);
	switch (k) {
	case BM_BEGIN_SHORT:   n = 9; break;
	case BM_BEGIN_LONG:    n = 11; break;
	case BM_BEGIN_VERSION: ckpt_put_le16(b, 1); n = 10; break;   /* an older peer's */
	case BM_BEGIN_EMPTY:   n = 0; break;
	case BM_PREPARE_SHORT: type = COMMIT_MSG_PREPARE; n = 20; break;
	case BM_PREPARE_LEN_MISMATCH:
	case BM_PREPARE_LEN_ZERO:
	case BM_PREPARE_LEN_HUGE:
	case BM_PREPARE_VERSION: {
		type = COMMIT_MSG_PREPARE;
		ckpt_put_le32(b + 10, 1);              /* rank 1: its own */
		ckpt_put_le64(b + 14, 4096);
		tu_fill(b + 22, CKPT_HASH_BYTES, seed, 3);
		ckpt_put_le64(b + 38, 0x5a5a);         /* save id */
		uint64_t len = k == BM_PREPARE_LEN_ZERO ? 0 : k == BM_PREPARE_LEN_HUGE ? UINT64_MAX
		             : k == BM_PREPARE_LEN_MISMATCH ? 1000 : 10;
		ckpt_put_le64(b + 46, len);
		tu_fill(b + 54, 10, seed, 4);
		n = 64;
		if (k == BM_PREPARE_VERSION)
			ckpt_put_le16(b, 0);
		break;
	}
	case BM_ABORT_REASON_LONG:
	case BM_ABORT_CODE_POSITIVE:
	case BM_ABORT_TRAILING:
		type = COMMIT_MSG_ABORT;
		ckpt_put_le32(b + 10, k == BM_ABORT_CODE_POSITIVE ? 5u : (uint32_t)-5);
		ckpt_put_le16(b + 14, k == BM_ABORT_REASON_LONG ? 600 : 4);
		memcpy(b + 16, "oops", 4);             /* then the save id, 8 bytes (zeros) */
		n = k == BM_ABORT_REASON_LONG ? 16 + 600 : k == BM_ABORT_TRAILING ? 29 : 28;
		break;
	case BM_UNKNOWN_TYPE:       type = 99; n = 10; break;
	case BM_HANDSHAKE_TYPE:     type = NET_MSG_HELLO; n = 10; break;
	case BM_DECISION_FROM_RANK: type = COMMIT_MSG_DECISION; n = 16; break;
	case BM_LENGTH_4GIB: {
		uint8_t h[NET_HEADER_BYTES];
		frame_header(h, COMMIT_MSG_PREPARE, 0xFFFFFFFFu);
		raw_write(net_conn_fd(c), h, sizeof h);
		return;
	}
	default: {
		uint8_t junk[1024];
		tu_fill(junk, sizeof junk, seed, 5);
		raw_write(net_conn_fd(c), junk, sizeof junk);
		return;
	}
	}
	int rc = net_send(c, type, b, n, 10000);
	ck_assert_msg(rc == 0, "bad message %d: send: %s", k, ckpt_err_msg());
}

START_TEST(malformed_messages_from_a_rank)
{
	enum bad_msg k = (enum bad_msg)_i;
	struct env e;
	env_start(&e, 2, 30000);
	uint64_t step = 40;
	struct commit_part *p[2] = { part_connect(&e, 0), NULL };
	struct net_conn *bad = bad_rank_connect(&e, 1);
	ck_assert_int_eq(ranks_begin(p[0], step), 0);
	ck_assert_int_eq(ranks_prepare(p[0], step, 0, 2), 0);
	bad_msg_send(bad, k, step, tu_seed());
	ranks_expect_dropped(bad, TMO, "a misbehaving connection");
	net_close(bad);
	/* Rank 1 had not voted: the step aborts at once (not after the 30 s timeout). */
	expect_wait(p[0], step, CKPT_EABORTED, (const char *const[]){ "rank 1", NULL });
	ranks_assert_not_committed(&e.r, step);
	ranks_commit_all(&e.r, p, step + 1);      /* rank 1 reconnects, honest */
	ranks_close(p, 2);
	env_stop(&e);
}
END_TEST

START_TEST(well_formed_vote_with_a_bad_index)
{
	/* PREPAREs that decode but whose index must not be committed: garbage bytes,
	 * the index of another step, the index of another rank. */
	struct env e;
	env_start(&e, 2, 5000);
	struct commit_part *p[2] = { part_connect(&e, 0), part_connect(&e, 1) };
	uint64_t seed = tu_seed();
	for (int round = 0; round < 3; round++) {
		uint64_t step = 60 + (uint64_t)round;
		for (uint32_t r = 0; r < 2; r++)
			ck_assert_int_eq(ranks_begin(p[r], step), 0);
		ck_assert_int_eq(ranks_prepare(p[0], step, 0, 2), 0);
		struct rank_vote rv;
		ranks_vote_make(&rv, round == 1 ? step + 100 : step, round == 2 ? 0 : 1, 2,
		                commit_part_attempt(p[1], step));
		rv.v.step = step;
		rv.v.rank = 1;
		uint8_t junk[200];
		if (round == 0) {
			tu_fill(junk, sizeof junk, seed, 9);
			rv.v.index = junk;
			rv.v.index_len = sizeof junk;
		}
		ck_assert_int_eq(commit_part_prepare(p[1], &rv.v), 0);
		ranks_vote_free(&rv);
		const char *const why[] = { "rank 1", NULL };
		expect_wait(p[0], step, CKPT_EABORTED, why);
		expect_wait(p[1], step, CKPT_EABORTED, why);
		ranks_assert_not_committed(&e.r, step);
	}
	ranks_commit_all(&e.r, p, 70);
	ranks_close(p, 2);
	env_stop(&e);
}
END_TEST

START_TEST(silent_clients_do_not_block)
{
	/* Hostile clients that connect and then say nothing (or half a header, or half
	 * a HELLO) hold handshake threads, never the job. */
	struct env e;
	env_start(&e, 3, 5000);
	int fds[4];
	for (int i = 0; i < 4; i++)
		fds[i] = raw_connect(e.port);
	uint8_t h[NET_HEADER_BYTES];
	frame_header(h, NET_MSG_HELLO, 64);
	raw_write(fds[2], h, 7);
	raw_write(fds[3], h, sizeof h);
	raw_write(fds[3], "job", 3);
	uint64_t t0 = ckpt_now_ns();
	ranks_honest_commit(&e.r, 1);
	ranks_honest_commit(&e.r, 2);
	double took = ms_since(t0);
	/* Proof that the commits ran while the handshakes were still blocked: the
	 * hostile sockets are still open (the 3 s allowed for a first message, and
	 * the handshake's 10 s, have not passed). Only checked when the commits were
	 * quick enough to tell. */
	if (took < 2500) {
		for (int i = 0; i < 4; i++) {
			struct pollfd pf = { .fd = fds[i], .events = POLLIN };
			ck_assert_msg(poll(&pf, 1, 0) == 0, "hostile client %d was closed already", i);
		}
	} else {
		printf("silent_clients_do_not_block: commits took %.0f ms; open-socket check skipped\n",
		       took);
	}
	/* Stopping does not wait out the silent handshakes (3 s or 10 s each): it
	 * breaks them. */
	uint64_t t1 = ckpt_now_ns();
	env_stop(&e);
	double stop_ms = ms_since(t1);
	ck_assert_msg(stop_ms < 3000, "stop took %.0f ms with silent handshakes pending", stop_ms);
	for (int i = 0; i < 4; i++)
		close(fds[i]);
}
END_TEST

/* ================================================================ main */

/* ---------------------------------------------------------------- votes and files */

/* Write rank's real shard of step for attempt save_id under e->root: one f32 tensor
 * "w" of [4 * world] rows, rank's 4 rows; *v is its vote (its index: res->footer). */
static void real_shard(const struct env *e, uint64_t step, uint32_t rank, uint64_t save_id,
                       struct io_shard_result *res, struct commit_vote *v)
{
	struct io_pool *pool;
	struct io_engine *eng;
	ck_assert_int_eq(io_pool_create(1u << 16, 4, NULL, &pool), 0);
	ck_assert_int_eq(io_engine_create(pool, 2, &eng), 0);
	char dir[4200], path[4400];
	ck_assert_int_eq(ckpt_path_step_dir(dir, sizeof dir, e->root, step), 0);
	mkdir(dir, 0700);
	ck_assert_int_eq(ckpt_path_shard(path, sizeof path, e->root, step, rank, save_id), 0);
	struct io_shard_writer *w;
	struct io_writer_opts o = { .step = step, .rank = rank, .world = e->world,
	                            .save_id = save_id, .block_bytes = IO_BLOCK_BYTES };
	ck_assert_msg(io_shard_writer_open(eng, path, &o, &w) == 0, "%s", ckpt_err_msg());
	uint64_t shape = 4ull * e->world, off = 4ull * rank, ext = 4;
	struct io_tensor_desc d = { .name = "w", .kind = CKPT_KIND_MODEL, .dtype = CKPT_F32,
	                            .policy = CKPT_SHARDED, .ndim = 1, .global_shape = &shape,
	                            .offset = &off, .extent = &ext, .raw_bytes = 16 };
	ck_assert_int_eq(io_shard_writer_add_tensor(w, &d), 0);
	int b = io_pool_get(pool, -1);
	ck_assert_int_ge(b, 0);
	memset(io_pool_addr(pool, (unsigned)b), (int)rank + 1, 16);
	ck_assert_int_eq(io_shard_writer_append(w, 0, (unsigned)b, 16, NULL), 0);
	ck_assert_msg(io_shard_writer_finish(w, res) == 0, "%s", ckpt_err_msg());
	io_engine_destroy(eng);
	io_pool_destroy(pool);
	*v = (struct commit_vote){ .rank = rank, .step = step, .save_id = save_id,
	                           .index = res->footer, .index_len = res->footer_len,
	                           .file_size = res->file_size };
	memcpy(v->footer_hash, res->footer_hash, CKPT_HASH_BYTES);
}

static void result_free(struct io_shard_result *r)
{
	free(r->footer);
	io_index_free(r->index);
}

/* A vote is held to the file it names: an index with no file behind it (a replayed
 * or forged vote, or a rank whose data is not there), a file of another size, or a
 * file whose footer is not the one voted for commits nothing; real votes commit. */
START_TEST(votes_held_to_their_files)
{
	struct env e;
	env_start_files(&e, 2, 5000, true);
	struct commit_part *p[2] = { part_connect(&e, 0), part_connect(&e, 1) };
	for (int round = 0; round < 4; round++) {
		uint64_t step = 70 + (uint64_t)round;
		for (uint32_t r = 0; r < 2; r++)
			ck_assert_int_eq(ranks_begin(p[r], step), 0);
		struct io_shard_result res[2];
		struct commit_vote v[2];
		for (uint32_t r = 0; r < 2; r++)
			real_shard(&e, step, r, commit_part_attempt(p[r], step), &res[r], &v[r]);
		const char *needle = NULL;
		char path[4400];
		ckpt_path_shard(path, sizeof path, e.root, step, 1, v[1].save_id);
		if (round == 0) {
			ck_assert_int_eq(unlink(path), 0);          /* the data is not there */
			needle = "no such shard file";
		} else if (round == 1) {
			ck_assert_int_eq(truncate(path, (off_t)v[1].file_size + 4096), 0);
			needle = "not the";
		} else if (round == 2) {
			v[1].footer_hash[3] ^= 1;                    /* another footer than the file's */
			needle = "another footer";
		}
		for (uint32_t r = 0; r < 2; r++)
			ck_assert_int_eq(commit_part_prepare(p[r], &v[r]), 0);
		if (needle) {
			const char *const why[] = { "rank 1", needle, NULL };
			expect_wait(p[0], step, CKPT_EABORTED, why);
			expect_wait(p[1], step, CKPT_EABORTED, why);
			ranks_assert_not_committed(&e.r, step);
		} else {
			expect_wait(p[0], step, 0, NULL);
			expect_wait(p[1], step, 0, NULL);
			struct manifest_step rec;
			ck_assert_int_eq(manifest_step_get(e.m, step, &rec), 0);
			ck_assert(rec.state == CKPT_STATE_COMMITTED && rec.save_id == v[0].save_id &&
			          rec.incarnation == 0x1c0ffee);
		}
		for (uint32_t r = 0; r < 2; r++)
			result_free(&res[r]);
	}
	ranks_close(p, 2);
	env_stop(&e);
}
END_TEST

/* A new attempt at a step removes the files of the attempt the manifest names dead
 * before any rank may write, and nothing else of the directory. */
START_TEST(new_attempt_clears_the_dead_one)
{
	struct env e;
	env_start_files(&e, 2, 5000, true);
	struct commit_part *p[2] = { part_connect(&e, 0), part_connect(&e, 1) };
	uint64_t step = 80;
	for (uint32_t r = 0; r < 2; r++)
		ck_assert_int_eq(ranks_begin(p[r], step), 0);
	uint64_t dead = commit_part_attempt(p[0], step);
	struct io_shard_result res;
	struct commit_vote v;
	real_shard(&e, step, 0, dead, &res, &v);
	result_free(&res);
	char mine[4400], other[4400];
	ckpt_path_shard(mine, sizeof mine, e.root, step, 0, dead);
	ckpt_path_shard(other, sizeof other, e.root, step, 1, 0x5ca1ab1e);
	ck_assert_int_eq(tu_write_file(other, "not named by any record", 23), 0);
	ck_assert_int_eq(commit_part_abort(p[1], step, CKPT_EABORTED, "rank 1 gives up"), 0);
	expect_wait(p[0], step, CKPT_EABORTED, NULL);
	struct stat st;
	ck_assert_int_eq(stat(mine, &st), 0);             /* an abort removes nothing itself */
	for (uint32_t r = 0; r < 2; r++)
		ck_assert_int_eq(ranks_begin(p[r], step), 0);
	ck_assert_uint_ne(commit_part_attempt(p[0], step), dead);
	ck_assert_int_eq(stat(mine, &st), -1);             /* the dead attempt's file: gone */
	ck_assert_int_eq(stat(other, &st), 0);             /* a file no record names: kept */
	for (uint32_t r = 0; r < 2; r++)
		commit_part_abort(p[r], step, CKPT_EABORTED, "test over");
	ranks_close(p, 2);
	env_stop(&e);
}
END_TEST

int main(void)
{
	tu_seed();
	/* Read the (empty) fault table before any thread starts. */
	ckpt_fault_reload();
	Suite *s = suite_create("commit_coordinator");
	TCase *tc = tcase_create("protocol");
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, commit_and_again);
	tcase_add_test(tc, commits_ordered_by_step);
	tcase_add_test(tc, begin_committed_step);
	tcase_add_test(tc, rank_abort);
	tcase_add_test(tc, late_vote_does_not_revive_a_step);
	tcase_add_test(tc, disconnect_before_vote);
	tcase_add_test(tc, timeout_one_rank_silent);
	tcase_add_test(tc, in_doubt_when_coordinator_stops);
	tcase_add_test(tc, in_doubt_when_decision_lost);
	tcase_add_test(tc, start_rejects_bad_options);
	tcase_add_test(tc, votes_held_to_their_files);
	tcase_add_test(tc, new_attempt_clears_the_dead_one);
	suite_add_tcase(s, tc);
	TCase *bp = tcase_create("bad_peers");
	tcase_set_timeout(bp, 120);
	tcase_add_loop_test(bp, raw_garbage_truncated_oversized, 0, 4);
	tcase_add_test(bp, handshake_rejections);
	tcase_add_test(bp, duplicate_rank);
	tcase_add_test(bp, forged_vote_for_another_rank);
	tcase_add_test(bp, replayed_prepare);
	tcase_add_loop_test(bp, malformed_messages_from_a_rank, 0, BM_COUNT_);
	tcase_add_test(bp, well_formed_vote_with_a_bad_index);
	tcase_add_test(bp, silent_clients_do_not_block);
	suite_add_tcase(s, bp);
	SRunner *sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
