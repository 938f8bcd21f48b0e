/*
 * commit_internal.h — private to lib/commit: the commit protocol's messages
 * (docs/protocol.md §3) and their codecs. Payloads are little-endian; decoders take
 * untrusted bytes and check every length before use.
 */
#ifndef CKPT_COMMIT_INTERNAL_H
#define CKPT_COMMIT_INTERNAL_H

#include "commit/commit.h"
#include <pthread.h>

#include "net/net.h"

enum commit_msg_type {
	COMMIT_MSG_BEGIN       = NET_MSG_USER_FIRST,  /* p -> c: {step} */
	COMMIT_MSG_BEGIN_REPLY = 33,                  /* c -> p: {step, code, reason, save id} */
	COMMIT_MSG_PREPARE     = 34,                  /* p -> c: {step, rank, size, hash, save id,
	                                                 index} */
	COMMIT_MSG_DECISION    = 35,                  /* c -> p: {step, code, reason, save id} */
	COMMIT_MSG_ABORT       = 36,                  /* p -> c: {step, code, reason, save id} */
	/* The hierarchical commit (docs/protocol.md §2.8): a node leader (l) between
	 * its node's ranks and the coordinator. */
	COMMIT_MSG_RELAY_HELLO = 37,                  /* l -> c: {node, n, ranks[n]} */
	COMMIT_MSG_RELAY_WELCOME = 38,                /* c -> l: {0, code, reason} (status) */
	COMMIT_MSG_RELAYED     = 39,                  /* l -> c: {rank, type, payload} */
	COMMIT_MSG_TO_RANK     = 40,                  /* c -> l: {rank, type, payload} */
	COMMIT_MSG_RANK_GONE   = 41,                  /* l -> c: {rank, reason} */
};

/* Largest set of ranks one leader may speak for (a node's ranks; the limit keeps
 * a RELAY_HELLO inside the handshake-sized messages of any transport). */
#define COMMIT_MAX_NODE_RANKS 4096u

#define COMMIT_MAX_REASON 512u

/* {step, code, reason, save id}: BEGIN_REPLY, DECISION and ABORT share one layout.
 * The save id names the attempt at the step: the one a BEGIN_REPLY opened or
 * joined, the one a DECISION decided, the one an ABORT gives up (0: none known). */
struct commit_status_msg {
	uint64_t step;
	int32_t  code;
	char     reason[COMMIT_MAX_REASON + 1];
	uint64_t save_id;
};
int commit_status_encode(const struct commit_status_msg *m, struct ckpt_buf *b);
int commit_status_decode(const void *p, size_t n, struct commit_status_msg *m);

int commit_step_encode(uint64_t step, struct ckpt_buf *b);
int commit_step_decode(const void *p, size_t n, uint64_t *step);

/* PREPARE; on decode, v->index (and v->meta, when the vote carries metadata)
 * point into the payload. */
int commit_prepare_encode(const struct commit_vote *v, struct ckpt_buf *b);
int commit_prepare_decode(const void *p, size_t n, struct commit_vote *v);

/* RELAYED and TO_RANK: one rank's message, tagged. The inner payload is copied
 * after the tag on encode; on decode *inner points into p. */
#define COMMIT_RELAY_TAG_BYTES 8u     /* version, rank, type */
int commit_relay_encode(uint32_t rank, uint16_t type, const void *inner, size_t inner_len,
                        struct ckpt_buf *b);
int commit_relay_decode(const void *p, size_t n, uint32_t *rank, uint16_t *type,
                        const uint8_t **inner, size_t *inner_len);

/* RELAY_HELLO: the ranks a leader speaks for, strictly ascending (so: distinct),
 * 1..COMMIT_MAX_NODE_RANKS of them. On decode *ranks is malloc'd. */
int commit_hello_encode(uint32_t node, const uint32_t *ranks, uint32_t n, struct ckpt_buf *b);
int commit_hello_decode(const void *p, size_t n, uint32_t *node, uint32_t **ranks,
                        uint32_t *nranks);

/* RANK_GONE: a rank's connection to its leader ended. */
int commit_gone_encode(uint32_t rank, const char *reason, struct ckpt_buf *b);
int commit_gone_decode(const void *p, size_t n, uint32_t *rank,
                       char reason[COMMIT_MAX_REASON + 1]);

/* ------------------------------------------------------------------ accept.c
 * Admitting peers on a listener, shared by the coordinator and the node leader:
 * each accepted connection's handshake runs on a short-lived thread of its own (a
 * silent or hostile client costs a thread for a bounded time, never the owner's
 * poll loop); an admitted connection waits, by rank, until the owner's loop takes
 * it. Handshakes at once are bounded, and a flood of connections breaks its own
 * silent ones, not the ranks' (docs/protocol.md §2.7). The owner's lock guards the
 * acceptor's state too, so that the owner's admit check and the acceptor's own (no
 * rank twice in a handshake or waiting to be taken) are one atomic decision. */
struct commit_acceptor;
/* Called with *lock held, after the peer proved the secret: may rank join? 0, or a
 * code with the reason in *why (sent to the peer). */
typedef int (*commit_admit_fn)(void *arg, uint32_t rank, const char **why);
struct commit_acceptor_opts {
	struct net_listener *lis;       /* borrowed; the owner closes it after the free */
	const char          *job_id;    /* borrowed, like secret: outlive the acceptor */
	uint32_t             world;
	const void          *secret;
	size_t               secret_len;
	pthread_mutex_t     *lock;      /* the owner's */
	commit_admit_fn      admit;
	void                *arg;
	int                  wake_fd;   /* a byte is written here when a connection is ready,
	                                   or when there is room for more after none was */
	const char          *who;       /* "coordinator", for log lines */
	bool                 same_user; /* unix listeners: refuse a peer process whose uid
	                                   is neither ours nor root (SO_PEERCRED) */
};
int  commit_acceptor_create(const struct commit_acceptor_opts *o, struct commit_acceptor **out);
/* The owner's loop, before each poll, without *lock held: should the listener be
 * polled? Not while the acceptor pauses (accept failed for want of descriptors or
 * memory) or has no room for another handshake. *timeout_ms, poll's timeout (< 0:
 * none), is lowered to when that may change and to when a count of held-back log
 * lines is due; room that frees up when a handshake ends comes through wake_fd. */
bool commit_acceptor_listening(struct commit_acceptor *a, int *timeout_ms);
/* The owner's loop, when the listener polls readable: accept what is pending (a
 * batch at most, so that the loop serves its links between batches). */
void commit_acceptor_accept(struct commit_acceptor *a);
/* With *lock held: is rank in a handshake, or admitted and not yet taken? */
bool commit_acceptor_holds_locked(const struct commit_acceptor *a, uint32_t rank);
/* With *lock held: an admitted connection not yet taken (NULL: none), its rank. */
struct net_conn *commit_acceptor_take_locked(struct commit_acceptor *a, uint32_t *rank);
/* Break handshakes still running (their peers are silent), wait for their threads,
 * close what was admitted but never taken, free. Without *lock held. NULL: no-op. */
void commit_acceptor_free(struct commit_acceptor *a);

/* ------------------------------------------------------------------ participants
 * How a rank takes part in the commit of its saves: commit_part_* (commit.h)
 * dispatch through ops, to the remote participant (participant.c: the coordinator is
 * another process) or the local one (local.c: a world of one decides itself). */
struct commit_part_ops {
	int      (*begin)(struct commit_part *p, uint64_t step, uint64_t *save_id);
	uint64_t (*attempt)(struct commit_part *p, uint64_t step);
	int      (*prepare)(struct commit_part *p, const struct commit_vote *v);
	int      (*abort)(struct commit_part *p, uint64_t step, int code, const char *why);
	int      (*wait)(struct commit_part *p, uint64_t step, int timeout_ms);
	int      (*decided)(struct commit_part *p, uint64_t step, int timeout_ms); /* NULL: none */
	void     (*close)(struct commit_part *p);
};
struct commit_part {
	const struct commit_part_ops *ops;   /* first member of each implementation */
};

#endif /* CKPT_COMMIT_INTERNAL_H */
