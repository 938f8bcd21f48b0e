/*
 * commit.h — lib/commit's interface: the coordinator's decision for a step.
 *
 * A vote is one rank's PREPARE: its encoded shard index and shard file facts, sent
 * only after that rank's data and directory entry are durable. commit_decide() is
 * the coordinator's whole decision once every vote is in: validate the gathered
 * index, then ONE durable manifest transaction (DESIGN §6). The distributed state
 * machines (gathering votes over lib/net, timeouts, broadcasting the decision) are
 * built on it.
 *
 * Depends on: manifest (the commit txn), io (the shard index codec only), net.
 */
#ifndef CKPT_COMMIT_H
#define CKPT_COMMIT_H

#include <stddef.h>
#include <stdint.h>

#include "ckpt_internal.h"
#include "io/io.h"
#include "manifest/manifest.h"

struct commit_vote {
	uint32_t    rank;
	uint64_t    step;
	const void *index;          /* encoded shard index (the footer bytes) */
	size_t      index_len;
	uint64_t    file_size;
	uint8_t     footer_hash[CKPT_HASH_BYTES];
};

/*
 * Validate a gathered set of decoded indices (one per rank, ix[r] for rank r):
 * every rank exactly once, same step and world; every name with the same kind,
 * dtype, policy, flags and global shape on every rank; sharded tensors tile the
 * global shape exactly (no gap, no overlap); replicated items identical by hash
 * wherever present; rank-bound items at most once per rank.
 * 0, or CKPT_EINVALID with the first problem in the error message.
 */
int commit_validate(const struct io_shard_index *const *ix, uint32_t world, uint64_t step);

/*
 * The decision: decode and validate the votes, then commit them in one durable
 * manifest transaction (fault points coord_before_commit_txn and
 * coord_after_commit_txn around it). votes[r] must be rank r's vote.
 * 0 (committed), -EEXIST (already committed), CKPT_EINVALID, CKPT_EFORMAT (a vote's
 * index does not decode), or the manifest's error. On any failure other than
 * -EEXIST the step is recorded as aborted, with the reason.
 */
int commit_decide(struct manifest *m, const char *job_id, uint64_t step, uint32_t world,
                  const struct commit_vote *votes);

#endif /* CKPT_COMMIT_H */
