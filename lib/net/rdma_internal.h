/*
 * rdma_internal.h — private to the rdma transport (rdma.c: connection set-up
 * with librdmacm; rdma_stream.c: the byte stream over an RC queue pair). The
 * wire format is in docs/protocol-rdma.md; this header holds the sizes and the
 * per-connection state both files work on.
 *
 * Threads: as net_internal.h says, one thread may send while another receives.
 * Both paths poll the same completion queue, so every field of struct rdma_conn
 * below `lock` is guarded by it; the fds and verbs objects are created before
 * the connection is shared and destroyed after, so they need no lock. Nothing
 * waits while holding the lock: waits are poll() on the fds.
 */
#ifndef CKPT_NET_RDMA_INTERNAL_H
#define CKPT_NET_RDMA_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include "net_internal.h"

#define RDMA_WIRE_VERSION 1u
#define RDMA_HDR_BYTES    16u              /* control header atop every SEND */
#define RDMA_SLOT_BYTES   4096u            /* one receive (and send) buffer */
#define RDMA_INLINE_MAX   (RDMA_SLOT_BYTES - RDMA_HDR_BYTES)
/* Data messages the peer may have outstanding: its send credits. */
#define RDMA_DATA_SLOTS   32u
/* Receives beyond the data slots, for messages that need no credit: CREDIT and
 * RING_INFO. A CREDIT is sent only when at least half the slots or half the
 * ring is owed, and the peer cannot be owed more than all of either, so at
 * most 2 + 2 CREDITs are unread at any time, plus the one RING_INFO. */
#define RDMA_CTRL_SLOTS   5u
#define RDMA_RECV_SLOTS   (RDMA_DATA_SLOTS + RDMA_CTRL_SLOTS)
#define RDMA_SEND_SLOTS   (RDMA_DATA_SLOTS + RDMA_CTRL_SLOTS)
/* The ring this side offers for the peer's RDMA WRITEs. A payload larger than
 * it streams through it in pieces. Small enough that 64 connections of a
 * coordinator fit in a small guest; see docs/perf-rdma.md for the trade-off. */
#define RDMA_RING_BYTES   (256u << 10)
#define RDMA_RING_MIN     4096u             /* accepted from a peer */
#define RDMA_RING_MAX     (64u << 20)
/* Set-up steps (address, route, connection) each get at least this long, even
 * from a caller that polls with timeout 0: rdma_cm needs a round trip. */
#define RDMA_SETUP_MIN_MS 5000
/* How long close waits for sends still in flight (the peer's ack), so that what
 * was sent before a close arrives, as over tcp. */
#define RDMA_LINGER_MS    2000

/* Message kinds (the first header byte). */
enum rdma_kind {
	RDMA_K_INLINE    = 1,   /* stream bytes inside this SEND */
	RDMA_K_RING      = 2,   /* stream bytes already written into the receiver's ring */
	RDMA_K_CREDIT    = 3,   /* only returns credits */
	RDMA_K_RING_INFO = 4,   /* the sender's ring: u64 addr, u32 rkey, u32 size */
};

/* What a work request was, kept in wr_id so that an error completion can name
 * the operation: bits 56..63 the op, 32..55 a length, 0..31 a slot or offset. */
enum rdma_op { RDMA_OP_RECV = 1, RDMA_OP_SEND = 2, RDMA_OP_WRITE = 3, RDMA_OP_DWRITE = 4 };
/* Direct writes (net_rdma_write) a queue pair holds at once, on top of the
 * stream's own work requests: its send queue is sized for both. */
#define RDMA_DWRITES      NET_RDMA_WRITES_MAX
#define RDMA_MAX_SEND_WR  (2u * RDMA_SEND_SLOTS + RDMA_DWRITES)

/* A registration (net.h's net_mr): on the connection's list until deregistered,
 * so that close can deregister what is left before it frees the PD. */
struct rdma_mr {
	struct net_mr   pub;             /* first: the handle net.h hands out */
	struct ibv_mr  *mr;
	struct rdma_mr *next, *prev;
};

/* A received data message not yet fully handed to the caller. */
struct rdma_rx_slot {
	uint8_t  kind;       /* RDMA_K_INLINE or RDMA_K_RING */
	uint32_t len;        /* stream bytes it carries */
	uint32_t done;       /* of them, handed to recv_some */
	uint32_t ring_off;   /* RDMA_K_RING: where in our ring */
};

struct rdma_conn {
	/* Immutable while shared. */
	struct rdma_event_channel *ch;   /* this connection's cm events (non-blocking fd) */
	struct rdma_cm_id *id;
	struct ibv_pd *pd;
	struct ibv_comp_channel *cc;     /* non-blocking fd */
	struct ibv_cq *cq;               /* send and receive completions */
	struct ibv_qp *qp;               /* id->qp */
	uint8_t *rbuf, *sbuf, *ring;     /* receive slots, send slots, our ring */
	struct ibv_mr *rmr, *smr, *ring_mr;
	int epfd;                        /* cc, ch and evrx: net_conn_fd */
	int evrx;                        /* eventfd: set while recv_some can progress */
	int evtx;                        /* eventfd: send capacity grew for a waiting sender */
	char dev[IBV_SYSFS_NAME_MAX];
	char peer[NET_PEER_NAME_MAX];    /* for log lines */

	pthread_mutex_t lock;
	/* send side */
	uint32_t credits;                /* data messages the peer can take now */
	uint32_t sfree[RDMA_SEND_SLOTS]; /* free send slots (a stack) */
	uint32_t nsfree;
	uint32_t sq_busy;                /* work requests posted, not completed */
	bool     have_peer_ring;
	uint64_t peer_addr;
	uint32_t peer_rkey, peer_size;
	uint8_t *stage;                  /* copy of the bytes being written (peer_size) */
	struct ibv_mr *stage_mr;
	uint64_t tx_written, tx_freed;   /* bytes written into the peer's ring; freed by it */
	bool     tx_want_ring;           /* the last send waited for ring space, not a slot */
	unsigned tx_waiters;
	bool     tx_grew;
	/* direct writes (net_rdma_write): numbered from 1; they complete in order */
	uint64_t dw_posted, dw_done;
	uint32_t dw_busy;                /* posted, not completed */
	uint32_t dw_len[RDMA_DWRITES];   /* by number mod RDMA_DWRITES: for messages */
	struct rdma_mr *mrs;             /* registrations not yet deregistered */
	/* receive side */
	struct rdma_rx_slot rx[RDMA_RECV_SLOTS];
	uint32_t rxq[RDMA_RECV_SLOTS];   /* data slots in arrival order (a ring of indices) */
	uint32_t rxq_head, rxq_len;
	uint64_t rx_ring_total;          /* bytes announced into our ring so far */
	uint32_t rx_ring_used;           /* announced, not yet handed out */
	uint32_t owed_slots, owed_ring;  /* returned locally, not yet told to the peer */
	bool     got_ring_info;
	bool     evrx_set;
	/* state */
	bool     established, peer_gone, shut;
	int      err;                    /* first fatal error, 0 if none */
	char     why[256];               /* its reason, for net's error message */
};

/* rdma_stream.c */
int  rdma_stream_start(struct net_conn *c);   /* after ESTABLISHED: RING_INFO out */
int  rdma_post_recv_slot(struct rdma_conn *r, uint32_t slot);
void rdma_conn_linger(struct rdma_conn *r);

ssize_t rdma_send(struct net_conn *c, const struct iovec *iov, int iovcnt);
ssize_t rdma_recv_some(struct net_conn *c, void *buf, size_t len);
int  rdma_wait(struct net_conn *c, short events, int timeout_ms);
void rdma_shutdown(struct net_conn *c);
const char *rdma_error_detail(const struct net_conn *c);
int  rdma_mr_register(struct net_conn *c, void *addr, size_t len, int access,
                      struct net_mr **out);
void rdma_mr_deregister(struct net_mr *m);
void rdma_mr_release_all(struct rdma_conn *r);
int  rdma_write_direct(struct net_conn *c, const struct net_mr *m, const void *local, size_t len,
                       uint64_t remote_addr, uint32_t rkey, uint64_t *ticket, int timeout_ms);
int  rdma_write_wait(struct net_conn *c, uint64_t ticket, int timeout_ms);

#endif /* CKPT_NET_RDMA_INTERNAL_H */
