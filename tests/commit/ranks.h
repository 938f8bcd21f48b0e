/*
 * ranks.h — honest ranks for the lib/commit tests, whatever way they reach the
 * coordinator (their own connection, or through their node's leader): synthetic
 * votes, every rank saving a step at once in threads of this process, and the
 * checks of what the manifest then holds. Each test file says how a rank connects
 * (struct ranks_env's open).
 */
#ifndef CKPT_TEST_RANKS_H
#define CKPT_TEST_RANKS_H

#include <stdint.h>

#include "commit/commit_internal.h"

struct ranks_env {
	struct manifest     *m;
	struct commit_coord *c;
	uint32_t             world;
	unsigned             tmo_ms;    /* a guard against hangs, never reached when passing */
	/* Connect rank as the test's job does; 0 or the connect error (its message set). */
	int (*open)(const void *env, uint32_t rank, struct commit_part **out);
	const void          *env;
};

/* A rank's vote: synth_typical's index for attempt save_id (the bytes live as long as
 * the struct). */
struct rank_vote {
	void *buf;
	size_t len;
	struct commit_vote v;
};
void ranks_vote_make(struct rank_vote *rv, uint64_t step, uint32_t rank, uint32_t world,
                     uint64_t save_id);
/* BEGIN step on p; the attempt's id stays with p (commit_part_attempt). */
static inline int ranks_begin(struct commit_part *p, uint64_t step)
{
	uint64_t id;
	return commit_part_begin(p, step, &id);
}
void ranks_vote_free(struct rank_vote *rv);
/* PREPARE rank's synthetic vote of step on p, for the attempt p began. */
int  ranks_prepare(struct commit_part *p, uint64_t step, uint32_t rank, uint32_t world);

/* Close and clear p[0..n). */
void ranks_close(struct commit_part **p, uint32_t n);
/* Every rank saves step at once (parts[r] NULL: that rank connects in its thread and
 * keeps the connection); all must commit. */
void ranks_commit_all(const struct ranks_env *e, struct commit_part **parts, uint64_t step);
/* Fresh connections commit step and close again; the coordinator has seen them go
 * when this returns (commit_coord_ranks_left): a departure it processed after the
 * next step began would rightly abort that step. */
void ranks_honest_commit(const struct ranks_env *e, uint64_t step);
/* Wait until the coordinator has processed n more departures than before. */
void ranks_wait_left(const struct ranks_env *e, uint64_t before, uint32_t n);

/* step is committed for world ranks, every shard record the rank's own (synth_vote's
 * file size: nothing forged); or nothing of step is committed. */
void ranks_assert_committed(const struct ranks_env *e, uint64_t step);
void ranks_assert_not_committed(const struct ranks_env *e, uint64_t step);

/* p's wait for step gives want within tmo_ms, and the message then holds every
 * string of needles (NULL-terminated; NULL: no check of the message). */
void ranks_expect_wait(struct commit_part *p, uint64_t step, int want,
                       const char *const *needles, int tmo_ms);
/* The coordinator must drop c: anything it still sends is read, then EOF or an
 * error; a timeout fails the test with "the coordinator kept <what>". */
void ranks_expect_dropped(struct net_conn *c, int tmo_ms, const char *what);

#endif
