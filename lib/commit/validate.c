/*
 * validate.c — the coordinator's check of a gathered checkpoint index before it
 * may be committed (DESIGN §6): every rank once; every name consistent across
 * ranks; sharded tensors tile their global shape exactly; replicated items are
 * whole and identical by hash; rank-bound items once per rank.
 *
 * Cost: sorting the pieces by name, then per sharded tensor a sweep over its
 * pieces sorted by their first-dimension offset, so the usual 1-D sharding is
 * checked in O(pieces log pieces).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commit/commit.h"

struct piece {
	const struct io_shard_index *ix;
	const struct io_tensor_entry *t;
	uint32_t rank;
};

static int piece_by_name(const void *a, const void *b)
{
	const struct piece *x = a, *y = b;
	int c = strcmp(x->t->name, y->t->name);
	return c ? c : (x->rank < y->rank ? -1 : x->rank > y->rank);
}

static int piece_by_offset0(const void *a, const void *b)
{
	const struct piece *x = a, *y = b;
	uint64_t p = x->t->ndim ? x->t->offset[0] : 0, q = y->t->ndim ? y->t->offset[0] : 0;
	return p < q ? -1 : p > q;
}

static int u32_cmp(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
	return x < y ? -1 : x > y;
}

static bool boxes_overlap(const struct io_tensor_entry *a, const struct io_tensor_entry *b)
{
	for (unsigned d = 0; d < a->ndim; d++) {
		if (a->offset[d] + a->extent[d] <= b->offset[d] ||
		    b->offset[d] + b->extent[d] <= a->offset[d])
			return false;
	}
	return true;
}

/* "0,1,5" — the ranks of pieces p[0..n), ascending, shortened with "..." to fit. */
static void ranks_list(char *out, size_t cap, const struct piece *p, size_t n)
{
	uint32_t *r = malloc((n ? n : 1) * sizeof *r);
	size_t len = 0;
	out[0] = '\0';
	if (!r) {
		snprintf(out, cap, "(%zu ranks)", n);
		return;
	}
	for (size_t i = 0; i < n; i++)
		r[i] = p[i].rank;
	qsort(r, n, sizeof *r, u32_cmp);
	for (size_t i = 0; i < n; i++) {
		if (len + 16 > cap) {
			snprintf(out + len, cap - len, "...");
			break;
		}
		len += (size_t)snprintf(out + len, cap - len, "%s%u", i ? "," : "", r[i]);
	}
	free(r);
}

static int check_sharded(struct piece *p, size_t n, uint64_t step)
{
	const struct io_tensor_entry *t0 = p[0].t;
	uint64_t want, have = 0;
	if (!ckpt_shape_elems(t0->ndim, t0->global_shape, &want))
		return ckpt_err(CKPT_EINVALID, "step %llu: tensor '%s': shape overflows",
		                (unsigned long long)step, t0->name);
	for (size_t i = 0; i < n; i++) {
		uint64_t v;
		if (!ckpt_shape_elems(p[i].t->ndim, p[i].t->extent, &v) || !ckpt_add_u64(have, v, &have))
			return ckpt_err(CKPT_EINVALID, "step %llu: tensor '%s': pieces overflow",
			                (unsigned long long)step, t0->name);
	}
	/* Empty pieces (extent 0 somewhere) hold nothing and cannot overlap anything. */
	qsort(p, n, sizeof *p, piece_by_offset0);
	for (size_t i = 0; i < n; i++) {
		uint64_t vi;
		ckpt_shape_elems(p[i].t->ndim, p[i].t->extent, &vi);
		if (!vi)
			continue;
		uint64_t end0 = p[i].t->ndim ? p[i].t->offset[0] + p[i].t->extent[0] : 1;
		for (size_t j = i + 1; j < n; j++) {
			uint64_t start0 = p[j].t->ndim ? p[j].t->offset[0] : 0;
			if (start0 >= end0)
				break;
			uint64_t vj;
			ckpt_shape_elems(p[j].t->ndim, p[j].t->extent, &vj);
			if (vj && boxes_overlap(p[i].t, p[j].t))
				return ckpt_err(CKPT_EINVALID, "step %llu: tensor '%s': the pieces of ranks "
				                "%u and %u overlap", (unsigned long long)step, t0->name,
				                p[i].rank, p[j].rank);
		}
	}
	if (have != want) {
		/* Which ranks hold pieces tells the operator which one is missing or short. */
		char who[160];
		ranks_list(who, sizeof who, p, n);
		return ckpt_err(CKPT_EINVALID, "step %llu: tensor '%s': the pieces of ranks %s "
		                "cover %llu of %llu elements (a gap)", (unsigned long long)step,
		                t0->name, who, (unsigned long long)have, (unsigned long long)want);
	}
	return 0;
}

static int check_replicated(const struct piece *p, size_t n, uint64_t step)
{
	const struct io_tensor_entry *a = p[0].t;
	/* Every rank holds the whole value (a reader of any rank loads it from any
	 * shard): a sub-box would pass the hash check when all ranks hold the same one. */
	for (size_t i = 0; i < n; i++) {
		const struct io_tensor_entry *t = p[i].t;
		for (unsigned d = 0; d < t->ndim; d++)
			if (t->offset[d] || t->extent[d] != t->global_shape[d])
				return ckpt_err(CKPT_EINVALID, "step %llu: replicated '%s' on rank %u is "
				                "not the whole value: dim %u holds [%llu, +%llu) of %llu",
				                (unsigned long long)step, t->name, p[i].rank, d,
				                (unsigned long long)t->offset[d],
				                (unsigned long long)t->extent[d],
				                (unsigned long long)t->global_shape[d]);
	}
	for (size_t i = 1; i < n; i++) {
		const struct io_tensor_entry *b = p[i].t;
		bool same = a->raw_bytes == b->raw_bytes && a->nchunks == b->nchunks;
		for (uint32_t k = 0; same && k < a->nchunks; k++) {
			const struct io_chunk_entry *x = &p[0].ix->chunks[a->first_chunk + k];
			const struct io_chunk_entry *y = &p[i].ix->chunks[b->first_chunk + k];
			same = x->raw_len == y->raw_len && !memcmp(x->hash, y->hash, CKPT_HASH_BYTES);
		}
		if (!same)
			return ckpt_err(CKPT_EINVALID, "step %llu: replicated '%s' differs between ranks "
			                "%u and %u", (unsigned long long)step, a->name, p[0].rank, p[i].rank);
	}
	return 0;
}

static int check_group(struct piece *p, size_t n, uint64_t step)
{
	const struct io_tensor_entry *a = p[0].t;
	for (size_t i = 1; i < n; i++) {
		const struct io_tensor_entry *b = p[i].t;
		if (a->kind != b->kind || a->dtype != b->dtype || a->policy != b->policy ||
		    a->flags != b->flags || a->ndim != b->ndim)
			return ckpt_err(CKPT_EINVALID, "step %llu: '%s' has a different kind, dtype, policy "
			                "or rank on ranks %u and %u", (unsigned long long)step, a->name,
			                p[0].rank, p[i].rank);
		/* Rank-bound items are each rank's own: their shapes may differ. */
		if (a->policy != CKPT_RANK_BOUND &&
		    memcmp(a->global_shape, b->global_shape, a->ndim * sizeof a->global_shape[0]))
			return ckpt_err(CKPT_EINVALID, "step %llu: '%s' has different global shapes on "
			                "ranks %u and %u", (unsigned long long)step, a->name, p[0].rank,
			                p[i].rank);
	}
	switch (a->policy) {
	case CKPT_SHARDED:    return check_sharded(p, n, step);
	case CKPT_REPLICATED: return check_replicated(p, n, step);
	default:              return 0;   /* rank-bound: names are unique within a shard */
	}
}

int commit_validate(const struct io_shard_index *const *ix, uint32_t world, uint64_t step)
{
	size_t total = 0;
	for (uint32_t r = 0; r < world; r++) {
		if (!ix[r])
			return ckpt_err(CKPT_EINVALID, "step %llu: no vote from rank %u",
			                (unsigned long long)step, r);
		if (ix[r]->rank != r || ix[r]->world != world || ix[r]->step != step)
			return ckpt_err(CKPT_EINVALID, "step %llu: rank %u sent the index of step %llu, "
			                "rank %u of %u", (unsigned long long)step, r,
			                (unsigned long long)ix[r]->step, ix[r]->rank, ix[r]->world);
		total += ix[r]->ntensors;
	}
	struct piece *p = malloc((total ? total : 1) * sizeof *p);
	if (!p)
		return ckpt_err(-ENOMEM, "validation of step %llu", (unsigned long long)step);
	size_t n = 0;
	for (uint32_t r = 0; r < world; r++)
		for (uint32_t t = 0; t < ix[r]->ntensors; t++)
			p[n++] = (struct piece){ ix[r], &ix[r]->tensors[t], r };
	qsort(p, n, sizeof *p, piece_by_name);
	int rc = 0;
	for (size_t i = 0; i < n && !rc;) {
		size_t j = i + 1;
		while (j < n && !strcmp(p[j].t->name, p[i].t->name))
			j++;
		rc = check_group(p + i, j - i, step);
		i = j;
	}
	free(p);
	return rc;
}
