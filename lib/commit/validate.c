/*
 * validate.c — the coordinator's check of a whole gathered index at once
 * (docs/protocol.md §2), for callers that hold every vote already (one rank,
 * rebuild, tools). It is the incremental validation of gather.c run over all ranks,
 * so that there is one implementation of the rules: every rank once; every name
 * consistent across ranks; sharded tensors tile their global shape exactly;
 * replicated items whole and identical by hash; rank-bound items once per rank.
 */
#include <errno.h>

#include "commit/commit.h"

int commit_validate(const struct io_shard_index *const *ix, uint32_t world, uint64_t step)
{
	for (uint32_t r = 0; r < world; r++) {
		if (!ix[r])
			return ckpt_err(CKPT_EINVALID, "step %llu: no vote from rank %u",
			                (unsigned long long)step, r);
		if (ix[r]->rank != r || ix[r]->world != world || ix[r]->step != step)
			return ckpt_err(CKPT_EINVALID, "step %llu: rank %u sent the index of step %llu, "
			                "rank %u of %u", (unsigned long long)step, r,
			                (unsigned long long)ix[r]->step, ix[r]->rank, ix[r]->world);
	}
	struct commit_gather *g;
	int rc = commit_gather_create(world, step, false, &g);
	for (uint32_t r = 0; r < world && !rc; r++)
		rc = commit_gather_add(g, (struct io_shard_index *)ix[r]);
	if (!rc)
		rc = commit_gather_finish(g, NULL);
	commit_gather_free(g);
	return rc;
}
