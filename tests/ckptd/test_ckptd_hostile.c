/*
 * test_ckptd_hostile.c — ckptd under hostile input. A server runs in this process
 * (ckptd_server_run in a thread, a pool of four buffers so that one lost on an
 * error path shows) and is attacked over raw lib/net connections: garbage and
 * oversized frames before and after the handshake, wrong secrets and path-like job
 * ids, a CHUNK whose DATA has another length or none, DATA beyond a pool buffer or
 * with no CHUNK, bad TENSORs, streams out of order, READ and CHECK of paths outside
 * the job's root or of another job's files, ranges that overflow, bad COORDs, ERROR
 * from a client, every message truncated or with a byte too many, streams abandoned
 * or stalled while they hold pool buffers, and one job writing and removing where
 * another job's file is.
 *
 * After each attack: the answer is an ERROR with its specific code and a message
 * naming the object, or (where the frame itself is bad) the connection is closed
 * and ckptd's log names the cause; nothing exists outside <data>/jobs/<job>/; job
 * B's files are byte for byte what B saved; every pool buffer is free once the
 * connections are gone; and honest ranks of jobs A and B, saving through the
 * library (ckpt_open with a ckptd:// target), save and load bit-exact. The server,
 * the peers and those checks are ckptd_fixture.c's.
 */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>

#include "ckpt/ckpt.h"
#include "ckptd_fixture.h"
#include "glue.h"            /* the context's pool: a buffer held out of a save */
#include "io/io.h"
#include "manifest/manifest.h"
#include "testutil.h"

/* ------------------------------------------------------------------ before the handshake */

START_TEST(garbage_before_handshake)
{
	uint64_t rejected = atomic_load(&counters.rejected);
	/* Something else's protocol. */
	int fd = raw_connect();
	static const char http[] = "GET /metrics HTTP/1.1\r\nHost: ckptd\r\n\r\n";
	raw_write(fd, http, sizeof http - 1);
	raw_expect_closed(fd, "HTTP request");
	ck_assert(log_has("bad magic"));
	/* Random bytes. */
	uint8_t junk[512];
	tu_fill(junk, sizeof junk, tu_seed(), 1);
	fd = raw_connect();
	raw_write(fd, junk, sizeof junk);
	raw_expect_closed(fd, "random bytes");
	/* Our magic with another version. */
	uint8_t h[NET_HEADER_BYTES];
	raw_header(h, 7, NET_MSG_HELLO, 10);
	fd = raw_connect();
	raw_write(fd, h, sizeof h);
	raw_expect_closed(fd, "version 7");
	ck_assert(log_has("protocol version 7"));
	/* Lengths beyond the handshake's limit, and the largest a header can say. */
	raw_header(h, NET_PROTO_VERSION, NET_MSG_HELLO, 4097);
	fd = raw_connect();
	raw_write(fd, h, sizeof h);
	raw_expect_closed(fd, "HELLO of 4097 bytes");
	ck_assert(log_has("message of 4097 bytes exceeds the limit"));
	raw_header(h, NET_PROTO_VERSION, NET_MSG_HELLO, UINT32_MAX);
	fd = raw_connect();
	raw_write(fd, h, sizeof h);
	raw_expect_closed(fd, "HELLO of 4 GiB");
	/* Half a header, and a HELLO cut short: the peer leaves. */
	fd = raw_connect();
	raw_write(fd, h, 7);
	close(fd);
	raw_header(h, NET_PROTO_VERSION, NET_MSG_HELLO, 100);
	fd = raw_connect();
	raw_write(fd, h, sizeof h);
	raw_write(fd, junk, 50);
	close(fd);
	/* Well framed, but not a HELLO: REJECT with the reason, then closed. */
	struct net_conn *c;
	ck_assert_int_eq(net_connect(NET_TCP, NULL, "127.0.0.1", port, WAIT_MS, &c), 0);
	send_msg(c, NET_MSG_HELLO, junk, 10);
	struct net_msg m;
	ck_assert_int_eq(net_recv(c, &m, WAIT_MS), 0);
	ck_assert_uint_eq(m.type, NET_MSG_REJECT);
	net_msg_free(&m);
	expect_closed(c, "expected HELLO");
	ck_assert_int_eq(net_connect(NET_TCP, NULL, "127.0.0.1", port, WAIT_MS, &c), 0);
	send_msg(c, REMOTE_MSG_READ, junk, 10);
	ck_assert_int_eq(net_recv(c, &m, WAIT_MS), 0);
	ck_assert_uint_eq(m.type, NET_MSG_REJECT);
	net_msg_free(&m);
	expect_closed(c, NULL);
	/* A silent peer is dropped when the handshake's time is up. */
	fd = raw_connect();
	time_t t0 = time(NULL);
	raw_expect_closed(fd, "silent peer");
	ck_assert_int_le(time(NULL) - t0, TIMEOUT_MS / 1000 + 3);
	ck_assert_uint_gt(atomic_load(&counters.rejected), rejected);
	after_attack();
}
END_TEST

START_TEST(refused_jobs)
{
	expect_refused("joba", "not-the-secret-0123456789", CKPT_EAUTH,
	               "server failed to prove the job secret");
	/* Another job's secret, both ways round. */
	expect_refused("joba", SECRET_B, CKPT_EAUTH, "server failed to prove");
	expect_refused("jobb", SECRET_A, CKPT_EAUTH, "server failed to prove");
	expect_refused("nosuch", SECRET_A, CKPT_EPEER, "not registered with this ckptd");
	/* Path-like ids name no job: nothing is created for them. */
	static const char *const ids[] = { "../joba", "../../x", "/etc", "joba/../jobb", ".", "..",
	                                   "jobs/joba", "joba/" };
	for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++)
		expect_refused(ids[i], SECRET_A, CKPT_EPEER, "not registered with this ckptd");
	char longid[NET_MAX_JOB_ID + 1];
	memset(longid, 'a', NET_MAX_JOB_ID);
	longid[NET_MAX_JOB_ID] = '\0';
	expect_refused(longid, SECRET_A, CKPT_EPEER, "not registered");
	/* A job id with a NUL inside, which no client library would send: a HELLO by
	 * hand (job id, rank, world, a 32-byte nonce; protocol.md §1.2). */
	struct net_conn *c;
	ck_assert_int_eq(net_connect(NET_TCP, NULL, "127.0.0.1", port, WAIT_MS, &c), 0);
	struct ckpt_buf b;
	ckpt_buf_init(&b);
	ckpt_buf_u16(&b, 9);
	ckpt_buf_put(&b, "joba\0jobb", 9);
	ckpt_buf_u32(&b, 0);
	ckpt_buf_u32(&b, 1);
	uint8_t nonce[32] = { 0 };
	ckpt_buf_put(&b, nonce, sizeof nonce);
	send_buf(c, NET_MSG_HELLO, &b);
	struct net_msg m;
	ck_assert_int_eq(net_recv(c, &m, WAIT_MS), 0);
	ck_assert_uint_eq(m.type, NET_MSG_REJECT);
	ck_assert_uint_ge(m.len, 6);
	ck_assert_int_eq((int32_t)ckpt_get_le32(m.payload), CKPT_EPEER);
	ck_assert(memmem(m.payload, m.len, "not registered", 14) != NULL);
	net_msg_free(&m);
	expect_closed(c, NULL);
	after_attack();
}
END_TEST

/* ------------------------------------------------------------------ frames after it */

START_TEST(oversized_after_handshake)
{
	/* The largest length a header can say. */
	struct net_conn *c = conn_a();
	send_header(c, REMOTE_MSG_COORD, UINT32_MAX);
	expect_closed(c, "exceeds the limit");
	/* A control message over REMOTE_MAX_CONTROL, though a pool buffer would hold it:
	 * refused at its header, before anything is allocated or read. */
	c = conn_a();
	send_header(c, REMOTE_MSG_TENSOR, REMOTE_MAX_CONTROL + 1);
	expect_closed(c, "TENSOR message (type 68) of 1048577 bytes");
	c = conn_a();
	start_stream(c, 7, 8192);
	send_header(c, REMOTE_MSG_CHUNK, BUF_BYTES);
	expect_closed(c, "CHUNK message (type 69) of 2097152 bytes");
	after_attack();
}
END_TEST

START_TEST(data_mismatch)
{
	/* A CHUNK of 4096 bytes, then DATA of 4095 and of 4097. */
	struct net_conn *c = conn_a();
	start_stream(c, 7, 8192);
	send_chunk(c, 0, 4096);
	send_data(c, 4095, 1);
	expect_closed(c, "DATA of 4095 bytes where the CHUNK said 4096");
	c = conn_a();
	start_stream(c, 7, 8192);
	send_chunk(c, 0, 4096);
	send_data(c, 4097, 1);
	expect_closed(c, "DATA of 4097 bytes where the CHUNK said 4096");
	/* DATA with no CHUNK: in a stream, and outside one. */
	c = conn_a();
	start_stream(c, 7, 8192);
	send_data(c, 100, 1);
	expect_closed(c, "DATA of 100 bytes where none was announced");
	c = conn_a();
	send_data(c, 100, 1);
	expect_closed(c, "none was announced");
	/* DATA longer than a pool buffer: announced by its CHUNK, which is refused, and
	 * where the CHUNK said less. */
	c = conn_a();
	start_stream(c, 7, 2 * (uint64_t)BUF_BYTES);
	send_chunk(c, 0, BUF_BYTES + 4096);
	expect_error(c, CKPT_EPROTO, "CHUNK of 2101248 bytes: a pool buffer holds 2097152");
	c = conn_a();
	start_stream(c, 7, 8192);
	send_chunk(c, 0, 4096);
	send_header(c, REMOTE_MSG_DATA, BUF_BYTES);
	expect_closed(c, "DATA of 2097152 bytes where the CHUNK said 4096");
	c = conn_a();
	start_stream(c, 7, 8192);
	send_chunk(c, 0, 4096);
	send_header(c, REMOTE_MSG_DATA, BUF_BYTES + 4096);
	expect_closed(c, "message of 2101248 bytes exceeds the limit of 2097152");
	after_attack();
}
END_TEST

START_TEST(data_empty)
{
	/* Empty DATA asks for no buffer, so it never meets the check at the header. */
	struct net_conn *c = conn_a();
	send_data(c, 0, 0);
	expect_error(c, CKPT_EPROTO, "DATA of 0 bytes where none was announced");
	c = conn_a();
	start_stream(c, 7, 8192);
	send_data(c, 0, 0);
	expect_error(c, CKPT_EPROTO, "DATA of 0 bytes where none was announced");
	c = conn_a();
	start_stream(c, 7, 8192);
	send_chunk(c, 0, 4096);
	send_data(c, 0, 0);
	expect_error(c, CKPT_EPROTO, "DATA of 0 bytes where the CHUNK said 4096");
	/* And in a job with a quota, whose refusal puts the buffer back itself. */
	c = conn_as("jobq", SECRET_Q, 1);
	start_stream(c, 7, 8192);
	send_chunk(c, 0, 4096);
	send_data(c, 0, 0);
	expect_error(c, CKPT_EPROTO, "DATA of 0 bytes");
	after_attack();
}
END_TEST

START_TEST(chunks_out_of_place)
{
	struct net_conn *c = conn_a();
	send_chunk(c, 0, 4096);
	expect_error(c, CKPT_EPROTO, "CHUNK outside a shard stream");
	c = conn_a();
	start_stream(c, 7, 8192);
	send_chunk(c, 0, 4096);
	send_chunk(c, 0, 4096);
	expect_error(c, CKPT_EPROTO, "CHUNK before the last chunk's DATA");
	/* A tensor that was never declared, and more bytes than the tensor has. */
	c = conn_a();
	start_stream(c, 7, 8192);
	send_chunk(c, 5, 4096);
	send_data(c, 4096, 1);
	expect_error(c, -EINVAL, "append to tensor 5 of 1");
	c = conn_a();
	start_stream(c, 7, 4096);
	send_chunk(c, 0, 8192);
	send_data(c, 8192, 1);
	expect_error(c, -EINVAL, "tensor 'w': 8192 more bytes past its 4096");
	/* A codec that does not exist; a raw chunk that says it is compressed. */
	c = conn_a();
	start_stream(c, 7, 8192);
	struct ckpt_buf b;
	chunk_msg(&b, 0, 4096);
	b.p[4] = 9;
	send_buf(c, REMOTE_MSG_CHUNK, &b);
	expect_error(c, CKPT_EPROTO, "CHUNK message: bad or truncated codec");
	c = conn_a();
	start_stream(c, 7, 8192);
	chunk_msg(&b, 0, 4096);
	ckpt_put_le64(b.p + 13, 4000);                  /* stored_len != raw_len, raw codec */
	send_buf(c, REMOTE_MSG_CHUNK, &b);
	expect_error(c, CKPT_EPROTO, "CHUNK message: bad or truncated lengths");
	/* Bytegroup where the writer cannot take it: a u8 tensor; stored bytes longer
	 * than raw. The stored bytes themselves are the reader's to check. */
	const struct { uint64_t stored; const char *msg; } bg[] = {
		{ 100, "a bytegroup chunk of dtype u8" }, { 4097, "encoded chunk (codec 2" },
	};
	for (size_t i = 0; i < CKPT_ARRAY_SIZE(bg); i++) {
		c = conn_a();
		start_stream(c, 7, 8192);
		struct remote_chunk ch = { .codec = IO_CODEC_BYTEGROUP, .raw_len = 4096,
		                           .stored_len = bg[i].stored };
		ckpt_buf_init(&b);
		remote_chunk_encode(&b, &ch, false);
		send_buf(c, REMOTE_MSG_CHUNK, &b);
		send_data(c, (size_t)bg[i].stored, 1);
		expect_error(c, -EINVAL, bg[i].msg);
	}
	after_attack();
}
END_TEST

/* A TENSOR message by hand: name bytes, ndim and the dims as given. */
static void send_raw_tensor(struct net_conn *c, const void *name, uint16_t name_len,
                            uint8_t dtype, uint8_t ndim, const uint64_t *shape,
                            const uint64_t *extent, uint64_t raw_bytes)
{
	struct ckpt_buf b;
	ckpt_buf_init(&b);
	ckpt_buf_u16(&b, name_len);
	ckpt_buf_put(&b, name, name_len);
	ckpt_buf_u8(&b, CKPT_KIND_MODEL);
	ckpt_buf_u8(&b, dtype);
	ckpt_buf_u8(&b, CKPT_SHARDED);
	ckpt_buf_u8(&b, 0);
	ckpt_buf_u8(&b, ndim);
	for (unsigned i = 0; i < ndim; i++)
		ckpt_buf_u64(&b, shape[i]);
	for (unsigned i = 0; i < ndim; i++)
		ckpt_buf_u64(&b, 0);
	for (unsigned i = 0; i < ndim; i++)
		ckpt_buf_u64(&b, extent[i]);
	ckpt_buf_u64(&b, raw_bytes);
	send_buf(c, REMOTE_MSG_TENSOR, &b);
}

static void expect_tensor_error(const void *name, uint16_t name_len, uint8_t dtype, uint8_t ndim,
                                const uint64_t *shape, const uint64_t *extent,
                                uint64_t raw_bytes, int code, const char *needle)
{
	struct net_conn *c = conn_a();
	start_stream(c, 7, 8192);
	send_raw_tensor(c, name, name_len, dtype, ndim, shape, extent, raw_bytes);
	expect_error(c, code, needle);
}

START_TEST(bad_tensors)
{
	uint64_t shape[255], one[1] = { 4 };
	for (unsigned i = 0; i < 255; i++)
		shape[i] = 1;
	expect_tensor_error("x", 1, CKPT_F32, 17, shape, shape, 4, CKPT_EPROTO,
	                    "TENSOR message: bad or truncated rank (ndim)");
	expect_tensor_error("x", 1, CKPT_F32, 255, shape, shape, 4, CKPT_EPROTO, "rank (ndim)");
	expect_tensor_error("a\0b", 3, CKPT_F32, 1, one, one, 16, CKPT_EPROTO,
	                    "TENSOR message: bad or truncated name");
	expect_tensor_error("", 0, CKPT_F32, 1, one, one, 16, CKPT_EPROTO, "bad or truncated name");
	expect_tensor_error("a\nb", 3, CKPT_F32, 1, one, one, 16, CKPT_EPROTO,
	                    "bad or truncated name");
	expect_tensor_error("w\xff\xfe", 3, CKPT_F32, 1, one, one, 16, CKPT_ENAME,
	                    "invalid tensor name 'w\\xff\\xfe'");
	expect_tensor_error("\xc0\xaf", 2, CKPT_F32, 1, one, one, 16, CKPT_ENAME,
	                    "invalid tensor name");
	expect_tensor_error("a/../b", 6, CKPT_F32, 1, one, one, 16, CKPT_ENAME,
	                    "invalid tensor name 'a/../b'");
	static char longname[CKPT_MAX_NAME + 1];
	memset(longname, 'n', sizeof longname);
	expect_tensor_error(longname, CKPT_MAX_NAME + 1, CKPT_F32, 1, one, one, 16, CKPT_EPROTO,
	                    "bad or truncated name");
	/* Shapes whose size overflows 64 bits, a box outside its shape, a size that lies. */
	uint64_t huge[2] = { 1ull << 40, 1ull << 40 };
	expect_tensor_error("h", 1, CKPT_F32, 2, huge, huge, 0, CKPT_ESHAPE,
	                    "tensor 'h': size overflows 64 bits");
	uint64_t big[1] = { UINT64_MAX };
	expect_tensor_error("h", 1, CKPT_F32, 1, big, big, 0, CKPT_ESHAPE, "overflows 64 bits");
	uint64_t wide[1] = { 8 };
	expect_tensor_error("h", 1, CKPT_F32, 1, one, wide, 32, CKPT_ESHAPE, "outside shape 4");
	expect_tensor_error("h", 1, CKPT_F32, 1, one, one, 17, CKPT_ESHAPE,
	                    "raw_bytes 17, extent holds 16");
	expect_tensor_error("h", 1, 0, 1, one, one, 16, -EINVAL, "tensor 'h': kind");
	/* The same name twice; a TENSOR with no stream. */
	struct net_conn *c = conn_a();
	start_stream(c, 7, 8192);
	struct ckpt_buf b;
	tensor_msg(&b, "w", 8192);
	send_buf(c, REMOTE_MSG_TENSOR, &b);
	expect_error(c, -EEXIST, "tensor 'w' added twice");
	c = conn_a();
	tensor_msg(&b, "w", 8192);
	send_buf(c, REMOTE_MSG_TENSOR, &b);
	expect_error(c, CKPT_EPROTO, "TENSOR outside a shard stream");
	after_attack();
}
END_TEST

START_TEST(streams_out_of_order)
{
	struct net_conn *c = conn_a();
	start_stream(c, 7, 8192);
	send_open(c, 8, STREAM_SID, 1u << 20, 0);
	expect_error(c, CKPT_EPROTO, "OPEN inside a shard stream");
	c = conn_a();
	send_msg(c, REMOTE_MSG_FINISH, NULL, 0);
	expect_error(c, CKPT_EPROTO, "FINISH outside a shard stream");
	c = conn_a();
	start_stream(c, 7, 8192);
	send_chunk(c, 0, 4096);
	send_msg(c, REMOTE_MSG_FINISH, NULL, 0);
	expect_error(c, CKPT_EPROTO, "FINISH before the last chunk's DATA");
	/* A shard cut short: FINISH with a tensor half sent. */
	c = conn_a();
	start_stream(c, 7, 8192);
	send_chunk(c, 0, 4096);
	send_data(c, 4096, 1);
	send_msg(c, REMOTE_MSG_FINISH, NULL, 0);
	struct net_msg m;
	ck_assert_int_eq(net_recv(c, &m, WAIT_MS), 0);
	ck_assert_uint_eq(m.type, REMOTE_MSG_ERROR);
	int rc = remote_error_take(m.payload, m.len, "ckptd");
	net_msg_free(&m);
	ck_assert_msg(rc < 0 && strstr(ckpt_err_msg(), "'w'"), "%d: %s", rc, ckpt_err_msg());
	expect_closed(c, NULL);
	/* Block sizes the writer does not take; a size hint no file can have. */
	c = conn_a();
	send_open(c, 7, STREAM_SID, 3000, 0);
	expect_error(c, -EINVAL, "block");
	c = conn_a();
	send_open(c, 7, 0, 0, UINT64_MAX);
	struct net_msg e;
	ck_assert_int_eq(net_recv(c, &e, WAIT_MS), 0);
	ck_assert_uint_eq(e.type, REMOTE_MSG_ERROR);
	rc = remote_error_take(e.payload, e.len, "ckptd");
	net_msg_free(&e);
	ck_assert_msg(rc < 0 && strstr(ckpt_err_msg(), "18446744073709551615"), "%d: %s", rc,
	              ckpt_err_msg());
	expect_closed(c, NULL);
	/* A quota cannot be slipped past with a hint that wraps around what the job
	 * holds (here: what a stream in flight reserved). */
	struct net_conn *q = conn_as("jobq", SECRET_Q, 1);
	send_open(q, 7, STREAM_SID, 1u << 20, 8192);
	expect_answer(q, REMOTE_MSG_OPEN_OK, &m);
	net_msg_free(&m);
	c = conn_as("jobq", SECRET_Q, 1);
	send_open(c, 8, STREAM_SID, 1u << 20, UINT64_MAX - 4095);
	expect_error(c, -EDQUOT, "quota of 1048576 bytes exceeded");
	c = conn_as("jobq", SECRET_Q, 1);
	send_open(c, 8, STREAM_SID, 1u << 20, UINT64_MAX);
	expect_error(c, -EDQUOT, "quota of 1048576 bytes exceeded");
	net_close(q);
	/* ABORT with nothing open is harmless; the connection goes on. */
	c = conn_a();
	send_msg(c, REMOTE_MSG_ABORT, NULL, 0);
	start_stream(c, 7, 4096);
	send_chunk(c, 0, 4096);
	send_data(c, 4096, 1);
	send_msg(c, REMOTE_MSG_ABORT, NULL, 0);
	send_msg(c, REMOTE_MSG_FINISH, NULL, 0);
	expect_error(c, CKPT_EPROTO, "FINISH outside a shard stream");
	after_attack();
}
END_TEST

/* ------------------------------------------------------------------ READ and CHECK */

static const char *const bad_paths[] = {
	"../x",
	"/etc/passwd",
	"step-00000000000000000001/../../jobs/jobb/step-00000000000000000001/rank-000000.shard",
	"step-00000000000000000001/../../../jobb/manifest/data.mdb",
	"../jobb/step-00000000000000000001/rank-000000.shard",
	"step-00000000000000000001/rank-000000.shard/../../../../etc/passwd",
	"step-00000000000000000001//rank-000000.shard",
	"step-00000000000000000001/./rank-000000.shard",
	"step-1/rank-000000.shard",
	"manifest/data.mdb",
	"ckptd.lock",
	"step-00000000000000000001/rank-000000.shardx",
	"step-00000000000000000001/rank-0.shard",
	"@127.0.0.1:1/step-00000000000000000001/rank-000000.shard",
	"step-00000000000000000001",
	"/",
};

START_TEST(read_paths)
{
	for (size_t i = 0; i < sizeof bad_paths / sizeof bad_paths[0]; i++)
		expect_read_error(bad_paths[i], 0, 16, CKPT_EPROTO, "not a shard path");
	/* Bytes a path may not hold; a path longer than any shard path. */
	expect_read_error("step-00000000000000000001/rank-000000\n.shard", 0, 16, CKPT_EPROTO,
	                  "READ message: bad or truncated path");
	static char longpath[REMOTE_MAX_PATH + 2];
	memset(longpath, 'a', REMOTE_MAX_PATH + 1);
	expect_read_error(longpath, 0, 16, CKPT_EPROTO, "READ message: bad or truncated path");
	/* A shard path of job B's: job A has no such file, and B's is never read. */
	expect_read_error(b_rel, 0, 16, CKPT_ENOTFOUND, b_rel);
	/* Ranges: past the end of A's file, beyond what one READ may ask, overflowing. */
	honest_save("joba", SECRET_A, 50);
	char dir[4400], rel[128] = "";
	snprintf(dir, sizeof dir, "%s/jobs/joba/step-00000000000000000050", data_dir);
	DIR *d = opendir(dir);
	ck_assert(d != NULL);
	struct dirent *e;
	while ((e = readdir(d)))
		if (e->d_name[0] != '.')
			snprintf(rel, sizeof rel, "step-00000000000000000050/%s", e->d_name);
	closedir(d);
	char path[4600];
	snprintf(path, sizeof path, "%s/jobs/joba/%s", data_dir, rel);
	void *file;
	size_t size;
	ck_assert_int_eq(tu_read_file(path, &file, &size), 0);
	expect_read_error(rel, size, 16, CKPT_ECORRUPT, "end of file");
	expect_read_error(rel, size - 8, 16, CKPT_ECORRUPT, "end of file");
	expect_read_error(rel, 0, BUF_BYTES + 1, -EINVAL, "READ of 2097153 bytes");
	expect_read_error(rel, 0, REMOTE_MAX_READ + 1ull, -EINVAL, "READ of");
	expect_read_error(rel, 0, UINT64_MAX, -EINVAL, "READ of");
	expect_read_error(rel, UINT64_MAX - 8, 16, -EINVAL, rel);
	expect_read_error(rel, UINT64_MAX, 1, -EINVAL, rel);
	expect_read_error(rel, 1ull << 63, 16, -EINVAL, rel);
	/* The control: a READ in range answers the file's bytes. */
	struct net_conn *c = conn_a();
	struct ckpt_buf b;
	read_msg(&b, rel, 4096, 1000);
	send_buf(c, REMOTE_MSG_READ, &b);
	struct net_msg m;
	expect_answer(c, REMOTE_MSG_DATA, &m);
	ck_assert_uint_eq(m.len, 1000);
	ck_assert(memcmp(m.payload, (uint8_t *)file + 4096, 1000) == 0);
	net_msg_free(&m);
	net_close(c);
	free(file);
	after_attack();
}
END_TEST

START_TEST(check_paths)
{
	for (size_t i = 0; i < sizeof bad_paths / sizeof bad_paths[0]; i++)
		expect_check_error(bad_paths[i], 8192, CKPT_EPROTO, "not a shard path");
	static char longpath[REMOTE_MAX_PATH + 2];
	memset(longpath, 'a', REMOTE_MAX_PATH + 1);
	expect_check_error(longpath, 8192, CKPT_EPROTO, "CHECK message: bad or truncated path");
	/* Job B's shard, with its real size: not A's to vouch for. */
	char bpath[4400];
	snprintf(bpath, sizeof bpath, "%s/jobs/jobb/%s", data_dir, b_rel);
	struct stat st;
	ck_assert_int_eq(stat(bpath, &st), 0);
	expect_check_error(b_rel, (uint64_t)st.st_size, CKPT_ECORRUPT, "no such shard file");
	/* A's own shard with sizes that are not its own. */
	honest_save("joba", SECRET_A, 51);
	char rel[128];
	snprintf(rel, sizeof rel, "%s", b_rel);
	char dir[4400];
	snprintf(dir, sizeof dir, "%s/jobs/joba/step-00000000000000000051", data_dir);
	DIR *d = opendir(dir);
	ck_assert(d != NULL);
	struct dirent *e;
	while ((e = readdir(d)))
		if (e->d_name[0] != '.')
			snprintf(rel, sizeof rel, "step-00000000000000000051/%s", e->d_name);
	closedir(d);
	expect_check_error(rel, 8192, CKPT_ECORRUPT, "not the 8192 of the shard voted for");
	expect_check_error(rel, UINT64_MAX, CKPT_ECORRUPT, "of the shard voted for");
	char apath[4400];
	snprintf(apath, sizeof apath, "%s/jobs/joba/%s", data_dir, rel);
	ck_assert_int_eq(stat(apath, &st), 0);
	expect_check_error(rel, (uint64_t)st.st_size, CKPT_ECORRUPT, "names another footer");
	after_attack();
}
END_TEST

/* ------------------------------------------------------------------ COORD, ERROR, types */

static void expect_coord_error(const struct ckpt_buf *b, int code, const char *needle)
{
	struct net_conn *c = conn_a();
	send_msg(c, REMOTE_MSG_COORD, b->p, b->len);
	expect_error(c, code, needle);
}

START_TEST(bad_coord)
{
	struct ckpt_buf b;
	/* No instances; 300 (the limit is 256); hosts that are no host names. */
	ckpt_buf_init(&b);
	ckpt_buf_u32(&b, 1);
	ckpt_buf_u16(&b, 0);
	expect_coord_error(&b, CKPT_EPROTO, "COORD message: bad or truncated world or instance count");
	ckpt_buf_free(&b);
	ckpt_buf_init(&b);
	ckpt_buf_u32(&b, 1);
	ckpt_buf_u16(&b, 300);
	for (unsigned i = 0; i < 300; i++) {
		ckpt_buf_u16(&b, 9);
		ckpt_buf_put(&b, "127.0.0.1", 9);
		ckpt_buf_u16(&b, (uint16_t)(1000 + i));
	}
	expect_coord_error(&b, CKPT_EPROTO, "world or instance count");
	ckpt_buf_free(&b);
	struct remote_instance in[2] = { { "127.0.0.1", 0 }, { "127.0.0.1", 0 } };
	in[0].port = port;
	in[1].port = port;
	/* A world other than the one the handshake proved. */
	ckpt_buf_init(&b);
	ck_assert_int_eq(remote_coord_encode(&b, 5, in, 1, NULL, 0), 0);
	expect_coord_error(&b, CKPT_EPROTO, "COORD for 5 ranks from a rank of a world of 1");
	ckpt_buf_free(&b);
	ckpt_buf_init(&b);
	ckpt_buf_u32(&b, 0);
	ckpt_buf_u16(&b, 1);
	ckpt_buf_u16(&b, 9);
	ckpt_buf_put(&b, "127.0.0.1", 9);
	ckpt_buf_u16(&b, 1);
	expect_coord_error(&b, CKPT_EPROTO, "world or instance count");
	ckpt_buf_free(&b);
	/* Port 0; a host with a control byte; an empty host. */
	in[0].port = 0;
	ckpt_buf_init(&b);
	ck_assert_int_eq(remote_coord_encode(&b, 1, in, 1, NULL, 0), 0);
	expect_coord_error(&b, CKPT_EPROTO, "instance port");
	ckpt_buf_free(&b);
	in[0].port = port;
	snprintf(in[1].host, sizeof in[1].host, "evil\nhost");
	ckpt_buf_init(&b);
	ck_assert_int_eq(remote_coord_encode(&b, 1, in, 2, NULL, 0), 0);
	expect_coord_error(&b, CKPT_EPROTO, "instance host");
	ckpt_buf_free(&b);
	in[1].host[0] = '\0';
	ckpt_buf_init(&b);
	ck_assert_int_eq(remote_coord_encode(&b, 1, in, 2, NULL, 0), 0);
	expect_coord_error(&b, CKPT_EPROTO, "instance host");
	ckpt_buf_free(&b);
	/* Retention rules one byte short, and one byte too many. */
	struct remote_keep keep = { .last = 1 };
	ckpt_buf_init(&b);
	ck_assert_int_eq(remote_coord_encode(&b, 1, in, 1, &keep, 0), 0);
	b.len--;
	expect_coord_error(&b, CKPT_EPROTO, "COORD message: bad or truncated length");
	ckpt_buf_u16(&b, 0);
	expect_coord_error(&b, CKPT_EPROTO, "COORD message: bad or truncated length");
	ckpt_buf_free(&b);
	/* A timeout that is there is not 0. */
	ckpt_buf_init(&b);
	ck_assert_int_eq(remote_coord_encode(&b, 1, in, 1, &keep, 0), 0);
	ckpt_buf_u32(&b, 0);
	expect_coord_error(&b, CKPT_EPROTO, "COORD message: bad or truncated timeout");
	ckpt_buf_free(&b);
	after_attack();
}
END_TEST

START_TEST(unexpected_types)
{
	/* ERROR from a client; answers a client never sends; lib/net's own types; one
	 * nobody defines. */
	static const uint16_t types[] = { REMOTE_MSG_ERROR, REMOTE_MSG_COORD_OK, REMOTE_MSG_OPEN_OK,
	                                  REMOTE_MSG_DURABLE, REMOTE_MSG_MANIFEST_OK,
	                                  REMOTE_MSG_CHECK_OK, REMOTE_MSG_REMOVE_OK, NET_MSG_HELLO,
	                                  NET_MSG_WELCOME,
	                                  NET_MSG_REJECT, 0, 31, 200, 65535 };
	for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
		struct net_conn *c = conn_a();
		struct ckpt_buf b;
		ckpt_buf_init(&b);
		remote_error_encode(&b, CKPT_ECORRUPT, "a client that says ckptd is broken");
		send_buf(c, types[i], &b);
		char want[64];
		snprintf(want, sizeof want, "unexpected message type %u", types[i]);
		expect_error(c, CKPT_EPROTO, want);
	}
	after_attack();
}
END_TEST

/* Every prefix of a valid message, and the message with a byte too many: each is
 * answered ERROR (CKPT_EPROTO) naming the message. */
static void truncations(uint16_t type, const struct ckpt_buf *valid, const char *needle,
                        bool in_stream)
{
	for (size_t k = 0; k <= valid->len + 1; k++) {
		if (k == valid->len)
			continue;
		uint8_t *p = malloc(valid->len + 1);
		memcpy(p, valid->p, valid->len);
		p[valid->len] = 0;
		struct net_conn *c = conn_a();
		if (in_stream)
			start_stream(c, 7, 8192);
		send_msg(c, type, p, k);
		free(p);
		expect_error(c, CKPT_EPROTO, needle);
	}
}

START_TEST(truncated_messages)
{
	struct ckpt_buf b;
	struct remote_instance in = { "127.0.0.1", 0 };
	in.port = port;
	ckpt_buf_init(&b);
	ck_assert_int_eq(remote_coord_encode(&b, 1, &in, 1, NULL, 0), 0);
	truncations(REMOTE_MSG_COORD, &b, "COORD message", false);
	ckpt_buf_free(&b);
	ckpt_buf_init(&b);
	remote_open_encode(&b, &(struct remote_open){ .step = 7, .save_id = 1,
	                   .block_bytes = 1u << 20, .chunk_bytes = 65536 });
	truncations(REMOTE_MSG_OPEN, &b, "OPEN message", false);
	ckpt_buf_free(&b);
	tensor_msg(&b, "w", 8192);
	truncations(REMOTE_MSG_TENSOR, &b, "TENSOR message", false);
	ckpt_buf_free(&b);
	chunk_msg(&b, 0, 4096);
	truncations(REMOTE_MSG_CHUNK, &b, "CHUNK message", true);
	ckpt_buf_free(&b);
	chunk_msg(&b, 0, 3u << 20);         /* with block hashes */
	truncations(REMOTE_MSG_CHUNK, &b, "CHUNK message", true);
	ckpt_buf_free(&b);
	read_msg(&b, b_rel, 0, 16);
	truncations(REMOTE_MSG_READ, &b, "READ message", false);
	ckpt_buf_free(&b);
	struct remote_check k = { .file_size = 8192, .footer_off = 4096, .footer_len = 100 };
	snprintf(k.path, sizeof k.path, "%s", b_rel);
	ckpt_buf_init(&b);
	remote_check_encode(&b, &k);
	truncations(REMOTE_MSG_CHECK, &b, "CHECK message", false);
	ckpt_buf_free(&b);
	ckpt_buf_init(&b);
	remote_remove_encode(&b, 7, 1);
	truncations(REMOTE_MSG_REMOVE, &b, "REMOVE message", false);
	ckpt_buf_free(&b);
	/* A REMOVE of save id 0 would name every attempt of the step. */
	struct net_conn *c = conn_a();
	ckpt_buf_init(&b);
	remote_remove_encode(&b, 7, 0);
	send_buf(c, REMOTE_MSG_REMOVE, &b);
	expect_error(c, CKPT_EPROTO, "REMOVE message: bad or truncated step or save id");
	/* The requests without a payload, with one. */
	static const struct { uint16_t type; const char *name; } empty[] = {
		{ REMOTE_MSG_FINISH, "FINISH message" }, { REMOTE_MSG_ABORT, "ABORT message" },
		{ REMOTE_MSG_MANIFEST, "MANIFEST message" },
	};
	for (size_t i = 0; i < sizeof empty / sizeof empty[0]; i++) {
		c = conn_a();
		send_msg(c, empty[i].type, "x", 1);
		expect_error(c, CKPT_EPROTO, empty[i].name);
	}
	after_attack();
}
END_TEST

/* ------------------------------------------------------------------ the format a stream asks for */

/* A one-chunk stream of job A at step, its OPEN with flags; what OPEN_OK's flags say,
 * and the format version in the header of the file ckptd wrote. */
static uint32_t stream_with_flags(uint64_t step, uint32_t flags, uint32_t *version)
{
	struct net_conn *c = conn_a();
	uint32_t got = open_with_flags(c, step, flags);
	finish_small_shard(c, 0x3c);
	char root[4400], path[4400];
	snprintf(root, sizeof root, "%s/jobs/joba", data_dir);
	ck_assert_int_eq(tu_shard_path(root, step, 0, path, sizeof path), 0);
	void *f;
	size_t n;
	ck_assert_int_eq(tu_read_file(path, &f, &n), 0);
	ck_assert_uint_ge(n, 12);
	*version = ckpt_get_le32((uint8_t *)f + 8);
	free(f);
	return got;
}

/* A rank of this build asks for format 5 (its chunk hashes are trees) and ckptd says
 * so back and writes a file of that version; a rank from before asks for nothing and
 * gets the file it expects (format 3); a flag ckptd does not know is refused, and so
 * are the direct path and hashes after the bytes together. */
START_TEST(open_flags_name_the_format)
{
	uint32_t v;
	ck_assert_uint_eq(stream_with_flags(31, REMOTE_OPEN_TREE, &v), REMOTE_OPEN_TREE);
	ck_assert_uint_eq(v, 5);
	ck_assert_uint_eq(stream_with_flags(32, 0, &v), 0);
	ck_assert_uint_eq(v, 3);
	struct net_conn *c = conn_a();
	struct ckpt_buf b;
	ckpt_buf_init(&b);
	remote_open_encode(&b, &(struct remote_open){ .step = 33, .save_id = STREAM_SID,
	                   .block_bytes = 1u << 20, .chunk_bytes = 65536, .flags = 8 });
	send_buf(c, REMOTE_MSG_OPEN, &b);
	expect_error(c, CKPT_EPROTO, "OPEN message");
	c = conn_a();
	ckpt_buf_init(&b);
	remote_open_encode(&b, &(struct remote_open){ .step = 33, .save_id = STREAM_SID,
	                   .block_bytes = 1u << 20, .chunk_bytes = 65536,
	                   .flags = REMOTE_OPEN_DIRECT | REMOTE_OPEN_AFTER });
	send_buf(c, REMOTE_MSG_OPEN, &b);
	expect_error(c, CKPT_EPROTO, "OPEN asks for the direct path and for hashes after the "
	             "bytes");
	after_attack();
}
END_TEST

/* ------------------------------------------------------------------ hashes after the bytes */

enum { AFTER_BLOCK = 1u << 20, AFTER_LEN = (1u << 20) + 4096 };   /* a chunk of 2 blocks */

/* A stream of job A at step that asks for hashes after the bytes (and trees), its
 * tensor "w" of AFTER_LEN bytes declared; data gets the chunk's bytes and h its
 * hashes, as the test computes them. */
static struct net_conn *after_stream(uint64_t step, uint8_t *data, uint8_t *h, uint8_t *blocks)
{
	struct net_conn *c = conn_a();
	ck_assert_uint_eq(open_with_flags(c, step, REMOTE_OPEN_TREE | REMOTE_OPEN_AFTER),
	                  REMOTE_OPEN_TREE | REMOTE_OPEN_AFTER);
	struct ckpt_buf b;
	tensor_msg(&b, "w", AFTER_LEN);
	send_buf(c, REMOTE_MSG_TENSOR, &b);
	for (size_t i = 0; i < AFTER_LEN; i++)
		data[i] = (uint8_t)(i * 7 + step);
	io_copy_hash128_blocks(NULL, data, AFTER_LEN, AFTER_BLOCK, true, h, blocks);
	return c;
}

static void send_after_chunk(struct net_conn *c, uint64_t len)
{
	struct remote_chunk ch = { .codec = IO_CODEC_RAW, .raw_len = len, .stored_len = len,
	                           .block_bytes = AFTER_BLOCK,
	                           .nblocks = (uint32_t)io_nblocks(len, AFTER_BLOCK) };
	struct ckpt_buf b;
	ckpt_buf_init(&b);
	remote_chunk_encode(&b, &ch, true);
	send_buf(c, REMOTE_MSG_CHUNK, &b);
}

static void send_hashes(struct net_conn *c, const uint8_t *h, const uint8_t *blocks,
                        uint32_t nblocks)
{
	struct ckpt_buf b;
	ckpt_buf_init(&b);
	remote_hashes_encode(&b, h, blocks, nblocks);
	send_buf(c, REMOTE_MSG_HASHES, &b);
}

/* FINISH of a one-chunk stream of job A at step: the file ckptd wrote is of format 5
 * and holds the chunk's hashes, h and blocks (2), beside its bytes, data. */
static void finish_after_file(struct net_conn *c, uint64_t step, const uint8_t *data,
                              const uint8_t *h, const uint8_t *blocks)
{
	send_msg(c, REMOTE_MSG_FINISH, NULL, 0);
	struct net_msg m;
	expect_answer(c, REMOTE_MSG_DURABLE, &m);
	net_msg_free(&m);
	net_close(c);
	char root[4400], path[4400];
	snprintf(root, sizeof root, "%s/jobs/joba", data_dir);
	ck_assert_int_eq(tu_shard_path(root, step, 0, path, sizeof path), 0);
	struct io_engine *e;
	ck_assert_int_eq(io_engine_create(NULL, 4, &e), 0);
	struct io_shard_reader *r;
	ck_assert_msg(io_shard_reader_open(e, path, NULL, &r) == 0, "%s", ckpt_err_msg());
	const struct io_shard_index *ix = io_shard_reader_index(r);
	ck_assert(ix->tree);
	ck_assert_uint_eq(ix->nchunks, 1);
	ck_assert_mem_eq(ix->chunks[0].hash, h, CKPT_HASH_BYTES);
	const uint8_t *got;
	ck_assert_int_eq(io_shard_reader_chunk_blocks(r, 0, &got), 0);
	ck_assert_mem_eq(got, blocks, 2 * CKPT_HASH_BYTES);
	uint64_t at = ix->chunks[0].file_offset;
	io_shard_reader_close(r);
	io_engine_destroy(e);
	void *f;
	size_t n;
	ck_assert_int_eq(tu_read_file(path, &f, &n), 0);
	ck_assert_uint_ge(n, at + AFTER_LEN);
	ck_assert_mem_eq((uint8_t *)f + at, data, AFTER_LEN);
	free(f);
}

/* A stream whose CHUNKs carry no hashes sends each chunk's after its bytes, in
 * HASHES: the file ckptd writes records them (format 5) beside the bytes sent. A
 * HASHES out of its place, or of the wrong length, and any message of the stream
 * while a chunk's HASHES are owed, are refused; a chunk whose HASHES never come is
 * never written, and its pool buffer comes back (after_attack). A rank from before,
 * whose CHUNKs carry the hashes, gets the same file. */
START_TEST(hashes_after_the_bytes)
{
	static uint8_t data[AFTER_LEN], blocks[2 * CKPT_HASH_BYTES];
	uint8_t h[CKPT_HASH_BYTES];
	struct net_conn *c = after_stream(41, data, h, blocks);
	send_after_chunk(c, AFTER_LEN);
	send_msg(c, REMOTE_MSG_DATA, data, AFTER_LEN);
	send_hashes(c, h, blocks, 2);
	finish_after_file(c, 41, data, h, blocks);
	/* The same chunk with its hashes in its CHUNK, as a rank from before sends it. */
	c = conn_a();
	ck_assert_uint_eq(open_with_flags(c, 40, REMOTE_OPEN_TREE), REMOTE_OPEN_TREE);
	struct ckpt_buf b;
	tensor_msg(&b, "w", AFTER_LEN);
	send_buf(c, REMOTE_MSG_TENSOR, &b);
	struct remote_chunk ch = { .codec = IO_CODEC_RAW, .raw_len = AFTER_LEN,
	                           .stored_len = AFTER_LEN, .block_bytes = AFTER_BLOCK,
	                           .nblocks = 2, .blocks = blocks };
	memcpy(ch.hash, h, CKPT_HASH_BYTES);
	ckpt_buf_init(&b);
	remote_chunk_encode(&b, &ch, false);
	send_buf(c, REMOTE_MSG_CHUNK, &b);
	send_msg(c, REMOTE_MSG_DATA, data, AFTER_LEN);
	finish_after_file(c, 40, data, h, blocks);

	/* Out of place: outside a stream, on a stream that did not ask, before DATA. */
	c = conn_a();
	send_hashes(c, h, blocks, 2);
	expect_error(c, CKPT_EPROTO, "HASHES outside a shard stream");
	c = conn_a();
	start_stream(c, 42, 8192);
	send_chunk(c, 0, 8192);
	send_data(c, 8192, 1);
	send_hashes(c, h, NULL, 0);
	expect_error(c, CKPT_EPROTO, "HASHES on a stream that sends hashes in its CHUNKs");
	c = after_stream(43, data, h, blocks);
	send_after_chunk(c, AFTER_LEN);
	send_hashes(c, h, blocks, 2);
	expect_error(c, CKPT_EPROTO, "HASHES before the chunk's DATA");
	c = after_stream(44, data, h, blocks);
	send_hashes(c, h, blocks, 2);
	expect_error(c, CKPT_EPROTO, "HASHES where no chunk's bytes came before them");
	/* The wrong count of block hashes. */
	c = after_stream(45, data, h, blocks);
	send_after_chunk(c, AFTER_LEN);
	send_msg(c, REMOTE_MSG_DATA, data, AFTER_LEN);
	send_hashes(c, h, blocks, 1);
	expect_error(c, CKPT_EPROTO, "malformed HASHES message: 32 bytes where the CHUNK before "
	             "it announced 2 block hashes (48 bytes)");
	/* A CHUNK in the other form (hashes and all) reads as a malformed one. */
	c = after_stream(46, data, h, blocks);
	send_chunk(c, 0, AFTER_LEN);
	expect_error(c, CKPT_EPROTO, "CHUNK message");
	/* Owed: each message of the stream but HASHES is refused until they come. */
	static const struct { uint16_t type; const char *msg; } owed[] = {
		{ REMOTE_MSG_CHUNK, "CHUNK before the last chunk's HASHES" },
		{ REMOTE_MSG_DATA, "DATA of 0 bytes before the last chunk's HASHES" },
		{ REMOTE_MSG_TENSOR, "TENSOR before the last chunk's HASHES" },
		{ REMOTE_MSG_FINISH, "FINISH before the last chunk's HASHES" },
	};
	for (size_t i = 0; i < CKPT_ARRAY_SIZE(owed); i++) {
		c = after_stream(47 + i, data, h, blocks);
		send_after_chunk(c, AFTER_LEN);
		send_msg(c, REMOTE_MSG_DATA, data, AFTER_LEN);
		switch (owed[i].type) {
		case REMOTE_MSG_CHUNK: send_after_chunk(c, 4096); break;
		case REMOTE_MSG_DATA: send_data(c, 0, 2); break;
		case REMOTE_MSG_TENSOR:
			tensor_msg(&b, "v", 4096);
			send_buf(c, REMOTE_MSG_TENSOR, &b);
			break;
		default: send_msg(c, owed[i].type, NULL, 0);
		}
		expect_error(c, CKPT_EPROTO, owed[i].msg);
	}
	/* A DATA with bytes is refused before they are read: the connection ends. */
	c = after_stream(51, data, h, blocks);
	send_after_chunk(c, AFTER_LEN);
	send_msg(c, REMOTE_MSG_DATA, data, AFTER_LEN);
	send_data(c, 4096, 2);
	expect_closed(c, "DATA of 4096 bytes before the last chunk's HASHES");
	/* Bytes whose HASHES never come: the stream aborted, or the rank gone. */
	c = after_stream(52, data, h, blocks);
	send_after_chunk(c, AFTER_LEN);
	send_msg(c, REMOTE_MSG_DATA, data, AFTER_LEN);
	send_msg(c, REMOTE_MSG_ABORT, NULL, 0);
	net_close(c);
	c = after_stream(53, data, h, blocks);
	send_after_chunk(c, AFTER_LEN);
	send_msg(c, REMOTE_MSG_DATA, data, AFTER_LEN);
	net_close(c);
	after_attack();
}
END_TEST

/* ------------------------------------------------------------------ one job, another's files */

START_TEST(namespace)
{
	uint32_t rank;
	uint64_t b_sid;
	ck_assert(ckpt_path_parse_shard(strchr(b_rel, '/') + 1, &rank, &b_sid));
	/* Job A has no manifest yet: it gets none, and never B's. */
	struct net_conn *c = conn_a();
	send_msg(c, REMOTE_MSG_MANIFEST, NULL, 0);
	expect_error(c, CKPT_ENOTFOUND, "job 'joba' has no manifest on this ckptd");
	/* A writes its own shard under the very name B's file has: it lands in A's root. */
	c = conn_a();
	send_one_chunk_shard(c, 1, b_sid, 8192, 0xa5);
	send_msg(c, REMOTE_MSG_FINISH, NULL, 0);
	struct net_msg m;
	expect_answer(c, REMOTE_MSG_DURABLE, &m);
	net_msg_free(&m);
	/* What A reads under that name is A's. */
	struct ckpt_buf b;
	read_msg(&b, b_rel, 4096, 8192);
	send_buf(c, REMOTE_MSG_READ, &b);
	expect_answer(c, REMOTE_MSG_DATA, &m);
	ck_assert_uint_eq(m.len, 8192);
	for (size_t i = 0; i < m.len; i++)
		ck_assert_uint_eq(((uint8_t *)m.payload)[i], 0xa5);
	net_msg_free(&m);
	net_close(c);
	char apath[4400];
	snprintf(apath, sizeof apath, "%s/jobs/joba/%s", data_dir, b_rel);
	struct stat st;
	ck_assert_msg(stat(apath, &st) == 0, "A's shard is not in A's root: %s", apath);
	/* A REMOVE of that attempt removes A's file, never B's (after_attack compares B's
	 * files with what B saved). */
	c = conn_a();
	ckpt_buf_init(&b);
	remote_remove_encode(&b, 1, b_sid);
	send_buf(c, REMOTE_MSG_REMOVE, &b);
	expect_answer(c, REMOTE_MSG_REMOVE_OK, &m);
	net_msg_free(&m);
	net_close(c);
	ck_assert_msg(stat(apath, &st) < 0 && errno == ENOENT, "A's shard %s is still there", apath);
	char bpath[4400];
	snprintf(bpath, sizeof bpath, "%s/jobs/jobb/%s", data_dir, b_rel);
	ck_assert_msg(stat(bpath, &st) == 0, "B's shard %s is gone", bpath);
	/* A's manifest, once it has one, holds nothing of B's. */
	honest_save("joba", SECRET_A, 60);
	c = conn_a();
	send_msg(c, REMOTE_MSG_MANIFEST, NULL, 0);
	net_conn_set_max_msg(c, REMOTE_MAX_MANIFEST);
	expect_answer(c, REMOTE_MSG_MANIFEST_OK, &m);
	char copy[4400];
	snprintf(copy, sizeof copy, "%s/copy", top);
	ck_assert_int_eq(mkdir(copy, 0700), 0);
	snprintf(copy, sizeof copy, "%s/copy/manifest", top);
	ck_assert_int_eq(mkdir(copy, 0700), 0);
	snprintf(copy, sizeof copy, "%s/copy/manifest/data.mdb", top);
	ck_assert_int_eq(tu_write_file(copy, m.payload, m.len), 0);
	net_msg_free(&m);
	net_close(c);
	snprintf(copy, sizeof copy, "%s/copy", top);
	struct manifest *man;
	ck_assert_msg(manifest_open(copy, MANIFEST_RDONLY, &man) == 0, "%s", ckpt_err_msg());
	uint64_t steps[8];
	int n = manifest_steps_list(man, true, steps, 8);
	manifest_close(man);
	ck_assert_msg(n == 1 && steps[0] == 60, "job A's manifest lists %d steps (%llu): not A's", n,
	              n > 0 ? (unsigned long long)steps[0] : 0ull);
	tu_rmtree(copy);
	after_attack();
}
END_TEST

/* ------------------------------------------------------------------ an attempt given up */

/* The shard files of job A's attempt sid of step, here. */
static unsigned attempt_files(uint64_t step, uint64_t sid)
{
	char dir[4400];
	snprintf(dir, sizeof dir, "%s/jobs/joba/step-%020llu", data_dir, (unsigned long long)step);
	DIR *d = opendir(dir);
	unsigned n = 0;
	struct dirent *e;
	while (d && (e = readdir(d))) {
		uint32_t r;
		uint64_t id;
		n += ckpt_path_parse_shard(e->d_name, &r, &id) && id == sid;
	}
	if (d)
		closedir(d);
	return n;
}

static void remove_attempt(uint64_t step, uint64_t sid)
{
	struct net_conn *c = conn_a();
	struct ckpt_buf b;
	ckpt_buf_init(&b);
	remote_remove_encode(&b, step, sid);
	send_buf(c, REMOTE_MSG_REMOVE, &b);
	struct net_msg m;
	expect_answer(c, REMOTE_MSG_REMOVE_OK, &m);
	net_msg_free(&m);
	net_close(c);
}

START_TEST(given_up_attempt)
{
	/* The removal comes while a rank's shard streams (the rank has not heard of the
	 * decision): FINISH is refused, and no file of the attempt stays. */
	struct net_conn *c = conn_a();
	send_one_chunk_shard(c, 8, 5, 8192, 0x5a);
	remove_attempt(8, 5);
	send_msg(c, REMOTE_MSG_FINISH, NULL, 0);
	expect_error(c, CKPT_EABORTED, "attempt 0000000000000005 was given up");
	ck_assert_uint_eq(attempt_files(8, 5), 0);
	/* The removal comes before the rank's OPEN (the rank began before the decision
	 * and opened its stream after the removal): the OPEN is refused, and the file it
	 * would have made is not left behind. */
	remove_attempt(9, 6);
	c = conn_a();
	send_open(c, 9, 6, 1u << 20, 0);
	expect_error(c, CKPT_EABORTED, "step 9: attempt 0000000000000006 was given up");
	ck_assert_uint_eq(attempt_files(9, 6), 0);
	/* A new attempt of that step is taken. */
	c = conn_a();
	send_one_chunk_shard(c, 9, 7, 8192, 0x5a);
	send_msg(c, REMOTE_MSG_FINISH, NULL, 0);
	struct net_msg m;
	expect_answer(c, REMOTE_MSG_DURABLE, &m);
	net_msg_free(&m);
	net_close(c);
	ck_assert_uint_eq(attempt_files(9, 7), 1);
	after_attack();
}
END_TEST

START_TEST(removal_beside_an_open)
{
	/* A removal comes while a rank's OPEN has made the step directory and not yet
	 * its file (held there by a delay fault). The removal of another attempt of the
	 * step leaves the directory to the OPEN, whose stream then completes ... */
	setenv("CKPT_FAULT", "after_step_dir:1:delay:1000", 1);
	ckpt_fault_reload();
	struct net_conn *c = conn_a();
	send_open(c, 10, 8, 1u << 20, 0);
	usleep(300 * 1000);
	remove_attempt(10, 7);
	struct net_msg m;
	expect_answer(c, REMOTE_MSG_OPEN_OK, &m);
	net_msg_free(&m);
	finish_small_shard(c, 0x5a);
	ck_assert_uint_eq(attempt_files(10, 8), 1);
	/* ... and the removal of the OPEN's own attempt refuses it as given up (not as a
	 * directory that went missing), and no file of it stays. */
	ckpt_fault_reload();
	c = conn_a();
	send_open(c, 11, 9, 1u << 20, 0);
	usleep(300 * 1000);
	remove_attempt(11, 9);
	expect_error(c, CKPT_EABORTED, "step 11: attempt 0000000000000009 was given up");
	ck_assert_uint_eq(attempt_files(11, 9), 0);
	unsetenv("CKPT_FAULT");
	ckpt_fault_reload();
	after_attack();
}
END_TEST

/* ------------------------------------------------------------------ bounds per connection */

START_TEST(index_bounded)
{
	/* Tensors without end in one stream: the index it builds is held to MAX_INDEX,
	 * then the stream is refused. */
	struct net_conn *c = conn_a();
	start_stream(c, 900, 4096);
	char name[128];
	unsigned n = MAX_INDEX / 100 + 16;
	int rc = 0;
	for (unsigned i = 0; i < n && !rc; i++) {
		snprintf(name, sizeof name, "t/%0100u", i);
		struct ckpt_buf b;
		tensor_msg(&b, name, 4096);
		/* ckptd may have refused and closed already: the sends then fail. */
		rc = net_send(c, REMOTE_MSG_TENSOR, b.p, b.len, WAIT_MS);
		ckpt_buf_free(&b);
	}
	expect_error(c, -EMSGSIZE, "--max-index");
	after_attack();
}
END_TEST

START_TEST(idle_closed_and_rank_reconnects)
{
	/* A connection without a stream is closed once idle past IDLE_MS ... */
	struct net_conn *idle = conn_a();
	usleep((IDLE_MS + 1500) * 1000u);
	expect_closed(idle, "idle for");
	/* ... and a rank whose connection was closed so connects again at its next save. */
	ckpt_ctx *c = honest_open("joba", SECRET_A, 0);
	honest_save_with(c, "joba", 40);
	usleep((IDLE_MS + 1500) * 1000u);
	honest_save_with(c, "joba", 41);
	ckpt_close(c);
	honest_load("joba", SECRET_A, 40);
	honest_load("joba", SECRET_A, 41);
	after_attack();
}
END_TEST

/* ------------------------------------------------------------------ the pool */

START_TEST(pool_not_leaked)
{
	/* Streams that die inside a DATA (its buffer taken), after whole chunks (their
	 * writes in flight), at a chunk the writer refuses, at a quota: twice as many
	 * as the pool has buffers, each kind. */
	for (unsigned i = 0; i < 2 * NBUFS; i++) {
		/* A step each: a stream the peer dropped may still be aborting its file. */
		uint64_t step = 1000 + 10 * i;
		struct net_conn *c = conn_a();
		start_stream(c, step, 1u << 20);
		send_chunk(c, 0, 65536);
		send_header(c, REMOTE_MSG_DATA, 65536);
		uint8_t part[100] = { 0 };
		raw_write(net_conn_fd(c), part, sizeof part);
		net_close(c);

		c = conn_a();
		start_stream(c, step + 1, 1u << 20);
		for (unsigned k = 0; k < 3; k++) {
			send_chunk(c, 0, 65536);
			send_data(c, 65536, (uint8_t)k);
		}
		net_close(c);

		c = conn_a();
		start_stream(c, step + 2, 8192);
		send_chunk(c, 3, 4096);
		send_data(c, 4096, 0);
		expect_error(c, -EINVAL, "append to tensor 3");

		c = conn_as("jobq", SECRET_Q, 1);
		start_stream(c, 7, 2u << 20);
		send_chunk(c, 0, (1u << 20) + 4096);
		send_data(c, (1u << 20) + 4096, 0);
		expect_error(c, -EDQUOT, "quota of 1048576 bytes exceeded while rank 0 wrote step 7");
	}
	wait_idle();
	/* Streams that stall inside a DATA hold every buffer until ckptd gives up on
	 * them (its timeout); then the buffers are back. */
	struct net_conn *held[NBUFS];
	for (unsigned i = 0; i < NBUFS; i++) {
		held[i] = conn_a();
		start_stream(held[i], 2000 + i, 1u << 20);
		send_chunk(held[i], 0, 65536);
		send_header(held[i], REMOTE_MSG_DATA, 65536);
	}
	struct ckptd_gauges g = { 0 };
	for (int i = 0; i < 500 && g.pool_used_bytes < (uint64_t)NBUFS * BUF_BYTES; i++) {
		usleep(10000);
		ckptd_server_gauges(srv, &g);
	}
	ck_assert_uint_eq(g.pool_used_bytes, (uint64_t)NBUFS * BUF_BYTES);
	for (unsigned i = 0; i < NBUFS; i++)
		expect_error(held[i], -ETIMEDOUT, "shard stream idle for 2000 ms");
	after_attack();
}
END_TEST

/* ckptd_queue_depth counts chunks received and not yet written: three chunks of a
 * stream that then waits for its rank are written within moments, and the gauge
 * says 0 while the stream is still open (it counted them until the stream ended). */
START_TEST(queue_depth_follows_writes)
{
	uint64_t before = atomic_load(&counters.bytes_received);
	struct net_conn *c = conn_a();
	start_stream(c, 3000, 1u << 20);
	for (unsigned k = 0; k < 3; k++) {
		send_chunk(c, 0, 65536);
		send_data(c, 65536, (uint8_t)k);
	}
	/* Received: the stream's bytes show, then the writes go out. */
	int64_t q = -1;
	for (int i = 0; i < 150 && atomic_load(&counters.bytes_received) < before + 3 * 65536; i++)
		usleep(10000);
	ck_assert_uint_eq(atomic_load(&counters.bytes_received), before + 3 * 65536);
	for (int i = 0; i < 150 && (q = atomic_load(&counters.queue_depth)) != 0; i++)
		usleep(10000);
	ck_assert_int_eq(q, 0);
	ck_assert(!log_has("shard stream idle"));   /* still open */
	net_close(c);
	after_attack();
	ck_assert_int_eq(atomic_load(&counters.queue_depth), 0);
}
END_TEST

/* A stop with a stream stalled inside a DATA: the stream is aborted after its grace
 * and its buffer is back before the pool goes. */
START_TEST(stop_while_stalled)
{
	struct net_conn *c = conn_a();
	start_stream(c, 7, 1u << 20);
	send_chunk(c, 0, 65536);
	send_header(c, REMOTE_MSG_DATA, 65536);
	struct ckptd_gauges g = { 0 };
	for (int i = 0; i < 500 && !g.pool_used_bytes; i++) {
		usleep(10000);
		ckptd_server_gauges(srv, &g);
	}
	ck_assert_uint_eq(g.pool_used_bytes, BUF_BYTES);
	ckptd_server_stop(srv, 0);
	pthread_join(runner, NULL);
	ckptd_server_free(srv);
	srv = NULL;
	ck_assert_msg(!log_has("buffers still out"), "a buffer was lost at the stop");
	char path[4400];
	snprintf(path, sizeof path, "%s/jobs/joba/step-00000000000000000007", data_dir);
	ck_assert_int_eq(tu_count_files(path), 0);
	net_close(c);
}
END_TEST

/* A state 32 times the rank's pool, saved through ckptd over tcp: all but its tail is
 * sent from the tensor where it lies (lib/save.c, save_direct), so the snapshot point
 * must wait for those sends. The tensor is overwritten the moment the snapshot point
 * comes: what was committed is what was there before, bit for bit (were the caller
 * released before the last send, ckptd would get overwritten bytes whose hashes do
 * not match, or the load would find them). */
enum { BIG_N = 8u << 20 };                      /* floats: 32 MiB */

/* A save of step: one tensor "big" of BIG_N floats at w, submitted. */
static ckpt_save *big_save(ckpt_ctx *c, uint64_t step, const float *w)
{
	ckpt_save *s;
	ck_assert_msg(ckpt_save_begin(c, step, &s) == 0, "%s", ckpt_last_error());
	uint64_t shape[1] = { BIG_N };
	struct ckpt_tensor t = { .name = "big", .kind = CKPT_KIND_MODEL, .dtype = CKPT_F32,
	                         .policy = CKPT_SHARDED, .ndim = 1, .global_shape = shape,
	                         .data = w };
	ck_assert_int_eq(ckpt_save_add_tensor(s, &t), 0);
	ck_assert_int_eq(ckpt_save_submit(s), 0);
	return s;
}

/* A save of step from w (which holds want's bytes), w overwritten the moment the
 * snapshot point comes, committed, and loaded back into got: want's bytes. */
static void big_save_overwritten(ckpt_ctx *c, uint64_t step, float *w, const float *want,
                                 float *got)
{
	ckpt_save *s = big_save(c, step, w);
	ck_assert_msg(ckpt_save_wait_snapshot(s, -1) == 0, "%s", ckpt_last_error());
	memset(w, 0xa5, BIG_N * sizeof *w);
	ck_assert_msg(ckpt_save_wait(s, -1) == 0, "step %llu: %s", (unsigned long long)step,
	              ckpt_last_error());
	ckpt_save_free(s);
	ckpt_load *l;
	ck_assert_msg(ckpt_load_open(c, step, &l) == 0, "%s", ckpt_last_error());
	memset(got, 0, BIG_N * sizeof *got);
	ck_assert_msg(ckpt_load_tensor(l, "big", CKPT_F32, 1, NULL, NULL, got,
	                               CKPT_MEM_HOST) == 0, "%s", ckpt_last_error());
	ck_assert_msg(memcmp(got, want, BIG_N * sizeof *w) == 0, "step %llu: the committed "
	              "tensor holds bytes written after the snapshot point",
	              (unsigned long long)step);
	ckpt_load_close(l);
}

START_TEST(direct_save_releases_after_sends)
{
	enum { N = BIG_N };
	float *w = malloc(N * sizeof *w), *want = malloc(N * sizeof *w);
	float *got = malloc(N * sizeof *w);
	ck_assert(w && want && got);
	tu_fill(want, N * sizeof *w, tu_seed(), 77);
	ckpt_ctx *c = honest_open("joba", SECRET_A, 0);
	for (uint64_t step = 200; step < 203; step++) {
		memcpy(w, want, N * sizeof *w);
		w[step] = (float)step;                  /* each step its own bytes */
		want[step] = (float)step;
		big_save_overwritten(c, step, w, want, got);
	}
	/* ckptd's disk fails in the middle of a direct save: the save fails with the
	 * disk's error, the caller is released (wait_snapshot returns), the step is not
	 * there, and the next save goes through. */
	setenv("CKPT_FAULT", "after_chunk_write:40:eio", 1);
	ckpt_fault_reload();
	ckpt_save *s = big_save(c, 210, w);
	(void)ckpt_save_wait_snapshot(s, WAIT_MS);
	int rc = ckpt_save_wait(s, WAIT_MS);
	ck_assert_msg(rc == -EIO, "a save whose chunks ckptd failed to write: %d (%s)", rc,
	              ckpt_last_error());
	ckpt_save_free(s);
	unsetenv("CKPT_FAULT");
	ckpt_fault_reload();
	ckpt_load *l;
	ck_assert_int_ne(ckpt_load_open(c, 210, &l), 0);
	ckpt_close(c);
	free(w);
	free(want);
	free(got);
	after_attack();
}
END_TEST

/* Loads of one step on another thread of the same context while direct saves of the
 * next steps run: the loads read into the context's pool, so a save that starts
 * while a load holds a buffer goes without its tail's region. Each save and each
 * load is bit for bit what it must be (a save that took the region beside a load's
 * buffer overwrote the load's bytes: checked). */
struct beside_load {
	ckpt_ctx   *c;
	const float *want;
	atomic_bool stop;
	unsigned    loads;
	char        err[512];
};

static void *loader(void *arg)
{
	struct beside_load *b = arg;
	float *got = malloc(BIG_N * sizeof *got);
	while (got && !atomic_load(&b->stop) && !b->err[0]) {
		ckpt_load *l;
		if (ckpt_load_open(b->c, 240, &l) != 0) {
			snprintf(b->err, sizeof b->err, "open: %s", ckpt_last_error());
			break;
		}
		memset(got, 0, BIG_N * sizeof *got);
		if (ckpt_load_tensor(l, "big", CKPT_F32, 1, NULL, NULL, got, CKPT_MEM_HOST) != 0)
			snprintf(b->err, sizeof b->err, "load: %s", ckpt_last_error());
		else if (memcmp(got, b->want, BIG_N * sizeof *got))
			snprintf(b->err, sizeof b->err, "load %u: other bytes", b->loads);
		ckpt_load_close(l);
		b->loads++;
	}
	free(got);
	return NULL;
}

START_TEST(direct_saves_beside_loads)
{
	float *w = malloc(BIG_N * sizeof *w), *first = malloc(BIG_N * sizeof *w);
	float *want = malloc(BIG_N * sizeof *w), *got = malloc(BIG_N * sizeof *w);
	ck_assert(w && first && want && got);
	tu_fill(first, BIG_N * sizeof *w, tu_seed(), 91);
	ckpt_ctx *c = honest_open("joba", SECRET_A, 0);
	memcpy(w, first, BIG_N * sizeof *w);
	ckpt_save *s = big_save(c, 240, w);
	ck_assert_msg(ckpt_save_wait(s, -1) == 0, "%s", ckpt_last_error());
	ckpt_save_free(s);
	struct beside_load b = { .c = c, .want = first };
	atomic_init(&b.stop, false);
	pthread_t th;
	ck_assert_int_eq(pthread_create(&th, NULL, loader, &b), 0);
	for (uint64_t step = 241; step < 245; step++) {
		tu_fill(want, BIG_N * sizeof *w, tu_seed(), 91 + (unsigned)step);
		memcpy(w, want, BIG_N * sizeof *w);
		big_save_overwritten(c, step, w, want, got);
	}
	atomic_store(&b.stop, true);
	pthread_join(th, NULL);
	ck_assert_msg(!b.err[0], "the load beside the saves: %s", b.err);
	ck_assert_uint_gt(b.loads, 0);
	ckpt_close(c);
	free(w);
	free(first);
	free(want);
	free(got);
	after_attack();
}
END_TEST

/* The tail of a direct save fills the pool whatever its classes and the state's
 * chunks: with chunks of 1 MiB and a pool of 16 MiB (twelve buffers of 1 MiB, and
 * of 512, 256, 128 and 64 KiB four each: 15.75 MiB), the tail is the state's last
 * chunks, each at the next multiple of 64 bytes of the pool taken whole, and a
 * first piece that fills what is left. The state is a large tensor, an odd-sized
 * one and a small blob; each is overwritten at the snapshot point and loaded back
 * bit for bit, and the shard's chunks show the tail: inside the large tensor one
 * regular chunk cut in two where the tail begins, and the chunks from that piece
 * on, padded, are the pool's bytes to the byte. (Given to the pool's buffers one
 * chunk each, the odd tensor's last piece held a 512 KiB buffer for 278 KiB.) */
enum { TAIL_CHUNK = 1u << 20, TAIL_POOL = 16u << 20 };

/* Step's shard in joba: its tail, from the large tensor's chunk cut where the tail
 * begins to the shard's last chunk, is the pool's bytes to the byte; or, region
 * false, there is no tail: every chunk of the large tensor is a regular one. */
static void check_tail(int step, bool region)
{
	char dir[4400], path[4700] = "";
	snprintf(dir, sizeof dir, "%s/jobs/joba/step-%020d", data_dir, step);
	DIR *dd = opendir(dir);
	ck_assert_msg(dd != NULL, "%s", dir);
	for (struct dirent *e; (e = readdir(dd));)
		if (strstr(e->d_name, ".shard"))
			snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
	closedir(dd);
	ck_assert_msg(path[0], "no shard in %s", dir);
	struct io_engine *e;
	ck_assert_int_eq(io_engine_create(NULL, 4, &e), 0);
	struct io_shard_reader *r;
	ck_assert_msg(io_shard_reader_open(e, path, NULL, &r) == 0, "%s", ckpt_err_msg());
	const struct io_shard_index *ix = io_shard_reader_index(r);
	int t = io_index_find(ix, "big");
	ck_assert_int_ge(t, 0);
	const struct io_tensor_entry *te = &ix->tensors[t];
	unsigned cut = 0;
	uint32_t piece = UINT32_MAX;
	for (uint32_t k = te->first_chunk; k < te->first_chunk + te->nchunks; k++) {
		const struct io_chunk_entry *ch = &ix->chunks[k];
		if (ch->raw_len == TAIL_CHUNK || ch->raw_offset + ch->raw_len == te->raw_bytes)
			continue;
		cut++;
		piece = k;                 /* the second of the two: the tail's first piece */
	}
	if (!region) {
		ck_assert_msg(cut == 0, "step %d: %u chunk(s) of the large tensor off the regular "
		              "grid in a save without a region", step, cut);
		io_shard_reader_close(r);
		io_engine_destroy(e);
		return;
	}
	ck_assert_msg(cut == 2 &&
	              ix->chunks[piece - 1].raw_len + ix->chunks[piece].raw_len == TAIL_CHUNK,
	              "step %d: %u chunk(s) of the large tensor off the regular grid", step, cut);
	/* From the piece to the shard's last chunk (the tensors' chunks follow one
	 * another in the order saved), each padded to 64 bytes. */
	uint64_t tail = 0;
	for (uint32_t k = piece; k < ix->nchunks; k++)
		tail += (ix->chunks[k].raw_len + 63) / 64 * 64;
	struct io_pool *pool;
	ck_assert_int_eq(io_pool_create_halving(TAIL_CHUNK, TAIL_POOL, NULL, &pool), 0);
	ck_assert_msg(tail == io_pool_bytes(pool), "step %d: the tail takes %llu bytes of the "
	              "pool's %llu", step, (unsigned long long)tail,
	              (unsigned long long)io_pool_bytes(pool));
	io_pool_destroy(pool);
	io_shard_reader_close(r);
	io_engine_destroy(e);
}

/* The state of direct_save_tail_fills_the_pool: a large tensor, an odd-sized one and
 * a small blob, and the bytes each must hold when loaded. */
enum { TAIL_NBIG = 10u << 20, TAIL_NODD = 333333, TAIL_NBLOB = 100 };  /* floats, floats, bytes */
struct tail_state {
	float  *big, *odd, *wbig, *wodd;
	uint8_t blob[TAIL_NBLOB], wblob[TAIL_NBLOB];
};

/* A save of step (the large tensor too where with_big), each tensor overwritten the
 * moment the snapshot point comes, and loaded back bit for bit. */
static void tail_save(ckpt_ctx *c, int step, bool with_big, struct tail_state *t)
{
	uint64_t shb[1] = { TAIL_NBIG }, sho[1] = { TAIL_NODD };
	struct ckpt_tensor tb = { .name = "big", .kind = CKPT_KIND_MODEL, .dtype = CKPT_F32,
	                          .policy = CKPT_SHARDED, .ndim = 1, .global_shape = shb,
	                          .data = t->big };
	struct ckpt_tensor to = { .name = "odd", .kind = CKPT_KIND_OPTIMIZER, .dtype = CKPT_F32,
	                          .policy = CKPT_SHARDED, .ndim = 1, .global_shape = sho,
	                          .data = t->odd };
	memcpy(t->big, t->wbig, TAIL_NBIG * sizeof *t->big);
	memcpy(t->odd, t->wodd, TAIL_NODD * sizeof *t->odd);
	memcpy(t->blob, t->wblob, TAIL_NBLOB);
	ckpt_save *s;
	ck_assert_int_eq(ckpt_save_begin(c, (uint64_t)step, &s), 0);
	if (with_big)
		ck_assert_int_eq(ckpt_save_add_tensor(s, &tb), 0);
	ck_assert_int_eq(ckpt_save_add_tensor(s, &to), 0);
	ck_assert_int_eq(ckpt_save_add_blob(s, "rng", CKPT_KIND_RNG, CKPT_RANK_BOUND, t->blob,
	                                    TAIL_NBLOB), 0);
	ck_assert_int_eq(ckpt_save_submit(s), 0);
	ck_assert_msg(ckpt_save_wait_snapshot(s, -1) == 0, "%s", ckpt_last_error());
	memset(t->big, 0xa5, TAIL_NBIG * sizeof *t->big);
	memset(t->odd, 0x5a, TAIL_NODD * sizeof *t->odd);
	memset(t->blob, 0x33, TAIL_NBLOB);
	ck_assert_msg(ckpt_save_wait(s, -1) == 0, "step %d: %s", step, ckpt_last_error());
	ckpt_save_free(s);
	ckpt_load *l;
	ck_assert_msg(ckpt_load_open(c, (uint64_t)step, &l) == 0, "%s", ckpt_last_error());
	if (with_big)
		ck_assert_msg(ckpt_load_tensor(l, "big", CKPT_F32, 1, NULL, NULL, t->big,
		                               CKPT_MEM_HOST) == 0, "%s", ckpt_last_error());
	ck_assert_msg(ckpt_load_tensor(l, "odd", CKPT_F32, 1, NULL, NULL, t->odd,
	                               CKPT_MEM_HOST) == 0, "%s", ckpt_last_error());
	size_t got = 0;
	ck_assert_msg(ckpt_load_blob(l, "rng", t->blob, TAIL_NBLOB, &got) == 0, "%s",
	              ckpt_last_error());
	ckpt_load_close(l);
	ck_assert_msg(!with_big || memcmp(t->big, t->wbig, TAIL_NBIG * sizeof *t->big) == 0,
	              "step %d: the large tensor", step);
	ck_assert_msg(memcmp(t->odd, t->wodd, TAIL_NODD * sizeof *t->odd) == 0,
	              "step %d: the odd tensor", step);
	ck_assert_msg(got == TAIL_NBLOB && memcmp(t->blob, t->wblob, TAIL_NBLOB) == 0,
	              "step %d: the blob", step);
}

START_TEST(direct_save_tail_fills_the_pool)
{
	struct tail_state t = {
		.big = malloc(TAIL_NBIG * sizeof *t.big), .odd = malloc(TAIL_NODD * sizeof *t.odd),
		.wbig = malloc(TAIL_NBIG * sizeof *t.big), .wodd = malloc(TAIL_NODD * sizeof *t.odd),
	};
	ck_assert(t.big && t.odd && t.wbig && t.wodd);
	tu_fill(t.wbig, TAIL_NBIG * sizeof *t.big, tu_seed(), 81);
	tu_fill(t.wodd, TAIL_NODD * sizeof *t.odd, tu_seed(), 82);
	tu_fill(t.wblob, TAIL_NBLOB, tu_seed(), 83);
	ckpt_ctx *c = honest_open_sized("joba", SECRET_A, 0, TAIL_CHUNK, TAIL_POOL);
	/* Two saves of one context: the second finds the whole pool back. */
	tail_save(c, 220, true, &t);
	tail_save(c, 221, true, &t);
	/* A buffer out (held here, as a load on another thread may): no region, every
	 * chunk of the larger state sent from the tensors and the snapshot point after
	 * the last send; the state that fits takes the buffers one chunk each. */
	int held = io_pool_get_fit(c->pool, 4096, 0);
	ck_assert_int_ge(held, 0);
	tail_save(c, 222, true, &t);
	tail_save(c, 223, false, &t);
	io_pool_put(c->pool, (unsigned)held);
	/* A state that fits the pool is the tail whole: copied before the snapshot
	 * point, every chunk of it. */
	tail_save(c, 224, false, &t);
	ckpt_close(c);
	check_tail(220, true);
	check_tail(221, true);
	check_tail(222, false);
	free(t.big);
	free(t.odd);
	free(t.wbig);
	free(t.wodd);
	after_attack();
}
END_TEST

/* ------------------------------------------------------------------ honest jobs meanwhile */

static atomic_bool attacking;

static void *attacker(void *arg)
{
	(void)arg;
	uint64_t s = tu_seed();
	uint8_t junk[256];
	while (atomic_load(&attacking)) {
		int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
		struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
		a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
		if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
			if (fd >= 0)
				close(fd);
			continue;
		}
		tu_fill(junk, sizeof junk, s, tu_rand(&s));
		if (tu_rand(&s) % 2)
			raw_header(junk, NET_PROTO_VERSION, (uint16_t)(tu_rand(&s) % 100),
			           (uint32_t)tu_rand(&s));
		raw_write(fd, junk, 1 + tu_rand(&s) % sizeof junk);
		close(fd);
		struct net_conn *c;
		if (net_connect(NET_TCP, NULL, "127.0.0.1", port, 1000, &c))
			continue;
		struct net_auth au = { .job_id = "joba", .world = 1, .secret = SECRET_A,
		                       .secret_len = strlen(SECRET_A) };
		if (!net_handshake_client(c, &au, WAIT_MS)) {
			tu_fill(junk, sizeof junk, s, tu_rand(&s));
			(void)net_send(c, (uint16_t)(REMOTE_MSG_COORD + tu_rand(&s) % 16), junk,
			               tu_rand(&s) % sizeof junk, 1000);
			struct net_msg m;
			if (!net_recv(c, &m, 1000))
				net_msg_free(&m);
		}
		net_close(c);
	}
	return NULL;
}

START_TEST(honest_under_fire)
{
	atomic_store(&attacking, true);
	pthread_t t[2];
	for (unsigned i = 0; i < 2; i++)
		ck_assert_int_eq(pthread_create(&t[i], NULL, attacker, NULL), 0);
	for (uint64_t step = 10; step < 13; step++) {
		honest_save("jobb", SECRET_B, step);
		honest_load("jobb", SECRET_B, step);
		honest_load("jobb", SECRET_B, 1);
	}
	atomic_store(&attacking, false);
	for (unsigned i = 0; i < 2; i++)
		pthread_join(t[i], NULL);
	after_attack();
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("ckptd_hostile");
	TCase *tc = tcase_create("attacks");
	tcase_add_checked_fixture(tc, hostile_setup, hostile_teardown);
	tcase_add_test(tc, garbage_before_handshake);
	tcase_add_test(tc, refused_jobs);
	tcase_add_test(tc, oversized_after_handshake);
	tcase_add_test(tc, data_mismatch);
	tcase_add_test(tc, data_empty);
	tcase_add_test(tc, chunks_out_of_place);
	tcase_add_test(tc, bad_tensors);
	tcase_add_test(tc, streams_out_of_order);
	tcase_add_test(tc, read_paths);
	tcase_add_test(tc, check_paths);
	tcase_add_test(tc, bad_coord);
	tcase_add_test(tc, unexpected_types);
	tcase_add_test(tc, truncated_messages);
	tcase_add_test(tc, open_flags_name_the_format);
	tcase_add_test(tc, hashes_after_the_bytes);
	tcase_add_test(tc, namespace);
	tcase_add_test(tc, given_up_attempt);
	tcase_add_test(tc, removal_beside_an_open);
	tcase_add_test(tc, index_bounded);
	tcase_add_test(tc, idle_closed_and_rank_reconnects);
	tcase_add_test(tc, pool_not_leaked);
	tcase_add_test(tc, queue_depth_follows_writes);
	tcase_add_test(tc, direct_save_releases_after_sends);
	tcase_add_test(tc, direct_save_tail_fills_the_pool);
	tcase_add_test(tc, direct_saves_beside_loads);
	tcase_add_test(tc, stop_while_stalled);
	tcase_add_test(tc, honest_under_fire);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *r = srunner_create(suite());
	srunner_run_all(r, CK_NORMAL);
	int failed = srunner_ntests_failed(r);
	srunner_free(r);
	return failed ? 1 : 0;
}
