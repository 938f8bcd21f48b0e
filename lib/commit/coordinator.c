/*
 * coordinator.c — the commit coordinator (docs/protocol.md §2): gathers each step's W votes
 * over lib/net, checking each as it arrives (gather.c), decides in step order, and
 * broadcasts the decision.
 *
 * One thread runs a poll loop over the listener and the links; it never blocks on
 * a peer (net_recv with timeout 0 keeps partial progress). The handshake of a new
 * connection runs in a short-lived thread of its own (accept.c), so a silent or
 * hostile client costs a thread for a few seconds, and a flood of them a bounded
 * number of threads and descriptors, not the job.
 *
 * A link is one connection: a rank's own, or a node leader's (the hierarchical
 * commit, docs/protocol.md §2.8). A leader authenticates as its own rank, then
 * announces the exact set of ranks it speaks for (RELAY_HELLO); from then on its
 * messages are tagged with the rank they are from (RELAYED), replies to one rank go
 * back tagged (TO_RANK), and a decision goes once per link, whatever the number of
 * ranks behind it. Every rank belongs to at most one link at a time (owner[]): an
 * announced set that overlaps another link, or a relayed message for a rank
 * outside the link's set, closes that link with a logged reason.
 *
 * Presumed abort: a step aborts when a rank asks for it, when a rank that has not
 * voted disconnects (its own link, or its leader's, or its leader reports it gone),
 * or when its votes are not all in timeout_ms after its first vote. A step with
 * every vote in is decided only when no lower step is still in flight, so commits
 * are ordered by step; it does not time out while it waits.
 *
 * Only BEGIN creates a step, and a vote counts only from a rank that began the
 * step's current attempt: a PREPARE that arrives after its step was decided (a
 * rank that finished writing after another rank had failed) must neither revive
 * the step — a revived step with votes that never complete would hold every
 * higher step behind it until its timeout — nor slip into a later attempt of the
 * same step with the index of a file its rank has since removed.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "commit/commit_internal.h"

#define SEND_TIMEOUT_MS      5000
#define NO_OWNER             UINT32_MAX

struct coord_step {
	uint64_t            step;
	uint64_t            save_id;           /* this attempt's (in its INFLIGHT record) */
	uint64_t            deadline_ns;       /* 0 until the first vote */
	uint32_t            nvotes;
	bool               *began;             /* [world]: BEGIN of this attempt seen */
	int                 abort_code;        /* non-zero: abort with why */
	char                why[COMMIT_MAX_REASON];
	void              **payloads;          /* [world] PREPARE payloads (own the votes' bytes) */
	struct commit_vote *votes;             /* [world] */
	struct manifest_shard *shards;         /* [world] records for the commit txn, built per vote */
	char              (*paths)[COMMIT_SHARD_PATH_MAX];   /* [world] their paths */
	struct commit_gather *gather;          /* votes decoded and checked as they arrive */
	uint64_t            t_last_recv;       /* the last vote read off its connection */
	uint64_t            t_last_done;       /* ... and decoded and checked */
	struct coord_step  *next;              /* ascending by step */
};

/* One connection, known by the rank it authenticated as. Loop thread only. */
struct coord_link {
	struct net_conn *conn;                 /* NULL: no link under this rank */
	bool             used;                 /* has sent a message: too late to announce */
	bool             relay;                /* a node leader: speaks for ranks[] */
	uint32_t         node;
	uint32_t        *ranks;                /* relay: ascending, includes its own rank */
	uint32_t         nranks;
};

struct commit_coord {
	struct manifest     *manifest;
	char                *root;             /* NULL: votes are not held to files */
	const char        *(*shard_holder)(void *arg, uint32_t rank);   /* see commit.h */
	int                (*remote_check)(void *arg, const char *holder, const char *rel,
	                                   uint64_t file_size, uint64_t footer_off,
	                                   uint64_t footer_len, const uint8_t *footer_hash);
	void                *holder_arg;
	void               (*on_decision)(void *arg, uint64_t step, int code);
	uint64_t             incarnation;
	char                *job_id;
	uint32_t             world;
	void                *secret;
	size_t               secret_len;
	unsigned             timeout_ms;
	struct net_listener *lis;
	struct commit_acceptor *acc;
	pthread_t            thread;
	bool                 thread_started;
	int                  wake[2];

	pthread_mutex_t      lock;             /* owner[], stop, stats; the acceptor's state */
	uint32_t            *owner;            /* [world]: the link that speaks for a rank;
	                                          written by the loop under lock, read by
	                                          handshake threads under lock */
	bool                 stop;

	struct coord_link   *links;            /* [world], loop thread only */
	struct pollfd       *pf;               /* [world + 2], the loop's; allocated by start, */
	uint32_t            *who;              /* so that a loop that cannot run never listens */
	struct coord_step   *steps;            /* loop thread only */
	struct commit_coord_stats stats;       /* last decided step, under lock */
	uint64_t             ranks_left;       /* under lock */
};

/* ------------------------------------------------------------------ handshakes */

/* Under c->lock (accept.c): a rank may join if no link speaks for it. */
static int coord_admit(void *arg, uint32_t rank, const char **why)
{
	struct commit_coord *c = arg;
	if (c->owner[rank] == NO_OWNER)
		return 0;
	*why = c->owner[rank] == rank ? "that rank is already connected"
	                              : "that rank is already served by its node leader";
	return CKPT_EPEER;
}

static void coord_wake(struct commit_coord *c)
{
	char b = 1;
	ssize_t n = write(c->wake[1], &b, 1);
	(void)n;
}

/* ------------------------------------------------------------------ steps */

static struct coord_step *step_find(struct commit_coord *c, uint64_t step, bool create)
{
	struct coord_step **pp = &c->steps;
	while (*pp && (*pp)->step < step)
		pp = &(*pp)->next;
	if (*pp && (*pp)->step == step)
		return *pp;
	if (!create)
		return NULL;
	struct coord_step *s = ckpt_calloc(1, sizeof *s);
	if (s) {
		s->payloads = ckpt_calloc(c->world, sizeof *s->payloads);
		s->votes = ckpt_calloc(c->world, sizeof *s->votes);
		s->began = ckpt_calloc(c->world, sizeof *s->began);
		s->shards = ckpt_calloc(c->world, sizeof *s->shards);
		s->paths = ckpt_calloc(c->world, sizeof *s->paths);
		if (commit_gather_create(c->world, step, true, &s->gather))
			s->gather = NULL;
	}
	if (!s || !s->payloads || !s->votes || !s->began || !s->shards || !s->paths || !s->gather) {
		if (s) {
			ckpt_free(s->payloads);
			ckpt_free(s->votes);
			ckpt_free(s->began);
			ckpt_free(s->shards);
			ckpt_free(s->paths);
			commit_gather_free(s->gather);
		}
		ckpt_free(s);
		return NULL;
	}
	s->step = step;
	s->next = *pp;
	*pp = s;
	return s;
}

static void step_free(struct commit_coord *c, struct coord_step *s)
{
	for (uint32_t r = 0; r < c->world; r++)
		ckpt_free(s->payloads[r]);
	ckpt_free(s->payloads);
	ckpt_free(s->votes);
	ckpt_free(s->began);
	ckpt_free(s->shards);
	ckpt_free(s->paths);
	commit_gather_free(s->gather);
	ckpt_free(s);
}

/* Take s off the list and free it (an attempt that never began). */
static void step_unlink(struct commit_coord *c, struct coord_step *s)
{
	for (struct coord_step **pp = &c->steps; *pp; pp = &(*pp)->next) {
		if (*pp == s) {
			*pp = s->next;
			break;
		}
	}
	step_free(c, s);
}

static void step_abort(struct coord_step *s, int code, const char *fmt, ...)
	CKPT_PRINTF(3, 4);
static void step_abort(struct coord_step *s, int code, const char *fmt, ...)
{
	if (s->abort_code)
		return;                 /* the first reason stands */
	s->abort_code = code;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(s->why, sizeof s->why, fmt, ap);
	va_end(ap);
}

/* A rank that had not voted never will: its steps cannot commit. True if any
 * step was hurt. how: "disconnected", "was lost by its node leader", ... */
static bool rank_lost(struct commit_coord *c, uint32_t rank, const char *how, const char *why)
{
	bool hurt = false;
	pthread_mutex_lock(&c->lock);
	c->ranks_left++;
	pthread_mutex_unlock(&c->lock);
	for (struct coord_step *s = c->steps; s; s = s->next) {
		if (!s->payloads[rank]) {
			step_abort(s, CKPT_EABORTED, "rank %u %s before voting for step %llu (%s)", rank,
			           how, (unsigned long long)s->step, why);
			hurt = true;
		}
	}
	return hurt;
}

/* ------------------------------------------------------------------ links */

static void link_drop(struct commit_coord *c, uint32_t l, const char *why)
{
	struct coord_link *k = &c->links[l];
	bool hurt = false;
	if (k->relay) {
		char how[96];
		snprintf(how, sizeof how, "disconnected (its node leader, rank %u, is gone)", l);
		for (uint32_t i = 0; i < k->nranks; i++)
			hurt |= rank_lost(c, k->ranks[i], how, why);
	} else {
		hurt = rank_lost(c, l, "disconnected", why);
	}
	/* A rank (or a node) leaving between saves is the normal end of a job. */
	if (k->relay)
		ckpt_log(hurt ? CKPT_LOG_WARN : CKPT_LOG_INFO, "coordinator: closing %s, the leader "
		         "of node %u (%u ranks): %s", net_conn_name(k->conn), k->node, k->nranks, why);
	else
		ckpt_log(hurt ? CKPT_LOG_WARN : CKPT_LOG_INFO, "coordinator: closing %s: %s",
		         net_conn_name(k->conn), why);
	/* The ranks are free again before the peer can see the close: one that
	 * reconnects at once must not be refused as still connected. */
	pthread_mutex_lock(&c->lock);
	if (k->relay) {
		for (uint32_t i = 0; i < k->nranks; i++)
			c->owner[k->ranks[i]] = NO_OWNER;
	} else {
		c->owner[l] = NO_OWNER;
	}
	pthread_mutex_unlock(&c->lock);
	net_close(k->conn);
	ckpt_free(k->ranks);
	memset(k, 0, sizeof *k);
}

/* Send one rank a status (BEGIN_REPLY, or a DECISION for it alone): on its own
 * link as is, through its leader tagged with its rank. */
static int send_status(struct commit_coord *c, uint32_t l, uint32_t rank, uint16_t type,
                       uint64_t step, uint64_t save_id, int code, const char *reason)
{
	struct commit_status_msg m = { .step = step, .code = code, .save_id = save_id };
	snprintf(m.reason, sizeof m.reason, "%s", reason ? reason : "");
	struct ckpt_buf b, t;
	ckpt_buf_init(&b);
	ckpt_buf_init(&t);
	int rc = commit_status_encode(&m, &b);
	if (!rc && c->links[l].relay) {
		rc = commit_relay_encode(rank, type, b.p, b.len, &t);
		if (!rc)
			rc = net_send(c->links[l].conn, COMMIT_MSG_TO_RANK, t.p, t.len, SEND_TIMEOUT_MS);
	} else if (!rc) {
		rc = net_send(c->links[l].conn, type, b.p, b.len, SEND_TIMEOUT_MS);
	}
	ckpt_buf_free(&b);
	ckpt_buf_free(&t);
	if (rc)
		link_drop(c, l, ckpt_err_msg());
	return rc;
}

/* The record of a new attempt at step, before any rank is told it may write. */
static int attempt_begin(struct commit_coord *c, struct coord_step *s)
{
	struct manifest_step id = { .step = s->step, .world = c->world, .save_id = s->save_id,
	                            .incarnation = c->incarnation };
	snprintf(id.job_id, sizeof id.job_id, "%s", c->job_id);
	return commit_attempt_begin(c->manifest, c->root, &id);
}

static void on_begin(struct commit_coord *c, uint32_t l, uint32_t rank, const void *p, size_t n)
{
	uint64_t step;
	if (commit_step_decode(p, n, &step)) {
		link_drop(c, l, ckpt_err_msg());
		return;
	}
	/* A step in flight: this rank joins its attempt. */
	struct coord_step *s = step_find(c, step, false);
	if (!s) {
		if (!(s = step_find(c, step, true))) {
			send_status(c, l, rank, COMMIT_MSG_BEGIN_REPLY, step, 0, -ENOMEM,
			            "coordinator out of memory");
			return;
		}
		s->save_id = ckpt_random_id();
		int rc = attempt_begin(c, s);
		if (rc) {
			char why[COMMIT_MAX_REASON];
			snprintf(why, sizeof why, "%s", ckpt_err_msg());
			step_unlink(c, s);
			send_status(c, l, rank, COMMIT_MSG_BEGIN_REPLY, step, 0, rc, why);
			return;
		}
	}
	s->began[rank] = true;
	send_status(c, l, rank, COMMIT_MSG_BEGIN_REPLY, step, s->save_id, 0, NULL);
}

/* rank's vote: the PREPARE payload lies at offset off of m's (off > 0: relayed). */
static void on_prepare(struct commit_coord *c, uint32_t l, uint32_t rank, struct net_msg *m,
                       size_t off)
{
	uint64_t t_recv = ckpt_now_ns();
	struct commit_vote v;
	if (commit_prepare_decode((const uint8_t *)m->payload + off, m->len - off, &v)) {
		link_drop(c, l, ckpt_err_msg());
		return;
	}
	if (v.rank != rank) {
		/* A rank may only vote for itself; a leader only as the rank it relays. */
		char why[128];
		if (c->links[l].relay)
			snprintf(why, sizeof why, "the node leader relayed, as rank %u, a vote for rank %u",
			         rank, v.rank);
		else
			snprintf(why, sizeof why, "rank %u sent a vote for rank %u", rank, v.rank);
		link_drop(c, l, why);
		return;
	}
	/* Only BEGIN creates a step, and only after the manifest said the step is not
	 * committed; this coordinator alone commits, so a step in flight is not
	 * committed and needs no look-up here. */
	struct coord_step *s = step_find(c, v.step, false);
	if (!s || !s->began[rank] || v.save_id != s->save_id) {
		struct manifest_step rec;
		if (manifest_step_get(c->manifest, v.step, &rec) == 0 &&
		    rec.state == CKPT_STATE_COMMITTED) {
			ckpt_log(CKPT_LOG_WARN, "coordinator: ignoring a PREPARE of rank %u for committed "
			         "step %llu", rank, (unsigned long long)v.step);
			return;
		}
		/* Late (its step was decided) or never begun: not a vote. The rank hears
		 * so, in case it is still waiting; a rank keeps the first decision. */
		char why[128];
		snprintf(why, sizeof why, "step %llu: the vote of rank %u came for no save in flight "
		         "that it had begun (attempt %016llx)", (unsigned long long)v.step, rank,
		         (unsigned long long)v.save_id);
		ckpt_log(CKPT_LOG_WARN, "coordinator: ignoring it: %s", why);
		send_status(c, l, rank, COMMIT_MSG_DECISION, v.step, v.save_id, CKPT_EABORTED, why);
		return;
	}
	if (s->payloads[rank]) {
		ckpt_log(CKPT_LOG_WARN, "coordinator: ignoring a replayed PREPARE of rank %u for step %llu",
		         rank, (unsigned long long)v.step);
		return;
	}
	s->payloads[rank] = m->payload;      /* the vote's index points into it */
	m->payload = NULL;
	s->votes[rank] = v;
	/* Decode and check the vote now, while other ranks are still writing: when the
	 * last vote arrives, only its own checks and the commit are left. Its shard
	 * record for the commit transaction is built now too. */
	struct io_shard_index *ix;
	if (io_index_decode(v.index, v.index_len, &ix)) {
		step_abort(s, CKPT_EABORTED, "step %llu: the index of rank %u does not decode: %s",
		           (unsigned long long)v.step, rank, ckpt_err_msg());
	} else if (ix->rank != rank || ix->step != v.step || ix->save_id != s->save_id) {
		step_abort(s, CKPT_EABORTED, "step %llu: rank %u voted with the index of step %llu "
		           "rank %u attempt %016llx (this attempt is %016llx)",
		           (unsigned long long)v.step, rank, (unsigned long long)ix->step, ix->rank,
		           (unsigned long long)ix->save_id, (unsigned long long)s->save_id);
		io_index_free(ix);
	} else {
		const char *holder = c->shard_holder ? c->shard_holder(c->holder_arg, rank) : NULL;
		commit_shard_record(v.step, &v, ix, holder, s->paths[rank], &s->shards[rank]);
		/* The vote is held to the file it names: a vote whose file is not there, or
		 * not the one voted for (a replayed or forged index), commits nothing. */
		char path[4400];
		int frc = 0;
		if (holder) {
			frc = c->remote_check(c->holder_arg, holder, strchr(s->paths[rank], '/') + 1,
			                      v.file_size, ix->data_end, v.index_len, v.footer_hash);
		} else if (c->root) {
			snprintf(path, sizeof path, "%s/%s", c->root, s->paths[rank]);
			frc = io_shard_trailer_check(path, v.file_size, ix->data_end, v.index_len,
			                             v.footer_hash);
		}
		if (frc == CKPT_ECORRUPT || frc == CKPT_EFORMAT || (frc && !holder)) {
			step_abort(s, CKPT_EABORTED, "step %llu: the vote of rank %u does not match the "
			           "shard it names: %s", (unsigned long long)v.step, rank, ckpt_err_msg());
			io_index_free(ix);
		} else if (frc) {
			/* The holder could not answer: nothing is known against the vote, but it
			 * cannot be held to its file either. */
			step_abort(s, CKPT_EABORTED, "step %llu: the shard of rank %u could not be checked "
			           "on %s, which holds it: %s", (unsigned long long)v.step, rank, holder,
			           ckpt_err_msg());
			io_index_free(ix);
		} else if (commit_gather_add(s->gather, ix)) {
			step_abort(s, CKPT_EABORTED, "%s", ckpt_err_msg());
		}
	}
	s->t_last_recv = t_recv;
	s->t_last_done = ckpt_now_ns();
	/* Stragglers get timeout_ms from the first vote: the save's own duration is
	 * not bounded here, only the wait for the last rank once one is done. */
	if (!s->nvotes++)
		s->deadline_ns = ckpt_deadline_ms(c->timeout_ms);
}

static void on_abort(struct commit_coord *c, uint32_t l, uint32_t rank, const void *p, size_t n)
{
	struct commit_status_msg st;
	if (commit_status_decode(p, n, &st)) {
		link_drop(c, l, ckpt_err_msg());
		return;
	}
	struct coord_step *s = step_find(c, st.step, false);
	/* An ABORT names the attempt it gives up: one for an earlier attempt of the
	 * step (sent after that one was decided) does not touch the current one. */
	if (s && (!st.save_id || st.save_id == s->save_id))
		step_abort(s, CKPT_EABORTED, "rank %u failed: %s", rank, st.reason);
}

/* A node leader announces the ranks it speaks for: all inside the world, its own
 * rank among them, none served by another link or in a handshake. Refused: the
 * leader hears why, and the link is closed. */
static void on_relay_hello(struct commit_coord *c, uint32_t l, const struct net_msg *m)
{
	uint32_t node, *ranks, n;
	if (commit_hello_decode(m->payload, m->len, &node, &ranks, &n)) {
		link_drop(c, l, ckpt_err_msg());
		return;
	}
	char why[192] = "";
	bool self = false;
	pthread_mutex_lock(&c->lock);
	for (uint32_t i = 0; i < n && !why[0]; i++) {
		uint32_t r = ranks[i];
		if (r >= c->world)
			snprintf(why, sizeof why, "rank %u is out of range for world size %u", r, c->world);
		else if (r == l)
			self = true;
		else if (c->owner[r] != NO_OWNER || commit_acceptor_holds_locked(c->acc, r))
			snprintf(why, sizeof why, "rank %u is already connected%s", r,
			         c->owner[r] != NO_OWNER && c->owner[r] != r ? " through another leader" : "");
	}
	if (!why[0] && !self)
		snprintf(why, sizeof why, "its own rank %u is not among the ranks it announced", l);
	if (!why[0])
		for (uint32_t i = 0; i < n; i++)
			c->owner[ranks[i]] = l;
	pthread_mutex_unlock(&c->lock);
	struct coord_link *k = &c->links[l];
	if (why[0]) {
		char full[COMMIT_MAX_REASON];
		snprintf(full, sizeof full, "node leader (rank %u) of node %u refused: %s", l, node, why);
		ckpt_free(ranks);
		if (!send_status(c, l, l, COMMIT_MSG_RELAY_WELCOME, 0, 0, CKPT_EPEER, full))
			link_drop(c, l, full);
		return;
	}
	k->relay = true;
	k->node = node;
	k->ranks = ranks;
	k->nranks = n;
	ckpt_log(CKPT_LOG_INFO, "coordinator: %s leads node %u: ranks %u..%u (%u)",
	         net_conn_name(k->conn), node, ranks[0], ranks[n - 1], n);
	struct commit_status_msg ok = { .step = 0, .code = 0 };
	struct ckpt_buf b;
	ckpt_buf_init(&b);
	int rc = commit_status_encode(&ok, &b);
	if (!rc)
		rc = net_send(k->conn, COMMIT_MSG_RELAY_WELCOME, b.p, b.len, SEND_TIMEOUT_MS);
	ckpt_buf_free(&b);
	if (rc)
		link_drop(c, l, ckpt_err_msg());
}

/* A message a node leader relays for one of its ranks. */
static void on_relayed(struct commit_coord *c, uint32_t l, struct net_msg *m)
{
	uint32_t rank;
	uint16_t type;
	const uint8_t *inner;
	size_t n;
	if (commit_relay_decode(m->payload, m->len, &rank, &type, &inner, &n)) {
		link_drop(c, l, ckpt_err_msg());
		return;
	}
	if (rank >= c->world || c->owner[rank] != l) {
		char why[160];
		snprintf(why, sizeof why, "the node leader relayed a message for rank %u, which is "
		         "not among the ranks it announced", rank);
		link_drop(c, l, why);
		return;
	}
	switch (type) {
	case COMMIT_MSG_BEGIN:   on_begin(c, l, rank, inner, n); break;
	case COMMIT_MSG_PREPARE: on_prepare(c, l, rank, m, COMMIT_RELAY_TAG_BYTES); break;
	case COMMIT_MSG_ABORT:   on_abort(c, l, rank, inner, n); break;
	default: {
		char why[96];
		snprintf(why, sizeof why, "the node leader relayed a message of type %u for rank %u",
		         type, rank);
		link_drop(c, l, why);
	}
	}
}

static void on_rank_gone(struct commit_coord *c, uint32_t l, const struct net_msg *m)
{
	uint32_t rank;
	char reason[COMMIT_MAX_REASON + 1];
	if (commit_gone_decode(m->payload, m->len, &rank, reason)) {
		link_drop(c, l, ckpt_err_msg());
		return;
	}
	if (rank >= c->world || c->owner[rank] != l) {
		char why[160];
		snprintf(why, sizeof why, "the node leader reported rank %u gone, which is not among "
		         "the ranks it announced", rank);
		link_drop(c, l, why);
		return;
	}
	bool hurt = rank_lost(c, rank, "disconnected from its node leader", reason);
	ckpt_log(hurt ? CKPT_LOG_WARN : CKPT_LOG_INFO, "coordinator: rank %u left node leader %s: %s",
	         rank, net_conn_name(c->links[l].conn), reason);
}

static void link_read(struct commit_coord *c, uint32_t l)
{
	struct coord_link *k = &c->links[l];
	while (k->conn) {
		struct net_msg m;
		int rc = net_recv(k->conn, &m, 0);
		if (rc == -EAGAIN)
			return;
		if (rc) {
			link_drop(c, l, rc == -ECONNRESET ? "peer closed the connection" : ckpt_err_msg());
			return;
		}
		bool first = !k->used;
		k->used = true;
		char why[96] = "";
		if (k->relay) {
			switch (m.type) {
			case COMMIT_MSG_RELAYED:   on_relayed(c, l, &m); break;
			case COMMIT_MSG_RANK_GONE: on_rank_gone(c, l, &m); break;
			default: snprintf(why, sizeof why, "unexpected message type %u from a node leader",
			                  m.type);
			}
		} else {
			switch (m.type) {
			case COMMIT_MSG_BEGIN:   on_begin(c, l, l, m.payload, m.len); break;
			case COMMIT_MSG_PREPARE: on_prepare(c, l, l, &m, 0); break;
			case COMMIT_MSG_ABORT:   on_abort(c, l, l, m.payload, m.len); break;
			case COMMIT_MSG_RELAY_HELLO:
				if (first)
					on_relay_hello(c, l, &m);
				else
					snprintf(why, sizeof why, "RELAY_HELLO after other messages");
				break;
			default: snprintf(why, sizeof why, "unexpected message type %u", m.type);
			}
		}
		if (why[0])
			link_drop(c, l, why);
		net_msg_free(&m);
	}
}

/* ------------------------------------------------------------------ decisions */

/* The decision to every link: a rank's own, or once per node leader, which hands
 * it to its ranks. Returns the number of sends. */
static uint32_t broadcast(struct commit_coord *c, const struct coord_step *s, int code,
                          const char *why)
{
	uint64_t step = s->step;
	if (ckpt_fault(CKPT_FP_BEFORE_DECISION_SEND) == CKPT_FA_DROP)
		return 0;
	/* One encoding for every link: the broadcast is on the commit's critical path. */
	struct commit_status_msg m = { .step = step, .code = code, .save_id = s->save_id };
	snprintf(m.reason, sizeof m.reason, "%s", why ? why : "");
	struct ckpt_buf b;
	ckpt_buf_init(&b);
	if (commit_status_encode(&m, &b)) {
		ckpt_log(CKPT_LOG_ERROR, "coordinator: step %llu: cannot encode the decision: %s",
		         (unsigned long long)step, ckpt_err_msg());
		ckpt_buf_free(&b);
		/* As for a send that fails: a rank that cannot be told is dropped, and learns
		 * now what waiting for the decision would tell it only at its timeout (in doubt
		 * after its vote: the manifest decides). */
		for (uint32_t l = 0; l < c->world; l++)
			if (c->links[l].conn)
				link_drop(c, l, "the coordinator could not encode the decision");
		return 0;
	}
	uint32_t sends = 0;
	for (uint32_t l = 0; l < c->world; l++) {
		if (!c->links[l].conn)
			continue;
		sends++;
		if (net_send(c->links[l].conn, COMMIT_MSG_DECISION, b.p, b.len, SEND_TIMEOUT_MS))
			link_drop(c, l, ckpt_err_msg());
	}
	ckpt_buf_free(&b);
	return sends;
}

/* Keep written space in data.mdb for the next commits (manifest_reserve), after
 * the decision is out: a commit that does not extend the file syncs its pages
 * and no file size. Room for ~16 steps of W shard records (~256 bytes of leaf
 * page each), at least 1 MiB, at most 64 MiB (a refill, up to twice that, runs
 * on this thread: ~1-3 ms every ~16 steps at W = 256). A failure costs only
 * that: logged. */
static void reserve(struct commit_coord *c)
{
	uint64_t slack = (uint64_t)c->world * 4096u;
	if (slack < (1u << 20))
		slack = 1u << 20;
	if (slack > (64u << 20))
		slack = 64u << 20;
	if (manifest_reserve(c->manifest, slack))
		ckpt_log(CKPT_LOG_WARN, "coordinator: %s", ckpt_err_msg());
}

static void step_decide(struct commit_coord *c, struct coord_step *s)
{
	int code = s->abort_code;
	char why[COMMIT_MAX_REASON];
	snprintf(why, sizeof why, "%s", s->why);
	uint64_t t_commit = ckpt_now_ns();
	struct manifest_step id = { .step = s->step, .world = c->world, .save_id = s->save_id,
	                            .incarnation = c->incarnation };
	snprintf(id.job_id, sizeof id.job_id, "%s", c->job_id);
	/* The step keeps rank 0's metadata (its vote's bytes live in payloads[0] until
	 * the step is freed); what other ranks might send is ignored. */
	id.meta = s->votes[0].meta;
	id.meta_len = (uint32_t)s->votes[0].meta_len;
	if (!code) {
		int rc = commit_decide(c->manifest, &id, &(struct commit_decision){
			.shards = s->shards, .gather = s->gather, .trust_manifest = true });
		/* The reason goes to the ranks. */
		snprintf(why, sizeof why, "%s", rc ? ckpt_err_msg() : "");
		if (rc) {
			code = rc == -EEXIST ? -EEXIST : CKPT_EABORTED;
			ckpt_log(CKPT_LOG_WARN, "coordinator: step %llu not committed: %s",
			         (unsigned long long)s->step, why);
		}
	} else {
		ckpt_log(CKPT_LOG_WARN, "coordinator: step %llu aborted: %s",
		         (unsigned long long)s->step, why);
		commit_decide(c->manifest, &id, &(struct commit_decision){ .abort = true, .why = why });
	}
	if (c->on_decision)
		c->on_decision(c->holder_arg, s->step, code);
	uint64_t t_sent = ckpt_now_ns();
	uint32_t sends = broadcast(c, s, code, why);
	uint64_t t_end = ckpt_now_ns();
	if (!code && s->t_last_recv) {
		pthread_mutex_lock(&c->lock);
		c->stats = (struct commit_coord_stats){
			.step = s->step, .last_vote_ns = s->t_last_done - s->t_last_recv,
			.commit_ns = t_sent - t_commit, .broadcast_ns = t_end - t_sent,
			.total_ns = t_end - s->t_last_recv, .sends = sends,
		};
		pthread_mutex_unlock(&c->lock);
	}
	reserve(c);
}

/* Decide what can be decided; returns ms until the next deadline (or -1). */
static int steps_process(struct commit_coord *c)
{
	uint64_t next = 0;
	bool lower_pending = false;
	struct coord_step **pp = &c->steps;
	while (*pp) {
		struct coord_step *s = *pp;
		bool all_in = s->nvotes == c->world;
		if (!s->abort_code && !all_in && s->deadline_ns && ckpt_deadline_passed(s->deadline_ns)) {
			char missing[256] = "";
			size_t n = 0;
			for (uint32_t r = 0; r < c->world && n + 12 < sizeof missing; r++)
				if (!s->payloads[r])
					n += (size_t)snprintf(missing + n, sizeof missing - n, "%s%u", n ? "," : "", r);
			step_abort(s, CKPT_EABORTED, "step %llu timed out after %u ms waiting for the votes "
			           "of ranks %s", (unsigned long long)s->step, c->timeout_ms, missing);
		}
		if (s->abort_code || (all_in && !lower_pending)) {
			step_decide(c, s);
			*pp = s->next;
			step_free(c, s);
			continue;
		}
		lower_pending = true;
		if (!all_in && s->deadline_ns && (!next || s->deadline_ns < next))
			next = s->deadline_ns;
		pp = &s->next;
	}
	if (!next)
		return -1;
	int ms = ckpt_deadline_left_ms(next);
	return ms > 1000 ? 1000 : ms;
}

/* ------------------------------------------------------------------ the loop */

/* Connections whose handshake is done become links (a rank's own, until it
 * announces itself as a node leader). */
static void links_take(struct commit_coord *c)
{
	pthread_mutex_lock(&c->lock);
	uint32_t rank;
	struct net_conn *conn;
	while ((conn = commit_acceptor_take_locked(c->acc, &rank))) {
		c->links[rank] = (struct coord_link){ .conn = conn };
		c->owner[rank] = rank;
	}
	pthread_mutex_unlock(&c->lock);
}

static void *coord_main(void *arg)
{
	struct commit_coord *c = arg;
	struct pollfd *pf = c->pf;
	uint32_t *who = c->who;
	for (;;) {
		pthread_mutex_lock(&c->lock);
		bool stop = c->stop;
		pthread_mutex_unlock(&c->lock);
		if (stop)
			break;
		links_take(c);
		int timeout = steps_process(c);
		/* The listener is left out while the acceptor has no room or pauses
		 * (accept.c): polled, it would stay readable and the loop would spin. */
		bool listening = commit_acceptor_listening(c->acc, &timeout);
		nfds_t n = 0;
		pf[n++] = (struct pollfd){ .fd = c->wake[0], .events = POLLIN };
		pf[n++] = (struct pollfd){ .fd = listening ? net_listener_fd(c->lis) : -1,
		                           .events = POLLIN };
		for (uint32_t l = 0; l < c->world; l++) {
			if (c->links[l].conn) {
				who[n] = l;
				pf[n++] = (struct pollfd){ .fd = net_conn_fd(c->links[l].conn), .events = POLLIN };
			}
		}
		if (poll(pf, n, timeout) < 0 && errno != EINTR)
			ckpt_log(CKPT_LOG_ERROR, "coordinator: poll: %s", ckpt_strerror(-errno));
		if (pf[0].revents) {
			char buf[64];
			while (read(c->wake[0], buf, sizeof buf) > 0)
				;
		}
		if (pf[1].revents)
			commit_acceptor_accept(c->acc);
		for (nfds_t i = 2; i < n; i++)
			if (pf[i].revents)
				link_read(c, who[i]);
	}
	return NULL;
}

int commit_coord_start(const struct commit_coord_opts *o, struct commit_coord **out)
{
	*out = NULL;
	if (!o || !o->manifest || !o->job_id || !o->addr || o->world == 0 ||
	    (o->secret_len && !o->secret))
		return ckpt_err(-EINVAL, "coordinator: needs a manifest, a job id, an address, a "
		                "world size > 0 and a secret of the given length");
	struct commit_coord *c = ckpt_calloc(1, sizeof *c);
	if (!c)
		return ckpt_err(-ENOMEM, "coordinator");
	c->wake[0] = c->wake[1] = -1;
	pthread_mutex_init(&c->lock, NULL);
	c->manifest = o->manifest;
	c->world = o->world;
	c->timeout_ms = o->timeout_ms;
	reserve(c);
	c->job_id = ckpt_strdup(o->job_id);
	c->root = o->root ? ckpt_strdup(o->root) : NULL;
	if (o->shard_holder && o->remote_check) {
		c->shard_holder = o->shard_holder;
		c->remote_check = o->remote_check;
	}
	c->holder_arg = o->holder_arg;
	c->on_decision = o->on_decision;
	c->incarnation = o->incarnation;
	c->links = ckpt_calloc(o->world, sizeof *c->links);
	c->pf = ckpt_calloc((size_t)o->world + 2, sizeof *c->pf);
	c->who = ckpt_calloc((size_t)o->world + 2, sizeof *c->who);
	c->owner = ckpt_malloc(o->world * sizeof *c->owner);
	if (c->owner)
		for (uint32_t r = 0; r < o->world; r++)
			c->owner[r] = NO_OWNER;
	if (o->secret_len) {
		c->secret = ckpt_malloc(o->secret_len);
		if (c->secret)
			memcpy(c->secret, o->secret, o->secret_len);
		c->secret_len = o->secret_len;
	}
	int rc;
	if (!c->job_id || !c->links || !c->pf || !c->who || !c->owner ||
	    (o->secret_len && !c->secret) || (o->root && !c->root)) {
		rc = ckpt_err(-ENOMEM, "coordinator");
		goto fail;
	}
	if (pipe2(c->wake, O_NONBLOCK | O_CLOEXEC) < 0) {
		rc = ckpt_err(-errno, "coordinator wake pipe");
		goto fail;
	}
	if ((rc = net_listen(o->transport, o->rdma, o->addr, o->port, &c->lis))) {
		ckpt_err_prefix(rc, "coordinator of job '%s' on %s:%u", o->job_id, o->addr, o->port);
		goto fail;
	}
	struct commit_acceptor_opts ao = {
		.lis = c->lis, .job_id = c->job_id, .world = c->world, .secret = c->secret,
		.secret_len = c->secret_len, .lock = &c->lock, .admit = coord_admit, .arg = c,
		.wake_fd = c->wake[1], .who = "coordinator",
	};
	if ((rc = commit_acceptor_create(&ao, &c->acc)))
		goto fail;
	if ((rc = ckpt_thread_create(&c->thread, NULL, coord_main, c))) {
		rc = ckpt_err(-rc, "coordinator thread");
		goto fail;
	}
	c->thread_started = true;
	ckpt_log(CKPT_LOG_INFO, "coordinator of job '%s' listening on %s:%u for %u ranks", o->job_id,
	         o->addr, net_listener_port(c->lis), o->world);
	*out = c;
	return 0;
fail:
	commit_coord_stop(c);
	return rc;
}

int commit_coord_last_stats(struct commit_coord *c, struct commit_coord_stats *out)
{
	pthread_mutex_lock(&c->lock);
	*out = c->stats;
	pthread_mutex_unlock(&c->lock);
	return out->step || out->total_ns ? 0 : CKPT_ENOTFOUND;
}

uint64_t commit_coord_ranks_left(struct commit_coord *c)
{
	pthread_mutex_lock(&c->lock);
	uint64_t n = c->ranks_left;
	pthread_mutex_unlock(&c->lock);
	return n;
}

unsigned commit_coord_port(const struct commit_coord *c)
{
	return net_listener_port(c->lis);
}

void commit_coord_stop(struct commit_coord *c)
{
	if (!c)
		return;
	pthread_mutex_lock(&c->lock);
	c->stop = true;
	pthread_mutex_unlock(&c->lock);
	if (c->thread_started) {
		coord_wake(c);
		pthread_join(c->thread, NULL);
	}
	/* Handshakes still running are broken and waited for, before the wake pipe
	 * they write to is closed. */
	commit_acceptor_free(c->acc);
	for (uint32_t l = 0; c->links && l < c->world; l++) {
		net_close(c->links[l].conn);
		ckpt_free(c->links[l].ranks);
	}
	while (c->steps) {
		struct coord_step *s = c->steps;
		c->steps = s->next;
		step_free(c, s);
	}
	net_listener_close(c->lis);
	if (c->wake[0] >= 0) {
		close(c->wake[0]);
		close(c->wake[1]);
	}
	if (c->secret) {
		explicit_bzero(c->secret, c->secret_len);
		ckpt_free(c->secret);
	}
	ckpt_free(c->job_id);
	ckpt_free(c->root);
	ckpt_free(c->links);
	ckpt_free(c->pf);
	ckpt_free(c->who);
	ckpt_free(c->owner);
	pthread_mutex_destroy(&c->lock);
	ckpt_free(c);
}
