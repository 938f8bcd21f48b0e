/*
 * test_rdma_commit.c — lib/commit over the rdma transport, and what the rdma
 * stream must survive beyond the conformance suite (test_net under
 * CKPT_TEST_TRANSPORT=rdma): the two-phase commit with a coordinator and W = 4
 * and 16 participants on NET_RDMA; payloads around and well beyond one
 * registered ring (the ring wraps, a message streams through it in pieces);
 * a receiver that closes while a large message is in flight; and a sender
 * process that dies mid-message (the kernel tears its queue pair down).
 *
 * Runs on a real RDMA device: inside the rdma guest (tests/rdma/run-rdma-tests.sh),
 * at CKPT_TEST_RDMA_ADDR (default 10.0.0.1, rxe0 on dummy0). Without a device it
 * says so and exits 77. Every wait is bounded.
 */
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "commit/commit.h"
#include "io/io.h"
#include "manifest/manifest.h"
#include "net/net.h"
#include "synth.h"
#include "net/rdma_internal.h"
#include "testutil.h"

#define TMO 30000   /* ms: a guard against hangs (TCG is slow), never reached when passing */

/* Read-only after main. */
static const char *addr = "10.0.0.1";

static double ms_since(uint64_t t0) { return (double)(ckpt_now_ns() - t0) / 1e6; }

/* ---------------------------------------------------------------- commit over rdma */

#define NTENSORS 8
#define ROWS     4096u


struct rank_job {
	struct commit_part *p;
	uint32_t rank, world;
	uint64_t step;
	int rc;
	char msg[1100];
};

static void *rank_main(void *arg)
{
	struct rank_job *j = arg;
	void *ix = NULL;
	size_t len = 0;
	uint64_t save_id = 0;
	j->rc = commit_part_begin(j->p, j->step, &save_id);
	if (!j->rc)
		j->rc = synth_rows_encode(j->step, j->rank, j->world, save_id, NTENSORS, ROWS, 16, &ix, &len);
	if (!j->rc) {
		struct commit_vote v = { .rank = j->rank, .step = j->step, .save_id = save_id, .index = ix,
		                         .index_len = len, .file_size = 1 };
		j->rc = commit_part_prepare(j->p, &v);
	}
	if (!j->rc)
		j->rc = commit_part_wait(j->p, j->step, TMO);
	if (j->rc)
		snprintf(j->msg, sizeof j->msg, "%s", ckpt_last_error());
	free(ix);
	return NULL;
}

static void commit_world(uint32_t w)
{
	char *root = tu_tmpdir("rdma-commit");
	struct manifest *m;
	ck_assert_int_eq(manifest_open(root, MANIFEST_CREATE, &m), 0);
	struct commit_coord *co;
	struct commit_coord_opts o = { .manifest = m, .job_id = "rdma-job", .world = w,
	                               .secret = "s3cret", .secret_len = 6, .transport = NET_RDMA,
	                               .addr = addr, .port = 0, .timeout_ms = TMO };
	ck_assert_msg(commit_coord_start(&o, &co) == 0, "coordinator: %s", ckpt_last_error());
	struct commit_part **parts = calloc(w, sizeof *parts);
	for (uint32_t r = 0; r < w; r++) {
		struct commit_part_opts po = { .transport = NET_RDMA, .addr = addr,
		                               .port = commit_coord_port(co), .job_id = "rdma-job",
		                               .rank = r, .world = w, .secret = "s3cret",
		                               .secret_len = 6, .timeout_ms = TMO };
		ck_assert_msg(commit_part_connect(&po, &parts[r]) == 0, "rank %u: %s", r,
		              ckpt_last_error());
	}
	struct rank_job *jobs = calloc(w, sizeof *jobs);
	pthread_t *th = calloc(w, sizeof *th);
	for (uint64_t step = 1; step <= 3; step++) {
		for (uint32_t r = 0; r < w; r++) {
			jobs[r] = (struct rank_job){ .p = parts[r], .rank = r, .world = w, .step = step };
			ck_assert_int_eq(pthread_create(&th[r], NULL, rank_main, &jobs[r]), 0);
		}
		for (uint32_t r = 0; r < w; r++) {
			pthread_join(th[r], NULL);
			ck_assert_msg(jobs[r].rc == 0, "W=%u step %llu rank %u: %s", w,
			              (unsigned long long)step, r, jobs[r].msg);
		}
		/* The decision each rank got is the manifest's: committed, with W shards. */
		struct manifest_step rec;
		ck_assert_int_eq(manifest_step_get(m, step, &rec), 0);
		ck_assert_int_eq(rec.state, CKPT_STATE_COMMITTED);
		ck_assert_uint_eq(rec.world, w);
	}
	/* A step already committed is refused at BEGIN, over rdma as over tcp. */
	uint64_t id;
	ck_assert_int_eq(commit_part_begin(parts[0], 2, &id), -EEXIST);
	for (uint32_t r = 0; r < w; r++)
		commit_part_close(parts[r]);
	commit_coord_stop(co);
	manifest_close(m);
	free(jobs);
	free(th);
	free(parts);
	tu_rmtree(root);
	free(root);
}

START_TEST(commit_w4) { commit_world(4); }
END_TEST
START_TEST(commit_w16) { commit_world(16); }
END_TEST

/* ---------------------------------------------------------------- pairs */

struct pair {
	struct net_listener *l;
	struct net_conn *srv, *cli;
};

struct connect_job {
	unsigned port;
	struct net_conn *c;
	int rc;
	char msg[1100];
};

static void *connect_thread(void *p)
{
	struct connect_job *j = p;
	j->rc = net_connect(NET_RDMA, NULL, addr, j->port, TMO, &j->c);
	snprintf(j->msg, sizeof j->msg, "%s", ckpt_last_error());
	return NULL;
}

static void pair_open(struct pair *p)
{
	memset(p, 0, sizeof *p);
	ck_assert_msg(net_listen(NET_RDMA, NULL, addr, 0, &p->l) == 0, "listen: %s", ckpt_last_error());
	struct connect_job j = { .port = net_listener_port(p->l) };
	pthread_t th;
	ck_assert_int_eq(pthread_create(&th, NULL, connect_thread, &j), 0);
	int rc = net_accept(p->l, TMO, &p->srv);
	pthread_join(th, NULL);
	ck_assert_msg(rc == 0, "accept: %s", ckpt_last_error());
	ck_assert_msg(j.rc == 0, "connect: %s", j.msg);
	p->cli = j.c;
}

static void pair_close(struct pair *p)
{
	net_close(p->cli);
	net_close(p->srv);
	net_listener_close(p->l);
}

struct send_job {
	struct net_conn *c;
	const size_t *sizes;
	size_t n;
	uint64_t seed;
	int rc;
	char msg[1100];
};

static void *send_thread(void *p)
{
	struct send_job *j = p;
	j->rc = 0;
	for (size_t i = 0; i < j->n && !j->rc; i++) {
		uint8_t *buf = malloc(j->sizes[i] ? j->sizes[i] : 1);
		tu_fill(buf, j->sizes[i], j->seed, i);
		j->rc = net_send(j->c, (uint16_t)(NET_MSG_USER_FIRST + i), buf, j->sizes[i], TMO);
		free(buf);
	}
	if (j->rc)
		snprintf(j->msg, sizeof j->msg, "%s", ckpt_last_error());
	return NULL;
}

static void exchange(struct net_conn *from, struct net_conn *to, const size_t *sizes, size_t n)
{
	struct send_job j = { .c = from, .sizes = sizes, .n = n, .seed = tu_seed() };
	pthread_t th;
	ck_assert_int_eq(pthread_create(&th, NULL, send_thread, &j), 0);
	for (size_t i = 0; i < n; i++) {
		struct net_msg m;
		int rc = net_recv(to, &m, TMO);
		ck_assert_msg(rc == 0, "message %zu (%zu bytes): %s", i, sizes[i], ckpt_last_error());
		ck_assert_uint_eq(m.type, NET_MSG_USER_FIRST + i);
		ck_assert_uint_eq(m.len, sizes[i]);
		uint8_t *want = malloc(sizes[i] ? sizes[i] : 1);
		tu_fill(want, sizes[i], j.seed, i);
		ck_assert_msg(sizes[i] == 0 || memcmp(m.payload, want, sizes[i]) == 0,
		              "message %zu (%zu bytes) differs", i, sizes[i]);
		free(want);
		net_msg_free(&m);
	}
	pthread_join(th, NULL);
	ck_assert_msg(j.rc == 0, "send: %s", j.msg);
}

/* ---------------------------------------------------------------- payloads */

START_TEST(payloads_beyond_one_ring)
{
	/* Sizes at the edges: a frame (16-byte header + payload) that just fits a
	 * SEND, one byte more (the ring), exactly one ring, one ring plus a byte, and
	 * several rings with an odd tail, so that the ring wraps mid-message. */
	const size_t H = NET_HEADER_BYTES, R = RDMA_RING_BYTES;
	const size_t sizes[] = { RDMA_INLINE_MAX - H, RDMA_INLINE_MAX - H + 1, R - H, R, R + 1,
	                         3 * R + 12345, 17, 5u << 20, 0, 4096 };
	struct pair p;
	pair_open(&p);
	net_conn_set_max_msg(p.srv, 8u << 20);
	net_conn_set_max_msg(p.cli, 8u << 20);
	exchange(p.cli, p.srv, sizes, CKPT_ARRAY_SIZE(sizes));
	exchange(p.srv, p.cli, sizes, CKPT_ARRAY_SIZE(sizes));
	pair_close(&p);
}
END_TEST

START_TEST(both_directions_at_once)
{
	/* Each side sends large messages while the other does too: the credit and
	 * ring returns must flow although both are busy sending. */
	const size_t sizes[] = { 2u << 20, 100, 1u << 20, 3 * RDMA_RING_BYTES + 1, 5 };
	struct pair p;
	pair_open(&p);
	struct send_job a = { .c = p.cli, .sizes = sizes, .n = CKPT_ARRAY_SIZE(sizes), .seed = 1 };
	struct send_job b = { .c = p.srv, .sizes = sizes, .n = CKPT_ARRAY_SIZE(sizes), .seed = 2 };
	pthread_t ta, tb;
	ck_assert_int_eq(pthread_create(&ta, NULL, send_thread, &a), 0);
	ck_assert_int_eq(pthread_create(&tb, NULL, send_thread, &b), 0);
	for (size_t i = 0; i < CKPT_ARRAY_SIZE(sizes); i++) {
		struct net_msg ms, mc;
		ck_assert_msg(net_recv(p.srv, &ms, TMO) == 0, "srv %zu: %s", i, ckpt_last_error());
		ck_assert_msg(net_recv(p.cli, &mc, TMO) == 0, "cli %zu: %s", i, ckpt_last_error());
		ck_assert_uint_eq(ms.len, sizes[i]);
		ck_assert_uint_eq(mc.len, sizes[i]);
		uint8_t *want = malloc(sizes[i]);
		tu_fill(want, sizes[i], 1, i);
		ck_assert(memcmp(ms.payload, want, sizes[i]) == 0);
		tu_fill(want, sizes[i], 2, i);
		ck_assert(memcmp(mc.payload, want, sizes[i]) == 0);
		free(want);
		net_msg_free(&ms);
		net_msg_free(&mc);
	}
	pthread_join(ta, NULL);
	pthread_join(tb, NULL);
	ck_assert_msg(a.rc == 0 && b.rc == 0, "send: %s / %s", a.msg, b.msg);
	pair_close(&p);
}
END_TEST

/* ---------------------------------------------------------------- peers that leave */

START_TEST(receiver_closes_mid_transfer)
{
	/* 32 MiB cannot fit in the receiver's ring: the sender is blocked on it when
	 * the receiver closes. The sender must learn it at once, with a specific
	 * code and the connection's name, and not hang until its timeout. */
	struct pair p;
	pair_open(&p);
	net_conn_set_max_msg(p.srv, 64u << 20);
	const size_t sizes[] = { 32u << 20 };
	struct send_job j = { .c = p.cli, .sizes = sizes, .n = 1, .seed = 3 };
	pthread_t th;
	ck_assert_int_eq(pthread_create(&th, NULL, send_thread, &j), 0);
	struct net_msg m;
	ck_assert_int_eq(net_recv(p.srv, &m, 300), -ETIMEDOUT);   /* part of it is in */
	uint64_t t0 = ckpt_now_ns();
	net_close(p.srv);
	p.srv = NULL;
	pthread_join(th, NULL);
	double ms = ms_since(t0);
	printf("receiver_closes_mid_transfer: the sender saw: %s\n", j.msg);
	ck_assert_msg(j.rc == -ECONNRESET || j.rc == -EPIPE, "send: %d %s", j.rc, j.msg);
	ck_assert_msg(strstr(j.msg, "rdma 10.") || strstr(j.msg, addr), "message: %s", j.msg);
	ck_assert_msg(ms < 10000, "the sender took %.0f ms to notice", ms);
	/* The connection is finished: later calls fail at once. */
	ck_assert_int_lt(net_send(p.cli, 40, "x", 1, TMO), 0);
	pair_close(&p);
}
END_TEST

struct big_send {
	struct net_conn *c;
	const void *p;
	size_t len;
};

static void *big_send_thread(void *arg)
{
	struct big_send *b = arg;
	(void)net_send(b->c, 41, b->p, b->len, TMO);   /* never finishes: the process dies */
	return NULL;
}

START_TEST(sender_dies_mid_transfer)
{
	/* A rank process that dies half-way through a large message (no close: the
	 * kernel reaps its queue pair and rdma_cm id). The child is forked before
	 * this process touches rdma (librdmacm's device handles do not survive a
	 * fork); it learns the port through one pipe and when to die through another,
	 * once this side has the frame's header and part of its payload. */
	int port_pipe[2], die_pipe[2];
	ck_assert_int_eq(pipe(port_pipe), 0);
	ck_assert_int_eq(pipe(die_pipe), 0);
	fflush(NULL);
	pid_t pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		close(port_pipe[1]);
		close(die_pipe[1]);
		unsigned port = 0;
		if (read(port_pipe[0], &port, sizeof port) != (ssize_t)sizeof port)
			_exit(3);
		struct net_conn *c;
		if (net_connect(NET_RDMA, NULL, addr, port, TMO, &c))
			_exit(4);
		static char small[1000];
		if (net_send(c, 40, small, sizeof small, TMO))
			_exit(5);
		/* Zero pages: no time spent filling 64 MiB before the send starts. */
		char *big = calloc(1, 64u << 20);
		pthread_t th;
		struct big_send b = { c, big, 64u << 20 };
		if (!big || pthread_create(&th, NULL, big_send_thread, &b))
			_exit(5);
		char go;
		(void)!read(die_pipe[0], &go, 1);
		kill(getpid(), SIGKILL);   /* mid-message, as a crash */
		_exit(6);
	}
	close(port_pipe[0]);
	close(die_pipe[0]);
	struct net_listener *l;
	ck_assert_int_eq(net_listen(NET_RDMA, NULL, addr, 0, &l), 0);
	unsigned port = net_listener_port(l);
	ck_assert_int_eq(write(port_pipe[1], &port, sizeof port), (ssize_t)sizeof port);
	close(port_pipe[1]);
	struct net_conn *s;
	ck_assert_msg(net_accept(l, TMO, &s) == 0, "accept: %s", ckpt_last_error());
	net_conn_set_max_msg(s, 128u << 20);
	struct net_msg m;
	ck_assert_msg(net_recv(s, &m, TMO) == 0, "first message: %s", ckpt_last_error());
	ck_assert_uint_eq(m.len, 1000);
	net_msg_free(&m);
	/* 64 MiB take far longer than this under emulation, and on hardware the
	 * ring's flow control holds the rest back while nobody reads. */
	ck_assert_int_eq(net_recv(s, &m, 500), -ETIMEDOUT);
	ck_assert_int_eq(write(die_pipe[1], "x", 1), 1);
	close(die_pipe[1]);
	uint64_t t0 = ckpt_now_ns();
	int rc = net_recv(s, &m, 60000);
	double ms = ms_since(t0);
	ck_assert_msg(rc == -ECONNRESET, "recv: %d %s", rc, ckpt_last_error());
	ck_assert_ptr_null(m.payload);
	ck_assert_msg(strstr(ckpt_last_error(), "inside a message"), "message: %s",
	              ckpt_last_error());
	ck_assert_msg(ms < 30000, "the receiver took %.0f ms to notice", ms);
	printf("sender_dies_mid_transfer: the receiver saw after %.0f ms: %s\n", ms,
	       ckpt_last_error());
	ck_assert_int_eq(net_recv(s, &m, TMO), -ECONNRESET);   /* fails fast from now on */
	int st;
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	ck_assert_msg(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "child status 0x%x", st);
	net_close(s);
	net_listener_close(l);
}
END_TEST

/* ---------------------------------------------------------------- main */

int main(void)
{
	const char *a = getenv("CKPT_TEST_RDMA_ADDR");
	if (a && *a)
		addr = a;
	/* Probe in a child: this process must not open the devices before Check
	 * forks the tests (the kernel refuses a parent's verbs handles in a child). */
	fflush(NULL);
	pid_t pid = fork();
	if (pid == 0) {
		struct net_listener *l;
		int rc = net_listen(NET_RDMA, NULL, addr, 0, &l);
		if (rc == CKPT_ENODEV) {
			printf("SKIP: rdma not available here: %s\n", ckpt_last_error());
			fflush(stdout);
			_exit(77);
		}
		if (rc)
			fprintf(stderr, "rdma listen on %s: %s\n", addr, ckpt_last_error());
		net_listener_close(l);
		_exit(rc ? 1 : 0);
	}
	int st = 0;
	if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st))
		return 1;
	if (WEXITSTATUS(st))
		return WEXITSTATUS(st);
	printf("rdma at %s\n", addr);
	tu_seed();
	ckpt_fault_reload();

	Suite *s = suite_create("rdma_commit");
	TCase *tc = tcase_create("rdma");
	tcase_set_timeout(tc, 240);
	tcase_add_test(tc, commit_w4);
	tcase_add_test(tc, commit_w16);
	tcase_add_test(tc, payloads_beyond_one_ring);
	tcase_add_test(tc, both_directions_at_once);
	tcase_add_test(tc, receiver_closes_mid_transfer);
	tcase_add_test(tc, sender_dies_mid_transfer);
	suite_add_tcase(s, tc);
	SRunner *sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
