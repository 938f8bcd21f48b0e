/*
 * test_ckptd_grants.c — ckptd's direct path under hostile ranks: a stream over rdma
 * that asks for it (REMOTE_OPEN_DIRECT) is granted pool buffers, RDMA-writes its
 * chunks into them and names them in its CHUNKs (docs/ckptd.md). Attacked here:
 * grants that were never given, used twice, or named by a stream that has none;
 * RDMA WRITEs past a granted buffer or into one already used (revoked); and streams
 * that end every way (ABORT, a dropped connection, an ERROR, a stop) while they
 * hold grants. After each, ckptd_fixture's after_attack: every pool buffer back,
 * job B untouched, honest ranks (over rdma, so through grants too) bit-exact. And
 * the pool as backpressure: a stream gets no grant while other streams hold the
 * pool, and gets one as soon as a buffer comes back.
 *
 * Runs where an RDMA device is (the rdma guest, tests/rdma: label rdma-guest);
 * elsewhere it says so and exits 77. The address is CKPT_TEST_RDMA_ADDR (10.0.0.1).
 */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ckpt/ckpt.h"
#include "ckptd_fixture.h"
#include "testutil.h"

/* OPEN asking for the direct path, answered with it; TENSOR "w" of bytes; then the
 * GRANT that follows OPEN_OK (the pool is free: the stream's full share). */
static unsigned start_direct(struct net_conn *c, uint64_t step, uint64_t bytes,
                             struct remote_grant *g)
{
	uint32_t flags = open_with_flags(c, step, REMOTE_OPEN_DIRECT);
	ck_assert_msg(flags == REMOTE_OPEN_DIRECT, "ckptd over rdma did not grant the direct path");
	struct ckpt_buf b;
	struct net_msg m;
	tensor_msg(&b, "w", bytes);
	send_buf(c, REMOTE_MSG_TENSOR, &b);
	expect_answer(c, REMOTE_MSG_GRANT, &m);
	unsigned n = 0;
	ck_assert_int_eq(remote_grant_decode(m.payload, m.len, g, REMOTE_MAX_GRANTS, &n), 0);
	net_msg_free(&m);
	/* A share of the pool: half of its NBUFS buffers. */
	ck_assert_uint_eq(n, NBUFS / 2);
	for (unsigned i = 0; i < n; i++)
		ck_assert_uint_eq(g[i].len, BUF_BYTES);
	return n;
}

/* This side's source of RDMA WRITEs: len bytes of fill, registered with c. */
static void *source(struct net_conn *c, size_t len, uint8_t fill, struct net_mr **mr)
{
	void *p = NULL;
	ck_assert_int_eq(posix_memalign(&p, 4096, len), 0);
	memset(p, fill, len);
	ck_assert_msg(net_mr_register(c, p, len, NET_MR_LOCAL, mr) == 0, "%s", ckpt_err_msg());
	return p;
}

/* A CHUNK of len bytes of tensor 0 naming grant id. */
static void send_chunk_granted(struct net_conn *c, uint64_t len, uint32_t id)
{
	struct ckpt_buf b;
	chunk_msg(&b, 0, len);
	ckpt_buf_u32(&b, id);
	send_buf(c, REMOTE_MSG_CHUNK, &b);
}

/* WRITE len bytes into the grant at off, then wait for it: 0, or the error that
 * broke c. */
static int write_into(struct net_conn *c, struct net_mr *mr, const void *p, size_t len,
                      const struct remote_grant *g, uint64_t off)
{
	uint64_t t;
	int rc = net_rdma_write(c, mr, p, len, g->addr + off, g->rkey, &t, WAIT_MS);
	return rc ? rc : net_rdma_write_wait(c, t, WAIT_MS);
}

/* expect_error, after the GRANTs ckptd may send first (it grants again as soon as a
 * grant was used). */
static void expect_error_after_grants(struct net_conn *c, int code, const char *needle)
{
	struct net_msg m;
	int rc;
	while ((rc = net_recv(c, &m, WAIT_MS)) == 0 && m.type == REMOTE_MSG_GRANT)
		net_msg_free(&m);
	ck_assert_msg(rc == 0, "no ERROR (want %d, '%s'): %s", code, needle, ckpt_err_msg());
	ck_assert_msg(m.type == REMOTE_MSG_ERROR, "type %u where ERROR (%d, '%s') was due", m.type,
	              code, needle);
	rc = remote_error_take(m.payload, m.len, "ckptd");
	net_msg_free(&m);
	ck_assert_msg(rc == code && strstr(ckpt_err_msg(), needle),
	              "ERROR %d (want %d): '%s' (want '%s')", rc, code, ckpt_err_msg(), needle);
	expect_closed(c, NULL);
}

static uint64_t pool_used(void)
{
	struct ckptd_gauges g;
	ckptd_server_gauges(srv, &g);
	return g.pool_used_bytes;
}

START_TEST(grants_forged)
{
	struct remote_grant g[REMOTE_MAX_GRANTS];
	struct net_conn *c = conn_a();
	start_direct(c, 7, 1u << 20, g);
	send_chunk_granted(c, 65536, 999999);
	expect_error(c, CKPT_EPROTO, "CHUNK names grant 999999, which is not outstanding");
	/* A stream that did not ask has no grants to name. */
	c = conn_a();
	start_stream(c, 8, 1u << 20);
	send_chunk_granted(c, 65536, 1);
	expect_error(c, CKPT_EPROTO, "this stream has no grants");
	/* Outside a stream. */
	c = conn_a();
	send_chunk_granted(c, 65536, 1);
	expect_error(c, CKPT_EPROTO, "CHUNK outside a shard stream");
	/* Another connection's grant (its ids are its own). */
	struct net_conn *other = conn_a();
	struct remote_grant og[REMOTE_MAX_GRANTS];
	start_direct(other, 9, 1u << 20, og);
	c = conn_a();
	start_stream(c, 10, 1u << 20);
	send_chunk_granted(c, 65536, og[0].id);
	expect_error(c, CKPT_EPROTO, "this stream has no grants");
	net_close(other);
	after_attack();
}
END_TEST

START_TEST(grant_used_twice)
{
	struct remote_grant g[REMOTE_MAX_GRANTS];
	struct net_conn *c = conn_a();
	start_direct(c, 7, 1u << 20, g);
	struct net_mr *mr;
	void *p = source(c, 65536, 0x33, &mr);
	uint64_t before = atomic_load(&counters.bytes_received_rdma);
	ck_assert_int_eq(write_into(c, mr, p, 65536, &g[0], 0), 0);
	send_chunk_granted(c, 65536, g[0].id);
	/* Taken as a chunk, counted as received by RDMA WRITE. */
	for (int i = 0; i < 500 && atomic_load(&counters.bytes_received_rdma) == before; i++)
		usleep(10000);
	ck_assert_uint_eq(atomic_load(&counters.bytes_received_rdma) - before, 65536);
	send_chunk_granted(c, 65536, g[0].id);
	expect_error_after_grants(c, CKPT_EPROTO, "CHUNK names grant");
	free(p);
	after_attack();
}
END_TEST

START_TEST(writes_outside_grants)
{
	struct remote_grant g[REMOTE_MAX_GRANTS];
	struct net_mr *mr;
	/* Past the granted buffer's end: refused by the registration, which covers that
	 * buffer alone; the attacker's connection breaks, nothing else. */
	struct net_conn *c = conn_a();
	start_direct(c, 7, 1u << 20, g);
	void *p = source(c, 65536, 0x44, &mr);
	int rc = write_into(c, mr, p, 65536, &g[0], BUF_BYTES - 4096);
	ck_assert_msg(rc == -EACCES || rc == -ECONNRESET, "WRITE past a grant: %d (%s)", rc,
	              ckpt_err_msg());
	expect_closed(c, NULL);
	free(p);
	/* Into a buffer whose grant was used: revoked when its CHUNK came. */
	c = conn_a();
	start_direct(c, 8, 1u << 20, g);
	p = source(c, 65536, 0x45, &mr);
	ck_assert_int_eq(write_into(c, mr, p, 65536, &g[0], 0), 0);
	uint64_t before = atomic_load(&counters.bytes_received_rdma);
	send_chunk_granted(c, 65536, g[0].id);
	/* Once ckptd has taken the chunk: it revokes the grant first. (A WRITE that the
	 * NIC takes before ckptd's thread has read the CHUNK still lands, and changes
	 * only bytes of the attacker's own that no longer match their hash.) */
	for (int i = 0; i < 500 && atomic_load(&counters.bytes_received_rdma) == before; i++)
		usleep(10000);
	ck_assert_uint_eq(atomic_load(&counters.bytes_received_rdma) - before, 65536);
	rc = write_into(c, mr, p, 65536, &g[0], 0);
	ck_assert_msg(rc == -EACCES || rc == -ECONNRESET, "WRITE into a used grant: %d (%s)", rc,
	              ckpt_err_msg());
	expect_closed(c, NULL);
	free(p);
	/* With another grant's key at the first one's address. */
	c = conn_a();
	start_direct(c, 9, 1u << 20, g);
	p = source(c, 4096, 0x46, &mr);
	struct remote_grant mixed = { .id = g[0].id, .addr = g[0].addr, .rkey = g[1].rkey,
	                              .len = g[0].len };
	if (g[0].rkey != g[1].rkey) {
		rc = write_into(c, mr, p, 4096, &mixed, 0);
		ck_assert_msg(rc == -EACCES || rc == -ECONNRESET, "WRITE with another grant's key: "
		              "%d (%s)", rc, ckpt_err_msg());
		expect_closed(c, NULL);
	} else {
		net_close(c);
	}
	free(p);
	after_attack();
}
END_TEST

START_TEST(grants_back_when_streams_end)
{
	struct remote_grant g[REMOTE_MAX_GRANTS];
	for (unsigned i = 0; i < 2 * NBUFS; i++) {
		uint64_t step = 1000 + 10 * i;
		/* ABORT, the connection kept. */
		struct net_conn *c = conn_a();
		start_direct(c, step, 1u << 20, g);
		send_msg(c, REMOTE_MSG_ABORT, NULL, 0);
		for (int k = 0; k < 500 && pool_used(); k++)
			usleep(10000);
		ck_assert_uint_eq(pool_used(), 0);
		net_close(c);
		/* The connection dropped. */
		c = conn_a();
		start_direct(c, step + 1, 1u << 20, g);
		net_close(c);
		/* An ERROR (a chunk of a tensor that is not there) with a grant left. */
		c = conn_a();
		start_direct(c, step + 2, 8192, g);
		struct net_mr *mr;
		void *p = source(c, 4096, 1, &mr);
		ck_assert_int_eq(write_into(c, mr, p, 4096, &g[0], 0), 0);
		struct ckpt_buf b;
		chunk_msg(&b, 3, 4096);
		ckpt_buf_u32(&b, g[0].id);
		send_buf(c, REMOTE_MSG_CHUNK, &b);
		expect_error(c, -EINVAL, "append to tensor 3");
		free(p);
	}
	wait_idle();
	/* A stop with grants out: they are back before the pool goes. */
	struct net_conn *c = conn_a();
	start_direct(c, 7, 1u << 20, g);
	ck_assert_uint_eq(pool_used(), (uint64_t)NBUFS / 2 * BUF_BYTES);
	ckptd_server_stop(srv, 0);
	pthread_join(runner, NULL);
	ckptd_server_free(srv);
	srv = NULL;
	ck_assert_msg(!log_has("buffers still out"), "a granted buffer was lost at the stop");
	net_close(c);
}
END_TEST

START_TEST(grants_are_backpressure)
{
	/* Two streams hold the whole pool as grants: a third is answered, but granted
	 * nothing until a buffer comes back. */
	struct remote_grant g1[REMOTE_MAX_GRANTS], g2[REMOTE_MAX_GRANTS], g3[REMOTE_MAX_GRANTS];
	struct net_conn *a = conn_a(), *b = conn_a(), *c = conn_a();
	start_direct(a, 7, 1u << 20, g1);
	start_direct(b, 8, 1u << 20, g2);
	ck_assert_uint_eq(pool_used(), (uint64_t)NBUFS * BUF_BYTES);
	struct ckpt_buf buf;
	ckpt_buf_init(&buf);
	remote_open_encode(&buf, &(struct remote_open){ .step = 9, .save_id = STREAM_SID,
	                   .block_bytes = 1u << 20, .chunk_bytes = 64u << 10,
	                   .flags = REMOTE_OPEN_DIRECT });
	send_buf(c, REMOTE_MSG_OPEN, &buf);
	struct net_msg m;
	expect_answer(c, REMOTE_MSG_OPEN_OK, &m);
	net_msg_free(&m);
	ck_assert_int_eq(net_recv(c, &m, 500), -ETIMEDOUT);
	/* A's stream ends: its buffers go back, and to C as grants. */
	send_msg(a, REMOTE_MSG_ABORT, NULL, 0);
	expect_answer(c, REMOTE_MSG_GRANT, &m);
	unsigned n = 0;
	ck_assert_int_eq(remote_grant_decode(m.payload, m.len, g3, REMOTE_MAX_GRANTS, &n), 0);
	ck_assert_uint_ge(n, 1);
	net_msg_free(&m);
	net_close(a);
	net_close(b);
	net_close(c);
	after_attack();
}
END_TEST

int main(void)
{
	const char *a = getenv("CKPT_TEST_RDMA_ADDR");
	fixture_host = a && *a ? a : "10.0.0.1";
	fixture_transport = NET_RDMA;
	/* Probe in a child: this process must not open the devices before Check forks
	 * the tests (the kernel refuses a parent's verbs handles in a child). */
	fflush(NULL);
	pid_t pid = fork();
	if (pid == 0) {
		struct net_listener *l;
		int rc = net_listen(NET_RDMA, NULL, fixture_host, 0, &l);
		if (rc == CKPT_ENODEV || rc == -EADDRNOTAVAIL) {
			printf("SKIP: rdma not available at %s here: %s (this runs inside the rdma "
			       "guest, tests/rdma/run-rdma-tests.sh)\n", fixture_host, ckpt_last_error());
			fflush(stdout);
			_exit(77);
		}
		if (rc)
			fprintf(stderr, "rdma listen on %s: %s\n", fixture_host, ckpt_last_error());
		net_listener_close(l);
		_exit(rc ? 1 : 0);
	}
	int st = 0;
	if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st))
		return 1;
	if (WEXITSTATUS(st))
		return WEXITSTATUS(st);
	Suite *s = suite_create("ckptd_grants");
	TCase *tc = tcase_create("grants");
	tcase_add_checked_fixture(tc, hostile_setup, hostile_teardown);
	tcase_add_test(tc, grants_forged);
	tcase_add_test(tc, grant_used_twice);
	tcase_add_test(tc, writes_outside_grants);
	tcase_add_test(tc, grants_back_when_streams_end);
	tcase_add_test(tc, grants_are_backpressure);
	suite_add_tcase(s, tc);
	SRunner *r = srunner_create(s);
	srunner_run_all(r, CK_NORMAL);
	int failed = srunner_ntests_failed(r);
	srunner_free(r);
	return failed ? 1 : 0;
}
