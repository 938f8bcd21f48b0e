/*
 * manifest.c — the operations of manifest.h: the commit, aborted steps, trust,
 * deletion, the readers, and the root a manifest kept apart belongs to.
 *
 * The manifest decides visibility (docs/format.md §8.6): a step is visible iff its COMMITTED
 * step record is here, and manifest_commit writes that record together with every
 * rank's shard record in one synced LMDB write transaction. Each function runs in
 * exactly one transaction (manifest_env.c), so a reader sees a step either whole
 * or not at all.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "manifest/manifest_internal.h"

/* ------------------------------------------------------------------ helpers in a txn */

/* The step record of step in txn. 0, CKPT_ENOTFOUND, CKPT_EFORMAT, CKPT_EVERSION. */
static int step_read(struct manifest *m, MDB_txn *txn, uint64_t step,
                     struct manifest_step *out)
{
	uint8_t k[MANIFEST_STEP_KEY_BYTES];
	manifest_step_key(k, step);
	MDB_val key = { sizeof k, k }, val;
	int rc = mdb_get(txn, m->dbi_steps, &key, &val);
	if (rc == MDB_NOTFOUND)
		return ckpt_err(CKPT_ENOTFOUND, "manifest %s: step %llu: no such step", m->dir,
		                (unsigned long long)step);
	if (rc)
		return manifest_fail(m, rc, "step %llu: read step record", (unsigned long long)step);
	rc = manifest_step_decode(val.mv_data, val.mv_size, step, out, NULL, 0);
	if (rc)
		return ckpt_err_prefix(rc, "manifest %s", m->dir);
	/* It would point into a page of txn: the metadata is read by manifest_step_meta
	 * (or copied, by a write that keeps it), the references by manifest_step_refs. */
	out->meta = NULL;
	out->refs_raw_ = NULL;
	return 0;
}

/* The references of a decoded record, copied (the record's bytes lie in a page of
 * the transaction). */
static int refs_copy(const struct manifest *m, const struct manifest_step *r,
                     struct manifest_ref **out)
{
	*out = NULL;
	if (!r->nrefs)
		return 0;
	if (!(*out = ckpt_malloc((size_t)r->nrefs * sizeof **out)))
		return ckpt_err(-ENOMEM, "manifest %s: step %llu: %u references", m->dir,
		                (unsigned long long)r->step, r->nrefs);
	for (uint32_t i = 0; i < r->nrefs; i++)
		manifest_ref_at(r->refs_raw_, i, &(*out)[i]);
	return 0;
}

/* The metadata of step's record in txn, copied into *copy (ckpt_malloc'd; NULL and
 * 0 when the record has none). Copied because the write that follows may move or
 * reuse the page it lies in. */
static int step_meta_copy(struct manifest *m, MDB_txn *txn, uint64_t step, char **copy,
                          uint32_t *len, struct manifest_ref **refs)
{
	*copy = NULL;
	*len = 0;
	if (refs)
		*refs = NULL;
	uint8_t k[MANIFEST_STEP_KEY_BYTES];
	manifest_step_key(k, step);
	MDB_val key = { sizeof k, k }, val;
	int rc = mdb_get(txn, m->dbi_steps, &key, &val);
	if (rc)
		return manifest_fail(m, rc, "step %llu: read step record", (unsigned long long)step);
	struct manifest_step r;
	if ((rc = manifest_step_decode(val.mv_data, val.mv_size, step, &r, NULL, 0)))
		return ckpt_err_prefix(rc, "manifest %s", m->dir);
	if (refs && (rc = refs_copy(m, &r, refs)))
		return rc;
	if (!r.meta_len)
		return 0;
	if (!(*copy = ckpt_malloc(r.meta_len)))
		return ckpt_err(-ENOMEM, "manifest %s: step %llu: metadata", m->dir,
		                (unsigned long long)step);
	memcpy(*copy, r.meta, r.meta_len);
	*len = r.meta_len;
	return 0;
}

/* Put a step record (re-encoded from *rec and note). */
static int step_write(struct manifest *m, MDB_txn *txn, const struct manifest_step *rec,
                      const char *note)
{
	uint8_t k[MANIFEST_STEP_KEY_BYTES];
	manifest_step_key(k, rec->step);
	MDB_val key = { sizeof k, k };
	MDB_val val = { manifest_step_encode(rec, note, NULL), NULL };
	/* MDB_RESERVE: encode straight into the page LMDB allocates; no copy. */
	int rc = mdb_put(txn, m->dbi_steps, &key, &val, MDB_RESERVE);
	if (rc)
		return manifest_fail(m, rc, "step %llu: write step record", (unsigned long long)rec->step);
	manifest_step_encode(rec, note, val.mv_data);
	return 0;
}

/* Delete every shard record of step; the count deleted, or a negative code. */
static int shards_delete(struct manifest *m, MDB_txn *txn, uint64_t step)
{
	int n = 0;
	/* A shard table (format 2) under the step's own key, then per-rank records. */
	uint8_t tk[MANIFEST_STEP_KEY_BYTES];
	manifest_step_key(tk, step);
	MDB_val tkey = { sizeof tk, tk };
	int trc = mdb_del(txn, m->dbi_shards, &tkey, NULL);
	if (trc == 0)
		n++;
	else if (trc != MDB_NOTFOUND)
		return manifest_fail(m, trc, "step %llu: delete shard table", (unsigned long long)step);
	for (;;) {
		/* Re-seek after each delete rather than rely on cursor-after-delete rules. */
		uint8_t k[MANIFEST_SHARD_KEY_BYTES];
		manifest_shard_key(k, step, 0);
		MDB_val key = { sizeof k, k }, val;
		MDB_cursor *cur;
		int rc = mdb_cursor_open(txn, m->dbi_shards, &cur);
		if (rc)
			return manifest_fail(m, rc, "step %llu: open cursor", (unsigned long long)step);
		rc = mdb_cursor_get(cur, &key, &val, MDB_SET_RANGE);
		bool mine = rc == 0 && key.mv_size == MANIFEST_SHARD_KEY_BYTES &&
		            ckpt_get_be64(key.mv_data) == step;
		if (mine)
			rc = mdb_cursor_del(cur, 0);
		mdb_cursor_close(cur);
		if (rc == MDB_NOTFOUND || (rc == 0 && !mine))
			return n;
		if (rc)
			return manifest_fail(m, rc, "step %llu: delete shard records", (unsigned long long)step);
		n++;
	}
}

/* ------------------------------------------------------------------ the commit */

struct commit_arg {
	const struct manifest_step  *rec;      /* state, trust and time already set */
	const struct manifest_shard *shards;
	uint32_t                     nshards;
};

static int commit_txn(struct manifest *m, MDB_txn *txn, void *varg)
{
	const struct commit_arg *a = varg;
	uint64_t step = a->rec->step;
	unsigned long long s = (unsigned long long)step;

	/* Saving a committed step again is an error, never an overwrite (docs/protocol.md §2).
	 * Checked inside the write transaction, so no other writer can slip in. */
	struct manifest_step old;
	int rc = step_read(m, txn, step, &old);
	if (rc == 0 && old.state == CKPT_STATE_COMMITTED)
		return ckpt_err(-EEXIST, "manifest %s: step %llu is already committed", m->dir, s);
	if (rc != 0 && rc != CKPT_ENOTFOUND)
		return ckpt_err_prefix(rc, "cannot commit over the existing record");
	/* Only the attempt the record names may commit: never one that was aborted, and
	 * never another than the one in flight (one coordinator per root makes both
	 * impossible; this keeps it so whatever calls this). */
	if (rc == 0 && old.save_id && a->rec->save_id &&
	    ((old.state == CKPT_STATE_INFLIGHT && old.save_id != a->rec->save_id) ||
	     (old.state == CKPT_STATE_ABORTED && old.save_id == a->rec->save_id)))
		return ckpt_err(-ESTALE, "manifest %s: step %llu: attempt %016llx cannot commit: the "
		                "record says attempt %016llx is %s", m->dir, s,
		                (unsigned long long)a->rec->save_id, (unsigned long long)old.save_id,
		                old.state == CKPT_STATE_INFLIGHT ? "in flight" : "aborted");

	/* An ABORTED/INFLIGHT record is replaced; it has no shard records, but clear
	 * the range anyway so that exactly world shard records exist afterwards. */
	rc = shards_delete(m, txn, step);
	if (rc < 0)
		return rc;

	/* Every shard canonical (the commits of lib/commit are): one table value for
	 * the step instead of a record per rank — one put, and a few contiguous pages
	 * to write and sync instead of a leaf page per ~30 ranks. */
	if (a->rec->save_id && a->nshards <= MANIFEST_MAX_TABLE_RANKS) {
		char prefix[MANIFEST_TABLE_PREFIX + 1];
		manifest_table_prefix(prefix, step);
		uint32_t i = 0;
		while (i < a->nshards && manifest_shard_tabular(prefix, a->rec->save_id, &a->shards[i]))
			i++;
		if (i == a->nshards) {
			uint8_t k[MANIFEST_STEP_KEY_BYTES];
			manifest_step_key(k, step);
			MDB_val key = { sizeof k, k };
			MDB_val val = { manifest_table_size(a->nshards), NULL };
			rc = mdb_put(txn, m->dbi_shards, &key, &val, MDB_RESERVE);
			if (rc)
				return manifest_fail(m, rc, "step %llu: write shard table", s);
			/* manifest_commit checked: ranks 0..world-1, each once. */
			manifest_table_header(val.mv_data, step, a->nshards, a->rec->save_id);
			for (i = 0; i < a->nshards; i++)
				manifest_table_put(val.mv_data, step, &a->shards[i]);
			return step_write(m, txn, a->rec, NULL);
		}
	}
	/* One cursor for every put: mdb_put would set one up and search from the root
	 * for each record (a third of the puts' time at 256 ranks). */
	MDB_cursor *cur;
	rc = mdb_cursor_open(txn, m->dbi_shards, &cur);
	if (rc)
		return manifest_fail(m, rc, "step %llu: open cursor", s);
	for (uint32_t i = 0; i < a->nshards; i++) {
		const struct manifest_shard *sh = &a->shards[i];
		uint8_t k[MANIFEST_SHARD_KEY_BYTES];
		manifest_shard_key(k, step, sh->rank);
		MDB_val key = { sizeof k, k };
		MDB_val val = { manifest_shard_rec_size(sh), NULL };
		rc = mdb_cursor_put(cur, &key, &val, MDB_RESERVE);
		if (rc) {
			mdb_cursor_close(cur);
			return manifest_fail(m, rc, "step %llu rank %u: write shard record", s, sh->rank);
		}
		manifest_shard_encode(step, sh, val.mv_data);
	}
	mdb_cursor_close(cur);
	/* The step record goes in last. Atomicity does not depend on it (the
	 * transaction is all or nothing) but it keeps the rule readable: the
	 * COMMITTED record never exists without its shard records. */
	return step_write(m, txn, a->rec, NULL);
}

int manifest_commit(struct manifest *m, const struct manifest_step *rec,
                    const struct manifest_shard *shards, uint32_t nshards)
{
	if (!m || !rec || (nshards && !shards))
		return ckpt_err(-EINVAL, "manifest_commit: NULL argument");
	unsigned long long s = (unsigned long long)rec->step;
	struct manifest_step r = *rec;
	r.state = CKPT_STATE_COMMITTED;
	if (r.trust == 0)
		r.trust = CKPT_TRUST_COMMITTED;
	if (r.commit_time_ns == 0)
		r.commit_time_ns = ckpt_wall_ns();
	int rc = manifest_step_check(&r);
	if (rc)
		return ckpt_err_prefix(rc, "manifest %s", m->dir);
	if (r.world == 0 || nshards != r.world)
		return ckpt_err(-EINVAL, "manifest %s: step %llu: %u shard records for world %u",
		                m->dir, s, nshards, r.world);

	/* Every rank 0..world-1 exactly once: a bitmap, since world may be large. */
	uint8_t *seen = ckpt_calloc((size_t)r.world / 8 + 1, 1);
	if (!seen)
		return ckpt_err(-ENOMEM, "manifest %s: step %llu: out of memory", m->dir, s);
	for (uint32_t i = 0; i < nshards && !rc; i++) {
		uint32_t rank = shards[i].rank;
		if (rank >= r.world)
			rc = ckpt_err(-EINVAL, "manifest %s: step %llu: rank %u outside world %u",
			              m->dir, s, rank, r.world);
		else if (seen[rank / 8] & (1u << (rank % 8)))
			rc = ckpt_err(-EINVAL, "manifest %s: step %llu: rank %u given twice",
			              m->dir, s, rank);
		else if ((rc = manifest_shard_check(r.step, &shards[i])) != 0)
			rc = ckpt_err_prefix(rc, "manifest %s", m->dir);
		else
			seen[rank / 8] |= (uint8_t)(1u << (rank % 8));
	}
	ckpt_free(seen);
	if (rc)
		return rc;

	struct commit_arg a = { &r, shards, nshards };
	return manifest_write(m, commit_txn, &a, "commit step");
}

/* ------------------------------------------------------------------ aborts, trust, delete */

struct abort_arg { const struct manifest_step *rec; const char *why; bool begin; };

/* An attempt's record: ABORTED with its reason, or INFLIGHT when it begins. Either
 * replaces an ABORTED or INFLIGHT record, never a COMMITTED one. An abort replaces
 * only its own attempt's record: over a newer attempt's, that attempt's files would
 * be named by no record. */
static int attempt_txn(struct manifest *m, MDB_txn *txn, void *varg)
{
	const struct abort_arg *a = varg;
	uint64_t step = a->rec->step;
	struct manifest_step old;
	int rc = step_read(m, txn, step, &old);
	if (rc == 0 && old.state == CKPT_STATE_COMMITTED)
		return ckpt_err(-EEXIST, "manifest %s: step %llu is already committed", m->dir,
		                (unsigned long long)step);
	/* A damaged record is not replaced: it may be a committed step's. */
	if (rc != 0 && rc != CKPT_ENOTFOUND)
		return rc;
	if (rc == 0 && !a->begin && old.save_id && a->rec->save_id &&
	    old.save_id != a->rec->save_id)
		return ckpt_err(-ESTALE, "manifest %s: step %llu: the record names attempt %016llx, "
		                "not the aborted %016llx: left as it is", m->dir,
		                (unsigned long long)step, (unsigned long long)old.save_id,
		                (unsigned long long)a->rec->save_id);
	struct manifest_step r;
	memset(&r, 0, sizeof r);
	r.step = step;
	r.state = a->begin ? CKPT_STATE_INFLIGHT : CKPT_STATE_ABORTED;
	r.world = a->rec->world;
	r.save_id = a->rec->save_id;
	r.incarnation = a->rec->incarnation;
	snprintf(r.job_id, sizeof r.job_id, "%s", a->rec->job_id);
	r.commit_time_ns = ckpt_wall_ns();
	rc = shards_delete(m, txn, step);
	return rc < 0 ? rc : step_write(m, txn, &r, a->why);
}

int manifest_record_abort(struct manifest *m, const struct manifest_step *rec, const char *why)
{
	if (!m || !rec)
		return ckpt_err(-EINVAL, "manifest_record_abort: NULL argument");
	struct abort_arg a = { rec, why, false };
	return manifest_write(m, attempt_txn, &a, "record an aborted step");
}

int manifest_begin(struct manifest *m, const struct manifest_step *rec)
{
	if (!m || !rec)
		return ckpt_err(-EINVAL, "manifest_begin: NULL argument");
	struct manifest_step r = *rec;
	r.state = CKPT_STATE_INFLIGHT;
	r.trust = 0;
	int rc = manifest_step_check(&r);
	if (rc)
		return ckpt_err_prefix(rc, "manifest %s", m->dir);
	struct abort_arg a = { rec, NULL, true };
	return manifest_write(m, attempt_txn, &a, "record a step in flight");
}

/* The record of step, which must be a committed step's (CKPT_ENOTFOUND otherwise). */
static int committed_read(struct manifest *m, MDB_txn *txn, uint64_t step,
                          struct manifest_step *r)
{
	int rc = step_read(m, txn, step, r);
	if (rc)
		return rc;
	if (r->state != CKPT_STATE_COMMITTED)
		return ckpt_err(CKPT_ENOTFOUND, "manifest %s: step %llu is not committed",
		                m->dir, (unsigned long long)step);
	return 0;
}

struct trust_arg { uint64_t step; uint32_t trust; };

static int trust_txn(struct manifest *m, MDB_txn *txn, void *varg)
{
	const struct trust_arg *a = varg;
	struct manifest_step r;
	int rc = committed_read(m, txn, a->step, &r);
	if (rc)
		return rc;
	r.trust = a->trust;
	/* A verified step keeps its metadata and its references. */
	char *meta;
	struct manifest_ref *refs;
	if ((rc = step_meta_copy(m, txn, a->step, &meta, &r.meta_len, &refs))) {
		ckpt_free(refs);
		return rc;
	}
	r.meta = meta;
	r.refs = refs;
	rc = step_write(m, txn, &r, NULL);
	ckpt_free(meta);
	ckpt_free(refs);
	return rc;
}

int manifest_set_trust(struct manifest *m, uint64_t step, uint32_t trust)
{
	if (!m)
		return ckpt_err(-EINVAL, "manifest_set_trust: NULL manifest");
	if (trust != CKPT_TRUST_COMMITTED && trust != CKPT_TRUST_VERIFIED)
		return ckpt_err(-EINVAL, "manifest %s: step %llu: bad trust level %u", m->dir,
		                (unsigned long long)step, trust);
	struct trust_arg a = { step, trust };
	return manifest_write(m, trust_txn, &a, "set trust");
}

struct retire_arg { uint64_t step; const char *why; };

static int retire_txn(struct manifest *m, MDB_txn *txn, void *varg)
{
	const struct retire_arg *a = varg;
	struct manifest_step r;
	int rc = committed_read(m, txn, a->step, &r);
	if (rc)
		return rc;
	r.state = CKPT_STATE_ABORTED;
	r.trust = 0;
	r.commit_time_ns = ckpt_wall_ns();
	rc = shards_delete(m, txn, a->step);
	return rc < 0 ? rc : step_write(m, txn, &r, a->why);
}

int manifest_step_retire(struct manifest *m, uint64_t step, const char *why)
{
	if (!m)
		return ckpt_err(-EINVAL, "manifest_step_retire: NULL manifest");
	struct retire_arg a = { step, why };
	return manifest_write(m, retire_txn, &a, "retire step");
}

static int delete_txn(struct manifest *m, MDB_txn *txn, void *varg)
{
	uint64_t step = *(const uint64_t *)varg;
	uint8_t k[MANIFEST_STEP_KEY_BYTES];
	manifest_step_key(k, step);
	MDB_val key = { sizeof k, k };
	int rc = mdb_del(txn, m->dbi_steps, &key, NULL);
	if (rc && rc != MDB_NOTFOUND)
		return manifest_fail(m, rc, "step %llu: delete step record", (unsigned long long)step);
	bool had_step = rc == 0;
	/* Shard records go in the same transaction: a reader never finds a step
	 * without its shards, nor shard records that outlive their step. */
	int n = shards_delete(m, txn, step);
	if (n < 0)
		return n;
	if (!had_step && n == 0)
		return ckpt_err(CKPT_ENOTFOUND, "manifest %s: step %llu: no such step", m->dir,
		                (unsigned long long)step);
	return 0;
}

int manifest_step_delete(struct manifest *m, uint64_t step)
{
	if (!m)
		return ckpt_err(-EINVAL, "manifest_step_delete: NULL manifest");
	return manifest_write(m, delete_txn, &step, "delete step");
}

void manifest_attempts_lock(struct manifest *m)
{
	pthread_mutex_lock(&m->attempts_lock);
}

void manifest_attempts_unlock(struct manifest *m)
{
	pthread_mutex_unlock(&m->attempts_lock);
}

/* ------------------------------------------------------------------ readers */

int manifest_step_get(struct manifest *m, uint64_t step, struct manifest_step *out)
{
	if (!m || !out)
		return ckpt_err(-EINVAL, "manifest_step_get: NULL argument");
	MDB_txn *txn;
	int rc = manifest_txn_begin(m, MDB_RDONLY, &txn);
	if (rc)
		return manifest_fail(m, rc, "step %llu: begin read transaction", (unsigned long long)step);
	rc = step_read(m, txn, step, out);
	manifest_txn_abort(m, txn);
	return rc;
}

int manifest_step_meta(struct manifest *m, uint64_t step, void *dst, size_t cap, size_t *len)
{
	if (!m || !len || (cap && !dst))
		return ckpt_err(-EINVAL, "manifest_step_meta: NULL argument");
	unsigned long long s = (unsigned long long)step;
	MDB_txn *txn;
	int rc = manifest_txn_begin(m, MDB_RDONLY, &txn);
	if (rc)
		return manifest_fail(m, rc, "step %llu: begin read transaction", s);
	uint8_t k[MANIFEST_STEP_KEY_BYTES];
	manifest_step_key(k, step);
	MDB_val key = { sizeof k, k }, val;
	struct manifest_step r;
	rc = mdb_get(txn, m->dbi_steps, &key, &val);
	if (rc == MDB_NOTFOUND)
		rc = ckpt_err(CKPT_ENOTFOUND, "manifest %s: step %llu: no such step", m->dir, s);
	else if (rc)
		rc = manifest_fail(m, rc, "step %llu: read step record", s);
	else if ((rc = manifest_step_decode(val.mv_data, val.mv_size, step, &r, NULL, 0)))
		ckpt_err_prefix(rc, "manifest %s", m->dir);
	else if ((*len = r.meta_len) > cap)
		rc = ckpt_err(-ENOSPC, "step %llu: metadata of %u bytes, room for %zu", s,
		              r.meta_len, cap);
	else if (r.meta_len)
		memcpy(dst, r.meta, r.meta_len);
	manifest_txn_abort(m, txn);
	return rc;
}

int manifest_step_refs(struct manifest *m, uint64_t step, struct manifest_ref **refs,
                       uint32_t *nrefs)
{
	if (!m || !refs || !nrefs)
		return ckpt_err(-EINVAL, "manifest_step_refs: NULL argument");
	*refs = NULL;
	*nrefs = 0;
	MDB_txn *txn;
	int rc = manifest_txn_begin(m, MDB_RDONLY, &txn);
	if (rc)
		return manifest_fail(m, rc, "step %llu: begin read transaction",
		                     (unsigned long long)step);
	uint8_t k[MANIFEST_STEP_KEY_BYTES];
	manifest_step_key(k, step);
	MDB_val key = { sizeof k, k }, val;
	struct manifest_step r;
	rc = mdb_get(txn, m->dbi_steps, &key, &val);
	if (rc == MDB_NOTFOUND)
		rc = ckpt_err(CKPT_ENOTFOUND, "manifest %s: step %llu: no such step", m->dir,
		              (unsigned long long)step);
	else if (rc)
		rc = manifest_fail(m, rc, "step %llu: read step record", (unsigned long long)step);
	else if ((rc = manifest_step_decode(val.mv_data, val.mv_size, step, &r, NULL, 0)))
		ckpt_err_prefix(rc, "manifest %s", m->dir);
	else if (!(rc = refs_copy(m, &r, refs)))
		*nrefs = r.nrefs;
	manifest_txn_abort(m, txn);
	return rc;
}

/* A read transaction and a cursor on the steps database; on failure nothing is left
 * open and the error names the manifest. */
static int steps_cursor_open(struct manifest *m, MDB_txn **txn, MDB_cursor **cur)
{
	int rc = manifest_txn_begin(m, MDB_RDONLY, txn);
	if (rc)
		return manifest_fail(m, rc, "begin read transaction");
	rc = mdb_cursor_open(*txn, m->dbi_steps, cur);
	if (rc) {
		manifest_txn_abort(m, *txn);
		return manifest_fail(m, rc, "open cursor");
	}
	return 0;
}

/* Walk the steps database (ascending, or descending from the end) and call fn on
 * each decoded record until fn returns non-zero (returned) or the end (0). */
typedef int (*step_visit_fn)(const struct manifest_step *r, void *arg);

static int steps_walk(struct manifest *m, bool descending, step_visit_fn fn, void *arg)
{
	MDB_txn *txn;
	MDB_cursor *cur;
	int rc = steps_cursor_open(m, &txn, &cur);
	if (rc)
		return rc;
	MDB_val key, val;
	int ret = 0;
	MDB_cursor_op op = descending ? MDB_LAST : MDB_FIRST;
	while ((rc = mdb_cursor_get(cur, &key, &val, op)) == 0) {
		op = descending ? MDB_PREV : MDB_NEXT;
		if (key.mv_size != MANIFEST_STEP_KEY_BYTES) {
			ret = ckpt_err(CKPT_EFORMAT, "manifest %s: steps database holds a key of %zu bytes",
			               m->dir, key.mv_size);
			break;
		}
		struct manifest_step r;
		uint64_t step = ckpt_get_be64(key.mv_data);
		/* A record we cannot read stops the walk with its error rather than being
		 * skipped: skipping could make "latest" silently roll back training. */
		ret = manifest_step_decode(val.mv_data, val.mv_size, step, &r, NULL, 0);
		if (ret) {
			ckpt_err_prefix(ret, "manifest %s", m->dir);
			break;
		}
		r.meta = NULL;        /* as step_read: nothing points into the transaction */
		r.refs_raw_ = NULL;
		if ((ret = fn(&r, arg)) != 0)
			break;
	}
	if (ret == 0 && rc != MDB_NOTFOUND)
		ret = manifest_fail(m, rc, "walk steps database");
	mdb_cursor_close(cur);
	manifest_txn_abort(m, txn);
	return ret;
}

int manifest_refs_all(struct manifest *m, struct manifest_ref **refs, uint64_t **by,
                      size_t *n, bool *any_damaged, uint64_t *damaged_max)
{
	*refs = NULL;
	*by = NULL;
	*n = 0;
	*any_damaged = false;
	*damaged_max = 0;
	MDB_txn *txn;
	MDB_cursor *cur;
	int rc = steps_cursor_open(m, &txn, &cur);
	if (rc)
		return rc;
	MDB_val key, val;
	size_t cap = 0;
	int ret = 0;
	MDB_cursor_op op = MDB_FIRST;
	while (!ret && (rc = mdb_cursor_get(cur, &key, &val, op)) == 0) {
		op = MDB_NEXT;
		struct manifest_step r;
		uint64_t step = key.mv_size == MANIFEST_STEP_KEY_BYTES ? ckpt_get_be64(key.mv_data) : 0;
		if (key.mv_size != MANIFEST_STEP_KEY_BYTES ||
		    manifest_step_decode(val.mv_data, val.mv_size, step, &r, NULL, 0)) {
			/* Unreadable: it may reference anything below it. */
			*any_damaged = true;
			*damaged_max = key.mv_size == MANIFEST_STEP_KEY_BYTES ? step : UINT64_MAX;
			ckpt_err_clear();
			continue;
		}
		if (r.state != CKPT_STATE_COMMITTED || !r.nrefs)
			continue;
		if (*n + r.nrefs > cap) {
			size_t ncap = cap ? cap : 64;
			while (ncap < *n + r.nrefs)
				ncap *= 2;
			struct manifest_ref *nr = ckpt_realloc(*refs, ncap * sizeof *nr);
			if (nr)
				*refs = nr;
			uint64_t *nb = nr ? ckpt_realloc(*by, ncap * sizeof *nb) : NULL;
			if (!nb) {
				ret = ckpt_err(-ENOMEM, "manifest %s: references of %zu files", m->dir,
				               ncap);
				break;
			}
			*by = nb;
			cap = ncap;
		}
		for (uint32_t i = 0; i < r.nrefs; i++, (*n)++) {
			manifest_ref_at(r.refs_raw_, i, &(*refs)[*n]);
			(*by)[*n] = step;
		}
	}
	if (ret == 0 && rc != MDB_NOTFOUND)
		ret = manifest_fail(m, rc, "walk steps database");
	mdb_cursor_close(cur);
	manifest_txn_abort(m, txn);
	if (ret) {
		ckpt_free(*refs);
		ckpt_free(*by);
		*refs = NULL;
		*by = NULL;
		*n = 0;
	}
	return ret;
}

struct latest_arg { bool found; uint64_t step; };

static int latest_visit(const struct manifest_step *r, void *varg)
{
	struct latest_arg *a = varg;
	/* Aborted and in-flight steps are invisible. The walk goes on past the first
	 * committed step: every record is checked, so that a damaged newer one is an
	 * error, not a silent roll-back to an older step. */
	if (r->state == CKPT_STATE_COMMITTED && !a->found) {
		a->found = true;
		a->step = r->step;
	}
	return 0;
}

int manifest_step_latest(struct manifest *m, uint64_t *step)
{
	if (!m || !step)
		return ckpt_err(-EINVAL, "manifest_step_latest: NULL argument");
	struct latest_arg a = { false, 0 };
	int rc = steps_walk(m, true, latest_visit, &a);
	if (rc < 0)
		return ckpt_err_prefix(rc, "latest step");
	if (!a.found)
		return ckpt_err(CKPT_ENOTFOUND, "manifest %s: no committed step", m->dir);
	*step = a.step;
	return 0;
}

int manifest_steps_count(struct manifest *m)
{
	if (!m)
		return ckpt_err(-EINVAL, "manifest_steps_count: NULL manifest");
	MDB_txn *txn;
	int rc = manifest_txn_begin(m, MDB_RDONLY, &txn);
	if (rc)
		return manifest_fail(m, rc, "begin read transaction");
	MDB_stat st;
	rc = mdb_stat(txn, m->dbi_steps, &st);
	manifest_txn_abort(m, txn);
	if (rc)
		return manifest_fail(m, rc, "count step records");
	return st.ms_entries > INT_MAX ? INT_MAX : (int)st.ms_entries;
}

int manifest_steps_damaged(struct manifest *m, uint64_t *steps, size_t cap)
{
	if (!m || (cap && !steps))
		return ckpt_err(-EINVAL, "manifest_steps_damaged: NULL argument");
	MDB_txn *txn;
	MDB_cursor *cur;
	int rc = steps_cursor_open(m, &txn, &cur);
	if (rc)
		return rc;
	MDB_val key, val;
	size_t n = 0;
	MDB_cursor_op op = MDB_FIRST;
	while ((rc = mdb_cursor_get(cur, &key, &val, op)) == 0) {
		op = MDB_NEXT;
		struct manifest_step r;
		/* A key of another length cannot be named by a step: report it as step 0's
		 * neighbour would be wrong, so it is left to the walk's own error. */
		if (key.mv_size != MANIFEST_STEP_KEY_BYTES)
			continue;
		uint64_t step = ckpt_get_be64(key.mv_data);
		if (manifest_step_decode(val.mv_data, val.mv_size, step, &r, NULL, 0) == 0)
			continue;
		if (n < cap)
			steps[n] = step;
		n++;
	}
	mdb_cursor_close(cur);
	manifest_txn_abort(m, txn);
	ckpt_err_clear();
	if (rc != MDB_NOTFOUND)
		return manifest_fail(m, rc, "walk steps database");
	if (n > INT_MAX)
		return ckpt_err(-EOVERFLOW, "manifest %s: %zu damaged records", m->dir, n);
	return (int)n;
}

struct list_arg { bool all; uint64_t *steps; size_t cap, count; };

static int list_visit(const struct manifest_step *r, void *varg)
{
	struct list_arg *a = varg;
	if (!a->all && r->state != CKPT_STATE_COMMITTED)
		return 0;
	if (a->count < a->cap)
		a->steps[a->count] = r->step;
	a->count++;
	return 0;
}

int manifest_steps_list(struct manifest *m, bool all, uint64_t *steps, size_t cap)
{
	if (!m || (cap && !steps))
		return ckpt_err(-EINVAL, "manifest_steps_list: NULL argument");
	struct list_arg a = { all, steps, cap, 0 };
	int rc = steps_walk(m, false, list_visit, &a);
	if (rc < 0)
		return rc;
	if (a.count > INT_MAX)
		return ckpt_err(-EOVERFLOW, "manifest %s: %zu steps do not fit an int", m->dir,
		                a.count);
	return (int)a.count;
}

int manifest_shard_get(struct manifest *m, uint64_t step, uint32_t rank,
                       struct manifest_shard *out)
{
	if (!out)
		return ckpt_err(-EINVAL, "manifest_shard_get: NULL argument");
	memset(out, 0, sizeof *out);
	if (!m)
		return ckpt_err(-EINVAL, "manifest_shard_get: NULL manifest");
	unsigned long long s = (unsigned long long)step;
	MDB_txn *txn;
	int rc = manifest_txn_begin(m, MDB_RDONLY, &txn);
	if (rc)
		return manifest_fail(m, rc, "step %llu rank %u: begin read transaction", s, rank);
	/* A shard table (format 2) first: the path is the canonical one. */
	uint8_t tk[MANIFEST_STEP_KEY_BYTES];
	manifest_step_key(tk, step);
	MDB_val tkey = { sizeof tk, tk }, val;
	rc = mdb_get(txn, m->dbi_shards, &tkey, &val);
	if (rc == 0) {
		struct manifest_shard sh;
		uint64_t save_id;
		rc = manifest_table_entry(val.mv_data, val.mv_size, step, rank, &sh, &save_id);
		manifest_txn_abort(m, txn);
		if (rc)
			return ckpt_err_prefix(rc, "manifest %s", m->dir);
		char *path = ckpt_malloc(MANIFEST_TABLE_PREFIX + 48);
		if (!path)
			return ckpt_err(-ENOMEM, "manifest %s: step %llu rank %u", m->dir, s, rank);
		ckpt_path_shard_rel(path, MANIFEST_TABLE_PREFIX + 48, step, rank, save_id);
		sh.path = path;
		sh.owned_ = path;
		*out = sh;
		return 0;
	}
	if (rc != MDB_NOTFOUND) {
		manifest_txn_abort(m, txn);
		return manifest_fail(m, rc, "step %llu rank %u: read shard table", s, rank);
	}
	uint8_t k[MANIFEST_SHARD_KEY_BYTES];
	manifest_shard_key(k, step, rank);
	MDB_val key = { sizeof k, k };
	rc = mdb_get(txn, m->dbi_shards, &key, &val);
	if (rc) {
		manifest_txn_abort(m, txn);
		if (rc == MDB_NOTFOUND)
			return ckpt_err(CKPT_ENOTFOUND, "manifest %s: step %llu rank %u: no shard record",
			                m->dir, s, rank);
		return manifest_fail(m, rc, "step %llu rank %u: read shard record", s, rank);
	}
	struct manifest_shard sh;
	size_t pl;
	rc = manifest_shard_decode(val.mv_data, val.mv_size, step, rank, &sh, &pl);
	if (rc) {
		manifest_txn_abort(m, txn);
		return ckpt_err_prefix(rc, "manifest %s", m->dir);
	}
	/* LMDB's pointers die with the transaction: copy index and path out, into one
	 * block (index first, so it keeps malloc's alignment). Sizes are bounded by
	 * the decoder (index <= MANIFEST_MAX_INDEX, path <= MANIFEST_MAX_PATH). */
	uint8_t *block = ckpt_malloc(sh.index_len + pl + 1);
	if (!block) {
		manifest_txn_abort(m, txn);
		return ckpt_err(-ENOMEM, "manifest %s: step %llu rank %u: %zu bytes for the shard "
		                "index", m->dir, s, rank, sh.index_len);
	}
	if (sh.index_len)
		memcpy(block, sh.index, sh.index_len);
	memcpy(block + sh.index_len, sh.path, pl);
	block[sh.index_len + pl] = '\0';
	manifest_txn_abort(m, txn);
	sh.index = block;
	sh.path = (const char *)(block + sh.index_len);
	sh.owned_ = block;
	*out = sh;
	return 0;
}

void manifest_shard_free(struct manifest_shard *s)
{
	if (!s)
		return;
	ckpt_free(s->owned_);
	memset(s, 0, sizeof *s);
}

int manifest_copy_fd(struct manifest *m, int fd)
{
	pthread_rwlock_rdlock(&m->resize_lock);
	int rc = mdb_env_copyfd2(m->env, fd, MDB_CP_COMPACT);
	pthread_rwlock_unlock(&m->resize_lock);
	if (rc)
		return ckpt_err(rc > 0 ? -rc : -EIO, "%s: copy of the manifest: %s", m->dir,
		                mdb_strerror(rc));
	return 0;
}

/* ------------------------------------------------------------------ the root it belongs to */

#define ROOT_KEY "root"

struct bind_arg {
	const char *root;
	size_t      len;
};

/* The root record in txn against a->root: 0 (the same), 1 (none), or the refusal. */
static int root_compare(struct manifest *m, MDB_txn *txn, const struct bind_arg *a)
{
	MDB_val key = { sizeof ROOT_KEY - 1, (void *)ROOT_KEY }, val;
	int rc = mdb_get(txn, m->dbi_meta, &key, &val);
	if (rc == MDB_NOTFOUND)
		return 1;
	if (rc)
		return manifest_fail(m, rc, "read the root record");
	if (val.mv_size == a->len && !memcmp(val.mv_data, a->root, a->len))
		return 0;
	if (val.mv_size == 0 || val.mv_size >= PATH_MAX)
		return ckpt_err(CKPT_ENOMANIFEST, "manifest %s: its root record is %zu bytes, not a "
		                "path: a damaged manifest", m->dir, val.mv_size);
	/* Another process's bytes, for a message: printable only. */
	char other[PATH_MAX];
	memcpy(other, val.mv_data, val.mv_size);
	other[val.mv_size] = '\0';
	for (char *p = other; *p; p++)
		if ((unsigned char)*p < 0x20 || (unsigned char)*p == 0x7f)
			*p = '?';
	return ckpt_err(CKPT_ENOMANIFEST, "manifest directory %s holds the manifest of checkpoint "
	                "root %s, not of %s: two roots never share one manifest directory (each "
	                "would take the other's steps for its own); give this root a manifest "
	                "directory of its own", m->dir, other, a->root);
}

static int bind_txn(struct manifest *m, MDB_txn *txn, void *varg)
{
	const struct bind_arg *a = varg;
	/* Compared again inside the write transaction: of two roots binding a new
	 * manifest at once, the second sees the first's record and is refused. */
	int rc = root_compare(m, txn, a);
	if (rc <= 0)
		return rc;
	MDB_val key = { sizeof ROOT_KEY - 1, (void *)ROOT_KEY }, val = { a->len, (void *)a->root };
	rc = mdb_put(txn, m->dbi_meta, &key, &val, 0);
	return rc ? manifest_fail(m, rc, "write the root record") : 0;
}

int manifest_root_bind(struct manifest *m, const char *root)
{
	if (!m || !root || root[0] != '/')
		return ckpt_err(-EINVAL, "manifest_root_bind: NULL or relative root");
	struct bind_arg a = { root, strlen(root) };
	MDB_txn *txn;
	int rc = manifest_txn_begin(m, MDB_RDONLY, &txn);
	if (rc)
		return manifest_fail(m, rc, "begin read transaction");
	rc = root_compare(m, txn, &a);
	manifest_txn_abort(m, txn);
	if (rc <= 0 || m->rdonly)
		return rc < 0 ? rc : 0;
	rc = manifest_write(m, bind_txn, &a, "record its root");
	if (rc == 0)
		ckpt_log(CKPT_LOG_INFO, "manifest %s: the manifest of checkpoint root %s", m->dir, root);
	return rc;
}

#define COORDINATOR_KEY "coordinator"

static int coordinator_txn(struct manifest *m, MDB_txn *txn, void *varg)
{
	uint8_t v[8];
	ckpt_put_le64(v, *(const uint64_t *)varg);
	MDB_val key = { sizeof COORDINATOR_KEY - 1, (void *)COORDINATOR_KEY }, val = { 8, v };
	int rc = mdb_put(txn, m->dbi_meta, &key, &val, 0);
	return rc ? manifest_fail(m, rc, "write the coordinator record") : 0;
}

int manifest_coordinator_set(struct manifest *m, uint64_t incarnation)
{
	if (!m)
		return ckpt_err(-EINVAL, "manifest_coordinator_set: manifest is NULL");
	return manifest_write(m, coordinator_txn, &incarnation, "record its coordinator");
}

int manifest_coordinator_get(struct manifest *m, uint64_t *incarnation)
{
	if (!m || !incarnation)
		return ckpt_err(-EINVAL, "manifest_coordinator_get: NULL argument");
	*incarnation = 0;
	MDB_txn *txn;
	int rc = manifest_txn_begin(m, MDB_RDONLY, &txn);
	if (rc)
		return manifest_fail(m, rc, "begin read transaction");
	MDB_val key = { sizeof COORDINATOR_KEY - 1, (void *)COORDINATOR_KEY }, val;
	rc = mdb_get(txn, m->dbi_meta, &key, &val);
	if (rc == MDB_NOTFOUND)
		rc = CKPT_ENOTFOUND;
	else if (rc)
		rc = manifest_fail(m, rc, "read the coordinator record");
	else if (val.mv_size != 8)
		rc = ckpt_err(CKPT_ENOMANIFEST, "manifest %s: its coordinator record is %zu bytes, "
		              "not 8: a damaged manifest", m->dir, val.mv_size);
	else
		*incarnation = ckpt_get_le64(val.mv_data);
	manifest_txn_abort(m, txn);
	return rc;
}
