/*
 * ranks.c — honest ranks for the lib/commit tests (ranks.h).
 */
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ranks.h"
#include "synth.h"

void ranks_vote_make(struct rank_vote *rv, uint64_t step, uint32_t rank, uint32_t world,
                     uint64_t save_id)
{
	struct synth s;
	synth_typical(&s, step, rank, world);
	synth_attempt(&s, save_id);
	synth_encode(&s, &rv->buf, &rv->len, NULL);
	synth_free(&s);
	rv->v = synth_vote(step, rank, rv->buf, rv->len);
	rv->v.save_id = save_id;
}

void ranks_vote_free(struct rank_vote *rv)
{
	free(rv->buf);
	rv->buf = NULL;
}

int ranks_prepare(struct commit_part *p, uint64_t step, uint32_t rank, uint32_t world)
{
	struct rank_vote rv;
	ranks_vote_make(&rv, step, rank, world, commit_part_attempt(p, step));
	int rc = commit_part_prepare(p, &rv.v);
	ranks_vote_free(&rv);
	return rc;
}

void ranks_close(struct commit_part **p, uint32_t n)
{
	for (uint32_t r = 0; r < n; r++) {
		commit_part_close(p[r]);
		p[r] = NULL;
	}
}

/* One rank's whole save of a step, in a thread: connect (if needed), BEGIN,
 * PREPARE, wait. */
struct rank_job {
	const struct ranks_env *e;
	struct commit_part **p;
	uint32_t rank;
	uint64_t step;
	int rc;
	char msg[1200];
};

static void *rank_thread(void *arg)
{
	struct rank_job *j = arg;
	int rc = 0;
	if (!*j->p)
		rc = j->e->open(j->e->env, j->rank, j->p);
	if (!rc)
		rc = ranks_begin(*j->p, j->step);
	if (!rc)
		rc = ranks_prepare(*j->p, j->step, j->rank, j->e->world);
	if (!rc)
		rc = commit_part_wait(*j->p, j->step, (int)j->e->tmo_ms);
	j->rc = rc;
	snprintf(j->msg, sizeof j->msg, "%s", rc ? ckpt_err_msg() : "");
	return NULL;
}

void ranks_commit_all(const struct ranks_env *e, struct commit_part **parts, uint64_t step)
{
	struct rank_job *j = calloc(e->world, sizeof *j);
	pthread_t *t = calloc(e->world, sizeof *t);
	for (uint32_t r = 0; r < e->world; r++) {
		j[r] = (struct rank_job){ .e = e, .p = &parts[r], .rank = r, .step = step };
		ck_assert_int_eq(pthread_create(&t[r], NULL, rank_thread, &j[r]), 0);
	}
	for (uint32_t r = 0; r < e->world; r++)
		pthread_join(t[r], NULL);
	for (uint32_t r = 0; r < e->world; r++)
		ck_assert_msg(j[r].rc == 0, "step %llu rank %u: rc %d (%s)", (unsigned long long)step,
		              r, j[r].rc, j[r].msg);
	free(j);
	free(t);
	ranks_assert_committed(e, step);
}

void ranks_wait_left(const struct ranks_env *e, uint64_t before, uint32_t n)
{
	uint64_t until = ckpt_now_ns() + (uint64_t)e->tmo_ms * 1000000ull;
	while (commit_coord_ranks_left(e->c) < before + n && ckpt_now_ns() < until)
		usleep(1000);
	ck_assert_uint_ge(commit_coord_ranks_left(e->c), before + n);
}

void ranks_honest_commit(const struct ranks_env *e, uint64_t step)
{
	struct commit_part **p = calloc(e->world, sizeof *p);
	ranks_commit_all(e, p, step);
	uint64_t left = commit_coord_ranks_left(e->c);
	ranks_close(p, e->world);
	ranks_wait_left(e, left, e->world);
	free(p);
}

void ranks_assert_committed(const struct ranks_env *e, uint64_t step)
{
	struct manifest_step rec;
	int rc = manifest_step_get(e->m, step, &rec);
	ck_assert_msg(rc == 0 && rec.state == CKPT_STATE_COMMITTED, "step %llu not committed: "
	              "rc %d state %u", (unsigned long long)step, rc, rc ? 0 : rec.state);
	ck_assert_uint_eq(rec.world, e->world);
	for (uint32_t r = 0; r < e->world; r++) {
		struct manifest_shard sh;
		ck_assert_int_eq(manifest_shard_get(e->m, step, r, &sh), 0);
		ck_assert_uint_eq(sh.rank, r);
		ck_assert_uint_eq(sh.file_size, 1000000u + r);   /* synth_vote's: nothing forged */
		manifest_shard_free(&sh);
	}
}

void ranks_assert_not_committed(const struct ranks_env *e, uint64_t step)
{
	struct manifest_step rec;
	int rc = manifest_step_get(e->m, step, &rec);
	ck_assert_msg(rc == CKPT_ENOTFOUND || (rc == 0 && rec.state != CKPT_STATE_COMMITTED),
	              "step %llu is committed", (unsigned long long)step);
	for (uint32_t r = 0; r < e->world; r++) {
		struct manifest_shard sh;
		ck_assert_int_eq(manifest_shard_get(e->m, step, r, &sh), CKPT_ENOTFOUND);
	}
}

void ranks_expect_wait(struct commit_part *p, uint64_t step, int want,
                       const char *const *needles, int tmo_ms)
{
	int rc = commit_part_wait(p, step, tmo_ms);
	ck_assert_msg(rc == want, "step %llu: wait gave %d, expected %d (%s)",
	              (unsigned long long)step, rc, want, ckpt_err_msg());
	for (; needles && *needles; needles++)
		ck_assert_msg(strstr(ckpt_err_msg(), *needles), "step %llu: message '%s' lacks '%s'",
		              (unsigned long long)step, ckpt_err_msg(), *needles);
}

void ranks_expect_dropped(struct net_conn *c, int tmo_ms, const char *what)
{
	for (;;) {
		struct net_msg m;
		int rc = net_recv(c, &m, tmo_ms);
		if (rc == 0) {
			net_msg_free(&m);
			continue;
		}
		ck_assert_msg(rc != -ETIMEDOUT, "the coordinator kept %s", what);
		return;
	}
}
