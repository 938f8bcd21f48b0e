/*
 * decide.c — the decision for one attempt at a step, by whoever coordinates it (the
 * coordinator thread, a rank of a world of one, a rebuild, GC presuming an abort):
 * commit_decide is the one entry. Commit: once every vote is in, decode, validate,
 * and ONE durable manifest transaction; abort: the attempt's record says so. Presumed
 * abort: if this process dies anywhere before the transaction commits, nothing is
 * visible. Also the begin of an attempt (commit_attempt_begin).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commit/commit.h"

void commit_shard_record(uint64_t step, const struct commit_vote *v,
                         const struct io_shard_index *ix, const char *holder,
                         char path[COMMIT_SHARD_PATH_MAX], struct manifest_shard *out)
{
	int n = holder ? snprintf(path, COMMIT_SHARD_PATH_MAX, "@%s/", holder) : 0;
	if (n < 0 || n >= COMMIT_SHARD_PATH_MAX / 2)
		n = 0;           /* holders are bounded by the caller (REMOTE_MAX_HOST) */
	ckpt_path_shard_rel(path + n, COMMIT_SHARD_PATH_MAX - (size_t)n, step, v->rank, v->save_id);
	*out = (struct manifest_shard){
		.rank = v->rank, .path = path, .file_size = v->file_size,
		.footer_offset = ix->data_end, .footer_len = v->index_len,
	};
	memcpy(out->footer_hash, v->footer_hash, CKPT_HASH_BYTES);
}

struct ref_keep {
	uint64_t step;
	struct manifest_ref *refs;
	uint64_t *by;
	size_t n;
};

static bool ref_keep_fn(void *arg, uint32_t rank, uint64_t save_id)
{
	const struct ref_keep *k = arg;
	for (size_t i = 0; i < k->n; i++)
		if (k->refs[i].step == k->step && k->refs[i].rank == rank &&
		    k->refs[i].save_id == save_id) {
			ckpt_log(CKPT_LOG_INFO, "step %llu: the shard of rank %u of attempt %016llx "
			         "kept: step %llu references it", (unsigned long long)k->step, rank,
			         (unsigned long long)save_id, (unsigned long long)k->by[i]);
			return true;
		}
	return false;
}

static int attempt_begin_locked(struct manifest *m, const char *root,
                                const struct manifest_step *id)
{
	struct manifest_step rec;
	unsigned long long step = (unsigned long long)id->step;
	int rc = manifest_step_get(m, id->step, &rec);
	if (rc == 0 && rec.state == CKPT_STATE_COMMITTED)
		return ckpt_err(-EEXIST, "step %llu is already committed", step);
	if (rc && rc != CKPT_ENOTFOUND)
		return rc;
	if (rc == 0 && root) {
		/* A step retired by retention may still hold files that committed steps
		 * reference (docs/format.md §8.6a): those stay. */
		struct ref_keep k = { .step = id->step };
		uint32_t removed;
		bool empty, damaged;
		uint64_t dmax;
		if ((rc = manifest_refs_all(m, &k.refs, &k.by, &k.n, &damaged, &dmax)))
			return ckpt_err_prefix(rc, "step %llu: the files committed steps reference", step);
		if (damaged && id->step < dmax)
			rc = ckpt_err(CKPT_ECORRUPT, "step %llu: a damaged record of step %llu may "
			              "reference its files: `ckpt-inspect rebuild --merge` first", step,
			              (unsigned long long)dmax);
		else
			rc = ckpt_step_remove_attempt_keep(root, id->step, rec.save_id, ref_keep_fn, &k,
			                                   &removed, &empty);
		ckpt_free(k.refs);
		ckpt_free(k.by);
		if (rc)
			return ckpt_err_prefix(rc, "step %llu: remove the files of the %s attempt %016llx",
			                       step, rec.state == CKPT_STATE_ABORTED ? "aborted" : "abandoned",
			                       (unsigned long long)rec.save_id);
	}
	return manifest_begin(m, id);
}

int commit_attempt_begin(struct manifest *m, const char *root, const struct manifest_step *id)
{
	/* GC of this process must not act on what it read of the step before now. */
	manifest_attempts_lock(m);
	int rc = attempt_begin_locked(m, root, id);
	manifest_attempts_unlock(m);
	return rc;
}

/* The attempt ends without committing, for why; this thread's message is kept. */
static void attempt_abort(struct manifest *m, const struct manifest_step *id, const char *why)
{
	char *msg = ckpt_strdup(ckpt_err_msg());
	int rc = manifest_record_abort(m, id, why);
	/* Committed after all (an injected fault after the transaction), or the step's
	 * record names a newer attempt now: either way not this attempt's to change. */
	if (rc && rc != -EEXIST && rc != -ESTALE)
		ckpt_log(CKPT_LOG_WARN, "step %llu: the end of attempt %016llx is not recorded "
		         "(the next open's garbage collection removes its files): %s",
		         (unsigned long long)id->step, (unsigned long long)id->save_id,
		         ckpt_err_msg());
	ckpt_err_restore(msg ? msg : why);
	ckpt_free(msg);
}

/* The commit transaction of a validated step: a small record per rank naming its
 * footer (the index is durable in the file already), and the step record. */
static int commit_txn(struct manifest *m, const struct manifest_step *id,
                      const struct manifest_shard *shards, const struct commit_summary *sum)
{
	struct manifest_step rec = *id;
	rec.state = CKPT_STATE_COMMITTED;
	rec.trust = CKPT_TRUST_COMMITTED;
	rec.commit_time_ns = 0;
	rec.ntensors = sum->ntensors;
	rec.logical_bytes = sum->logical_bytes;
	rec.stored_bytes = sum->stored_bytes;
	rec.refs = sum->nrefs ? sum->refs : NULL;
	rec.nrefs = sum->nrefs;
	int rc = ckpt_fault(CKPT_FP_COORD_BEFORE_COMMIT_TXN);
	/* The commit point of the whole checkpoint (docs/format.md §8.6). */
	if (rc >= 0)
		rc = manifest_commit(m, &rec, shards, id->world);
	if (!rc)
		rc = ckpt_fault(CKPT_FP_COORD_AFTER_COMMIT_TXN);
	return rc < 0 ? rc : 0;
}

/* The reason of the failure is the abort record's, and stays this thread's message:
 * it is what the coordinator sends the ranks. */
static void record_abort(struct manifest *m, const struct manifest_step *id)
{
	char why[1024];
	snprintf(why, sizeof why, "%s", ckpt_err_msg());
	attempt_abort(m, id, why[0] ? why : "commit failed");
}

/* The decision from shard records prepared as the votes arrived. */
static int decide_records(struct manifest *m, const struct manifest_step *id,
                          const struct manifest_shard *shards, struct commit_gather *g)
{
	struct commit_summary sum;
	int rc = commit_gather_finish(g, &sum);
	if (!rc)
		rc = commit_txn(m, id, shards, &sum);
	if (rc && rc != -EEXIST)
		record_abort(m, id);
	return rc;
}

/* The decision from the votes themselves: decode each index, check that it is the
 * attempt's, gather, then as decide_records. */
static int decide_votes(struct manifest *m, const struct manifest_step *id,
                        const struct commit_vote *votes)
{
	uint64_t step = id->step;
	uint32_t world = id->world;
	struct commit_gather *g = NULL;
	struct manifest_shard *shards = ckpt_calloc(world ? world : 1, sizeof *shards);
	char (*paths)[COMMIT_SHARD_PATH_MAX] = ckpt_calloc(world ? world : 1, sizeof *paths);
	int rc = shards && paths ? commit_gather_create(world, step, true, &g)
	                         : ckpt_err(-ENOMEM, "commit of step %llu", (unsigned long long)step);
	for (uint32_t r = 0; r < world && !rc; r++) {
		struct io_shard_index *ix;
		if (votes[r].rank != r || votes[r].step != step) {
			rc = ckpt_err(CKPT_EINVALID, "step %llu: vote %u is from rank %u for step %llu",
			              (unsigned long long)step, r, votes[r].rank,
			              (unsigned long long)votes[r].step);
		} else if ((rc = io_index_decode(votes[r].index, votes[r].index_len, &ix))) {
			ckpt_err_prefix(rc, "step %llu: index of rank %u", (unsigned long long)step, r);
		} else if (id->save_id && (ix->save_id != id->save_id || votes[r].save_id != id->save_id)) {
			rc = ckpt_err(CKPT_EINVALID, "step %llu: the shard of rank %u was written for "
			              "attempt %016llx, not %016llx", (unsigned long long)step, r,
			              (unsigned long long)ix->save_id, (unsigned long long)id->save_id);
			io_index_free(ix);
		} else {
			commit_shard_record(step, &votes[r], ix, NULL, paths[r], &shards[r]);
			rc = commit_gather_add(g, ix);
		}
	}
	if (!rc)
		rc = decide_records(m, id, shards, g);
	else if (rc != -EEXIST)
		record_abort(m, id);
	commit_gather_free(g);
	ckpt_free(shards);
	ckpt_free(paths);
	return rc;
}

/* A failure after the commit transaction (an injected fault, a lost disk) does not
 * undo it: if the manifest holds the step committed, it is. Telling ranks to abort
 * would make them delete the files of a committed step. The look-up records its
 * own message on a miss ("no such step"): the failure's stays. */
static int committed_after_all(struct manifest *m, const struct manifest_step *id, int rc)
{
	char why[1024];
	snprintf(why, sizeof why, "%s", ckpt_err_msg());
	struct manifest_step rec;
	bool committed = manifest_step_get(m, id->step, &rec) == 0 &&
	                 rec.state == CKPT_STATE_COMMITTED;
	ckpt_err_restore(why);
	if (!committed)
		return rc;
	ckpt_log(CKPT_LOG_WARN, "step %llu committed; then: %s", (unsigned long long)id->step, why);
	return 0;
}

int commit_decide(struct manifest *m, const struct manifest_step *id,
                  const struct commit_decision *d)
{
	if (!m || !id || !d)
		return ckpt_err(-EINVAL, "commit_decide: NULL argument");
	if (d->abort) {
		attempt_abort(m, id, d->why);
		return CKPT_EABORTED;
	}
	int rc;
	if (d->votes)
		rc = decide_votes(m, id, d->votes);
	else if (d->shards && d->gather)
		rc = decide_records(m, id, d->shards, d->gather);
	else
		return ckpt_err(-EINVAL, "step %llu: a decision without votes",
		                (unsigned long long)id->step);
	if (rc && rc != -EEXIST && d->trust_manifest)
		rc = committed_after_all(m, id, rc);
	return rc;
}

bool commit_keep_step(const struct commit_keep *k, uint64_t step, uint64_t latest,
                      uint64_t newer, uint64_t commit_ns, uint64_t now_ns)
{
	if (step == latest || (!k->last && !k->every && !k->seconds))
		return true;
	if (k->last && newer < k->last)
		return true;
	if (k->every && step % k->every == 0)
		return true;
	/* Its age by the record's commit time (wall clock, as the record keeps it). */
	return k->seconds && (commit_ns >= now_ns || (now_ns - commit_ns) / 1000000000u < k->seconds);
}
