/*
 * net.h — lib/net's interface: framed, versioned messages between ranks and the
 * coordinator over a transport (tcp, or rdma: docs/protocol-rdma.md), with an
 * authenticated handshake. lib/commit uses only this header, so a transport can
 * be added without touching it.
 *
 * Framing: every message is a 16-byte header (magic, protocol version, type,
 * flags, payload length) and a payload of any size up to the receiver's limit.
 * The receiver checks the header before it allocates anything: a bad magic or
 * version, or a length over the limit, closes the connection with a logged
 * reason (CKPT_EPROTO) and never crashes or blocks the caller.
 *
 * Threads: a net_conn belongs to one thread at a time, except that one thread
 * may send while another receives. A net_listener likewise.
 *
 * Processes (rdma): fork before the first rdma listen or connect. librdmacm opens
 * the devices once per process, and the kernel refuses their use from a child
 * (every post fails with -EACCES); docs/protocol-rdma.md.
 */
#ifndef CKPT_NET_H
#define CKPT_NET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ckpt_internal.h"

#define NET_PROTO_VERSION   1u
#define NET_HEADER_BYTES    16u
#define NET_MAX_JOB_ID      256u
#define NET_DEFAULT_MAX_MSG (256u << 20)   /* largest payload accepted by default */

/* NET_UNIX: processes of one machine (a node's ranks and their leader); the address
 * is "@name" (an abstract socket) or a path, the port is not used (unix.c). */
enum net_transport { NET_TCP = 1, NET_RDMA = 2, NET_UNIX = 3 };

/* Message types 1..31 are lib/net's own (the handshake; docs/protocol.md §1.2);
 * lib/commit numbers its messages from NET_MSG_USER_FIRST (32) up. */
enum net_msg_type {
	NET_MSG_HELLO      = 1,
	NET_MSG_CHALLENGE  = 2,
	NET_MSG_RESPONSE   = 3,
	NET_MSG_WELCOME    = 4,
	NET_MSG_REJECT     = 5,
	NET_MSG_USER_FIRST = 32,
};

struct net_listener;
struct net_conn;

/* The rdma transport's settings, resolved by lib/config.c from CKPT_RDMA_DEVICE and
 * CKPT_RDMA_GID (docs/operations.md, docs/protocol-rdma.md §1); other transports
 * ignore them. All zero (or a NULL pointer where one is taken): any device, the GID
 * rdma_cm picks. */
#define NET_RDMA_DEVICE_MAX 64
struct net_rdma_opts {
	char     device[NET_RDMA_DEVICE_MAX];   /* "": any device */
	bool     gid_set;                       /* check the GID against gid_index */
	unsigned gid_index;
};

/* Listen on addr:port (port 0: an ephemeral port, see net_listener_port); rdma may be
 * NULL. Errors: -EADDRINUSE, -EADDRNOTAVAIL, CKPT_ENODEV (transport not built/no
 * device). */
int  net_listen(int transport, const struct net_rdma_opts *rdma, const char *addr,
                unsigned port, struct net_listener **out);
unsigned net_listener_port(const struct net_listener *l);
/* An fd that polls readable when accept may succeed. */
int  net_listener_fd(const struct net_listener *l);
/* Accept one connection; timeout_ms < 0 waits forever, 0 polls. -ETIMEDOUT/-EAGAIN. */
int  net_accept(struct net_listener *l, int timeout_ms, struct net_conn **out);
void net_listener_close(struct net_listener *l);        /* NULL: no-op */

/* Connect, retrying refused connections until timeout_ms (the coordinator may not be
 * up yet); rdma may be NULL. Errors: -ETIMEDOUT, -ECONNREFUSED, -EHOSTUNREACH,
 * CKPT_ENODEV. */
int  net_connect(int transport, const struct net_rdma_opts *rdma, const char *addr,
                 unsigned port, int timeout_ms, struct net_conn **out);
void net_close(struct net_conn *c);                     /* NULL: no-op */
/* Break c from any thread: every call blocked on it returns at once with an error,
 * and every later call fails. c stays valid until net_close (by its owner). Used to
 * end a handshake that a silent peer would hold for its whole timeout. */
void net_conn_shutdown(struct net_conn *c);
/* Has an error made c unusable (every later call fails)? */
bool net_conn_broken(const struct net_conn *c);
/* "tcp 127.0.0.1:4242 rank 3" — for messages. */
const char *net_conn_name(const struct net_conn *c);
/* An fd that polls readable when net_recv may make progress. */
int  net_conn_fd(const struct net_conn *c);
/* Limit on received payloads (default NET_DEFAULT_MAX_MSG). */
void net_conn_set_max_msg(struct net_conn *c, size_t max);

struct net_msg {
	uint16_t type;
	uint16_t flags;
	void    *payload;   /* malloc'd by net_recv (NULL when len is 0); caller frees (net_msg_free) */
	size_t   len;
	bool     borrowed;  /* payload is the caller's memory (net_recv_into): not freed */
};
void net_msg_free(struct net_msg *m);

/* Send one whole message. Errors: -ETIMEDOUT, -EPIPE/-ECONNRESET (peer gone). */
int net_send(struct net_conn *c, uint16_t type, const void *payload, size_t len,
             int timeout_ms);
/* One message whose payload goes out in pieces, in order, each as soon as it is
 * made (a sender that hashes each block of a chunk just before the kernel copies
 * it, while it is in the CPU's cache): net_send_head sends the header of a
 * len-byte payload together with its first piece (n bytes, 0 allowed),
 * net_send_more each further piece. The pieces add up to len exactly: a piece past
 * it is -EINVAL, and so is any other send on c before the last piece; both break
 * the connection, whose peer would otherwise read the next message as payload.
 * Errors otherwise as net_send's; one inside the payload breaks the connection.
 * The msg_send fault point counts the message at its head (dropped: its pieces are
 * taken and nothing is sent). */
int net_send_head(struct net_conn *c, uint16_t type, size_t len, const void *p, size_t n,
                  int timeout_ms);
int net_send_more(struct net_conn *c, const void *p, size_t n, int timeout_ms);
/* Receive one whole message. Keeps partial progress across calls, so timeout_ms 0
 * never blocks (-EAGAIN until a whole message has arrived) — a poll loop over many
 * connections is never stalled by one slow or hostile peer. Errors: -ETIMEDOUT,
 * -EAGAIN, -ECONNRESET (peer closed; also a clean EOF), CKPT_EPROTO (bad header,
 * oversized length: the connection is then unusable). */
int net_recv(struct net_conn *c, struct net_msg *m, int timeout_ms);
/* net_recv whose payload goes where the caller says: once the header is checked
 * (limit included), into(arg, type, len, &dst) is called, once per message; it
 * returns 0 with dst (len bytes of the caller's memory, for a message it wants
 * placed, e.g. a chunk into an I/O buffer; or NULL: allocated as by net_recv) or a
 * negative code, which breaks the connection and is returned. A placed message has
 * borrowed set and its payload is dst. into may block (the sender then waits: the
 * backpressure of a bounded receiver). */
typedef int (*net_payload_fn)(void *arg, uint16_t type, size_t len, void **dst);
int net_recv_into(struct net_conn *c, struct net_msg *m, net_payload_fn into, void *arg,
                  int timeout_ms);

/* ------------------------------------------------------------------ RDMA WRITE
 * Direct placement, for a peer that receives bulk bytes into memory of its own
 * choosing (ckptd's pool buffers, docs/ckptd.md): only the rdma transport has it;
 * the others return -EOPNOTSUPP from every call here, and the caller sends the
 * bytes as messages instead. net_conn_can_write says which, without trying.
 *
 * A registration pins addr..addr+len and ties it to c's protection domain: the
 * source of net_rdma_write (NET_MR_LOCAL), or a target the peer may write into
 * with the registration's rkey (NET_MR_REMOTE_WRITE: give the rkey only for as long
 * as the peer may write there; net_mr_deregister revokes it, and a WRITE that comes
 * after fails on the peer's side, breaking its connection, not ours). Registrations
 * still held when c is closed are deregistered by net_close (the handles are then
 * gone: deregister first where the handle is kept).
 *
 * net_rdma_write posts one RDMA WRITE of len bytes from local (inside mr) to
 * remote_addr with rkey, behind what was sent on c before it and before the next
 * net_send: the peer sees the bytes in place when it receives that message (RC
 * order). It waits, up to timeout_ms, while the queue pair holds NET_RDMA_WRITES_MAX
 * writes. *ticket gets the write's number (1, 2, ...); local may be reused once
 * net_rdma_write_wait(c, ticket, ...) returned 0. A failed write becomes c's error,
 * as a failed send does. Errors: -EOPNOTSUPP, -EINVAL (local outside mr, len 0 or
 * over 4 GiB - 1), -ETIMEDOUT, -EAGAIN (timeout 0), and those of net_send
 * (-EPIPE/-ECONNRESET, -EACCES for a write the peer's memory refused).
 *
 * Threads: register and deregister from the thread that owns c, not while another
 * registers or deregisters; write and write_wait from c's sending thread. */
#define NET_RDMA_WRITES_MAX 16u
enum net_mr_access { NET_MR_LOCAL = 0, NET_MR_REMOTE_WRITE = 1 };
struct net_mr;
bool net_conn_can_write(const struct net_conn *c);
/* Errors: -EOPNOTSUPP, -EINVAL (len 0), -ENOMEM, -EFAULT and other errnos of the
 * registration, with a message naming the connection and the range. */
int  net_mr_register(struct net_conn *c, void *addr, size_t len, int access,
                     struct net_mr **out);
uint32_t net_mr_rkey(const struct net_mr *mr);
void net_mr_deregister(struct net_mr *mr);              /* NULL: no-op */
int  net_rdma_write(struct net_conn *c, const struct net_mr *mr, const void *local, size_t len,
                    uint64_t remote_addr, uint32_t rkey, uint64_t *ticket, int timeout_ms);
/* Wait until writes 1..ticket have completed (the peer's side has them):
 * 0, -ETIMEDOUT, -EAGAIN (timeout 0), or c's error. */
int  net_rdma_write_wait(struct net_conn *c, uint64_t ticket, int timeout_ms);

/* ------------------------------------------------------------------ handshake
 * Challenge-response over the job secret (HMAC-SHA256, OpenSSL libcrypto); the
 * secret never crosses the wire. Both sides prove knowledge of it (mutual).
 *   client -> HELLO{job_id, rank, world, client_nonce}
 *   server -> CHALLENGE{server_nonce, HMAC(secret, "srv" ‖ client_nonce ‖ server_nonce ‖ job ‖ rank ‖ world)}
 *   client -> RESPONSE{HMAC(secret, "cli" ‖ server_nonce ‖ client_nonce ‖ job ‖ rank ‖ world)}
 *   server -> WELCOME or REJECT{code, reason}
 * An empty secret (len 0) is allowed for single-user machines; it still checks
 * job id, rank and world. */
struct net_auth {
	const char *job_id;
	uint32_t    rank;        /* client: its rank; server: ignored */
	uint32_t    world;
	const void *secret;
	size_t      secret_len;
};

/* Client side. Errors: CKPT_EAUTH (server failed to prove the secret, or rejected
 * ours), CKPT_EPEER (rejected: wrong job, world, rank out of range, duplicate rank —
 * the message carries the server's reason), CKPT_EPROTO, -ETIMEDOUT. */
int net_handshake_client(struct net_conn *c, const struct net_auth *a, int timeout_ms);

/* Server side: verifies the client; *rank gets its rank. accept_rank (may be NULL)
 * is asked whether that rank may join (e.g. not already connected) and returns 0 or
 * a negative code with a reason in *why. On failure the client is sent REJECT with a
 * reason and the same code is returned here. */
typedef int (*net_rank_check_fn)(void *arg, uint32_t rank, const char **why);
int net_handshake_server(struct net_conn *c, const struct net_auth *a,
                         net_rank_check_fn accept_rank, void *arg, uint32_t *rank,
                         int timeout_ms);
/* Server side of a server of many jobs (ckptd): the job is the one the HELLO names.
 * find(arg, job, job_len, world, a, why) is asked for it before any proof is
 * exchanged: 0 with *a filled (job_id, world and the job's secret; valid until the
 * handshake returns), or a negative code (the job is unknown to this server:
 * CKPT_EPEER) with a reason in why (cap NET_JOB_WHY_MAX) for the client. On success
 * *hello gets the client's job id (NUL-terminated; cap NET_MAX_JOB_ID + 1), rank and
 * world. The rest is net_handshake_server's. */
#define NET_JOB_WHY_MAX 256u
typedef int (*net_job_find_fn)(void *arg, const char *job, size_t job_len, uint32_t world,
                               struct net_auth *a, char *why);
struct net_hello {
	char     job_id[NET_MAX_JOB_ID + 1];
	uint32_t rank, world;
};
int net_handshake_server_find(struct net_conn *c, net_job_find_fn find, void *find_arg,
                              net_rank_check_fn accept_rank, void *arg,
                              struct net_hello *hello, int timeout_ms);

#endif /* CKPT_NET_H */
