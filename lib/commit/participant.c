/*
 * participant.c — a rank's side of the two-phase commit (docs/protocol.md §2): BEGIN before
 * any file of a step is written (the coordinator refuses committed steps), PREPARE
 * once the shard is durable, then the decision.
 *
 * A receiver thread files BEGIN replies and decisions by step, so several saves
 * may be in flight and any thread may wait. Losing the coordinator before voting
 * aborts the save; losing it after voting leaves the outcome in doubt
 * (CKPT_EINDOUBT): the manifest decides, and this rank keeps its file.
 *
 * A decision may reach this rank before the reply to its BEGIN: the coordinator
 * aborted the step (another rank failed) while this rank's BEGIN was on the way,
 * and then took that BEGIN as the start of a new attempt. Such a rank must not
 * write or vote: its begin fails with the coordinator's reason, and it sends ABORT
 * so that the attempt its BEGIN opened is aborted too instead of waiting for votes
 * that will not come. Likewise a rank never votes for a step already decided.
 * The decision of an attempt this rank already gave up (or waited for) is told
 * apart by its save id: it may come after the rank began the step again (a save
 * retried at once), and is not the new attempt's.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commit/commit_internal.h"

struct part_entry {
	uint64_t           step;
	uint64_t           save_id;          /* the attempt this rank began (its BEGIN reply) */
	bool               begin_done, decided, prepared;
	int                begin_code, decision;
	char               begin_reason[COMMIT_MAX_REASON + 1];   /* the BEGIN reply's */
	char               reason[COMMIT_MAX_REASON + 1];         /* the decision's */
	struct part_entry *next;
};

#define PART_DONE 8

struct part_remote {
	struct commit_part base;              /* first: the ops (commit_internal.h) */
	struct net_conn   *conn;
	char               name[128];
	unsigned           timeout_ms;
	pthread_t          rx;
	bool               rx_started;
	pthread_mutex_t    send_lock;        /* one sender at a time on the connection */
	pthread_mutex_t    lock;             /* entries, lost, stop */
	pthread_cond_t     cond;
	struct part_entry *entries;
	/* Attempts this rank is done with (it gave them up, or took their decision),
	 * the newest PART_DONE: their decision, should it come after this rank began
	 * the step again, is not the new attempt's (rx_main). */
	struct { uint64_t step, save_id; } done[PART_DONE];
	unsigned           ndone;
	bool               lost, stop;
	char               lost_why[256];
};

static struct part_entry *entry_get(struct part_remote *p, uint64_t step, bool create)
{
	for (struct part_entry *e = p->entries; e; e = e->next)
		if (e->step == step)
			return e;
	if (!create)
		return NULL;
	struct part_entry *e = ckpt_calloc(1, sizeof *e);
	if (e) {
		e->step = step;
		e->next = p->entries;
		p->entries = e;
	}
	return e;
}

static void entry_drop(struct part_remote *p, uint64_t step)
{
	for (struct part_entry **pp = &p->entries; *pp; pp = &(*pp)->next) {
		if ((*pp)->step == step) {
			struct part_entry *e = *pp;
			*pp = e->next;
			ckpt_free(e);
			return;
		}
	}
}

/* Under p->lock. */
static void done_add(struct part_remote *p, uint64_t step, uint64_t save_id)
{
	if (!save_id)
		return;
	unsigned i = p->ndone++ % PART_DONE;
	p->done[i].step = step;
	p->done[i].save_id = save_id;
}

static bool done_has(const struct part_remote *p, uint64_t step, uint64_t save_id)
{
	unsigned n = p->ndone < PART_DONE ? p->ndone : PART_DONE;
	for (unsigned i = 0; i < n; i++)
		if (p->done[i].step == step && p->done[i].save_id == save_id)
			return true;
	return false;
}

static void part_lost(struct part_remote *p, const char *why)
{
	pthread_mutex_lock(&p->lock);
	if (!p->lost) {
		p->lost = true;
		snprintf(p->lost_why, sizeof p->lost_why, "%s", why);
	}
	pthread_cond_broadcast(&p->cond);
	pthread_mutex_unlock(&p->lock);
}

static void *rx_main(void *arg)
{
	struct part_remote *p = arg;
	for (;;) {
		pthread_mutex_lock(&p->lock);
		bool stop = p->stop;
		pthread_mutex_unlock(&p->lock);
		if (stop)
			break;
		/* Blocks until a message comes: close breaks the connection to end it
		 * (a thread that woke up every so often to look for stop would cost every
		 * rank process wake-ups for nothing, and big jobs on few cores feel them). */
		struct net_msg m;
		int rc = net_recv(p->conn, &m, -1);
		if (rc == -ETIMEDOUT || rc == -EAGAIN)
			continue;
		if (rc) {
			pthread_mutex_lock(&p->lock);
			stop = p->stop;
			pthread_mutex_unlock(&p->lock);
			if (stop)
				break;
			part_lost(p, rc == -ECONNRESET ? "the coordinator closed the connection"
			                               : ckpt_err_msg());
			break;
		}
		struct commit_status_msg st;
		if ((m.type != COMMIT_MSG_BEGIN_REPLY && m.type != COMMIT_MSG_DECISION) ||
		    commit_status_decode(m.payload, m.len, &st)) {
			char why[128];
			snprintf(why, sizeof why, "bad message (type %u) from the coordinator", m.type);
			net_msg_free(&m);
			part_lost(p, why);
			break;
		}
		pthread_mutex_lock(&p->lock);
		/* Decisions of steps this rank never began are not ours to keep. */
		struct part_entry *e = entry_get(p, st.step, false);
		if (e) {
			/* Separate reasons: a BEGIN reply that follows a decision must not
			 * blank the decision's reason. */
			if (m.type == COMMIT_MSG_BEGIN_REPLY) {
				e->begin_done = true;
				e->begin_code = st.code;
				e->save_id = st.save_id;
				snprintf(e->begin_reason, sizeof e->begin_reason, "%s", st.reason);
			} else if (e->begin_done && st.save_id && e->save_id && st.save_id != e->save_id) {
				/* The decision of another attempt at this step (an earlier one,
				 * decided after this rank began the current one): not ours. */
			} else if (!e->begin_done && st.save_id && done_has(p, st.step, st.save_id)) {
				/* The decision of an attempt this rank gave up, come after it
				 * began the step again and before the reply: not the new one's
				 * (a rank that voted and then gave up keeps its entry, and
				 * takes its attempt's decision as ever). */
			} else if (!e->decided) {
				e->decided = true;
				e->decision = st.code;
				snprintf(e->reason, sizeof e->reason, "%s", st.reason);
			}
			pthread_cond_broadcast(&p->cond);
		}
		pthread_mutex_unlock(&p->lock);
		net_msg_free(&m);
	}
	return NULL;
}

static void     remote_close(struct commit_part *base);
static int      remote_begin(struct commit_part *base, uint64_t step, uint64_t *save_id);
static uint64_t remote_attempt(struct commit_part *base, uint64_t step);
static int      remote_prepare(struct commit_part *base, const struct commit_vote *v);
static int      remote_abort(struct commit_part *base, uint64_t step, int code, const char *why);
static int      remote_wait(struct commit_part *base, uint64_t step, int timeout_ms);

static int remote_decided(struct commit_part *base, uint64_t step, int timeout_ms);
static const struct commit_part_ops remote_ops = {
	.begin = remote_begin, .attempt = remote_attempt, .prepare = remote_prepare,
	.abort = remote_abort, .wait = remote_wait, .decided = remote_decided,
	.close = remote_close,
};

int commit_part_connect(const struct commit_part_opts *o, struct commit_part **out)
{
	*out = NULL;
	struct part_remote *p = ckpt_calloc(1, sizeof *p);
	if (!p)
		return ckpt_err(-ENOMEM, "participant");
	p->base.ops = &remote_ops;
	pthread_mutex_init(&p->send_lock, NULL);
	pthread_mutex_init(&p->lock, NULL);
	ckpt_cond_init(&p->cond);
	p->timeout_ms = o->timeout_ms;
	if (o->peer_name)
		snprintf(p->name, sizeof p->name, "%s", o->peer_name);
	else
		snprintf(p->name, sizeof p->name, "coordinator %s:%u", o->addr, o->port);
	int rc = net_connect(o->transport, o->rdma, o->addr, o->port, (int)o->timeout_ms, &p->conn);
	if (rc) {
		ckpt_err_prefix(rc, "rank %u: connect to the %s", o->rank, p->name);
		goto fail;
	}
	struct net_auth a = { .job_id = o->job_id, .rank = o->rank, .world = o->world,
	                      .secret = o->secret, .secret_len = o->secret_len };
	if ((rc = net_handshake_client(p->conn, &a, (int)o->timeout_ms))) {
		ckpt_err_prefix(rc, "rank %u: join job '%s' at the %s", o->rank, o->job_id, p->name);
		goto fail;
	}
	if ((rc = ckpt_thread_create(&p->rx, NULL, rx_main, p))) {
		rc = ckpt_err(-rc, "participant receiver thread");
		goto fail;
	}
	p->rx_started = true;
	*out = &p->base;
	return 0;
fail:
	remote_close(&p->base);
	return rc;
}

static void remote_close(struct commit_part *base)
{
	struct part_remote *p = (struct part_remote *)base;
	if (!p)
		return;
	if (p->rx_started) {
		pthread_mutex_lock(&p->lock);
		p->stop = true;
		pthread_mutex_unlock(&p->lock);
		net_conn_shutdown(p->conn);
		pthread_join(p->rx, NULL);
	}
	net_close(p->conn);
	while (p->entries)
		entry_drop(p, p->entries->step);
	pthread_mutex_destroy(&p->send_lock);
	pthread_mutex_destroy(&p->lock);
	pthread_cond_destroy(&p->cond);
	ckpt_free(p);
}

static int part_send(struct part_remote *p, uint16_t type, const struct ckpt_buf *b)
{
	pthread_mutex_lock(&p->send_lock);
	int rc = net_send(p->conn, type, b->p, b->len, (int)p->timeout_ms);
	pthread_mutex_unlock(&p->send_lock);
	/* The peer is gone (the coordinator, or the node leader relaying for it): say
	 * so, whether this send or the receiver thread notices first. */
	if (rc == -EPIPE || rc == -ECONNRESET)
		ckpt_err_prefix(rc, "lost the coordinator");
	return rc;
}

/* ABORT of attempt save_id (0: whichever is in flight) of step. */
static int part_send_abort(struct part_remote *p, uint64_t step, uint64_t save_id, int code,
                           const char *why)
{
	struct commit_status_msg m = { .step = step, .save_id = save_id,
	                               .code = code < 0 && code > -2000 ? code : CKPT_EABORTED };
	snprintf(m.reason, sizeof m.reason, "%s", why ? why : "");
	struct ckpt_buf b;
	ckpt_buf_init(&b);
	int rc = commit_status_encode(&m, &b);
	if (!rc)
		rc = part_send(p, COMMIT_MSG_ABORT, &b);
	ckpt_buf_free(&b);
	return rc;
}

static int remote_begin(struct commit_part *base, uint64_t step, uint64_t *save_id)
{
	struct part_remote *p = (struct part_remote *)base;
	*save_id = 0;
	pthread_mutex_lock(&p->lock);
	struct part_entry *e = entry_get(p, step, true);
	bool lost = p->lost;
	pthread_mutex_unlock(&p->lock);
	if (!e)
		return ckpt_err(-ENOMEM, "begin step %llu", (unsigned long long)step);
	if (lost)
		return ckpt_err(-ECONNRESET, "step %llu: lost the %s: %s", (unsigned long long)step,
		                p->name, p->lost_why);
	struct ckpt_buf b;
	ckpt_buf_init(&b);
	int rc = commit_step_encode(step, &b);
	if (!rc)
		rc = part_send(p, COMMIT_MSG_BEGIN, &b);
	ckpt_buf_free(&b);
	uint64_t deadline = ckpt_deadline_ms(p->timeout_ms);
	bool stale = false, unanswered = false;
	pthread_mutex_lock(&p->lock);
	while (!rc && !e->begin_done && !p->lost)
		if (ckpt_cond_wait_until(&p->cond, &p->lock, deadline) == ETIMEDOUT) {
			rc = ckpt_err(-ETIMEDOUT, "step %llu: no answer to BEGIN from the %s in %u ms",
			              (unsigned long long)step, p->name, p->timeout_ms);
			unanswered = true;
		}
	if (!rc && !e->begin_done)
		rc = ckpt_err(-ECONNRESET, "step %llu: lost the %s: %s", (unsigned long long)step,
		              p->name, p->lost_why);
	if (!rc && e->begin_code)
		rc = ckpt_err(e->begin_code, "step %llu refused by the %s: %s",
		              (unsigned long long)step, p->name, e->begin_reason);
	if (!rc && e->decided) {
		/* Decided before this rank began (see the top of the file). */
		stale = true;
		rc = ckpt_err(e->decision == -EEXIST ? -EEXIST : CKPT_EABORTED,
		              "step %llu aborted by the coordinator before this rank began: %s",
		              (unsigned long long)step, e->reason);
	}
	if (!rc && !e->save_id)
		rc = ckpt_err(CKPT_EPROTO, "step %llu: the %s began it without an attempt id",
		              (unsigned long long)step, p->name);
	uint64_t attempt = e->save_id;
	if (!rc)
		*save_id = attempt;
	if (rc)
		entry_drop(p, step);
	if (stale)
		done_add(p, step, attempt);
	pthread_mutex_unlock(&p->lock);
	/* A BEGIN that was decided before this rank began, or never answered, may still
	 * have opened an attempt at the coordinator: close it, so that it does not hold
	 * the steps after it while waiting for this rank's vote. */
	if (stale || unanswered) {
		char why[COMMIT_MAX_REASON];
		snprintf(why, sizeof why, "%s", ckpt_err_msg());
		part_send_abort(p, step, attempt, rc, why);
		ckpt_err_restore(why);
	}
	return rc;
}

static uint64_t remote_attempt(struct commit_part *base, uint64_t step)
{
	struct part_remote *p = (struct part_remote *)base;
	pthread_mutex_lock(&p->lock);
	struct part_entry *e = entry_get(p, step, false);
	uint64_t id = e && e->begin_done ? e->save_id : 0;
	pthread_mutex_unlock(&p->lock);
	return id;
}

static int remote_prepare(struct commit_part *base, const struct commit_vote *v)
{
	struct part_remote *p = (struct part_remote *)base;
	pthread_mutex_lock(&p->lock);
	struct part_entry *e = entry_get(p, v->step, true);
	bool decided = e && e->decided;
	if (e)
		e->prepared = true;
	pthread_mutex_unlock(&p->lock);
	if (!e)
		return ckpt_err(-ENOMEM, "prepare step %llu", (unsigned long long)v->step);
	/* Already decided (aborted while this rank wrote): a vote now would only open
	 * a new attempt at the coordinator. remote_wait reports the decision. */
	if (decided)
		return 0;
	struct ckpt_buf b;
	ckpt_buf_init(&b);
	int rc = commit_prepare_encode(v, &b);
	if (!rc)
		rc = part_send(p, COMMIT_MSG_PREPARE, &b);
	ckpt_buf_free(&b);
	if (rc)
		return ckpt_err_prefix(rc, "step %llu: send the vote to the %s",
		                       (unsigned long long)v->step, p->name);
	int f = ckpt_fault(CKPT_FP_AFTER_PREPARE_SENT);
	return f < 0 ? f : 0;
}

static int remote_abort(struct commit_part *base, uint64_t step, int code, const char *why)
{
	struct part_remote *p = (struct part_remote *)base;
	/* The attempt given up, when this rank knows it (see the coordinator's on_abort). */
	pthread_mutex_lock(&p->lock);
	struct part_entry *cur = entry_get(p, step, false);
	uint64_t attempt = cur ? cur->save_id : 0;
	pthread_mutex_unlock(&p->lock);
	int rc = part_send_abort(p, step, attempt, code, why);
	/* A rank that already voted keeps waiting for the decision: its ABORT may
	 * arrive after the coordinator decided, and then the decision stands. */
	pthread_mutex_lock(&p->lock);
	struct part_entry *e = entry_get(p, step, false);
	if (e && !e->prepared)
		entry_drop(p, step);
	done_add(p, step, attempt);
	pthread_mutex_unlock(&p->lock);
	return rc;
}

static int remote_wait(struct commit_part *base, uint64_t step, int timeout_ms)
{
	struct part_remote *p = (struct part_remote *)base;
	uint64_t deadline = ckpt_deadline_ms(timeout_ms);
	int rc = 0;
	pthread_mutex_lock(&p->lock);
	struct part_entry *e = entry_get(p, step, false);
	if (!e) {
		pthread_mutex_unlock(&p->lock);
		return ckpt_err(CKPT_ESTATE, "step %llu: no save of it in flight", (unsigned long long)step);
	}
	bool timed_out = false;
	while (!e->decided && !p->lost && !timed_out)
		timed_out = ckpt_cond_wait_until(&p->cond, &p->lock, deadline) == ETIMEDOUT;
	if (e->decided) {
		if (e->decision)
			rc = ckpt_err(e->decision == -EEXIST ? -EEXIST : CKPT_EABORTED,
			              "step %llu aborted by the coordinator: %s", (unsigned long long)step,
			              e->reason);
	} else if (e->prepared) {
		rc = ckpt_err(CKPT_EINDOUBT, "step %llu: voted, then %s; the manifest decides",
		              (unsigned long long)step,
		              p->lost ? p->lost_why : "no decision before the timeout");
	} else {
		rc = ckpt_err(CKPT_EABORTED, "step %llu: %s before voting", (unsigned long long)step,
		              p->lost ? p->lost_why : "timed out");
	}
	if (e->begin_done)
		done_add(p, step, e->save_id);
	entry_drop(p, step);
	pthread_mutex_unlock(&p->lock);
	return rc;
}

static int remote_decided(struct commit_part *base, uint64_t step, int timeout_ms)
{
	struct part_remote *p = (struct part_remote *)base;
	uint64_t deadline = ckpt_deadline_ms(timeout_ms);
	bool timed_out = false;
	pthread_mutex_lock(&p->lock);
	struct part_entry *e = entry_get(p, step, false);
	while (e && !e->decided && !p->lost && !timed_out)
		timed_out = ckpt_cond_wait_until(&p->cond, &p->lock, deadline) == ETIMEDOUT;
	bool decided = e && e->decided;
	pthread_mutex_unlock(&p->lock);
	if (!decided)
		return ckpt_err(-ETIMEDOUT, "step %llu: no decision from the %s in %d ms",
		                (unsigned long long)step, p->name, timeout_ms);
	/* Only this rank's save thread ends its step: the entry is still there. */
	return remote_wait(base, step, 0);
}

/* ------------------------------------------------------------------ the one road
 * Every save takes part in its commit through these, whether the coordinator is
 * another process (above) or, in a world of one, the rank itself (local.c). */

void commit_part_close(struct commit_part *p)
{
	if (p)
		p->ops->close(p);
}

int commit_part_begin(struct commit_part *p, uint64_t step, uint64_t *save_id)
{
	return p->ops->begin(p, step, save_id);
}

uint64_t commit_part_attempt(struct commit_part *p, uint64_t step)
{
	return p->ops->attempt(p, step);
}

int commit_part_prepare(struct commit_part *p, const struct commit_vote *v)
{
	return p->ops->prepare(p, v);
}

int commit_part_abort(struct commit_part *p, uint64_t step, int code, const char *why)
{
	return p->ops->abort(p, step, code, why);
}

int commit_part_wait(struct commit_part *p, uint64_t step, int timeout_ms)
{
	return p->ops->wait(p, step, timeout_ms);
}

int commit_part_decided(struct commit_part *p, uint64_t step, int timeout_ms)
{
	if (!p->ops->decided)
		return ckpt_err(-ETIMEDOUT, "step %llu: no decision comes before the vote",
		                (unsigned long long)step);
	return p->ops->decided(p, step, timeout_ms);
}
