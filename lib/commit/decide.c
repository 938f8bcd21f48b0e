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

static int name_cmp(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Distinct names over all ranks (names within one shard are unique). */
static int count_names(const struct io_shard_index *const *ix, uint32_t world, uint32_t *out)
{
	size_t total = 0;
	for (uint32_t r = 0; r < world; r++)
		total += ix[r]->ntensors;
	const char **names = malloc((total ? total : 1) * sizeof *names);
	if (!names)
		return -ENOMEM;
	size_t n = 0;
	for (uint32_t r = 0; r < world; r++)
		for (uint32_t t = 0; t < ix[r]->ntensors; t++)
			names[n++] = ix[r]->tensors[t].name;
	qsort(names, n, sizeof *names, name_cmp);
	uint32_t distinct = 0;
	for (size_t i = 0; i < n; i++)
		if (i == 0 || strcmp(names[i], names[i - 1]))
			distinct++;
	free(names);
	*out = distinct;
	return 0;
}

static int decide(struct manifest *m, const char *job_id, uint64_t step, uint32_t world,
                  const struct commit_vote *votes, struct io_shard_index **ix,
                  struct manifest_shard *shards, char (*paths)[64])
{
	int rc;
	for (uint32_t r = 0; r < world; r++) {
		if (votes[r].rank != r || votes[r].step != step)
			return ckpt_err(CKPT_EINVALID, "step %llu: vote %u is from rank %u for step %llu",
			                (unsigned long long)step, r, votes[r].rank,
			                (unsigned long long)votes[r].step);
		if ((rc = io_index_decode(votes[r].index, votes[r].index_len, &ix[r])))
			return ckpt_err_prefix(rc, "step %llu: index of rank %u", (unsigned long long)step, r);
	}
	if ((rc = commit_validate((const struct io_shard_index *const *)ix, world, step)))
		return rc;

	struct manifest_step rec;
	memset(&rec, 0, sizeof rec);
	rec.step = step;
	rec.state = CKPT_STATE_COMMITTED;
	rec.trust = CKPT_TRUST_COMMITTED;
	rec.world = world;
	snprintf(rec.job_id, sizeof rec.job_id, "%s", job_id);
	if ((rc = count_names((const struct io_shard_index *const *)ix, world, &rec.ntensors)))
		return ckpt_err(rc, "step %llu", (unsigned long long)step);
	for (uint32_t r = 0; r < world; r++) {
		for (uint32_t t = 0; t < ix[r]->ntensors; t++)
			rec.logical_bytes += ix[r]->tensors[t].raw_bytes;
		for (uint32_t k = 0; k < ix[r]->nchunks; k++)
			rec.stored_bytes += ix[r]->chunks[k].stored_len;
		ckpt_path_shard_rel(paths[r], sizeof paths[r], step, r);
		shards[r] = (struct manifest_shard){
			.rank = r, .path = paths[r], .file_size = votes[r].file_size,
			.index = votes[r].index, .index_len = votes[r].index_len,
		};
		memcpy(shards[r].footer_hash, votes[r].footer_hash, CKPT_HASH_BYTES);
	}
	if ((rc = ckpt_fault(CKPT_FP_COORD_BEFORE_COMMIT_TXN)) < 0)
		return rc;
	/* The commit point of the whole checkpoint (DESIGN §3). */
	if ((rc = manifest_commit(m, &rec, shards, world)))
		return rc;
	if ((rc = ckpt_fault(CKPT_FP_COORD_AFTER_COMMIT_TXN)) < 0)
		return rc;
	return 0;
}

int commit_decide(struct manifest *m, const char *job_id, uint64_t step, uint32_t world,
                  const struct commit_vote *votes)
{
	struct io_shard_index **ix = calloc(world, sizeof *ix);
	struct manifest_shard *shards = calloc(world, sizeof *shards);
	char (*paths)[64] = calloc(world, sizeof *paths);
	int rc;
	if (!ix || !shards || !paths)
		rc = ckpt_err(-ENOMEM, "commit of step %llu", (unsigned long long)step);
	else
		rc = decide(m, job_id, step, world, votes, ix, shards, paths);
	/* An injected fault after the txn leaves the step committed: the manifest decides.
	 * The manifest calls below set this thread's message themselves ("no such step"),
	 * so the reason is copied first and restored after: it is what the coordinator
	 * sends the ranks. */
	if (rc && rc != -EEXIST) {
		char *why = strdup(ckpt_err_msg());
		struct manifest_step cur;
		if (!(manifest_step_get(m, step, &cur) == 0 && cur.state == CKPT_STATE_COMMITTED))
			manifest_record_abort(m, step, world, why ? why : "commit failed");
		ckpt_err_restore(why ? why : "commit failed (out of memory for the reason)");
		free(why);
	}
	for (uint32_t r = 0; ix && r < world; r++)
		io_index_free(ix[r]);
	free(ix);
	free(shards);
	free(paths);
	return rc;
}
