/*
 * net_internal.h — private to lib/net: the transport ops table and the generic
 * listener and connection objects that msg.c (framing) and auth.c (handshake)
 * work on.
 *
 * A transport (tcp.c; rdma.c with rdma_stream.c) supplies only a struct
 * net_transport_ops: connection set-up, non-blocking byte transfer, a wait for
 * readiness, and teardown. Everything above bytes — framing, limits, partial
 * receive progress, timeouts across calls, the handshake — lives in
 * transport-independent files, so a new transport cannot get those wrong.
 *
 * Threads: as in net.h. One thread may send while another receives on the same
 * connection, so the send path and the receive path share nothing mutable except
 * the atomic `broken` code; the receive state (rx) belongs to the receiving
 * thread, and name/ops/priv are written only before the connection is shared.
 */
#ifndef CKPT_NET_INTERNAL_H
#define CKPT_NET_INTERNAL_H

#include <poll.h>
#include <stdatomic.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "net/net.h"

#define NET_MAGIC             0x4D4E4B43u  /* "CKNM" as bytes on the wire (little-endian u32) */
#define NET_HANDSHAKE_MAX_MSG 4096u        /* payload limit while the peer is not yet authenticated */
#define NET_NONCE_BYTES       32u
#define NET_MAC_BYTES         32u          /* HMAC-SHA256 */
#define NET_REASON_MAX        512u         /* longest REJECT reason carried or accepted */
#define NET_PEER_NAME_MAX     64u          /* "[ffff:...:ffff]:65535" fits */
#define NET_CONN_NAME_MAX     (NET_PEER_NAME_MAX + 48u)

struct net_conn;
struct net_listener;

/*
 * What a transport provides. All byte transfer is non-blocking: send and
 * recv_some return at once, with -EAGAIN when they would block, and the caller
 * (msg.c) waits with wait() under its own deadline. Set-up calls (listen,
 * accept, connect) do their own waiting, because how to wait for a connection
 * is transport-specific (poll on a socket, rdma_cm events).
 *
 * On success, listen fills l->priv and l->port; accept and connect fill c->priv
 * and c->peer (a printable address for messages). On failure they leave priv
 * NULL, set the thread's error message and return a negative code; the generic
 * code frees the object. Codes are negated errno or CKPT_E*: foreign codes are
 * converted inside the transport.
 */
struct net_transport_ops {
	const char *name;                      /* "tcp": first word of net_conn_name */
	int  (*listen)(struct net_listener *l, const char *addr, unsigned port);
	int  (*listener_fd)(const struct net_listener *l);
	/* timeout_ms < 0: forever; 0: -EAGAIN at once if none pending; else -ETIMEDOUT. */
	int  (*accept)(struct net_listener *l, int timeout_ms, struct net_conn *c);
	void (*listener_close)(struct net_listener *l);
	/* Retries refused attempts until timeout_ms (< 0: forever). */
	int  (*connect)(struct net_conn *c, const char *addr, unsigned port, int timeout_ms);
	/* Bytes accepted (> 0), -EAGAIN, -EINTR, or -errno (-EPIPE, -ECONNRESET, ...). */
	ssize_t (*send)(struct net_conn *c, const struct iovec *iov, int iovcnt);
	/* Bytes read (> 0), 0 on the peer's orderly close, -EAGAIN, -EINTR, or -errno. */
	ssize_t (*recv_some)(struct net_conn *c, void *buf, size_t len);
	/* Wait until send (POLLOUT) or recv_some (POLLIN) may make progress:
	 * > 0 ready (or in error: the next call reports it), 0 timed out, -errno. */
	int  (*wait)(struct net_conn *c, short events, int timeout_ms);
	int  (*fd)(const struct net_conn *c);  /* pollable readable when recv_some may progress */
	/* End the byte stream in both directions now (the peer sees the close at
	 * once) while keeping priv and the fd valid until close. Safe while another
	 * thread is inside send, recv_some or wait on the same connection. */
	void (*shutdown)(struct net_conn *c);
	void (*close)(struct net_conn *c);     /* frees priv */
	/* Optional (NULL: none): after send, recv_some or wait failed, the
	 * transport's own reason (rdma: the failed work request and its
	 * ibv_wc_status_str), for net's error message. Valid until close. */
	const char *(*error_detail)(const struct net_conn *c);
	/* Optional (NULL: -EOPNOTSUPP): net.h's RDMA WRITE calls. mr_register
	 * allocates the handle (its public part first); close deregisters what is
	 * left. */
	int  (*mr_register)(struct net_conn *c, void *addr, size_t len, int access,
	                    struct net_mr **out);
	void (*mr_deregister)(struct net_mr *mr);
	int  (*write)(struct net_conn *c, const struct net_mr *mr, const void *local, size_t len,
	              uint64_t remote_addr, uint32_t rkey, uint64_t *ticket, int timeout_ms);
	int  (*write_wait)(struct net_conn *c, uint64_t ticket, int timeout_ms);
};

/* A registration (net.h): what every transport's handle starts with. */
struct net_mr {
	struct net_conn *c;
	uint8_t *addr;
	size_t   len;
	uint32_t lkey, rkey;
};

extern const struct net_transport_ops net_tcp_ops;
#ifdef CKPT_HAVE_RDMA
extern const struct net_transport_ops net_rdma_ops;   /* rdma.c, rdma_stream.c */
#endif

extern const struct net_transport_ops net_unix_ops;   /* unix.c */

/* ---------------------------------------------------------------- stream sockets
 * What tcp.c and unix.c share: a connected or listening non-blocking socket is
 * priv = struct net_sock; bytes, waits and teardown are the same for both. */
struct net_sock {
	int fd;
};
int     net_sock_fd_of(void *priv);
/* priv = a new net_sock owning fd (closed on failure). 0 or -ENOMEM. */
int     net_sock_new(void **priv, int fd);
/* poll one fd until deadline, retrying EINTR. > 0 ready, 0 timeout, -errno. */
int     net_sock_poll(int fd, short events, uint64_t deadline);
int     net_sock_listener_fd(const struct net_listener *l);
void    net_sock_listener_close(struct net_listener *l);
ssize_t net_sock_send(struct net_conn *c, const struct iovec *iov, int iovcnt);
ssize_t net_sock_recv_some(struct net_conn *c, void *buf, size_t len);
int     net_sock_wait(struct net_conn *c, short events, int timeout_ms);
int     net_sock_fd(const struct net_conn *c);
void    net_sock_shutdown(struct net_conn *c);
void    net_sock_close(struct net_conn *c);

/* Look up a transport by enum net_transport; CKPT_ENODEV with a message if not built. */
int net_transport_ops_get(int transport, const struct net_transport_ops **out);

struct net_listener {
	const struct net_transport_ops *ops;
	void     *priv;                        /* the transport's state */
	unsigned  port;                        /* bound port (port 0 resolved) */
	struct net_rdma_opts rdma;             /* for the connections it accepts */
};

/* Receive progress of one message, kept across net_recv calls (net.h: timeout 0
 * never blocks). The payload buffer exists only once the header passed its checks. */
struct net_rx {
	uint8_t  hdr[NET_HEADER_BYTES];
	size_t   hdr_got;
	uint16_t type, flags;
	uint8_t *payload;
	size_t   len, got;
	bool     borrowed;       /* payload is the caller's (net_recv_into) */
};

struct net_conn {
	const struct net_transport_ops *ops;
	void       *priv;                      /* the transport's state */
	char        peer[NET_PEER_NAME_MAX];   /* filled by the transport */
	char        name[NET_CONN_NAME_MAX];   /* "tcp 127.0.0.1:4242 rank 3" */
	size_t      max_msg;                   /* payload limit for net_recv */
	atomic_int  broken;                    /* 0, or the error that made the connection unusable */
	struct net_rx rx;                      /* receiving thread only */
	size_t      tx_left;                   /* sending thread only: payload bytes of a
	                                        * message sent in pieces still to come */
	bool        tx_drop;                   /* ... which the msg_send fault dropped */
	struct net_rdma_opts rdma;             /* set before the transport's connect */
};

/* ---------------------------------------------------------------- msg.c */
/* net_send without the msg_send fault point (the handshake's messages are not
 * counted by it, so that CKPT_FAULT=msg_send:<nth> addresses lib/commit's messages). */
int net_msg_send(struct net_conn *c, uint16_t type, const void *payload, size_t len,
                 int timeout_ms);
/* net_recv with an explicit payload limit (the handshake's small one). */
int net_msg_recv(struct net_conn *c, struct net_msg *m, size_t max, int timeout_ms);
/* The same with the payload's memory chosen by into (NULL: allocated). */
int net_msg_recv_into(struct net_conn *c, struct net_msg *m, size_t max,
                      net_payload_fn into, void *arg, int timeout_ms);
/* Record the first fatal error and shut the stream down (the peer learns at once
 * that this connection is over); later calls fail fast with it. Returns code. */
int net_conn_break(struct net_conn *c, int code);
/* Append " <suffix>" to the name (after the handshake: "rank 3"). Not thread-safe:
 * only before the connection is shared between threads. */
void net_conn_name_suffix(struct net_conn *c, const char *suffix);

#endif /* CKPT_NET_INTERNAL_H */
