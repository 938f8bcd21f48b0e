/*
 * gather.c — validation of a step's votes as they arrive (docs/protocol.md §2.3),
 * so that when the last vote comes in only O(tensors) work is left before the
 * commit.
 *
 * Every name's pieces are grouped in a hash table. Each new piece is checked at
 * once against its group: same kind, dtype, policy, flags, rank and global shape;
 * a sharded piece must not overlap any earlier one (pieces are kept sorted by their
 * first-dimension offset, and only those whose first-dimension range can reach the
 * new one are compared); a replicated piece must hash like the first. Coverage
 * (no gaps) is a volume sum checked at the end: with no overlaps, covering the
 * whole shape is the same as the volumes adding up to it.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "commit/commit.h"

struct gpiece {
	const struct io_shard_index  *ix;
	const struct io_tensor_entry *t;
	uint32_t                      rank;
};

struct group {
	const char    *name;
	uint64_t       hash;
	struct gpiece  first;        /* defines kind, dtype, shape; replicated: the content */
	uint64_t       global_elems;
	uint64_t       volume;       /* sharded: elements covered so far */
	uint64_t       max_ext0;     /* longest first-dimension extent seen */
	struct gpiece *pieces;       /* sharded, non-empty: sorted by offset[0] */
	uint32_t       n, cap;
};

struct commit_gather {
	uint64_t                step;
	uint32_t                world, nvotes;
	bool                    owns;      /* free the indexes at the end */
	bool                    failed;
	struct io_shard_index **ix;        /* [world] */
	struct group          **table;     /* open addressing, power of two */
	size_t                  table_cap, ngroups;
	uint64_t                logical, stored;
	struct manifest_ref    *refs;      /* the files the votes' shards reference */
	uint32_t                nrefs, refs_cap;
};

int commit_gather_create(uint32_t world, uint64_t step, bool owns, struct commit_gather **out)
{
	*out = NULL;
	struct commit_gather *g = ckpt_calloc(1, sizeof *g);
	if (!g || !(g->ix = ckpt_calloc(world, sizeof *g->ix))) {
		ckpt_free(g);
		return ckpt_err(-ENOMEM, "validation of step %llu", (unsigned long long)step);
	}
	g->step = step;
	g->world = world;
	g->owns = owns;
	*out = g;
	return 0;
}

void commit_gather_free(struct commit_gather *g)
{
	if (!g)
		return;
	for (size_t i = 0; i < g->table_cap; i++) {
		if (g->table[i]) {
			ckpt_free(g->table[i]->pieces);
			ckpt_free(g->table[i]);
		}
	}
	ckpt_free(g->table);
	if (g->owns)
		for (uint32_t r = 0; r < g->world; r++)
			io_index_free(g->ix[r]);
	ckpt_free(g->ix);
	ckpt_free(g->refs);
	ckpt_free(g);
}

static int g_fail(struct commit_gather *g, int code)
{
	g->failed = true;
	return code;
}

static int table_grow(struct commit_gather *g)
{
	size_t cap = g->table_cap ? g->table_cap * 2 : 256;
	struct group **t = ckpt_calloc(cap, sizeof *t);
	if (!t)
		return -ENOMEM;
	for (size_t i = 0; i < g->table_cap; i++) {
		struct group *e = g->table[i];
		if (!e)
			continue;
		size_t j = e->hash & (cap - 1);
		while (t[j])
			j = (j + 1) & (cap - 1);
		t[j] = e;
	}
	ckpt_free(g->table);
	g->table = t;
	g->table_cap = cap;
	return 0;
}

/* The group of name, created (from piece p) when absent; *created tells which. */
static struct group *group_get(struct commit_gather *g, const struct gpiece *p, bool *created)
{
	*created = false;
	if ((g->ngroups + 1) * 2 > g->table_cap && table_grow(g))
		return NULL;
	const char *name = p->t->name;
	uint64_t h = XXH3_64bits(name, p->t->name_len);
	size_t j = h & (g->table_cap - 1);
	while (g->table[j]) {
		if (g->table[j]->hash == h && !strcmp(g->table[j]->name, name))
			return g->table[j];
		j = (j + 1) & (g->table_cap - 1);
	}
	struct group *e = ckpt_calloc(1, sizeof *e);
	if (!e)
		return NULL;
	e->name = name;
	e->hash = h;
	e->first = *p;
	g->table[j] = e;
	g->ngroups++;
	*created = true;
	return e;
}

static bool boxes_overlap(const struct io_tensor_entry *a, const struct io_tensor_entry *b)
{
	for (unsigned d = 0; d < a->ndim; d++)
		if (a->offset[d] + a->extent[d] <= b->offset[d] ||
		    b->offset[d] + b->extent[d] <= a->offset[d])
			return false;
	return true;
}

static uint64_t off0(const struct io_tensor_entry *t) { return t->ndim ? t->offset[0] : 0; }
static uint64_t ext0(const struct io_tensor_entry *t) { return t->ndim ? t->extent[0] : 1; }

static int add_sharded(struct commit_gather *g, struct group *e, const struct gpiece *p)
{
	const struct io_tensor_entry *t = p->t;
	uint64_t vol;
	if (!ckpt_shape_elems(t->ndim, t->extent, &vol) || !ckpt_add_u64(e->volume, vol, &e->volume))
		return ckpt_err(CKPT_EINVALID, "step %llu: tensor '%s': pieces overflow",
		                (unsigned long long)g->step, t->name);
	if (!vol)
		return 0;     /* an empty piece holds nothing and overlaps nothing */
	if (ext0(t) > e->max_ext0)
		e->max_ext0 = ext0(t);
	/* Insertion point by first-dimension offset. */
	uint32_t lo = 0, hi = e->n;
	while (lo < hi) {
		uint32_t mid = (lo + hi) / 2;
		if (off0(e->pieces[mid].t) <= off0(t))
			lo = mid + 1;
		else
			hi = mid;
	}
	/* Left: pieces that start earlier but may reach into this one. */
	for (uint32_t i = lo; i-- > 0;) {
		const struct io_tensor_entry *q = e->pieces[i].t;
		if (off0(q) + e->max_ext0 <= off0(t))
			break;
		if (boxes_overlap(q, t))
			return ckpt_err(CKPT_EINVALID, "step %llu: tensor '%s': the pieces of ranks %u "
			                "and %u overlap", (unsigned long long)g->step, t->name,
			                e->pieces[i].rank, p->rank);
	}
	/* Right: pieces that start inside this one's first-dimension range. */
	for (uint32_t i = lo; i < e->n && off0(e->pieces[i].t) < off0(t) + ext0(t); i++)
		if (boxes_overlap(e->pieces[i].t, t))
			return ckpt_err(CKPT_EINVALID, "step %llu: tensor '%s': the pieces of ranks %u "
			                "and %u overlap", (unsigned long long)g->step, t->name,
			                e->pieces[i].rank, p->rank);
	if (e->n == e->cap) {
		uint32_t cap = e->cap ? e->cap * 2 : 4;
		struct gpiece *n = ckpt_realloc(e->pieces, cap * sizeof *n);
		if (!n)
			return ckpt_err(-ENOMEM, "validation of step %llu", (unsigned long long)g->step);
		e->pieces = n;
		e->cap = cap;
	}
	memmove(&e->pieces[lo + 1], &e->pieces[lo], (e->n - lo) * sizeof *e->pieces);
	e->pieces[lo] = *p;
	e->n++;
	return 0;
}

static int add_replicated(struct commit_gather *g, const struct group *e, const struct gpiece *p)
{
	const struct io_tensor_entry *a = e->first.t, *b = p->t;
	bool same = a->raw_bytes == b->raw_bytes && a->nchunks == b->nchunks;
	for (uint32_t k = 0; same && k < a->nchunks; k++) {
		const struct io_chunk_entry *x = &e->first.ix->chunks[a->first_chunk + k];
		const struct io_chunk_entry *y = &p->ix->chunks[b->first_chunk + k];
		same = x->raw_len == y->raw_len && !memcmp(x->hash, y->hash, CKPT_HASH_BYTES);
	}
	if (!same)
		return ckpt_err(CKPT_EINVALID, "step %llu: replicated '%s' differs between ranks %u and %u",
		                (unsigned long long)g->step, a->name, e->first.rank, p->rank);
	return 0;
}

static int add_piece(struct commit_gather *g, const struct gpiece *p)
{
	bool created;
	struct group *e = group_get(g, p, &created);
	if (!e)
		return ckpt_err(-ENOMEM, "validation of step %llu", (unsigned long long)g->step);
	const struct io_tensor_entry *a = e->first.t, *b = p->t;
	if (created) {
		if (!ckpt_shape_elems(b->ndim, b->global_shape, &e->global_elems))
			return ckpt_err(CKPT_EINVALID, "step %llu: tensor '%s': shape overflows",
			                (unsigned long long)g->step, b->name);
	} else {
		if (a->kind != b->kind || a->dtype != b->dtype || a->policy != b->policy ||
		    a->flags != b->flags || a->ndim != b->ndim)
			return ckpt_err(CKPT_EINVALID, "step %llu: '%s' has a different kind, dtype, policy "
			                "or rank on ranks %u and %u", (unsigned long long)g->step, a->name,
			                e->first.rank, p->rank);
		/* Rank-bound items are each rank's own: their shapes may differ. */
		if (a->policy != CKPT_RANK_BOUND &&
		    memcmp(a->global_shape, b->global_shape, a->ndim * sizeof a->global_shape[0]))
			return ckpt_err(CKPT_EINVALID, "step %llu: '%s' has different global shapes on "
			                "ranks %u and %u", (unsigned long long)g->step, a->name,
			                e->first.rank, p->rank);
	}
	if (b->policy == CKPT_REPLICATED) {
		/* Every rank holds the whole value (a reader of any rank loads it from any
		 * shard): a sub-box would pass the hash check when all ranks hold the same one. */
		for (unsigned d = 0; d < b->ndim; d++)
			if (b->offset[d] || b->extent[d] != b->global_shape[d])
				return ckpt_err(CKPT_EINVALID, "step %llu: replicated '%s' on rank %u is "
				                "not the whole value: dim %u holds [%llu, +%llu) of %llu",
				                (unsigned long long)g->step, b->name, p->rank, d,
				                (unsigned long long)b->offset[d],
				                (unsigned long long)b->extent[d],
				                (unsigned long long)b->global_shape[d]);
	}
	switch (b->policy) {
	case CKPT_SHARDED:    return add_sharded(g, e, p);
	case CKPT_REPLICATED: return created ? 0 : add_replicated(g, e, p);
	default:              return 0;   /* rank-bound: names are unique within a shard */
	}
}

/* The files ix references, into the step's list (each once): the commit records
 * them with the step, so that GC and retention keep them while it is committed. */
static int gather_refs(struct commit_gather *g, const struct io_shard_index *ix)
{
	for (uint32_t f = 0; f < ix->nfiles; f++) {
		const struct io_ref_file *e = &ix->files[f];
		bool seen = false;
		for (uint32_t i = 0; i < g->nrefs && !seen; i++)
			seen = g->refs[i].step == e->step && g->refs[i].save_id == e->save_id &&
			       g->refs[i].rank == e->rank;
		if (seen)
			continue;
		if (g->nrefs >= MANIFEST_MAX_REFS)
			return ckpt_err(CKPT_EINVALID, "step %llu: the shards reference more than %u "
			                "files", (unsigned long long)g->step, MANIFEST_MAX_REFS);
		if (g->nrefs == g->refs_cap) {
			uint32_t cap = g->refs_cap ? g->refs_cap * 2 : 16;
			struct manifest_ref *n = ckpt_realloc(g->refs, (size_t)cap * sizeof *n);
			if (!n)
				return ckpt_err(-ENOMEM, "step %llu: referenced files",
				                (unsigned long long)g->step);
			g->refs = n;
			g->refs_cap = cap;
		}
		g->refs[g->nrefs++] = (struct manifest_ref){ e->step, e->save_id, e->rank };
	}
	return 0;
}

int commit_gather_add(struct commit_gather *g, struct io_shard_index *ix)
{
	if (g->failed) {
		if (g->owns)
			io_index_free(ix);
		return CKPT_EINVALID;
	}
	uint32_t r = ix->rank;
	if (r >= g->world || ix->world != g->world || ix->step != g->step || g->ix[r]) {
		int rc = (r < g->world && g->ix[r])
			? ckpt_err(CKPT_EINVALID, "step %llu: rank %u voted twice",
			           (unsigned long long)g->step, r)
			: ckpt_err(CKPT_EINVALID, "step %llu: an index of step %llu, rank %u of %u",
			           (unsigned long long)g->step, (unsigned long long)ix->step, ix->rank,
			           ix->world);
		if (g->owns)
			io_index_free(ix);
		return g_fail(g, rc);
	}
	g->ix[r] = ix;
	g->nvotes++;
	for (uint32_t i = 0; i < ix->ntensors; i++) {
		struct gpiece p = { ix, &ix->tensors[i], r };
		int rc = add_piece(g, &p);
		if (rc)
			return g_fail(g, rc);
		g->logical += ix->tensors[i].raw_bytes;
	}
	/* Stored: what this step wrote; a reference's bytes are another step's. */
	for (uint32_t k = 0; k < ix->nchunks; k++)
		if (!io_chunk_file(ix, k))
			g->stored += ix->chunks[k].stored_len;
	int rc = gather_refs(g, ix);
	return rc ? g_fail(g, rc) : 0;
}

int commit_gather_finish(struct commit_gather *g, struct commit_summary *sum)
{
	if (g->failed)
		return CKPT_EINVALID;
	for (uint32_t r = 0; r < g->world; r++)
		if (!g->ix[r])
			return ckpt_err(CKPT_EINVALID, "step %llu: no vote from rank %u",
			                (unsigned long long)g->step, r);
	for (size_t i = 0; i < g->table_cap; i++) {
		const struct group *e = g->table[i];
		if (e && e->first.t->policy == CKPT_SHARDED && e->volume != e->global_elems) {
			/* Which ranks hold pieces tells the operator which one is missing or short. */
			char who[160];
			size_t n = 0;
			who[0] = '\0';
			for (uint32_t k = 0; k < e->n && n + 16 < sizeof who; k++)
				n += (size_t)snprintf(who + n, sizeof who - n, "%s%u", k ? "," : "",
				                      e->pieces[k].rank);
			if (!e->n)
				snprintf(who, sizeof who, "(none)");
			return ckpt_err(CKPT_EINVALID, "step %llu: tensor '%s': the pieces of ranks %s "
			                "cover %llu of %llu elements (a gap)", (unsigned long long)g->step,
			                e->name, who, (unsigned long long)e->volume,
			                (unsigned long long)e->global_elems);
		}
	}
	if (sum) {
		sum->ntensors = (uint32_t)g->ngroups;
		sum->logical_bytes = g->logical;
		sum->stored_bytes = g->stored;
		sum->refs = g->refs;
		sum->nrefs = g->nrefs;
	}
	return 0;
}

const struct io_shard_index *commit_gather_index(const struct commit_gather *g, uint32_t rank)
{
	return rank < g->world ? g->ix[rank] : NULL;
}
