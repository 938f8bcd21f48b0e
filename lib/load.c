/*
 * load.c — reading a committed step: the catalog of its tensors, and the read of
 * any box of any tensor whatever sharding it was saved with.
 *
 * For each saved piece (one rank's box) that overlaps the requested box, only the
 * chunks that hold overlapping bytes are read (io_read_batch: many in flight over
 * all shard files), and of a chunk with block hashes only the blocks that hold
 * them; all verified, and the overlap is copied run by run into the destination.
 * Resharding is therefore a property of load.
 */
#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "glue.h"
#include "snapshot/snapshot.h"

/* ------------------------------------------------------------------ open / close */

void ckpt_load_close(ckpt_load *l)
{
	if (!l)
		return;
	uint32_t world = l->rec.world;
	for (uint32_t r = 0; r < world; r++) {
		if (l->readers && l->readers[r]) {
			/* What the loads read of this file: partial reads show here. */
			struct io_read_stats st;
			io_shard_reader_stats(l->readers[r], &st);
			if (st.reads)
				ckpt_log(CKPT_LOG_DEBUG, "step %llu: %s: %llu chunk reads (%llu partial, "
				         "%llu blocks checked), %llu bytes, block table %llu bytes",
				         (unsigned long long)l->rec.step, l->shards[r].path,
				         (unsigned long long)st.reads, (unsigned long long)st.partial_reads,
				         (unsigned long long)st.blocks_checked, (unsigned long long)st.bytes,
				         (unsigned long long)st.table_bytes);
		}
		if (l->readers)
			io_shard_reader_close(l->readers[r]);
		if (l->ix)
			io_index_free(l->ix[r]);
		if (l->shards)
			manifest_shard_free(&l->shards[r]);
	}
	for (size_t i = 0; i < l->nref_rel; i++)
		ckpt_free(l->ref_rel[i]);
	ckpt_free(l->ref_rel);
	ckpt_free(l->ref_first);
	ckpt_free(l->readers);
	ckpt_free(l->fetch);
	ckpt_free(l->ix);
	ckpt_free(l->shards);
	ckpt_free(l->entries);
	ckpt_free(l->piece_store);
	ckpt_free(l);
}

static int piece_cmp(const void *a, const void *b, void *arg)
{
	const ckpt_load *l = arg;
	const struct load_piece *x = a, *y = b;
	int c = strcmp(l->ix[x->rank]->tensors[x->tensor].name, l->ix[y->rank]->tensors[y->tensor].name);
	if (c)
		return c;
	return x->rank < y->rank ? -1 : x->rank > y->rank;
}

/* Group every rank's tensors by name into entries. */
static int load_build_catalog(ckpt_load *l)
{
	uint64_t total = 0;
	for (uint32_t r = 0; r < l->rec.world; r++)
		total += l->ix[r]->ntensors;
	l->piece_store = ckpt_malloc((total ? total : 1) * sizeof *l->piece_store);
	l->entries = ckpt_malloc((total ? total : 1) * sizeof *l->entries);
	if (!l->piece_store || !l->entries)
		return ckpt_err(-ENOMEM, "catalog of step %llu", (unsigned long long)l->rec.step);
	size_t n = 0;
	for (uint32_t r = 0; r < l->rec.world; r++)
		for (uint32_t t = 0; t < l->ix[r]->ntensors; t++)
			l->piece_store[n++] = (struct load_piece){ r, t };
	qsort_r(l->piece_store, n, sizeof *l->piece_store, piece_cmp, l);
	l->nentries = 0;
	for (size_t i = 0; i < n;) {
		const struct io_tensor_entry *m = &l->ix[l->piece_store[i].rank]->tensors[l->piece_store[i].tensor];
		struct load_entry *e = &l->entries[l->nentries++];
		memset(e, 0, sizeof *e);
		e->meta = m;
		e->pieces = &l->piece_store[i];
		while (i < n) {
			const struct load_piece *p = &l->piece_store[i];
			const struct io_shard_index *ix = l->ix[p->rank];
			const struct io_tensor_entry *t = &ix->tensors[p->tensor];
			if (strcmp(t->name, m->name))
				break;
			/* Validated at commit; re-checked because the manifest is on disk. */
			if (t->dtype != m->dtype || t->ndim != m->ndim || t->policy != m->policy ||
			    t->flags != m->flags)
				return ckpt_err(CKPT_ECORRUPT, "step %llu: tensor '%s' differs between ranks",
				                (unsigned long long)l->rec.step, m->name);
			e->npieces++;
			e->nchunks += t->nchunks;
			for (uint32_t k = 0; k < t->nchunks; k++)
				e->stored_bytes += ix->chunks[t->first_chunk + k].stored_len;
			i++;
		}
	}
	return 0;
}

/* Bytes of a shard held by ckptd, in pieces a READ may ask for. */
#define LOAD_FETCH_PIECE (8u << 20)
static int load_fetch_bytes(void *arg, void *buf, size_t len, uint64_t off)
{
	struct load_fetch *f = arg;
	ckpt_ctx *c = f->ctx;
	pthread_mutex_lock(&c->manifest_lock);
	int rc = c->fetch[f->inst] ? 0 : glue_remote_conn(c, f->inst, &c->fetch[f->inst]);
	struct remote_conn *conn = c->fetch[f->inst];
	pthread_mutex_unlock(&c->manifest_lock);
	for (size_t done = 0; !rc && done < len; done += LOAD_FETCH_PIECE) {
		size_t n = len - done < LOAD_FETCH_PIECE ? len - done : LOAD_FETCH_PIECE;
		rc = remote_fetch(conn, f->rel, (uint8_t *)buf + done, n, off + done);
	}
	return rc;
}

int load_reader_open(const ckpt_load *l, uint32_t r, struct io_engine *e,
                     const struct io_shard_index *index, struct io_shard_reader **out)
{
	const struct manifest_shard *sh = &l->shards[r];
	ckpt_ctx *c = l->ctx;
	if (!glue_remote(c)) {
		char path[4400];
		snprintf(path, sizeof path, "%s/%s", c->cfg.root, sh->path);
		return io_shard_reader_open(e, path, index, out);
	}
	char holder[REMOTE_MAX_HOST + 8];
	const char *rel;
	int rc = remote_path_split(sh->path, holder, sizeof holder, &rel);
	if (rc)
		return rc;
	unsigned inst = 0;
	if (holder[0]) {
		char name[REMOTE_MAX_HOST + 8];
		for (inst = 0; inst < c->cfg.nckptd; inst++) {
			snprintf(name, sizeof name, "%s:%u", c->inst[inst].host, c->inst[inst].port);
			if (!strcmp(name, holder))
				break;
		}
		if (inst == c->cfg.nckptd)
			return ckpt_err(CKPT_ENOTFOUND, "the shard of rank %u is held by ckptd %s, which "
			                "the target does not name", r, holder);
	}
	struct load_fetch *f = &l->fetch[r];
	*f = (struct load_fetch){ .ctx = c, .inst = inst, .rel = rel };
	char name[4400];
	snprintf(name, sizeof name, "ckptd %s:%u: %s", c->inst[inst].host, c->inst[inst].port, rel);
	return io_shard_reader_open_fetch(e, name, sh->file_size, index, load_fetch_bytes, f, out);
}

int load_footer_open(const ckpt_load *l, uint32_t r, struct io_shard_reader **out)
{
	char path[4400];
	const struct manifest_shard *sh = &l->shards[r];
	snprintf(path, sizeof path, "%s", sh->path);
	struct io_shard_reader *rd;
	int rc = load_reader_open(l, r, NULL, NULL, &rd);
	if (rc)
		return rc;
	uint8_t h[CKPT_HASH_BYTES];
	if (io_shard_reader_footer_hash(rd, h) || memcmp(h, sh->footer_hash, sizeof h) ||
	    io_shard_reader_index(rd)->data_end != sh->footer_offset) {
		rc = ckpt_err(CKPT_ECORRUPT, "%s: its footer is not the index committed for rank %u "
		              "(hash or offset %llu differs: file replaced or damaged)", path, r,
		              (unsigned long long)sh->footer_offset);
		io_shard_reader_close(rd);
		return rc;
	}
	*out = rd;
	return 0;
}

/* The committed index of rank r is the footer of its shard file. */
static int load_index_from_footer(ckpt_load *l, uint32_t r)
{
	struct io_shard_reader *rd;
	int rc = load_footer_open(l, r, &rd);
	if (rc)
		return rc;
	l->ix[r] = io_shard_reader_take_index(rd);
	io_shard_reader_close(rd);
	return 0;
}

/* The paths of the files the shards reference (ckpt_load_chunks names them). */
static int load_ref_paths(ckpt_load *l)
{
	uint32_t world = l->rec.world;
	size_t n = 0;
	for (uint32_t r = 0; r < world; r++)
		n += l->ix[r]->nfiles;
	if (!n)
		return 0;
	l->ref_first = ckpt_calloc(world, sizeof *l->ref_first);
	l->ref_rel = ckpt_calloc(n, sizeof *l->ref_rel);
	if (!l->ref_first || !l->ref_rel)
		return ckpt_err(-ENOMEM, "paths of %zu referenced files", n);
	for (uint32_t r = 0; r < world; r++) {
		l->ref_first[r] = l->nref_rel;
		for (uint32_t f = 0; f < l->ix[r]->nfiles; f++) {
			const struct io_ref_file *e = &l->ix[r]->files[f];
			char rel[256];
			int rc = ckpt_path_shard_rel(rel, sizeof rel, e->step, e->rank, e->save_id);
			if (rc)
				return ckpt_err(rc, "path of a file rank %u references", r);
			if (!(l->ref_rel[l->nref_rel] = ckpt_strdup(rel)))
				return ckpt_err(-ENOMEM, "paths of %zu referenced files", n);
			l->nref_rel++;
		}
	}
	return 0;
}

const char *load_chunk_file(const ckpt_load *l, uint32_t rank, uint32_t k)
{
	uint32_t f = io_chunk_file(l->ix[rank], k);
	return f ? l->ref_rel[l->ref_first[rank] + f - 1] : l->shards[rank].path;
}

int ckpt_load_open(ckpt_ctx *c, uint64_t step, ckpt_load **out)
{
	if (!out)
		return ckpt_err(-EINVAL, "ckpt_load_open: out is NULL");
	*out = NULL;
	if (!c)
		return ckpt_err(-EINVAL, "ckpt_load_open: context is NULL");
	CKPT_LOG_SCOPE(&c->log, step == CKPT_LATEST ? CKPT_LOG_NO_STEP : step);
	ckpt_err_clear();
	struct manifest *m;
	int rc = glue_manifest(c, &m);
	if (rc)
		return rc;
	if (step == CKPT_LATEST && (rc = manifest_step_latest(m, &step)))
		return ckpt_err(rc, "%s has no committed step", c->where);
	ckpt_load *l = ckpt_calloc(1, sizeof *l);
	if (!l)
		return ckpt_err(-ENOMEM, "load of step %llu", (unsigned long long)step);
	l->ctx = c;
	rc = manifest_step_get(m, step, &l->rec);
	if (rc == 0 && l->rec.state != CKPT_STATE_COMMITTED)
		rc = CKPT_ENOTFOUND;
	if (rc) {
		if (rc == CKPT_ENOTFOUND)
			ckpt_err(rc, "step %llu is not a committed step of %s", (unsigned long long)step,
			         c->where);
		l->rec.world = 0;
		ckpt_load_close(l);
		return rc;
	}
	uint32_t world = l->rec.world;
	l->shards = ckpt_calloc(world, sizeof *l->shards);
	l->ix = ckpt_calloc(world, sizeof *l->ix);
	l->readers = ckpt_calloc(world, sizeof *l->readers);
	l->fetch = ckpt_calloc(world, sizeof *l->fetch);
	if (!l->shards || !l->ix || !l->readers || !l->fetch) {
		rc = ckpt_err(-ENOMEM, "load of step %llu", (unsigned long long)step);
		goto fail;
	}
	for (uint32_t r = 0; r < world; r++) {
		if ((rc = manifest_shard_get(m, step, r, &l->shards[r])))
			goto fail;
		if (l->shards[r].index_len)
			rc = io_index_decode(l->shards[r].index, l->shards[r].index_len, &l->ix[r]);
		else
			rc = load_index_from_footer(l, r);
		if (rc)
			goto fail;
		if (l->ix[r]->rank != r || l->ix[r]->world != world || l->ix[r]->step != step) {
			rc = ckpt_err(CKPT_ECORRUPT, "shard record of rank %u describes step %llu rank %u "
			              "of %u", r, (unsigned long long)l->ix[r]->step, l->ix[r]->rank,
			              l->ix[r]->world);
			goto fail;
		}
	}
	if ((rc = load_build_catalog(l)) || (rc = load_ref_paths(l)))
		goto fail;
	*out = l;
	return 0;
fail:
	ckpt_err_prefix(rc, "open step %llu of %s", (unsigned long long)step, c->where);
	ckpt_load_close(l);
	return rc;
}

uint64_t ckpt_load_step(const ckpt_load *l)
{
	return l ? l->rec.step : CKPT_LATEST;
}

static const struct load_entry *load_find(const ckpt_load *l, const char *name)
{
	size_t lo = 0, hi = l->nentries;
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		int c = strcmp(l->entries[mid].meta->name, name);
		if (c == 0)
			return &l->entries[mid];
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

/* ------------------------------------------------------------------ the overlap copy */

/*
 * How one saved piece P maps onto the requested box R through their intersection I.
 * Dimensions after k are covered whole by P, R and I alike, so one run of
 * ie[k] * inner elements is contiguous in both P and R; dimensions before k are
 * walked row by row ("rows" of P are its index over dims 0..k-1).
 */
struct copy_plan {
	unsigned ndim, k;
	size_t   esize;
	uint64_t po[CKPT_MAX_NDIM], pe[CKPT_MAX_NDIM];
	uint64_t ro[CKPT_MAX_NDIM], re[CKPT_MAX_NDIM];
	uint64_t io[CKPT_MAX_NDIM], ie[CKPT_MAX_NDIM];
	uint64_t rstride[CKPT_MAX_NDIM];   /* bytes per index step of R in each dim */
	uint64_t prow;                     /* bytes per row of P */
	uint64_t run_off;                  /* byte offset of the run inside a row of P */
	uint64_t run;                      /* bytes of one run */
	uint64_t lo, hi;                   /* byte range of P holding the overlap */
	uint8_t *dst;
	struct snapshot *sn;               /* copies into device memory go through it */
	int      mem;                      /* dst's kind, resolved: CKPT_MEM_HOST or _DEVICE */
};

/* Build the plan; false if P and R do not overlap. */
static bool plan_make(struct copy_plan *p, const struct io_tensor_entry *t, unsigned ndim,
                      const uint64_t *ro, const uint64_t *re, void *dst)
{
	memset(p, 0, sizeof *p);
	p->esize = (t->flags & IO_TENSOR_BLOB) ? 1 : ckpt_dtype_size(t->dtype);
	p->dst = dst;
	/* A scalar is a 1-element vector. */
	p->ndim = ndim ? ndim : 1;
	for (unsigned d = 0; d < p->ndim; d++) {
		p->po[d] = ndim ? t->offset[d] : 0;
		p->pe[d] = ndim ? t->extent[d] : 1;
		p->ro[d] = ndim ? ro[d] : 0;
		p->re[d] = ndim ? re[d] : 1;
		uint64_t a = p->po[d] > p->ro[d] ? p->po[d] : p->ro[d];
		uint64_t pend = p->po[d] + p->pe[d], rend = p->ro[d] + p->re[d];
		uint64_t b = pend < rend ? pend : rend;
		if (b <= a)
			return false;
		p->io[d] = a;
		p->ie[d] = b - a;
	}
	unsigned k = p->ndim - 1;
	while (k > 0 && p->ie[k] == p->pe[k] && p->ie[k] == p->re[k])
		k--;
	p->k = k;
	uint64_t inner = 1;
	for (unsigned d = k + 1; d < p->ndim; d++)
		inner *= p->pe[d];
	uint64_t s = p->esize;
	for (unsigned d = p->ndim; d-- > 0;) {
		p->rstride[d] = s;
		s *= p->re[d];
	}
	p->prow = p->pe[k] * inner * p->esize;
	p->run_off = (p->io[k] - p->po[k]) * inner * p->esize;
	p->run = p->ie[k] * inner * p->esize;
	/* First and last rows of P that meet I, as linear row indices. */
	uint64_t first = 0, last = 0;
	for (unsigned d = 0; d < k; d++) {
		first = first * p->pe[d] + (p->io[d] - p->po[d]);
		last = last * p->pe[d] + (p->io[d] + p->ie[d] - 1 - p->po[d]);
	}
	p->lo = first * p->prow + p->run_off;
	p->hi = last * p->prow + p->run_off + p->run;
	return true;
}

/* Copy the part of the overlap held by P's bytes [cb, cb+len) from raw. */
static int plan_copy(const struct copy_plan *p, uint64_t cb, const uint8_t *raw, size_t len)
{
	uint64_t ce = cb + len;
	if (ce <= p->lo || cb >= p->hi)
		return 0;
	uint64_t r0 = cb / p->prow, r1 = (ce - 1) / p->prow;
	for (uint64_t r = r0; r <= r1; r++) {
		/* Row index -> index over dims 0..k-1 of P; skip rows outside I. */
		uint64_t rem = r, dst_off = 0;
		bool inside = true;
		for (unsigned d = p->k; d-- > 0;) {
			uint64_t m = rem % p->pe[d];
			rem /= p->pe[d];
			uint64_t g = p->po[d] + m;
			if (g < p->io[d] || g >= p->io[d] + p->ie[d]) {
				inside = false;
				break;
			}
			dst_off += (g - p->ro[d]) * p->rstride[d];
		}
		if (!inside)
			continue;
		dst_off += (p->io[p->k] - p->ro[p->k]) * p->rstride[p->k];
		uint64_t s = r * p->prow + p->run_off, e = s + p->run;
		uint64_t a = s > cb ? s : cb, b = e < ce ? e : ce;
		if (a < b) {
			int rc = snapshot_copy_out(p->sn, p->dst + dst_off + (a - s), raw + (a - cb),
			                           (size_t)(b - a), p->mem);
			if (rc)
				return rc;
		}
	}
	return 0;
}

/* ------------------------------------------------------------------ the batch */

/* One saved piece that overlaps one request's box. q->arg of its chunk reads. */
struct load_job {
	struct copy_plan plan;
	const struct io_shard_index *ix;
	uint64_t *pending;            /* chunks of its request not yet delivered */
};

static int load_chunk_cb(void *arg, const struct io_read_req *req, uint64_t off, const void *raw,
                         size_t len)
{
	const struct load_job *j = arg;
	const struct io_chunk_entry *ch = &j->ix->chunks[req->chunk];
	int rc = plan_copy(&j->plan, ch->raw_offset + off, raw, len);
	/* Copies to device memory read raw, whose buffer goes back to the pool when this
	 * returns: wait for them (the reads of other chunks stay in flight). */
	int w = snapshot_copy_out_wait(j->plan.sn);
	if (rc || w)
		return rc ? rc : w;
	(*j->pending)--;
	return 0;
}

/* Read the batch: the chunks GPUDirect Storage can serve (raw, into device memory,
 * when it is on) through cuFile, the others through io_uring. */
static int load_read(ckpt_load *l, struct io_engine *eng, struct io_read_req *reads, size_t n)
{
	struct snapshot *sn = l->ctx->snap;
	if (!(l->ctx->cfg.gds & CKPT_GDS_LOAD) || !snapshot_gds_on(sn))
		return io_read_batch(eng, reads, n, load_chunk_cb);
	size_t k = 0;                  /* reads[0, k): for cuFile */
	for (size_t i = 0; i < n; i++) {
		const struct load_job *j = reads[i].arg;
		/* A reference's bytes are in another file, which the reader opens. */
		if (j->plan.mem == CKPT_MEM_DEVICE && j->ix->chunks[reads[i].chunk].codec == IO_CODEC_RAW &&
		    !io_chunk_file(j->ix, reads[i].chunk)) {
			struct io_read_req t = reads[i];
			reads[i] = reads[k];
			reads[k++] = t;
		}
	}
	int rc = k ? snapshot_gds_read_batch(sn, l->ctx->pool, reads, k, load_chunk_cb) : 0;
	if (rc == -EOPNOTSUPP) {       /* cuFile refused a file; nothing was read */
		ckpt_log(CKPT_LOG_WARN, "%s; reading through the pinned path", ckpt_err_msg());
		ckpt_err_clear();
		return io_read_batch(eng, reads, n, load_chunk_cb);
	}
	if (!rc && k < n)
		rc = io_read_batch(eng, reads + k, n - k, load_chunk_cb);
	return rc;
}

int load_engine_acquire(ckpt_ctx *c, struct io_engine **out)
{
	pthread_mutex_lock(&c->load_lock);
	int rc = 0;
	if (!c->load_engine)
		rc = io_engine_create(c->pool, c->cfg.queue_depth, &c->load_engine);
	if (rc) {
		pthread_mutex_unlock(&c->load_lock);
		return ckpt_err_prefix(rc, "load engine of %s", c->cfg.root);
	}
	*out = c->load_engine;
	return 0;
}

void load_engine_release(ckpt_ctx *c)
{
	pthread_mutex_unlock(&c->load_lock);
}

int load_shard_reader(ckpt_load *l, uint32_t rank, struct io_shard_reader **out)
{
	if (!l->readers[rank]) {
		int rc = load_reader_open(l, rank, l->ctx->load_engine, l->ix[rank], &l->readers[rank]);
		if (rc)
			return rc;
	}
	*out = l->readers[rank];
	return 0;
}

/* Choose the pieces to read for entry e on behalf of this rank, or of saved_rank
 * when the caller mapped one explicitly (>= 0). */
static int load_pick(const ckpt_load *l, const struct load_entry *e, int saved_rank,
                     uint32_t *first, uint32_t *count)
{
	const ckpt_ctx *c = l->ctx;
	*first = 0;
	*count = e->npieces;
	if (e->meta->policy == CKPT_SHARDED)
		return 0;
	if (saved_rank >= 0) {
		for (uint32_t i = 0; i < e->npieces; i++) {
			if (e->pieces[i].rank == (uint32_t)saved_rank) {
				*first = i;
				*count = 1;
				return 0;
			}
		}
		return ckpt_err(CKPT_ENOTFOUND, "'%s': saved rank %d of %u holds no copy of it",
		                e->meta->name, saved_rank, l->rec.world);
	}
	if (e->meta->policy == CKPT_RANK_BOUND && (uint32_t)c->cfg.world != l->rec.world)
		return ckpt_err(CKPT_ERANKBOUND, "'%s' is rank-bound and was saved by %u ranks; this "
		                "job has %d: it loads only for the same world size and rank, unless "
		                "a saved rank is chosen explicitly (ckpt_load_blob_rank, "
		                "ckpt_load_req.saved_rank)", e->meta->name, l->rec.world, c->cfg.world);
	/* Replicated: this rank's copy if it has one (local disk first), else the first. */
	for (uint32_t i = 0; i < e->npieces; i++) {
		if (e->pieces[i].rank == (uint32_t)c->cfg.rank) {
			*first = i;
			*count = 1;
			return 0;
		}
	}
	if (e->meta->policy == CKPT_RANK_BOUND)
		return ckpt_err(CKPT_ERANKBOUND, "'%s' is rank-bound and rank %d saved none",
		                e->meta->name, c->cfg.rank);
	*count = 1;
	return 0;
}

/* A request after its checks: the entry, the box, and the pieces to read. */
struct load_plan_req {
	const struct load_entry *e;
	struct load_entry one;        /* a single-piece view (blobs by rank) */
	uint64_t ro[CKPT_MAX_NDIM], re[CKPT_MAX_NDIM];
	uint32_t first, count;
	bool     empty;               /* nothing to read */
	int      mem;                 /* the destination's kind, resolved */
};

/* Check request q against the step; 0 or its error (message names the tensor). */
static int load_req_check(const ckpt_load *l, const struct ckpt_load_req *q,
                          struct load_plan_req *p)
{
	memset(p, 0, sizeof *p);
	if (!q->name)
		return ckpt_err(-EINVAL, "load request without a name");
	const char *name = q->name;
	const struct load_entry *e = load_find(l, name);
	if (!e)
		return ckpt_err(CKPT_ENOTFOUND, "tensor '%.200s' is not in step %llu", name,
		                (unsigned long long)l->rec.step);
	const struct io_tensor_entry *t = e->meta;
	if (q->flags)
		return ckpt_err(-EINVAL, "tensor '%s': request flags 0x%x (must be 0)", name, q->flags);
	int dev;
	p->mem = snapshot_mem_kind(l->ctx->snap, q->dst, q->mem, &dev);
	if (p->mem < 0)
		return ckpt_err_prefix(p->mem, "tensor '%s'", name);
	if (q->dtype != t->dtype)
		return ckpt_err(CKPT_EDTYPE, "tensor '%s' is %s, asked for %s", name,
		                ckpt_dtype_name(t->dtype), ckpt_dtype_name(q->dtype));
	if (q->ndim != t->ndim)
		return ckpt_err(CKPT_ESHAPE, "tensor '%s' has %u dimensions, asked for %u", name,
		                t->ndim, q->ndim);
	int rc = load_pick(l, e, q->saved_rank, &p->first, &p->count);
	if (rc)
		return rc;
	p->e = e;
	/* A rank-bound or replicated item is read from one piece, whose shape may differ
	 * from the first piece's record (rank-bound values are each rank's own). */
	if (p->count == 1 && e->meta->policy != CKPT_SHARDED) {
		p->one = *e;
		const struct load_piece *pc = &e->pieces[p->first];
		p->one.meta = &l->ix[pc->rank]->tensors[pc->tensor];
		p->one.pieces = (struct load_piece *)pc;
		p->one.npieces = 1;
		p->first = 0;
		p->e = &p->one;
		t = p->one.meta;
	}
	const uint64_t *shape = (t->flags & IO_TENSOR_BLOB) ? t->extent : t->global_shape;
	for (unsigned d = 0; d < q->ndim; d++) {
		p->ro[d] = q->offset ? q->offset[d] : 0;
		p->re[d] = q->extent ? q->extent[d] : shape[d];
		uint64_t end;
		if (!ckpt_add_u64(p->ro[d], p->re[d], &end) || end > shape[d])
			return ckpt_err(CKPT_ESHAPE, "tensor '%s': slice [%llu, +%llu) outside dimension %u "
			                "of size %llu", name, (unsigned long long)p->ro[d],
			                (unsigned long long)p->re[d], d, (unsigned long long)shape[d]);
		if (p->re[d] == 0)
			p->empty = true;    /* an empty box: nothing to read */
	}
	if (!p->empty && !q->dst)
		return ckpt_err(-EINVAL, "tensor '%s': destination is NULL", name);
	return 0;
}

/* Plan request i's jobs and chunk reads; the jobs array is sized by the caller. */
static int load_req_plan(ckpt_load *l, const struct load_plan_req *p, void *dst,
                         uint64_t *pending, struct load_job *jobs, size_t *njobs,
                         struct io_read_req **reads, size_t *nreads, size_t *rcap)
{
	const struct load_entry *e = p->e;
	unsigned ndim = e->meta->ndim;
	uint64_t covered = 0, want = 1;
	for (unsigned d = 0; d < ndim; d++)
		want *= p->re[d];
	for (uint32_t i = p->first; i < p->first + p->count; i++) {
		const struct load_piece *pc = &e->pieces[i];
		const struct io_shard_index *ix = l->ix[pc->rank];
		const struct io_tensor_entry *t = &ix->tensors[pc->tensor];
		struct load_job *j = &jobs[*njobs];
		j->ix = ix;
		j->pending = pending;
		if (!plan_make(&j->plan, t, ndim, p->ro, p->re, dst))
			continue;
		j->plan.sn = l->ctx->snap;
		j->plan.mem = p->mem;
		(*njobs)++;
		uint64_t vol = 1;
		for (unsigned d = 0; d < j->plan.ndim; d++)
			vol *= j->plan.ie[d];
		covered += vol;
		struct io_shard_reader *rd;
		int rc = load_shard_reader(l, pc->rank, &rd);
		if (rc)
			return rc;
		for (uint32_t k = 0; k < t->nchunks; k++) {
			uint32_t ci = t->first_chunk + k;
			const struct io_chunk_entry *ch = &ix->chunks[ci];
			if (ch->raw_offset + ch->raw_len <= j->plan.lo || ch->raw_offset >= j->plan.hi)
				continue;
			if (*nreads == *rcap) {
				size_t cap = *rcap ? *rcap * 2 : 64;
				struct io_read_req *n = ckpt_realloc(*reads, cap * sizeof *n);
				if (!n)
					return ckpt_err(-ENOMEM, "load of '%s'", e->meta->name);
				*reads = n;
				*rcap = cap;
			}
			/* Only the bytes of the overlap: a chunk with block hashes is then read
			 * and verified block-wise (io_read_batch decides). */
			uint64_t lo = j->plan.lo > ch->raw_offset ? j->plan.lo - ch->raw_offset : 0;
			uint64_t hi = j->plan.hi - ch->raw_offset < ch->raw_len
				? j->plan.hi - ch->raw_offset : ch->raw_len;
			(*reads)[(*nreads)++] = (struct io_read_req){ .reader = rd, .chunk = ci, .arg = j,
			                                              .lo = lo, .hi = hi };
			(*pending)++;
		}
	}
	/* Commit-time validation guarantees the pieces tile the shape; a manifest that
	 * says otherwise is damaged, and a partly filled buffer must not pass as data. */
	if (covered != want && !(ndim == 0 && covered == 1))
		return ckpt_err(CKPT_ECORRUPT, "'%s': saved pieces cover %llu of %llu requested elements",
		                e->meta->name, (unsigned long long)covered, (unsigned long long)want);
	return 0;
}

/* Remember the message of the earliest failed request (in the caller's order). */
static void load_note_failure(size_t i, size_t *first_idx, char *msg, size_t cap)
{
	if (i < *first_idx) {
		*first_idx = i;
		snprintf(msg, cap, "%s", ckpt_err_msg());
	}
}

int ckpt_load_tensors(ckpt_load *l, const struct ckpt_load_req *reqs, size_t n, int *results)
{
	if (!l || (n && !reqs))
		return ckpt_err(-EINVAL, "ckpt_load_tensors: NULL argument");
	CKPT_LOG_SCOPE(&l->ctx->log, l->rec.step);
	ckpt_err_clear();
	size_t first_idx = SIZE_MAX;
	char first_msg[1024] = "";
	struct load_plan_req *plans = ckpt_calloc(n ? n : 1, sizeof *plans);
	int *rcs = ckpt_calloc(n ? n : 1, sizeof *rcs);
	uint64_t *pending = ckpt_calloc(n ? n : 1, sizeof *pending);
	struct load_job *jobs = NULL;
	struct io_read_req *reads = NULL;
	size_t njobs = 0, nreads = 0, rcap = 0, maxjobs = 0;
	int rc = 0;
	if (!plans || !rcs || !pending) {
		rc = ckpt_err(-ENOMEM, "batch load of %zu requests", n);
		goto out;
	}
	/* Checks first, without the engine: a bad request is answered on its own and
	 * does not hold up the others. */
	for (size_t i = 0; i < n; i++) {
		if ((rcs[i] = load_req_check(l, &reqs[i], &plans[i]))) {
			ckpt_err_prefix(rcs[i], "load of step %llu", (unsigned long long)l->rec.step);
			load_note_failure(i, &first_idx, first_msg, sizeof first_msg);
		} else if (!plans[i].empty) {
			maxjobs += plans[i].count;
		}
	}
	jobs = ckpt_calloc(maxjobs ? maxjobs : 1, sizeof *jobs);
	struct io_engine *eng = NULL;
	if (!jobs)
		rc = ckpt_err(-ENOMEM, "batch load of %zu requests", n);
	else
		rc = load_engine_acquire(l->ctx, &eng);
	if (rc) {
		for (size_t i = 0; i < n; i++) {
			if (!rcs[i] && !plans[i].empty) {
				rcs[i] = rc;
				load_note_failure(i, &first_idx, first_msg, sizeof first_msg);
			}
		}
		goto out;
	}
	for (size_t i = 0; i < n; i++) {
		if (rcs[i] || plans[i].empty)
			continue;
		rcs[i] = load_req_plan(l, &plans[i], reqs[i].dst, &pending[i], jobs, &njobs, &reads,
		                       &nreads, &rcap);
		if (rcs[i]) {
			ckpt_err_prefix(rcs[i], "load of step %llu", (unsigned long long)l->rec.step);
			load_note_failure(i, &first_idx, first_msg, sizeof first_msg);
		}
	}
	/* ONE batch over every request: reads of all of them in flight together. Reads
	 * planned for a request that then failed its planning land in its own dst, which
	 * the caller must treat as undefined anyway. */
	if (nreads)
		rc = load_read(l, eng, reads, nreads);
	load_engine_release(l->ctx);
	if (rc) {
		ckpt_err_prefix(rc, "load of step %llu", (unsigned long long)l->rec.step);
		for (size_t i = 0; i < n; i++) {
			if (!rcs[i] && pending[i]) {
				rcs[i] = rc;
				load_note_failure(i, &first_idx, first_msg, sizeof first_msg);
			}
		}
	}
out:
	if (!rcs || !plans || !pending) {
		/* Nothing was read: every request shares the failure. */
		for (size_t i = 0; results && i < n; i++)
			results[i] = rc;
		ckpt_free(plans);
		ckpt_free(rcs);
		ckpt_free(pending);
		return rc;
	}
	int ret = first_idx < n ? rcs[first_idx] : 0;
	for (size_t i = 0; results && i < n; i++)
		results[i] = rcs[i];
	if (ret)
		ckpt_err_restore(first_msg);
	ckpt_free(plans);
	ckpt_free(rcs);
	ckpt_free(pending);
	ckpt_free(jobs);
	ckpt_free(reads);
	return ret;
}

int ckpt_load_tensor(ckpt_load *l, const char *name, int dtype, unsigned ndim,
                     const uint64_t *offset, const uint64_t *extent, void *dst, int mem)
{
	if (!l || !name)
		return ckpt_err(-EINVAL, "ckpt_load_tensor: NULL argument");
	struct ckpt_load_req q = {
		.name = name, .dtype = dtype, .ndim = ndim, .offset = offset, .extent = extent,
		.dst = dst, .mem = mem, .saved_rank = -1,
	};
	return ckpt_load_tensors(l, &q, 1, NULL);
}

static int load_blob(ckpt_load *l, const char *name, int saved_rank, void *dst, size_t cap,
                     size_t *len)
{
	ckpt_err_clear();
	const struct load_entry *e = load_find(l, name);
	if (!e)
		return ckpt_err(CKPT_ENOTFOUND, "blob '%.200s' is not in step %llu", name,
		                (unsigned long long)l->rec.step);
	uint32_t first, count;
	int rc = load_pick(l, e, saved_rank, &first, &count);
	if (rc)
		return ckpt_err_prefix(rc, "load of step %llu", (unsigned long long)l->rec.step);
	const struct load_piece *pc = &e->pieces[first];
	const struct io_tensor_entry *t = &l->ix[pc->rank]->tensors[pc->tensor];
	if (!(t->flags & IO_TENSOR_BLOB))
		return ckpt_err(CKPT_EDTYPE, "'%s' is a tensor, not a blob", name);
	if (len)
		*len = (size_t)t->raw_bytes;
	if (t->raw_bytes > cap)
		return ckpt_err(-ENOSPC, "blob '%s' is %llu bytes; the buffer holds %zu", name,
		                (unsigned long long)t->raw_bytes, cap);
	if (!t->raw_bytes)
		return 0;
	if (!dst)
		return ckpt_err(-EINVAL, "blob '%s': destination is NULL", name);
	/* The piece chosen above, named by its rank: a batch of one. */
	uint64_t n = t->raw_bytes;
	struct ckpt_load_req q = {
		.name = name, .dtype = CKPT_U8, .ndim = 1, .extent = &n, .dst = dst,
		.mem = CKPT_MEM_HOST, .saved_rank = (int)pc->rank,
	};
	return ckpt_load_tensors(l, &q, 1, NULL);
}

int ckpt_load_blob(ckpt_load *l, const char *name, void *dst, size_t cap, size_t *len)
{
	if (!l || !name)
		return ckpt_err(-EINVAL, "ckpt_load_blob: NULL argument");
	CKPT_LOG_SCOPE(&l->ctx->log, l->rec.step);
	return load_blob(l, name, -1, dst, cap, len);
}

int ckpt_load_blob_rank(ckpt_load *l, const char *name, int saved_rank, void *dst, size_t cap,
                        size_t *len)
{
	if (!l || !name)
		return ckpt_err(-EINVAL, "ckpt_load_blob_rank: NULL argument");
	if (saved_rank < 0)
		return ckpt_err(-EINVAL, "blob '%s': saved rank %d is not a rank", name, saved_rank);
	CKPT_LOG_SCOPE(&l->ctx->log, l->rec.step);
	return load_blob(l, name, saved_rank, dst, cap, len);
}

/* ------------------------------------------------------------------ catalog */

int ckpt_load_count(const ckpt_load *l)
{
	return l ? (int)l->nentries : ckpt_err(-EINVAL, "load handle is NULL");
}

/* The structs as first published: a caller's element is at least this. */
#define TENSOR_INFO_MIN sizeof(struct ckpt_tensor_info)
/* The size before hash_blocks was appended: callers built then still fill theirs. */
#define CHUNK_INFO_MIN  offsetof(struct ckpt_chunk_info, hash_blocks)

int ckpt_load_info(const ckpt_load *l, unsigned i, struct ckpt_tensor_info *uout,
                   size_t elem_size)
{
	if (!l || !uout)
		return ckpt_err(-EINVAL, "ckpt_load_info: NULL argument");
	int rc = glue_elem_size_check("ckpt_load_info", elem_size, TENSOR_INFO_MIN);
	if (rc)
		return rc;
	if (i >= l->nentries)
		return ckpt_err(CKPT_ENOTFOUND, "entry %u of %u", i, l->nentries);
	const struct load_entry *e = &l->entries[i];
	const struct io_tensor_entry *t = e->meta;
	struct ckpt_tensor_info info, *out = &info;
	memset(out, 0, sizeof *out);
	out->name = t->name;
	out->kind = t->kind;
	out->dtype = t->dtype;
	out->policy = t->policy;
	out->ndim = t->ndim;
	memcpy(out->global_shape, t->global_shape, sizeof out->global_shape);
	out->nshards = e->npieces;
	out->nchunks = e->nchunks;
	for (uint32_t k = 0; k < e->npieces; k++)
		out->logical_bytes += l->ix[e->pieces[k].rank]->tensors[e->pieces[k].tensor].raw_bytes;
	out->stored_bytes = e->stored_bytes;
	glue_elem_put(uout, 0, elem_size, &info, sizeof info);
	return 0;
}

int ckpt_load_is_blob(const ckpt_load *l, unsigned i)
{
	if (!l)
		return ckpt_err(-EINVAL, "ckpt_load_is_blob: load handle is NULL");
	if (i >= l->nentries)
		return ckpt_err(CKPT_ENOTFOUND, "entry %u of %u", i, l->nentries);
	return (l->entries[i].meta->flags & IO_TENSOR_BLOB) ? 1 : 0;
}

const char *ckpt_codec_name(int codec)
{
	switch (codec) {
	case CKPT_CODEC_RAW:  return "raw";
	case CKPT_CODEC_ZSTD: return "zstd";
	case CKPT_CODEC_BYTEGROUP: return "bytegroup";
	default:              return "?";
	}
}

int ckpt_load_chunks(const ckpt_load *l, unsigned i, struct ckpt_chunk_info *out, size_t cap,
                     size_t elem_size)
{
	if (!l || (cap && !out))
		return ckpt_err(-EINVAL, "ckpt_load_chunks: NULL argument");
	int rc = glue_elem_size_check("ckpt_load_chunks", elem_size, CHUNK_INFO_MIN);
	if (rc)
		return rc;
	if (i >= l->nentries)
		return ckpt_err(CKPT_ENOTFOUND, "entry %u of %u", i, l->nentries);
	const struct load_entry *e = &l->entries[i];
	size_t n = 0;
	/* Pieces are sorted by rank and a piece's chunks by raw offset (the index codec
	 * checks that runs are contiguous and in order). */
	for (uint32_t p = 0; p < e->npieces; p++) {
		const struct load_piece *pc = &e->pieces[p];
		const struct io_shard_index *ix = l->ix[pc->rank];
		const struct io_tensor_entry *t = &ix->tensors[pc->tensor];
		for (uint32_t k = 0; k < t->nchunks; k++, n++) {
			if (n >= cap)
				continue;
			const struct io_chunk_entry *ch = &ix->chunks[t->first_chunk + k];
			struct ckpt_chunk_info v, *o = &v;
			memset(o, 0, sizeof *o);
			o->rank = pc->rank;
			o->chunk = t->first_chunk + k;
			o->file = load_chunk_file(l, pc->rank, t->first_chunk + k);
			o->file_offset = ch->file_offset;
			o->stored_len = ch->stored_len;
			o->raw_offset = ch->raw_offset;
			o->raw_len = ch->raw_len;
			o->codec = ch->codec;
			memcpy(o->hash, ch->hash, sizeof o->hash);
			if (ix->tree && io_nblocks(ch->raw_len, ix->block_bytes))
				o->hash_blocks = ix->block_bytes;
			for (unsigned d = 0; d < t->ndim; d++) {
				o->box_offset[d] = t->offset[d];
				o->box_extent[d] = t->extent[d];
			}
			glue_elem_put(out, n, elem_size, &v, sizeof v);
		}
	}
	if (n > INT_MAX)
		return ckpt_err(-EOVERFLOW, "'%s': %zu chunks", e->meta->name, n);
	return (int)n;
}
