/*
 * local.c — the participant of a rank alone (a world of one), which is its own
 * coordinator. The save takes the same road as in a world of several ranks
 * (commit_part_begin, _prepare, _wait, or _abort); here begin records the attempt
 * in the manifest (commit_attempt_begin) and prepare decides at once with the one
 * vote (commit_decide), in the caller's thread. The manifest decides: a failure
 * after the commit transaction that left the step committed is no failure.
 *
 * An attempt begun and never voted for is recorded as aborted (abort), so that its
 * INFLIGHT record does not read as a save in flight; after the vote the decision
 * stands, as a coordinator's does, and abort changes nothing.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "commit/commit_internal.h"

struct local_entry {
	uint64_t            step, save_id;
	bool                decided;
	int                 rc;              /* the decision: 0, or its code */
	char               *why;             /* its message when rc != 0 */
	struct local_entry *next;
};

struct part_local {
	struct commit_part  base;            /* first: the ops (commit_internal.h) */
	struct manifest    *m;
	const char         *root;
	uint64_t            incarnation;
	char                job_id[MANIFEST_MAX_JOB_ID + 1];
	pthread_mutex_t     lock;            /* entries: saves of several steps may overlap */
	struct local_entry *entries;
};

static struct local_entry **entry_find(struct part_local *p, uint64_t step)
{
	struct local_entry **e = &p->entries;
	while (*e && (*e)->step != step)
		e = &(*e)->next;
	return e;
}

/* Take step's entry out of the list (the caller frees it); NULL if none. */
static struct local_entry *entry_take(struct part_local *p, uint64_t step)
{
	pthread_mutex_lock(&p->lock);
	struct local_entry **pe = entry_find(p, step), *e = *pe;
	if (e)
		*pe = e->next;
	pthread_mutex_unlock(&p->lock);
	return e;
}

static void entry_free(struct local_entry *e)
{
	if (e) {
		ckpt_free(e->why);
		ckpt_free(e);
	}
}

static void local_id(const struct part_local *p, uint64_t step, uint64_t save_id,
                     struct manifest_step *id)
{
	memset(id, 0, sizeof *id);
	id->step = step;
	id->world = 1;
	id->save_id = save_id;
	id->incarnation = p->incarnation;
	snprintf(id->job_id, sizeof id->job_id, "%s", p->job_id);
}

static int local_begin(struct commit_part *base, uint64_t step, uint64_t *save_id)
{
	struct part_local *p = (struct part_local *)base;
	*save_id = 0;
	struct local_entry *e = ckpt_calloc(1, sizeof *e);
	if (!e)
		return ckpt_err(-ENOMEM, "begin step %llu", (unsigned long long)step);
	struct manifest_step id;
	local_id(p, step, ckpt_random_id(), &id);
	int rc = commit_attempt_begin(p->m, p->root, &id);
	if (rc) {
		ckpt_free(e);
		if (rc == -EEXIST)
			ckpt_err(-EEXIST, "step %llu is already committed in %s",
			         (unsigned long long)step, p->root);
		return rc;
	}
	e->step = step;
	e->save_id = id.save_id;
	pthread_mutex_lock(&p->lock);
	struct local_entry *old = *entry_find(p, step);
	if (!old) {
		e->next = p->entries;
		p->entries = e;
	}
	pthread_mutex_unlock(&p->lock);
	if (old) {
		/* The context allows one save of a step at a time (ckpt_save_begin's -EBUSY). */
		ckpt_free(e);
		return ckpt_err(CKPT_ESTATE, "step %llu: an attempt is in flight already",
		                (unsigned long long)step);
	}
	*save_id = id.save_id;
	return 0;
}

static uint64_t local_attempt(struct commit_part *base, uint64_t step)
{
	struct part_local *p = (struct part_local *)base;
	pthread_mutex_lock(&p->lock);
	struct local_entry *e = *entry_find(p, step);
	uint64_t id = e ? e->save_id : 0;
	pthread_mutex_unlock(&p->lock);
	return id;
}

static int local_prepare(struct commit_part *base, const struct commit_vote *v)
{
	struct part_local *p = (struct part_local *)base;
	pthread_mutex_lock(&p->lock);
	struct local_entry *e = *entry_find(p, v->step);
	pthread_mutex_unlock(&p->lock);
	if (!e || e->save_id != v->save_id || e->decided)
		return ckpt_err(CKPT_ESTATE, "step %llu: no attempt %016llx to vote for",
		                (unsigned long long)v->step, (unsigned long long)v->save_id);
	struct manifest_step id;
	local_id(p, v->step, v->save_id, &id);
	/* The only rank is rank 0: its metadata is the step's. */
	id.meta = v->meta;
	id.meta_len = (uint32_t)v->meta_len;
	int rc = commit_decide(p->m, &id, &(struct commit_decision){
		.votes = v, .trust_manifest = true });
	/* Only this save's thread reaches its entry between begin and wait. */
	e->decided = true;
	e->rc = rc;
	if (rc)
		e->why = ckpt_strdup(ckpt_err_msg());    /* NULL on ENOMEM: the code stays */
	return rc;
}

static int local_abort(struct commit_part *base, uint64_t step, int code, const char *why)
{
	struct part_local *p = (struct part_local *)base;
	CKPT_UNUSED(code);
	pthread_mutex_lock(&p->lock);
	struct local_entry *e = *entry_find(p, step);
	bool decided = e && e->decided;
	pthread_mutex_unlock(&p->lock);
	if (!e || decided)
		return 0;                            /* nothing begun, or the decision stands */
	e = entry_take(p, step);
	struct manifest_step id;
	local_id(p, step, e->save_id, &id);
	entry_free(e);
	commit_decide(p->m, &id, &(struct commit_decision){ .abort = true, .why = why });
	return 0;
}

static int local_wait(struct commit_part *base, uint64_t step, int timeout_ms)
{
	struct part_local *p = (struct part_local *)base;
	CKPT_UNUSED(timeout_ms);
	struct local_entry *e = entry_take(p, step);
	if (!e || !e->decided) {
		entry_free(e);
		return ckpt_err(CKPT_ESTATE, "step %llu: no vote of it was decided",
		                (unsigned long long)step);
	}
	int rc = e->rc;
	if (rc && e->why)
		ckpt_err_restore(e->why);
	entry_free(e);
	return rc;
}

static void local_close(struct commit_part *base)
{
	struct part_local *p = (struct part_local *)base;
	while (p->entries) {
		struct local_entry *e = p->entries;
		p->entries = e->next;
		entry_free(e);
	}
	pthread_mutex_destroy(&p->lock);
	ckpt_free(p);
}

static const struct commit_part_ops local_ops = {
	.begin = local_begin, .attempt = local_attempt, .prepare = local_prepare,
	.abort = local_abort, .wait = local_wait, .close = local_close,
};

int commit_part_open_local(const struct commit_local_opts *o, struct commit_part **out)
{
	*out = NULL;
	struct part_local *p = ckpt_calloc(1, sizeof *p);
	if (!p)
		return ckpt_err(-ENOMEM, "participant");
	p->base.ops = &local_ops;
	p->m = o->manifest;
	p->root = o->root;
	p->incarnation = o->incarnation;
	snprintf(p->job_id, sizeof p->job_id, "%s", o->job_id ? o->job_id : "");
	pthread_mutex_init(&p->lock, NULL);
	*out = &p->base;
	return 0;
}
