/*
 * ckptd_fixture.h — what test_ckptd_hostile.c attacks with, and what it checks
 * after each attack (ckptd_fixture.c).
 *
 * The fixture (hostile_setup, hostile_teardown; Check's checked fixture, so once per
 * test in its own process): a ckptd server in this process, its run loop in a
 * thread, serving three jobs from a jobs file in a fresh directory (joba and jobb,
 * and jobq with a quota of 1 MiB) out of <top>/data, with a pool of NBUFS buffers of
 * BUF_BYTES; job B has saved step 1 through it before the test begins.
 *
 * Peers: raw TCP sockets (raw_*), and lib/net connections past the handshake as a
 * job's rank 0 (conn_as, conn_a) on which messages are built by hand or with
 * lib/remote's encoders; expect_* wait for ckptd's answer (an ERROR with its code
 * and a part of its message, or the connection closed with ckptd's log naming why).
 *
 * after_attack: every connection gone and every pool buffer free; nothing outside
 * the jobs' directories; job B's files as B saved them; honest ranks of jobs A and B
 * (the library, ckpt_open with a ckptd:// target) load and save bit-exact.
 *
 * Every function asserts (ck_assert) and is called from the test's thread.
 */
#ifndef CKPTD_FIXTURE_H
#define CKPTD_FIXTURE_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "remote/remote.h"
#include "server.h"

#define BUF_BYTES  (2u << 20)   /* a pool buffer: above REMOTE_MAX_CONTROL on purpose */
#define NBUFS      4u
#define TIMEOUT_MS 2000u        /* ckptd's: handshakes and idle streams */
#define IDLE_MS    3000u        /* ckptd's: a connection without a stream */
#define MAX_INDEX  (256u << 10) /* ckptd's: what one stream's index may hold */
#define WAIT_MS    15000        /* how long a test waits for an answer or a close */
#define SECRET_A   "secret-of-job-a-0123456789"
#define SECRET_B   "secret-of-job-b-9876543210"
#define SECRET_Q   "secret-of-job-q-5555555555"
#define HN         100000u      /* floats of an honest rank's tensor: 7 chunks of 64 KiB */
#define STREAM_SID 1u           /* the save id of hand-made streams */

extern char *top;                      /* the test's directory: jobs, secrets, data/ */
extern char data_dir[4200];            /* <top>/data: ckptd's --data */
extern struct ckptd_counters counters;
extern struct ckptd_server *srv;       /* NULL once a test stopped it itself */
extern pthread_t runner;               /* the thread in ckptd_server_run */
extern unsigned port;
extern char b_rel[128];                /* job B's shard of step 1, as a record names it */
/* The transport ckptd listens on and every peer uses, and its address: tcp on
 * 127.0.0.1 unless a test sets them before hostile_setup (rdma: the rdma guest's
 * device address). */
extern int fixture_transport;
extern const char *fixture_host;

void hostile_setup(void);
void hostile_teardown(void);
/* Whether ckptd's log (or the library's) so far holds needle. */
bool log_has(const char *needle);

/* Honest ranks: rank 0 of a world of 1 of job, through the library. honest_save_with
 * saves step on an open context c (honest_open's), so that one context can save
 * several times. */
ckpt_ctx *honest_open(const char *job, const char *secret, unsigned flags);
/* The same with chunks of chunk_bytes and a pool of pool_bytes (honest_open's: 64 KiB
 * and 1 MiB). */
ckpt_ctx *honest_open_sized(const char *job, const char *secret, unsigned flags,
                            size_t chunk_bytes, size_t pool_bytes);
void honest_save_with(ckpt_ctx *c, const char *job, uint64_t step);
void honest_save(const char *job, const char *secret, uint64_t step);
void honest_load(const char *job, const char *secret, uint64_t step);
/* Every connection gone (also those ckptd closes itself), then every buffer free. */
void wait_idle(void);
void after_attack(void);

/* Raw sockets, before any handshake. */
int  raw_connect(void);
void raw_write(int fd, const void *p, size_t n);
void raw_header(uint8_t h[NET_HEADER_BYTES], uint16_t version, uint16_t type, uint32_t len);
void raw_expect_closed(int fd, const char *what);

/* Connections past the handshake, and the handshake refused. */
struct net_conn *conn_as(const char *job, const char *secret, uint32_t world);
struct net_conn *conn_a(void);
void expect_refused(const char *job, const char *secret, int code, const char *needle);

/* Messages. */
void send_msg(struct net_conn *c, uint16_t type, const void *p, size_t n);
void send_buf(struct net_conn *c, uint16_t type, struct ckpt_buf *b);   /* frees b */
void send_header(struct net_conn *c, uint16_t type, uint32_t len);
void send_open(struct net_conn *c, uint64_t step, uint64_t save_id, uint32_t block_bytes,
               uint64_t size_hint);
void tensor_msg(struct ckpt_buf *b, const char *name, uint64_t bytes);
void start_stream(struct net_conn *c, uint64_t step, uint64_t bytes);
/* start_stream of attempt save_id (the save id of hand-made streams: STREAM_SID). */
void start_stream_of(struct net_conn *c, uint64_t step, uint64_t save_id, uint64_t bytes);
/* OPEN of attempt STREAM_SID at step with flags, answered OPEN_OK with the pool's
 * buffer size: the flags OPEN_OK says back. */
uint32_t open_with_flags(struct net_conn *c, uint64_t step, uint32_t flags);
/* After OPEN_OK: TENSOR "w" of 8192 bytes, one chunk of them all fill, FINISH,
 * DURABLE; then the connection is closed. */
void finish_small_shard(struct net_conn *c, uint8_t fill);
/* A shard of one tensor "w" of bytes, all fill, in one chunk: everything but FINISH. */
void send_one_chunk_shard(struct net_conn *c, uint64_t step, uint64_t save_id, uint64_t bytes,
                          uint8_t fill);
void chunk_msg(struct ckpt_buf *b, uint32_t tensor, uint64_t len);
void send_chunk(struct net_conn *c, uint32_t tensor, uint64_t len);
void send_data(struct net_conn *c, size_t len, uint8_t fill);
void read_msg(struct ckpt_buf *b, const char *path, uint64_t off, uint64_t len);

/* Answers. Each closes c (net_close) except expect_answer. */
void expect_closed(struct net_conn *c, const char *log_needle);
void expect_error(struct net_conn *c, int code, const char *needle);
void expect_answer(struct net_conn *c, uint16_t type, struct net_msg *m);
void expect_read_error(const char *path, uint64_t off, uint64_t len, int code,
                       const char *needle);
void expect_check_error(const char *path, uint64_t size, int code, const char *needle);

#endif /* CKPTD_FIXTURE_H */
