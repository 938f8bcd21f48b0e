/*
 * decide.c — the coordinator's decision for one step, once every vote is in:
 * decode, validate, and ONE durable manifest transaction. Presumed abort: if this
 * process dies anywhere before the transaction commits, nothing is visible.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commit/commit.h"

/* The commit transaction of a validated step: a small record per rank naming its
 * footer (the index is durable in the file already), and the step record. */
static int commit_txn(struct manifest *m, const char *job_id, uint64_t step, uint32_t world,
                      const struct commit_vote *votes, const struct commit_gather *g,
                      const struct commit_summary *sum)
{
	struct manifest_shard *shards = calloc(world, sizeof *shards);
	char (*paths)[64] = calloc(world, sizeof *paths);
	if (!shards || !paths) {
		free(shards);
		free(paths);
		return ckpt_err(-ENOMEM, "commit of step %llu", (unsigned long long)step);
	}
	struct manifest_step rec;
	memset(&rec, 0, sizeof rec);
	rec.step = step;
	rec.state = CKPT_STATE_COMMITTED;
	rec.trust = CKPT_TRUST_COMMITTED;
	rec.world = world;
	rec.ntensors = sum->ntensors;
	rec.logical_bytes = sum->logical_bytes;
	rec.stored_bytes = sum->stored_bytes;
	snprintf(rec.job_id, sizeof rec.job_id, "%s", job_id);
	for (uint32_t r = 0; r < world; r++) {
		ckpt_path_shard_rel(paths[r], sizeof paths[r], step, r);
		shards[r] = (struct manifest_shard){
			.rank = r, .path = paths[r], .file_size = votes[r].file_size,
			.footer_offset = commit_gather_index(g, r)->data_end,
			.footer_len = votes[r].index_len,
		};
		memcpy(shards[r].footer_hash, votes[r].footer_hash, CKPT_HASH_BYTES);
	}
	int rc = ckpt_fault(CKPT_FP_COORD_BEFORE_COMMIT_TXN);
	/* The commit point of the whole checkpoint (DESIGN §3). */
	if (rc >= 0)
		rc = manifest_commit(m, &rec, shards, world);
	if (!rc)
		rc = ckpt_fault(CKPT_FP_COORD_AFTER_COMMIT_TXN);
	free(shards);
	free(paths);
	return rc < 0 ? rc : 0;
}

/* An injected fault after the txn leaves the step committed: the manifest decides.
 * The manifest calls below set this thread's message themselves ("no such step"), so
 * the reason is copied first and restored after: it is what the coordinator sends
 * the ranks. */
static void record_abort(struct manifest *m, uint64_t step, uint32_t world)
{
	char *why = strdup(ckpt_err_msg());
	struct manifest_step cur;
	if (!(manifest_step_get(m, step, &cur) == 0 && cur.state == CKPT_STATE_COMMITTED))
		manifest_record_abort(m, step, world, why ? why : "commit failed");
	ckpt_err_restore(why ? why : "commit failed (out of memory for the reason)");
	free(why);
}

int commit_decide_gathered(struct manifest *m, const char *job_id, uint64_t step,
                           uint32_t world, const struct commit_vote *votes,
                           struct commit_gather *g)
{
	struct commit_summary sum;
	int rc = commit_gather_finish(g, &sum);
	if (!rc)
		rc = commit_txn(m, job_id, step, world, votes, g, &sum);
	if (rc && rc != -EEXIST)
		record_abort(m, step, world);
	return rc;
}

static int commit_decide_gathered_free(struct manifest *m, const char *job_id, uint64_t step,
                                      uint32_t world, const struct commit_vote *votes,
                                      struct commit_gather *g)
{
	int rc = commit_decide_gathered(m, job_id, step, world, votes, g);
	commit_gather_free(g);
	return rc;
}

int commit_decide(struct manifest *m, const char *job_id, uint64_t step, uint32_t world,
                  const struct commit_vote *votes)
{
	struct commit_gather *g;
	int rc = commit_gather_create(world, step, true, &g);
	for (uint32_t r = 0; r < world && !rc; r++) {
		struct io_shard_index *ix;
		if (votes[r].rank != r || votes[r].step != step) {
			rc = ckpt_err(CKPT_EINVALID, "step %llu: vote %u is from rank %u for step %llu",
			              (unsigned long long)step, r, votes[r].rank,
			              (unsigned long long)votes[r].step);
		} else if ((rc = io_index_decode(votes[r].index, votes[r].index_len, &ix))) {
			ckpt_err_prefix(rc, "step %llu: index of rank %u", (unsigned long long)step, r);
		} else {
			rc = commit_gather_add(g, ix);
		}
	}
	if (!rc)
		return commit_decide_gathered_free(m, job_id, step, world, votes, g);
	if (rc != -EEXIST)
		record_abort(m, step, world);
	commit_gather_free(g);
	return rc;
}
