/*
 * coordinator.c — the commit coordinator (DESIGN §6): gathers each step's W votes
 * over lib/net, checking each as it arrives (gather.c), decides in step order, and
 * broadcasts the decision.
 *
 * One thread runs a poll loop over the listener and the W rank connections; it
 * never blocks on a peer (net_recv with timeout 0 keeps partial progress). The
 * handshake of a new connection runs in a short-lived thread of its own, so a
 * silent or hostile client costs a thread for the handshake timeout, not the job.
 *
 * Presumed abort: a step aborts when a rank asks for it, when a rank that has not
 * voted disconnects, or when its votes are not all in timeout_ms after its first
 * vote. A step with every vote in is decided only when no lower step is still in
 * flight, so commits are ordered by step; it does not time out while it waits.
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

#define HANDSHAKE_TIMEOUT_MS 10000
#define SEND_TIMEOUT_MS      5000

struct coord_step {
	uint64_t            step;
	uint64_t            deadline_ns;       /* 0 until the first vote */
	uint32_t            nvotes;
	bool               *began;             /* [world]: BEGIN of this attempt seen */
	int                 abort_code;        /* non-zero: abort with why */
	char                why[COMMIT_MAX_REASON];
	void              **payloads;          /* [world] PREPARE payloads (own the votes' bytes) */
	struct commit_vote *votes;             /* [world] */
	struct commit_gather *gather;          /* votes decoded and checked as they arrive */
	uint64_t            t_last_recv;       /* the last vote read off its connection */
	uint64_t            t_last_done;       /* ... and decoded and checked */
	struct coord_step  *next;              /* ascending by step */
};

struct commit_coord {
	struct manifest     *manifest;
	char                *job_id;
	uint32_t             world;
	void                *secret;
	size_t               secret_len;
	unsigned             timeout_ms;
	struct net_listener *lis;
	pthread_t            thread;
	int                  wake[2];

	/* Shared with handshake threads, under lock. */
	pthread_mutex_t      lock;
	pthread_cond_t       cond;
	struct net_conn    **conns;            /* [world]: established, owned by the loop */
	struct net_conn    **arrived;          /* [world]: handshaken, not yet taken by the loop */
	bool                *reserved;         /* [world]: a handshake claims this rank */
	unsigned             handshakes;       /* running handshake threads */
	struct handshake_arg *pending;         /* their connections, for stop to break */
	bool                 stop;

	struct coord_step   *steps;            /* loop thread only */
	struct commit_coord_stats stats;       /* last decided step, under lock */
};

struct handshake_arg {
	struct commit_coord  *c;
	struct net_conn      *conn;
	bool                  reserved;
	uint32_t              rank;
	struct handshake_arg *next;        /* c->pending, under c->lock, while it runs */
};

/* ------------------------------------------------------------------ handshakes */

static int coord_rank_check(void *arg, uint32_t rank, const char **why)
{
	struct handshake_arg *h = arg;
	struct commit_coord *c = h->c;
	int rc = 0;
	pthread_mutex_lock(&c->lock);
	if (c->conns[rank] || c->arrived[rank] || c->reserved[rank]) {
		*why = "that rank is already connected";
		rc = CKPT_EPEER;
	} else {
		c->reserved[rank] = true;
		h->reserved = true;
		h->rank = rank;
	}
	pthread_mutex_unlock(&c->lock);
	return rc;
}

static void coord_wake(struct commit_coord *c)
{
	char b = 1;
	ssize_t n = write(c->wake[1], &b, 1);
	(void)n;
}

static void *handshake_main(void *p)
{
	struct handshake_arg *h = p;
	struct commit_coord *c = h->c;
	struct net_auth a = { .job_id = c->job_id, .world = c->world, .secret = c->secret,
	                      .secret_len = c->secret_len };
	uint32_t rank = 0;
	int rc = net_handshake_server(h->conn, &a, coord_rank_check, h, &rank, HANDSHAKE_TIMEOUT_MS);
	if (rc)
		ckpt_log(CKPT_LOG_WARN, "coordinator: rejected %s: %s", net_conn_name(h->conn),
		         ckpt_err_msg());
	bool handed = false;
	pthread_mutex_lock(&c->lock);
	/* Off the pending list before its connection can be closed or handed on: stop
	 * breaks the connections on that list, under the same lock. */
	for (struct handshake_arg **pp = &c->pending; *pp; pp = &(*pp)->next) {
		if (*pp == h) {
			*pp = h->next;
			break;
		}
	}
	if (h->reserved)
		c->reserved[h->rank] = false;
	if (!rc && !c->stop) {
		c->arrived[rank] = h->conn;
		h->conn = NULL;
		handed = true;
	}
	pthread_mutex_unlock(&c->lock);
	net_close(h->conn);
	if (handed)
		coord_wake(c);
	/* The last touch of c: commit_coord_stop frees it (and closes the wake pipe)
	 * as soon as handshakes reaches 0. */
	pthread_mutex_lock(&c->lock);
	c->handshakes--;
	pthread_cond_broadcast(&c->cond);
	pthread_mutex_unlock(&c->lock);
	free(h);
	return NULL;
}

static void coord_accept(struct commit_coord *c)
{
	for (;;) {
		struct net_conn *conn;
		if (net_accept(c->lis, 0, &conn))
			return;
		struct handshake_arg *h = calloc(1, sizeof *h);
		pthread_t t;
		pthread_attr_t attr;
		pthread_attr_init(&attr);
		pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
		if (h) {
			h->c = c;
			h->conn = conn;
		}
		pthread_mutex_lock(&c->lock);
		c->handshakes++;
		if (h) {
			h->next = c->pending;
			c->pending = h;
		}
		pthread_mutex_unlock(&c->lock);
		if (!h || pthread_create(&t, &attr, handshake_main, h)) {
			ckpt_log(CKPT_LOG_ERROR, "coordinator: cannot start a handshake thread");
			pthread_mutex_lock(&c->lock);
			for (struct handshake_arg **pp = &c->pending; h && *pp; pp = &(*pp)->next) {
				if (*pp == h) {
					*pp = h->next;
					break;
				}
			}
			c->handshakes--;
			pthread_mutex_unlock(&c->lock);
			net_close(conn);
			free(h);
		}
		pthread_attr_destroy(&attr);
	}
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
	struct coord_step *s = calloc(1, sizeof *s);
	if (s) {
		s->payloads = calloc(c->world, sizeof *s->payloads);
		s->votes = calloc(c->world, sizeof *s->votes);
		s->began = calloc(c->world, sizeof *s->began);
		if (commit_gather_create(c->world, step, true, &s->gather))
			s->gather = NULL;
	}
	if (!s || !s->payloads || !s->votes || !s->began || !s->gather) {
		if (s) {
			free(s->payloads);
			free(s->votes);
			free(s->began);
			commit_gather_free(s->gather);
		}
		free(s);
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
		free(s->payloads[r]);
	free(s->payloads);
	free(s->votes);
	free(s->began);
	commit_gather_free(s->gather);
	free(s);
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

/* ------------------------------------------------------------------ connections */

static void conn_drop(struct commit_coord *c, uint32_t rank, const char *why)
{
	/* A rank that had not voted never will: its steps cannot commit. */
	bool hurt = false;
	for (struct coord_step *s = c->steps; s; s = s->next) {
		if (!s->payloads[rank]) {
			step_abort(s, CKPT_EABORTED, "rank %u disconnected before voting for step %llu (%s)",
			           rank, (unsigned long long)s->step, why);
			hurt = true;
		}
	}
	/* A rank leaving between saves is the normal end of a job. */
	ckpt_log(hurt ? CKPT_LOG_WARN : CKPT_LOG_INFO, "coordinator: closing %s: %s",
	         net_conn_name(c->conns[rank]), why);
	net_close(c->conns[rank]);
	pthread_mutex_lock(&c->lock);
	c->conns[rank] = NULL;
	pthread_mutex_unlock(&c->lock);
}

static int send_status(struct commit_coord *c, uint32_t rank, uint16_t type, uint64_t step,
                       int code, const char *reason)
{
	struct commit_status_msg m = { .step = step, .code = code };
	snprintf(m.reason, sizeof m.reason, "%s", reason ? reason : "");
	struct ckpt_buf b;
	ckpt_buf_init(&b);
	int rc = commit_status_encode(&m, &b);
	if (!rc)
		rc = net_send(c->conns[rank], type, b.p, b.len, SEND_TIMEOUT_MS);
	ckpt_buf_free(&b);
	if (rc)
		conn_drop(c, rank, ckpt_err_msg());
	return rc;
}

static void on_begin(struct commit_coord *c, uint32_t rank, const struct net_msg *m)
{
	uint64_t step;
	if (commit_step_decode(m->payload, m->len, &step)) {
		conn_drop(c, rank, ckpt_err_msg());
		return;
	}
	struct manifest_step rec;
	int rc = manifest_step_get(c->manifest, step, &rec);
	if (rc == 0 && rec.state == CKPT_STATE_COMMITTED) {
		char why[96];
		snprintf(why, sizeof why, "step %llu is already committed", (unsigned long long)step);
		send_status(c, rank, COMMIT_MSG_BEGIN_REPLY, step, -EEXIST, why);
		return;
	}
	if (rc && rc != CKPT_ENOTFOUND) {
		send_status(c, rank, COMMIT_MSG_BEGIN_REPLY, step, rc, ckpt_err_msg());
		return;
	}
	struct coord_step *s = step_find(c, step, true);
	if (!s) {
		send_status(c, rank, COMMIT_MSG_BEGIN_REPLY, step, -ENOMEM, "coordinator out of memory");
		return;
	}
	s->began[rank] = true;
	send_status(c, rank, COMMIT_MSG_BEGIN_REPLY, step, 0, NULL);
}

static void on_prepare(struct commit_coord *c, uint32_t rank, struct net_msg *m)
{
	uint64_t t_recv = ckpt_now_ns();
	struct commit_vote v;
	if (commit_prepare_decode(m->payload, m->len, &v)) {
		conn_drop(c, rank, ckpt_err_msg());
		return;
	}
	if (v.rank != rank) {
		/* An authenticated rank may only vote for itself. */
		char why[96];
		snprintf(why, sizeof why, "rank %u sent a vote for rank %u", rank, v.rank);
		conn_drop(c, rank, why);
		return;
	}
	struct manifest_step rec;
	if (manifest_step_get(c->manifest, v.step, &rec) == 0 && rec.state == CKPT_STATE_COMMITTED) {
		ckpt_log(CKPT_LOG_WARN, "coordinator: ignoring a PREPARE of rank %u for committed step %llu",
		         rank, (unsigned long long)v.step);
		return;
	}
	struct coord_step *s = step_find(c, v.step, false);
	if (!s || !s->began[rank]) {
		/* Late (its step was decided) or never begun: not a vote. The rank hears
		 * so, in case it is still waiting; a rank keeps the first decision. */
		char why[128];
		snprintf(why, sizeof why, "step %llu: the vote of rank %u came for no save in flight "
		         "that it had begun", (unsigned long long)v.step, rank);
		ckpt_log(CKPT_LOG_WARN, "coordinator: ignoring it: %s", why);
		send_status(c, rank, COMMIT_MSG_DECISION, v.step, CKPT_EABORTED, why);
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
	 * last vote arrives, only its own checks and the commit are left. */
	struct io_shard_index *ix;
	if (io_index_decode(v.index, v.index_len, &ix)) {
		step_abort(s, CKPT_EABORTED, "step %llu: the index of rank %u does not decode: %s",
		           (unsigned long long)v.step, rank, ckpt_err_msg());
	} else if (ix->rank != rank || ix->step != v.step) {
		step_abort(s, CKPT_EABORTED, "step %llu: rank %u voted with the index of step %llu "
		           "rank %u", (unsigned long long)v.step, rank, (unsigned long long)ix->step,
		           ix->rank);
		io_index_free(ix);
	} else if (commit_gather_add(s->gather, ix)) {
		step_abort(s, CKPT_EABORTED, "%s", ckpt_err_msg());
	}
	s->t_last_recv = t_recv;
	s->t_last_done = ckpt_now_ns();
	/* Stragglers get timeout_ms from the first vote: the save's own duration is
	 * not bounded here, only the wait for the last rank once one is done. */
	if (!s->nvotes++)
		s->deadline_ns = ckpt_now_ns() + (uint64_t)c->timeout_ms * 1000000ull;
}

static void on_abort(struct commit_coord *c, uint32_t rank, const struct net_msg *m)
{
	struct commit_status_msg st;
	if (commit_status_decode(m->payload, m->len, &st)) {
		conn_drop(c, rank, ckpt_err_msg());
		return;
	}
	struct coord_step *s = step_find(c, st.step, false);
	if (s)
		step_abort(s, CKPT_EABORTED, "rank %u failed: %s", rank, st.reason);
}

static void conn_read(struct commit_coord *c, uint32_t rank)
{
	while (c->conns[rank]) {
		struct net_msg m;
		int rc = net_recv(c->conns[rank], &m, 0);
		if (rc == -EAGAIN)
			return;
		if (rc) {
			conn_drop(c, rank, rc == -ECONNRESET ? "peer closed the connection" : ckpt_err_msg());
			return;
		}
		switch (m.type) {
		case COMMIT_MSG_BEGIN:   on_begin(c, rank, &m); break;
		case COMMIT_MSG_PREPARE: on_prepare(c, rank, &m); break;
		case COMMIT_MSG_ABORT:   on_abort(c, rank, &m); break;
		default: {
			char why[64];
			snprintf(why, sizeof why, "unexpected message type %u", m.type);
			conn_drop(c, rank, why);
		}
		}
		net_msg_free(&m);
	}
}

/* ------------------------------------------------------------------ decisions */

static void broadcast(struct commit_coord *c, uint64_t step, int code, const char *why)
{
	if (ckpt_fault(CKPT_FP_BEFORE_DECISION_SEND) == CKPT_FA_DROP)
		return;
	/* One encoding for every rank: the broadcast is on the commit's critical path. */
	struct commit_status_msg m = { .step = step, .code = code };
	snprintf(m.reason, sizeof m.reason, "%s", why ? why : "");
	struct ckpt_buf b;
	ckpt_buf_init(&b);
	if (commit_status_encode(&m, &b)) {
		ckpt_log(CKPT_LOG_ERROR, "coordinator: step %llu: cannot encode the decision: %s",
		         (unsigned long long)step, ckpt_err_msg());
		ckpt_buf_free(&b);
		return;
	}
	for (uint32_t r = 0; r < c->world; r++)
		if (c->conns[r] && net_send(c->conns[r], COMMIT_MSG_DECISION, b.p, b.len, SEND_TIMEOUT_MS))
			conn_drop(c, r, ckpt_err_msg());
	ckpt_buf_free(&b);
}

static void step_decide(struct commit_coord *c, struct coord_step *s)
{
	int code = s->abort_code;
	char why[COMMIT_MAX_REASON];
	snprintf(why, sizeof why, "%s", s->why);
	uint64_t t_commit = ckpt_now_ns();
	if (!code) {
		int rc = commit_decide_gathered(c->manifest, c->job_id, s->step, c->world, s->votes,
		                                s->gather);
		/* The reason goes to the ranks: copied before the manifest is asked again. */
		snprintf(why, sizeof why, "%s", rc ? ckpt_err_msg() : "");
		/* The manifest decides: a failure after the commit transaction (an injected
		 * fault, a lost disk) does not undo it, and telling ranks to abort would make
		 * them delete the files of a committed step. */
		struct manifest_step rec;
		if (rc && manifest_step_get(c->manifest, s->step, &rec) == 0 &&
		    rec.state == CKPT_STATE_COMMITTED && rc != -EEXIST) {
			ckpt_log(CKPT_LOG_WARN, "coordinator: step %llu committed; then: %s",
			         (unsigned long long)s->step, why);
			rc = 0;
			why[0] = '\0';
		}
		if (rc) {
			code = rc == -EEXIST ? -EEXIST : CKPT_EABORTED;
			ckpt_log(CKPT_LOG_WARN, "coordinator: step %llu not committed: %s",
			         (unsigned long long)s->step, why);
		}
	} else {
		ckpt_log(CKPT_LOG_WARN, "coordinator: step %llu aborted: %s",
		         (unsigned long long)s->step, why);
		struct manifest_step rec;
		if (!(manifest_step_get(c->manifest, s->step, &rec) == 0 &&
		      rec.state == CKPT_STATE_COMMITTED))
			manifest_record_abort(c->manifest, s->step, c->world, why);
	}
	uint64_t t_sent = ckpt_now_ns();
	broadcast(c, s->step, code, why);
	uint64_t t_end = ckpt_now_ns();
	if (!code && s->t_last_recv) {
		pthread_mutex_lock(&c->lock);
		c->stats = (struct commit_coord_stats){
			.step = s->step, .last_vote_ns = s->t_last_done - s->t_last_recv,
			.commit_ns = t_sent - t_commit, .broadcast_ns = t_end - t_sent,
			.total_ns = t_end - s->t_last_recv,
		};
		pthread_mutex_unlock(&c->lock);
	}
}

/* Decide what can be decided; returns ms until the next deadline (or -1). */
static int steps_process(struct commit_coord *c)
{
	uint64_t now = ckpt_now_ns(), next = 0;
	bool lower_pending = false;
	struct coord_step **pp = &c->steps;
	while (*pp) {
		struct coord_step *s = *pp;
		bool all_in = s->nvotes == c->world;
		if (!s->abort_code && !all_in && s->deadline_ns && now >= s->deadline_ns) {
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
	uint64_t ms = next > now ? (next - now) / 1000000ull + 1 : 0;
	return ms > 1000 ? 1000 : (int)ms;
}

/* ------------------------------------------------------------------ the loop */

static void *coord_main(void *arg)
{
	struct commit_coord *c = arg;
	struct pollfd *pf = calloc(c->world + 2, sizeof *pf);
	uint32_t *who = calloc(c->world + 2, sizeof *who);
	if (!pf || !who) {
		ckpt_log(CKPT_LOG_ERROR, "coordinator: out of memory; not serving");
		free(pf);
		free(who);
		return NULL;
	}
	for (;;) {
		pthread_mutex_lock(&c->lock);
		bool stop = c->stop;
		for (uint32_t r = 0; r < c->world; r++) {
			if (c->arrived[r]) {
				c->conns[r] = c->arrived[r];
				c->arrived[r] = NULL;
			}
		}
		pthread_mutex_unlock(&c->lock);
		if (stop)
			break;
		int timeout = steps_process(c);
		nfds_t n = 0;
		pf[n++] = (struct pollfd){ .fd = c->wake[0], .events = POLLIN };
		pf[n++] = (struct pollfd){ .fd = net_listener_fd(c->lis), .events = POLLIN };
		for (uint32_t r = 0; r < c->world; r++) {
			if (c->conns[r]) {
				who[n] = r;
				pf[n++] = (struct pollfd){ .fd = net_conn_fd(c->conns[r]), .events = POLLIN };
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
			coord_accept(c);
		for (nfds_t i = 2; i < n; i++)
			if (pf[i].revents)
				conn_read(c, who[i]);
	}
	free(pf);
	free(who);
	return NULL;
}

int commit_coord_start(const struct commit_coord_opts *o, struct commit_coord **out)
{
	*out = NULL;
	if (!o || !o->manifest || !o->job_id || !o->addr || o->world == 0 ||
	    (o->secret_len && !o->secret))
		return ckpt_err(-EINVAL, "coordinator: needs a manifest, a job id, an address, a "
		                "world size > 0 and a secret of the given length");
	struct commit_coord *c = calloc(1, sizeof *c);
	if (!c)
		return ckpt_err(-ENOMEM, "coordinator");
	c->wake[0] = c->wake[1] = -1;
	pthread_mutex_init(&c->lock, NULL);
	pthread_cond_init(&c->cond, NULL);
	c->manifest = o->manifest;
	c->world = o->world;
	c->timeout_ms = o->timeout_ms;
	c->job_id = strdup(o->job_id);
	c->conns = calloc(o->world, sizeof *c->conns);
	c->arrived = calloc(o->world, sizeof *c->arrived);
	c->reserved = calloc(o->world, sizeof *c->reserved);
	if (o->secret_len) {
		c->secret = malloc(o->secret_len);
		if (c->secret)
			memcpy(c->secret, o->secret, o->secret_len);
		c->secret_len = o->secret_len;
	}
	int rc;
	if (!c->job_id || !c->conns || !c->arrived || !c->reserved || (o->secret_len && !c->secret)) {
		rc = ckpt_err(-ENOMEM, "coordinator");
		goto fail;
	}
	if (pipe2(c->wake, O_NONBLOCK | O_CLOEXEC) < 0) {
		rc = ckpt_err(-errno, "coordinator wake pipe");
		goto fail;
	}
	if ((rc = net_listen(o->transport, o->addr, o->port, &c->lis))) {
		ckpt_err_prefix(rc, "coordinator of job '%s' on %s:%u", o->job_id, o->addr, o->port);
		goto fail;
	}
	if ((rc = pthread_create(&c->thread, NULL, coord_main, c))) {
		rc = ckpt_err(-rc, "coordinator thread");
		goto fail;
	}
	ckpt_log(CKPT_LOG_INFO, "coordinator of job '%s' listening on %s:%u for %u ranks", o->job_id,
	         o->addr, net_listener_port(c->lis), o->world);
	*out = c;
	return 0;
fail:
	net_listener_close(c->lis);
	c->lis = NULL;
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
	if (c->lis) {
		coord_wake(c);
		pthread_join(c->thread, NULL);
	}
	/* Handshakes still running are waiting on silent peers: break their connections
	 * so that they end now, not at their timeout; they see stop and close. */
	pthread_mutex_lock(&c->lock);
	for (struct handshake_arg *h = c->pending; h; h = h->next)
		net_conn_shutdown(h->conn);
	while (c->handshakes)
		pthread_cond_wait(&c->cond, &c->lock);
	pthread_mutex_unlock(&c->lock);
	for (uint32_t r = 0; c->conns && r < c->world; r++) {
		net_close(c->conns[r]);
		net_close(c->arrived[r]);
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
		free(c->secret);
	}
	free(c->job_id);
	free(c->conns);
	free(c->arrived);
	free(c->reserved);
	pthread_mutex_destroy(&c->lock);
	pthread_cond_destroy(&c->cond);
	free(c);
}
