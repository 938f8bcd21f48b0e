/*
 * save.c — a save from begin to committed: item validation in the caller's
 * thread, then on the save worker the pipeline
 *     snapshot (copy into a pool buffer) -> hash -> [zstd] -> io_uring write
 * -> footer -> fdatasync -> vote -> commit decision (the shard's directory entry is
 * made durable when the file is created: lib/io/writer.c).
 *
 * The snapshot point is reached when the last byte of the caller's data has been
 * copied into the pool (or, for a save through ckptd that sends chunks from where
 * they lie, into the socket: save_direct): from then on the caller may change its
 * tensors. Copies
 * run ahead of the writer through a window of pool buffers (lib/snapshot; device
 * memory by DMA on a CUDA stream), so the snapshot point comes at copy speed when
 * the state fits. When the state is larger than the pool, buffers come back as
 * writes complete (backpressure) and the snapshot point moves accordingly; host
 * memory never grows past the pool.
 *
 * Incremental saves: before it streams, the worker reads the index of this rank's
 * shard of the previous committed step (save_prev_open). A chunk whose hash equals
 * the chunk at the same place there (same tensor, box and chunk) is appended as a
 * reference to the file that holds its bytes, and is not written (docs/format.md
 * §3b). A chunk of host memory is hashed where it lies, before any copy: unchanged,
 * it takes no pool buffer and is never copied, so an unchanged state costs one read
 * of memory at hash speed (save_prev_inplace). A device chunk, or one from a source
 * callback, is copied and hashed as in a full save and compared after the copy; its
 * buffer then goes back to the pool unwritten.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>
#include <xxhash.h>

#include "glue.h"
#include "snapshot/snapshot.h"

/* The lines of a save's calls carry its context and step (s may be NULL). */
#define SAVE_LOG_SCOPE(s) \
	CKPT_LOG_SCOPE((s) ? &(s)->ctx->log : NULL, (s) ? (s)->step : CKPT_LOG_NO_STEP)

/* How long a rank whose stream ckptd refused as given up waits for the coordinator's
 * decision, which was sent before the refusal (on another connection). */
#define SAVE_DECISION_WAIT_MS 2000

/* Where a direct save's tail chunks start in the pool's arena: a cache line, so that
 * no two chunks share one (they are only sent from there, never written O_DIRECT). */
#define SAVE_TAIL_ALIGN 64u

/* ------------------------------------------------------------------ item checks */

static int item_name_add(struct ckpt_save *s, const char *name, size_t len)
{
	/* Open addressing on XXH3-64 of the name; collisions are resolved by strcmp. */
	if ((s->nitems + 1) * 2 > s->hash_cap) {
		size_t cap = s->hash_cap ? s->hash_cap * 2 : 64;
		uint64_t *h = ckpt_calloc(cap, sizeof *h);
		if (!h)
			return ckpt_err(-ENOMEM, "save of step %llu", (unsigned long long)s->step);
		for (size_t i = 0; i < s->nitems; i++) {
			uint64_t v = XXH3_64bits(s->items[i].name, strlen(s->items[i].name)) | 1;
			size_t j = v & (cap - 1);
			while (h[j])
				j = (j + 1) & (cap - 1);
			h[j] = (uint64_t)i << 32 | (v & 0xffffffffu) | 1;
		}
		ckpt_free(s->name_hashes);
		s->name_hashes = h;
		s->hash_cap = cap;
	}
	uint64_t v = XXH3_64bits(name, len) | 1;
	size_t j = v & (s->hash_cap - 1);
	while (s->name_hashes[j]) {
		uint64_t e = s->name_hashes[j];
		if ((e & 0xffffffffu) == ((v & 0xffffffffu) | 1) &&
		    !strcmp(s->items[e >> 32].name, name))
			return ckpt_err(-EEXIST, "'%s' was already added to the save of step %llu",
			                name, (unsigned long long)s->step);
		j = (j + 1) & (s->hash_cap - 1);
	}
	s->name_hashes[j] = (uint64_t)s->nitems << 32 | (v & 0xffffffffu) | 1;
	return 0;
}

static bool save_submitted(ckpt_save *s)
{
	pthread_mutex_lock(&s->ctx->lock);
	bool r = s->state != SAVE_OPEN;
	pthread_mutex_unlock(&s->ctx->lock);
	return r;
}

static int save_check_open(ckpt_save *s)
{
	if (!s)
		return ckpt_err(-EINVAL, "save handle is NULL");
	/* Once submitted, the state is the worker's: read under the lock. */
	if (save_submitted(s))
		return ckpt_err(CKPT_ESTATE, "save of step %llu was already submitted",
		                (unsigned long long)s->step);
	return 0;
}

static int save_push(struct ckpt_save *s, struct save_item *it)
{
	size_t len = strlen(it->name);
	int rc = item_name_add(s, it->name, len);
	if (rc)
		return rc;
	if (s->nitems == s->cap) {
		size_t cap = s->cap ? s->cap * 2 : 32;
		struct save_item *n = ckpt_realloc(s->items, cap * sizeof *n);
		if (!n)
			return ckpt_err(-ENOMEM, "save of step %llu", (unsigned long long)s->step);
		s->items = n;
		s->cap = cap;
	}
	it->name = ckpt_strdup(it->name);
	if (!it->name)
		return ckpt_err(-ENOMEM, "save of step %llu", (unsigned long long)s->step);
	s->items[s->nitems++] = *it;
	s->logical_bytes += it->raw_bytes;
	return 0;
}

static int save_add(ckpt_save *s, const struct ckpt_tensor *t, ckpt_source_fn fn, void *arg);

int ckpt_save_add_tensor(ckpt_save *s, const struct ckpt_tensor *t)
{
	SAVE_LOG_SCOPE(s);
	return save_add(s, t, NULL, NULL);
}

int ckpt_save_add_tensor_source(ckpt_save *s, const struct ckpt_tensor *t, ckpt_source_fn fn,
                                void *arg)
{
	SAVE_LOG_SCOPE(s);
	if (!fn)
		return ckpt_err(-EINVAL, "tensor source: the callback is NULL");
	if (t && t->mem == CKPT_MEM_DEVICE) {
		/* The name is not checked yet: quoted, never copied. */
		char q[CKPT_NAME_QUOTE_CAP];
		return ckpt_err(-EINVAL, "tensor '%s': a source fills host memory (mem must be "
		                "auto or host)", t->name ? ckpt_name_quote(t->name,
		                strnlen(t->name, CKPT_MAX_NAME + 1), q, sizeof q) : "?");
	}
	return save_add(s, t, fn, arg);
}

static int save_add(ckpt_save *s, const struct ckpt_tensor *t, ckpt_source_fn fn, void *arg)
{
	int rc = save_check_open(s);
	if (rc)
		return rc;
	if (!t || !t->name)
		return ckpt_err(-EINVAL, "tensor or its name is NULL");
	size_t nlen = strnlen(t->name, CKPT_MAX_NAME + 1);
	const char *why = ckpt_name_problem(t->name, nlen, true);
	if (why) {
		/* Quoted, never copied: the bad bytes would make the message invalid too. */
		char q[CKPT_NAME_QUOTE_CAP];
		return ckpt_err(CKPT_ENAME, "tensor name '%s' is invalid: %s",
		                ckpt_name_quote(t->name, nlen, q, sizeof q), why);
	}
	if (t->kind < 1 || t->kind > CKPT_KIND_MAX_ || t->policy < 1 || t->policy > CKPT_POLICY_MAX_)
		return ckpt_err(-EINVAL, "tensor '%s': unknown kind %d or policy %d", t->name,
		                t->kind, t->policy);
	size_t esize = ckpt_dtype_size(t->dtype);
	if (!esize)
		return ckpt_err(-EINVAL, "tensor '%s': unknown dtype %d", t->name, t->dtype);
	if (t->ndim > CKPT_MAX_NDIM || (t->ndim && !t->global_shape))
		return ckpt_err(CKPT_ESHAPE, "tensor '%s': ndim %u (at most %d, shape required)",
		                t->name, t->ndim, CKPT_MAX_NDIM);
	struct save_item it;
	memset(&it, 0, sizeof it);
	it.name = (char *)t->name;
	it.kind = (uint8_t)t->kind;
	it.dtype = (uint8_t)t->dtype;
	it.policy = (uint8_t)t->policy;
	it.ndim = (uint8_t)t->ndim;
	it.data = t->data;
	for (unsigned d = 0; d < t->ndim; d++) {
		it.global_shape[d] = t->global_shape[d];
		it.offset[d] = t->offset ? t->offset[d] : 0;
		it.extent[d] = t->extent ? t->extent[d] : t->global_shape[d];
		uint64_t end;
		if (!ckpt_add_u64(it.offset[d], it.extent[d], &end) || end > it.global_shape[d])
			return ckpt_err(CKPT_ESHAPE, "tensor '%s': box [%llu, +%llu) outside dimension %u "
			                "of size %llu", t->name, (unsigned long long)it.offset[d],
			                (unsigned long long)it.extent[d], d,
			                (unsigned long long)it.global_shape[d]);
		if (t->policy == CKPT_REPLICATED && (it.offset[d] || it.extent[d] != it.global_shape[d]))
			return ckpt_err(CKPT_ESHAPE, "tensor '%s': a replicated tensor is saved whole",
			                t->name);
	}
	uint64_t elems, gelems;
	if (!ckpt_shape_elems(it.ndim, it.global_shape, &gelems) ||
	    !ckpt_mul_u64(gelems, esize, &gelems) ||
	    !ckpt_shape_elems(it.ndim, it.extent, &elems) ||
	    !ckpt_mul_u64(elems, esize, &it.raw_bytes))
		return ckpt_err(CKPT_ESHAPE, "tensor '%s': size overflows 64 bits", t->name);
	it.source = fn;
	it.source_arg = arg;
	if (it.raw_bytes && !t->data && !fn)
		return ckpt_err(-EINVAL, "tensor '%s': data is NULL", t->name);
	/* Host or device memory, decided now so that a pointer the snapshot cannot
	 * copy fails here, in the caller's thread, and not half-way through the save. */
	int dev = -1;
	it.mem = CKPT_MEM_HOST;
	if (it.raw_bytes && !fn) {
		int kind = snapshot_mem_kind(s->ctx->snap, t->data, t->mem, &dev);
		int rc2 = kind < 0 ? kind : snapshot_bind(s->ctx->snap, dev);
		if (rc2)
			return ckpt_err_prefix(rc2, "tensor '%s'", t->name);
		it.mem = kind;
	}
	return save_push(s, &it);
}

int ckpt_save_add_blob(ckpt_save *s, const char *name, int kind, int policy,
                       const void *data, size_t len)
{
	SAVE_LOG_SCOPE(s);
	int rc = save_check_open(s);
	if (rc)
		return rc;
	if (!name)
		return ckpt_err(-EINVAL, "blob name is NULL");
	size_t nlen = strnlen(name, CKPT_MAX_NAME + 1);
	const char *why = ckpt_name_problem(name, nlen, true);
	if (why) {
		char q[CKPT_NAME_QUOTE_CAP];
		return ckpt_err(CKPT_ENAME, "blob name '%s' is invalid: %s",
		                ckpt_name_quote(name, nlen, q, sizeof q), why);
	}
	if (kind < 1 || kind > CKPT_KIND_MAX_)
		return ckpt_err(-EINVAL, "blob '%s': unknown kind %d", name, kind);
	if (policy != CKPT_REPLICATED && policy != CKPT_RANK_BOUND)
		return ckpt_err(-EINVAL, "blob '%s': policy must be replicated or rank-bound", name);
	if (len && !data)
		return ckpt_err(-EINVAL, "blob '%s': data is NULL", name);
	struct save_item it;
	memset(&it, 0, sizeof it);
	it.name = (char *)name;
	it.kind = (uint8_t)kind;
	it.dtype = CKPT_U8;
	it.policy = (uint8_t)policy;
	it.flags = IO_TENSOR_BLOB;
	it.ndim = 1;
	it.global_shape[0] = it.extent[0] = len;
	it.raw_bytes = len;
	it.data = data;
	it.mem = CKPT_MEM_HOST;
	return save_push(s, &it);
}

int ckpt_save_set_meta(ckpt_save *s, const char *json, size_t len)
{
	SAVE_LOG_SCOPE(s);
	int rc = save_check_open(s);
	if (rc)
		return rc;
	unsigned long long step = (unsigned long long)s->step;
	if (!json && len)
		return ckpt_err(-EINVAL, "metadata of step %llu: json is NULL", step);
	if (len > CKPT_MAX_META)
		return ckpt_err(-E2BIG, "metadata of step %llu: %zu bytes, more than CKPT_MAX_META "
		                "(%d)", step, len, CKPT_MAX_META);
	/* Parsed, not trusted to be JSON: jansson refuses what is not (ill-formed UTF-8
	 * and NUL bytes included), and the text is kept as given, byte for byte. Any
	 * value decodes, so that a scalar is told apart from what is not JSON at all; a
	 * number is only checked, so integers beyond 64 bits are taken as reals. */
	json_error_t jerr;
	json_t *v = len ? json_loadb(json, len, JSON_DECODE_ANY | JSON_DECODE_INT_AS_REAL, &jerr)
	                : NULL;
	if (!v)
		return len ? ckpt_err(-EINVAL, "metadata of step %llu is not JSON: %s (line %d, "
		                      "column %d, byte %d)", step, jerr.text, jerr.line,
		                      jerr.column, jerr.position)
		           : ckpt_err(-EINVAL, "metadata of step %llu is empty, not a JSON object",
		                      step);
	bool object = json_is_object(v);
	json_decref(v);
	if (!object)
		return ckpt_err(-EINVAL, "metadata of step %llu is JSON but not an object ({...})",
		                step);
	char *copy = ckpt_malloc(len);
	if (!copy)
		return ckpt_err(-ENOMEM, "metadata of step %llu", step);
	memcpy(copy, json, len);
	ckpt_free(s->meta);
	s->meta = copy;
	s->meta_len = len;
	return 0;
}

int ckpt_save_set_incremental(ckpt_save *s, int on)
{
	SAVE_LOG_SCOPE(s);
	int rc = save_check_open(s);
	if (rc)
		return rc;
	if (on != 0 && on != 1)
		return ckpt_err(-EINVAL, "save of step %llu: incremental %d (0 or 1)",
		                (unsigned long long)s->step, on);
	s->incremental = on == 1;
	return 0;
}

/* ------------------------------------------------------------------ lifecycle */

/* The end of what ckpt_save_begin took: a place among the saves in flight. */
static void save_release(ckpt_ctx *c, ckpt_save *s)
{
	pthread_mutex_lock(&c->lock);
	for (ckpt_save **p = &c->live; *p; p = &(*p)->live_next) {
		if (*p == s) {
			*p = s->live_next;
			break;
		}
	}
	c->inflight--;
	pthread_cond_broadcast(&c->cond);
	pthread_mutex_unlock(&c->lock);
}

int ckpt_save_begin(ckpt_ctx *c, uint64_t step, ckpt_save **out)
{
	if (!out)
		return ckpt_err(-EINVAL, "ckpt_save_begin: out is NULL");
	*out = NULL;
	if (!c)
		return ckpt_err(-EINVAL, "ckpt_save_begin: context is NULL");
	CKPT_LOG_SCOPE(&c->log, step);
	if (c->cfg.flags & CKPT_OPEN_READONLY)
		return ckpt_err(CKPT_ESTATE, "%s was opened read-only", c->cfg.root);
	if (step == CKPT_LATEST)
		return ckpt_err(-EINVAL, "step %llu is reserved (CKPT_LATEST)",
		                (unsigned long long)step);
	ckpt_save *s = ckpt_calloc(1, sizeof *s);
	if (!s)
		return ckpt_err(-ENOMEM, "save of step %llu", (unsigned long long)step);
	s->ctx = c;
	s->step = step;
	s->incremental = c->cfg.incremental;
	/* Bound the saves in flight: wait for an older one to finish. A step has one
	 * save at a time in a context: a second would begin a new attempt, which
	 * removes the first one's files. */
	pthread_mutex_lock(&c->lock);
	while (c->inflight >= c->cfg.max_inflight)
		pthread_cond_wait(&c->cond, &c->lock);
	for (ckpt_save *o = c->live; o; o = o->live_next) {
		if (o->step == step && o->state != SAVE_DONE) {
			pthread_mutex_unlock(&c->lock);
			ckpt_free(s);
			return ckpt_err(-EBUSY, "step %llu is being saved in %s already (a save "
			                "begun and not finished)", (unsigned long long)step,
			                c->cfg.root);
		}
	}
	c->inflight++;
	s->live_next = c->live;
	c->live = s;
	pthread_mutex_unlock(&c->lock);
	/* A committed step is never written over: check before any file is touched. In
	 * a world of several ranks the coordinator answers for every rank; a rank alone
	 * is its own coordinator. Either way the attempt gets its id, and its INFLIGHT
	 * record is durable, before this rank writes anything (commit_attempt_begin). */
	int rc = c->part ? commit_part_begin(c->part, step, &s->save_id)
	                 : ckpt_err(CKPT_ESTATE, "%s: this context takes part in no commit",
	                            c->cfg.root);
	if (rc && c->cfg.world > 1)
		ckpt_err_prefix(rc, "rank %d", c->cfg.rank);
	if (rc) {
		save_release(c, s);
		ckpt_free(s);
		return rc;
	}
	*out = s;
	return 0;
}

static bool save_has_device(const ckpt_save *s)
{
	for (size_t i = 0; i < s->nitems; i++)
		if (s->items[i].mem == CKPT_MEM_DEVICE && !s->items[i].source)
			return true;
	return false;
}

int ckpt_save_submit(ckpt_save *s)
{
	SAVE_LOG_SCOPE(s);
	int rc = save_check_open(s);
	if (rc)
		return rc;
	ckpt_ctx *c = s->ctx;
	/* The copies run on the library's stream, which does not synchronise with the
	 * caller's: capture here, in the caller's thread, the work queued before this
	 * call (the optimizer step that wrote the tensors), which the first copy waits
	 * for (ckpt/cuda.h). A save of host memory only never calls CUDA. */
	if (save_has_device(s) &&
	    (rc = snapshot_fence(c->snap, s->order_stream, &s->fence)))
		return ckpt_err_prefix(rc, "save of step %llu", (unsigned long long)s->step);
	pthread_mutex_lock(&c->lock);
	s->state = SAVE_QUEUED;
	s->t_submit = ckpt_now_ns();
	/* Commits are ordered by step: the worker runs the queue in submission order,
	 * and the glue keeps it sorted by step. */
	struct ckpt_save **pp = &c->queue_head;
	while (*pp && (*pp)->step <= s->step)
		pp = &(*pp)->next;
	s->next = *pp;
	*pp = s;
	if (!s->next)
		c->queue_tail = s;
	pthread_cond_broadcast(&c->cond);
	pthread_mutex_unlock(&c->lock);
	return 0;
}

/* The worker writes s->state under ctx->lock once the save is queued: read it
 * there too (a bare read races with QUEUED -> RUNNING). */

static int save_wait_until(ckpt_save *s, bool snapshot, int timeout_ms)
{
	SAVE_LOG_SCOPE(s);
	if (!s)
		return ckpt_err(-EINVAL, "save handle is NULL");
	if (!save_submitted(s))
		return ckpt_err(CKPT_ESTATE, "save of step %llu was not submitted",
		                (unsigned long long)s->step);
	ckpt_ctx *c = s->ctx;
	uint64_t deadline = ckpt_deadline_ms(timeout_ms);
	int rc = 0;
	pthread_mutex_lock(&c->lock);
	while (s->state != SAVE_DONE && !(snapshot && s->snapshot_done)) {
		if (ckpt_cond_wait_until(&c->cond, &c->lock, deadline) == ETIMEDOUT) {
			rc = ckpt_err(-ETIMEDOUT, "save of step %llu: still in flight after %d ms",
			              (unsigned long long)s->step, timeout_ms);
			break;
		}
	}
	if (!rc && s->state == SAVE_DONE && s->rc) {
		rc = s->rc;
		ckpt_err_restore(s->msg);
	}
	pthread_mutex_unlock(&c->lock);
	return rc;
}

int ckpt_save_wait_snapshot(ckpt_save *s, int timeout_ms)
{
	return save_wait_until(s, true, timeout_ms);
}

int ckpt_save_wait(ckpt_save *s, int timeout_ms)
{
	return save_wait_until(s, false, timeout_ms);
}

void ckpt_save_free(ckpt_save *s)
{
	if (!s)
		return;
	SAVE_LOG_SCOPE(s);
	ckpt_ctx *c = s->ctx;
	if (save_submitted(s))
		save_wait_until(s, false, -1);
	else
		/* Begun but never submitted: no rank waits for this vote, and the attempt
		 * is recorded as given up. */
		commit_part_abort(c->part, s->step, CKPT_EABORTED, "save freed without being submitted");
	save_release(c, s);
	snapshot_event_destroy(c->snap, s->snapshot_event);
	snapshot_event_destroy(c->snap, s->fence);
	for (size_t i = 0; i < s->nitems; i++)
		ckpt_free(s->items[i].name);
	ckpt_free(s->items);
	ckpt_free(s->name_hashes);
	ckpt_free(s->meta);
	ckpt_free(s);
}

int ckpt_save_stats(const ckpt_save *s, struct ckpt_save_stats *st)
{
	if (!s || !st || st->size < sizeof(size_t))
		return ckpt_err(-EINVAL, "ckpt_save_stats: bad arguments");
	struct ckpt_save_stats v;
	memset(&v, 0, sizeof v);
	ckpt_ctx *c = s->ctx;
	pthread_mutex_lock(&c->lock);
	v.logical_bytes = s->logical_bytes;
	v.stored_bytes = s->stored_bytes;
	v.referenced_bytes = s->ref_bytes;
	v.device_staged_bytes = s->staged_bytes;
	v.device_unchanged_bytes = s->unchanged_bytes;
	if (s->t_snapshot) v.snapshot_seconds = (double)(s->t_snapshot - s->t_submit) / 1e9;
	if (s->t_durable)  v.durable_seconds = (double)(s->t_durable - s->t_submit) / 1e9;
	if (s->t_commit)   v.commit_seconds = (double)(s->t_commit - s->t_submit) / 1e9;
	pthread_mutex_unlock(&c->lock);
	size_t n = st->size < sizeof v ? st->size : sizeof v;
	v.size = st->size;
	memcpy(st, &v, n);
	return 0;
}

/* ------------------------------------------------------------------ the worker's part */

static void save_mark_snapshot(ckpt_ctx *c, ckpt_save *s)
{
	uint64_t step = s->step, after = 0;
	pthread_mutex_lock(&c->lock);
	if (!s->snapshot_done) {
		s->snapshot_done = true;
		s->t_snapshot = ckpt_now_ns();
		after = s->t_snapshot - s->t_submit;
		pthread_cond_broadcast(&c->cond);
	}
	pthread_mutex_unlock(&c->lock);
	/* s may be freed once the lock is let go (the caller was waiting for this). */
	if (after)
		ckpt_log(CKPT_LOG_DEBUG, "step %llu: snapshot point %.3f ms after submit",
		         (unsigned long long)step, (double)after / 1e6);
}

static void save_finish(ckpt_ctx *c, ckpt_save *s, int rc)
{
	pthread_mutex_lock(&c->lock);
	s->rc = rc;
	if (rc)
		snprintf(s->msg, sizeof s->msg, "%s", ckpt_err_msg());
	else
		s->t_commit = ckpt_now_ns();
	if (!s->snapshot_done) {
		s->snapshot_done = true;
		s->t_snapshot = ckpt_now_ns();
	}
	s->state = SAVE_DONE;
	pthread_cond_broadcast(&c->cond);
	pthread_mutex_unlock(&c->lock);
}

/* Create the step directory, and make its entry in the root durable: the shard's
 * own fsync of its directory covers the file's entry, not the directory's. */
static int step_dir_create(ckpt_ctx *c, uint64_t step, char *dir, size_t cap)
{
	int rc = ckpt_path_step_dir(dir, cap, c->cfg.root, step);
	if (rc)
		return ckpt_err(rc, "step directory path");
	if (mkdir(dir, (mode_t)c->cfg.dir_mode) < 0) {
		if (errno != EEXIST)
			return ckpt_err(-errno, "create step directory %s", dir);
		return 0;
	}
	return ckpt_fsync_dir(c->cfg.root);
}

/* ------------------------------------------------------------------ the snapshot stream
 *
 * Copies are issued ahead through a window of pool buffers (lib/snapshot's pipe),
 * and taken out in order as each chunk's own copy lands: hashed (device chunks) and
 * appended to the writer. When the state fits in the window every copy is issued
 * before the first write, so the snapshot point comes at copy speed; when it does
 * not, the copies wait for buffers that completed writes give back (backpressure),
 * and the snapshot point moves by what did not fit.
 */

/* Where the worker is in the save's items. Items are declared to the writer only
 * when their first chunk is appended (or at the end, for empty ones): the writer
 * wants a tensor's chunks consecutive, and the file keeps the layout it had before
 * copies ran ahead. The writer numbers tensors in declaration order, so a chunk's
 * tag (its item's index) is also its tensor's index in the shard. */
struct save_cursor {
	struct snapshot_pipe *pipe;
	size_t   item;          /* next item to issue from */
	uint64_t off;           /* next byte of that item */
	size_t   declared;      /* items the writer knows */
	bool     sealed;
	/* GPUDirect Storage save (ckpt/cuda.h, CKPT_GDS_SAVE): device chunks are
	 * written from device memory, and the snapshot point waits for the writes. */
	bool     gds;
	void    *gds_file;      /* the shard's cuFile registration, on first write */
	size_t   out_item;      /* the chunk taken out last: item and offset in it */
	uint64_t out_off;
	const uint8_t *out_src; /* device bytes of the chunk being appended */
	void    *gds_event;     /* sealed, published after the writes */
	bool     gds_refused;   /* cuFile refused the file: write from out_host */
	const uint8_t *out_host;/* the pool copy of the chunk being appended */
	ckpt_ctx *ctx;
	/* A save streamed from where the state lies (save_direct): the chunks before
	 * item tail_item at tail_off are hashed in place and sent from the caller's
	 * memory, the rest (the tail) copied first into the pool, taken whole as one
	 * arena (arena NULL: no tail), each at the next multiple of SAVE_TAIL_ALIGN
	 * (arena_in: where the next one issued goes; arena_out: where the next one
	 * taken out lies); src_issued and src_drained count the former; src_sealed
	 * once remote_writer_src_seal was called. With sender_hashes the chunks sent
	 * from where they lie are not hashed here: the stream's sender hashes each block
	 * just before it sends it (remote_writer_append_src). */
	bool     direct, sender_hashes;
	size_t   tail_item;
	uint64_t tail_off;
	uint8_t *arena;
	uint64_t arena_in, arena_out;
	uint64_t src_issued, src_drained;
	bool     src_sealed;
	/* Incremental: this rank's shard of the previous committed step, or ix NULL. */
	struct save_prev {
		struct io_shard_index *ix;
		struct io_ref_file     self;     /* its own file */
		char     *path;                  /* its path */
		struct io_shard_reader *rd;      /* opened on first need of its block table */
		bool      no_blocks;             /* its block table failed: copy every chunk */
		uint32_t *by_name;               /* its tensors, sorted by name */
		/* Where issue and drain are in it (they run apart): an item, its tensor
		 * there (or -1), the next of that tensor's chunks to compare. */
		struct save_prev_pos {
			size_t   item;
			int64_t  t;
			uint32_t k;
		} issue, drain;
		/* The chunk the issue pass last hashed in place and found changed: a retry
		 * after -EAGAIN copies it without hashing it again. */
		size_t    changed_item;
		uint64_t  changed_off;
		uint64_t  nrefs, ref_bytes, inplace_chunks;
	} prev;
	/* The device staging pool (save_stage): the chunks from item stage_item at
	 * stage_off on are staged, stage_n of them (stage_item SIZE_MAX: none); the
	 * issue and drain passes are at staged chunk stage_issue, stage_drain. */
	size_t   stage_item;
	uint64_t stage_off;
	size_t   stage_n, stage_issue, stage_drain;
	struct save_staged {
		const uint8_t *addr;              /* its place in the staging pool */
		bool     diffed;                  /* compare-and-copied on the device */
		uint8_t  was[CKPT_HASH_BYTES];    /* diffed: the hash of what the pool held */
	} *staged;
	bool     stage_diffs;                 /* any chunk diffed */
	bool     released;                    /* the snapshot event is out */
	uint64_t staged_bytes, unchanged_bytes;
};

/* What the device staging pool holds, chunk by chunk, after the last save that
 * staged (the save worker's; freed by ckpt_close): a chunk's item name, place and
 * length, its offset in the pool, and — once its copy to the host was hashed —
 * the hash of the bytes there. The next save compares on the device only against
 * a chunk it finds here at the same place with its hash known. */
struct save_stage_rec {
	struct stage_chunk {
		char    *name;
		uint64_t off, len, at;
		uint8_t  hash[CKPT_HASH_BYTES];
		bool     known;
	} *c;
	size_t n, cap;
};

void save_stage_rec_free(struct save_stage_rec *r)
{
	if (!r)
		return;
	for (size_t i = 0; i < r->n; i++)
		ckpt_free(r->c[i].name);
	ckpt_free(r->c);
	ckpt_free(r);
}

/* Every copy has landed: the snapshot point. Runs on a CUDA thread when there were
 * device copies (it must not call CUDA), else on the worker inside seal. */
static void save_snapshot_landed(void *arg)
{
	ckpt_save *s = arg;
	save_mark_snapshot(s->ctx, s);
}

/* The copies have landed, but it is not yet the snapshot point: the writes of a
 * GPUDirect Storage save still read the device tensors (save_run marks it once they
 * are done), and the sends of a direct save read the caller's memory (its sender
 * marks it once they are done: save_direct_release). */
static void save_landed_still_read(void *arg)
{
	CKPT_UNUSED(arg);
}

/* Let ckpt_save_snapshot_event hand the event out. */
static void save_publish_event(ckpt_ctx *c, ckpt_save *s, void *ev)
{
	pthread_mutex_lock(&c->lock);
	s->snapshot_event = ev;
	s->snapshot_issued = true;
	pthread_cond_broadcast(&c->cond);
	pthread_mutex_unlock(&c->lock);
}

/* ext->write of a GPUDirect Storage save: the chunk's whole blocks from device
 * memory. A file cuFile refuses is written from the pool copy instead (the same
 * bytes, hashed), so asking for GDS never fails a save the pinned path would do. */
static int save_gds_write(void *arg, int fd, const char *path, uint64_t off, size_t n)
{
	struct save_cursor *cur = arg;
	ckpt_ctx *c = cur->ctx;
	if (!cur->gds_file && !cur->gds_refused) {
		int rc = snapshot_gds_file_open(c->snap, path, &cur->gds_file);
		if (rc == -EOPNOTSUPP) {
			ckpt_log(CKPT_LOG_WARN, "%s; writing through the pinned path", ckpt_err_msg());
			cur->gds_refused = true;
		} else if (rc) {
			return rc;
		}
	}
	if (cur->gds_file)
		return snapshot_gds_write(cur->gds_file, cur->out_src, n, off);
	for (size_t done = 0; done < n;) {
		ssize_t w = pwrite(fd, cur->out_host + done, n - done, (off_t)(off + done));
		if (w <= 0)
			return ckpt_err(w < 0 ? -errno : -EIO, "%s: write %zu bytes at offset %llu: %s",
			                path, n - done, (unsigned long long)(off + done),
			                w < 0 ? strerror(errno) : "nothing written");
		done += (size_t)w;
	}
	return 0;
}

/* Issue copies until every chunk is issued and the pipe sealed (0), until the pipe
 * wants a chunk taken out first (-EAGAIN), or until limit chunks were issued while
 * more remain (1). A limit of SAVE_ISSUE_ASYNC issues device copies only: it stops
 * (1) after the first chunk that this thread copies itself (host memory, a fill
 * callback), which the disk should start on while the rest are copied. */
#define SAVE_ISSUE_ASYNC SIZE_MAX
static int save_prev_inplace(ckpt_ctx *c, struct save_cursor *cur, const ckpt_save *s,
                             const struct save_item *it, size_t n);
static int save_issue_staged(ckpt_ctx *c, struct save_cursor *cur, const ckpt_save *s,
                             size_t n);
static int save_prev_stored(ckpt_ctx *c, struct save_cursor *cur, const ckpt_save *s,
                            size_t n, const uint8_t *data, const uint8_t *hash);
static void save_stage_drained(ckpt_ctx *c, struct save_cursor *cur, uint64_t tag,
                               uint64_t off, const struct io_hashes *h);

static bool save_in_stage(const struct save_cursor *cur)
{
	return cur->stage_item != SIZE_MAX &&
	       (cur->item > cur->stage_item ||
	        (cur->item == cur->stage_item && cur->off >= cur->stage_off));
}

/* Every read of the caller's memory is queued: the rest reads the staging pool.
 * The snapshot event is recorded now, and handed out. */
static int save_release_caller(ckpt_ctx *c, ckpt_save *s, struct save_cursor *cur)
{
	void *ev = NULL;
	int rc = snapshot_pipe_release(cur->pipe, &ev, save_snapshot_landed, s);
	if (rc)
		return rc;
	cur->released = true;
	save_publish_event(c, s, ev);
	return 0;
}

/* Whether the cursor is in a direct save's tail (save_direct_plan). */
static bool save_in_tail(const struct save_cursor *cur)
{
	return cur->direct && (cur->item > cur->tail_item ||
	                       (cur->item == cur->tail_item && cur->off >= cur->tail_off));
}

/* The length of a direct save's next chunk, n the regular one: each ends at the next
 * multiple of the chunk size in its item (the tail's first piece begins between
 * two), the chunk before the tail where the tail begins. */
static size_t save_direct_len(const struct save_cursor *cur, size_t chunk, size_t n)
{
	uint64_t end = (cur->off / chunk + 1) * chunk;
	if (cur->item == cur->tail_item && cur->off < cur->tail_off && cur->tail_off < end)
		end = cur->tail_off;
	return end - cur->off < n ? (size_t)(end - cur->off) : n;
}

/* A direct save's next chunk, of n bytes: hashed where it lies before the tail,
 * copied into the pool's region (at the next multiple of SAVE_TAIL_ALIGN) in it. */
static int save_issue_direct(struct save_cursor *cur, const struct save_item *it, size_t n)
{
	const uint8_t *src = (const uint8_t *)it->data + cur->off;
	int rc;
	if (!save_in_tail(cur)) {
		if (!(rc = snapshot_pipe_issue_inplace(cur->pipe, src, n, !cur->sender_hashes,
		                                       cur->item)))
			cur->src_issued++;
		return rc;
	}
	uint64_t at = cur->arena_in, padded = ckpt_align_up(n, SAVE_TAIL_ALIGN);
	uint64_t bytes = io_pool_bytes(cur->ctx->pool);
	if (padded > bytes - at)
		return ckpt_err(-EINVAL, "chunk at %llu of %zu bytes beyond the pool's %llu bytes "
		                "the save's plan has", (unsigned long long)cur->off, n,
		                (unsigned long long)bytes);
	if (!(rc = snapshot_pipe_issue_into(cur->pipe, cur->arena + at, src, n, cur->item)))
		cur->arena_in += padded;
	return rc;
}

static int save_issue(ckpt_ctx *c, ckpt_save *s, struct save_cursor *cur, size_t limit)
{
	size_t chunk = c->cfg.chunk_bytes, issued = 0;
	int rc;
	while (cur->item < s->nitems) {
		const struct save_item *it = &s->items[cur->item];
		if (cur->off >= it->raw_bytes) {
			cur->item++;
			cur->off = 0;
			continue;
		}
		bool staged = save_in_stage(cur);
		if (staged && !cur->released) {
			if ((rc = save_release_caller(c, s, cur)))
				return rc;
			/* The caller is waiting for the event, to queue its own work behind it:
			 * the first pass ends here, and the CUDA calls of the copies out of the
			 * staging pool come after the shard file is set up, not in its way
			 * (and after the previous step is open: whether a chunk compared on
			 * the device needs a copy at all is known then). */
			if (limit == SAVE_ISSUE_ASYNC)
				return 1;
		}
		if (issued == limit)
			return 1;
		size_t n = (size_t)(it->raw_bytes - cur->off < chunk ? it->raw_bytes - cur->off : chunk);
		if (cur->direct)
			n = save_direct_len(cur, chunk, n);
		if (staged) {
			rc = save_issue_staged(c, cur, s, n);
			if (rc == -EAGAIN)
				return rc;
			if (rc < 0)
				return ckpt_err_prefix(rc, "tensor '%s'", it->name);
			cur->off += n;
			issued++;
			continue;
		}
		/* A direct save hashes the chunks before its tail where they lie (they are
		 * sent from there) and copies its tail into the pool's region. */
		if (cur->direct) {
			rc = save_issue_direct(cur, it, n);
			if (rc == -EAGAIN)
				return rc;
			if (rc)
				return ckpt_err_prefix(rc, "tensor '%s'", it->name);
			cur->off += n;
			issued++;
			if (limit == SAVE_ISSUE_ASYNC &&
			    (cur->off < it->raw_bytes || cur->item + 1 < s->nitems))
				return 1;
			continue;
		}
		/* An incremental save looks at a host chunk where it lies first: unchanged
		 * since the previous step, it needs no copy. */
		rc = save_prev_inplace(c, cur, s, it, n);
		if (rc == 1) {
			cur->off += n;
			issued++;
			continue;
		}
		if (!rc && it->source)
			rc = snapshot_pipe_issue_fill(cur->pipe, it->source, it->source_arg, cur->off, n,
			                              cur->item);
		else if (!rc)
			rc = snapshot_pipe_issue(cur->pipe, (const uint8_t *)it->data + cur->off, n,
			                         it->mem, cur->item);
		if (rc == -EAGAIN)
			return rc;
		if (rc)
			return ckpt_err_prefix(rc, "tensor '%s'", it->name);
		cur->off += n;
		issued++;
		if (limit == SAVE_ISSUE_ASYNC && (it->source || it->mem != CKPT_MEM_DEVICE) &&
		    (cur->off < it->raw_bytes || cur->item + 1 < s->nitems))
			return 1;
	}
	if (cur->sealed)
		return 0;
	cur->sealed = true;
	void *ev = NULL;
	rc = snapshot_pipe_seal(cur->pipe, &ev, cur->gds || cur->direct ? save_landed_still_read
	                                                                 : save_snapshot_landed, s);
	if (rc)
		return rc;
	/* ckpt_save_snapshot_event may hand the event out from now on; a GPUDirect
	 * Storage save hands it out once its writes are done (save_run); a save that
	 * released its caller's memory into the staging pool did already. */
	if (cur->gds)
		cur->gds_event = ev;
	else if (!cur->released)
		save_publish_event(c, s, ev);
	return 0;
}

/* Where the shard goes: a file of this rank's (the writer), or a stream to its ckptd
 * (lib/remote): the same calls, in the same order. */
struct save_sink {
	struct io_shard_writer *w;
	struct remote_writer   *rw;
	uint32_t                ntensors;    /* declared to rw */
};

static int sink_add_tensor(struct save_sink *k, const struct io_tensor_desc *d)
{
	if (!k->rw)
		return io_shard_writer_add_tensor(k->w, d);
	int rc = remote_writer_add_tensor(k->rw, d);
	return rc ? rc : (int)k->ntensors++;
}

static bool sink_ready(struct save_sink *k)
{
	return k->rw ? remote_writer_ready(k->rw) : io_shard_writer_ready(k->w);
}

static int sink_append(struct save_sink *k, uint32_t t, unsigned b, size_t n,
                       const struct io_append *a)
{
	if (k->rw)
		return remote_writer_append(k->rw, t, b, n, a->hashes);
	return io_shard_writer_append(k->w, t, b, n, a);
}

/* Declare items [cur->declared, upto) to the writer. */
static int save_declare(struct save_sink *w, ckpt_save *s, size_t upto,
                        struct save_cursor *cur)
{
	for (; cur->declared < upto; cur->declared++) {
		const struct save_item *it = &s->items[cur->declared];
		struct io_tensor_desc d = {
			.name = it->name, .kind = it->kind, .dtype = it->dtype, .policy = it->policy,
			.flags = it->flags, .ndim = it->ndim, .global_shape = it->global_shape,
			.offset = it->offset, .extent = it->extent, .raw_bytes = it->raw_bytes,
		};
		int t = sink_add_tensor(w, &d);
		if (t < 0)
			return t;
		if ((size_t)t != cur->declared)
			return ckpt_err(-EINVAL, "tensor '%s': shard index %d, item %zu", it->name, t,
			                cur->declared);
	}
	return 0;
}

/* ------------------------------------------------------------------ incremental */

static int prev_name_cmp(const void *a, const void *b, void *arg)
{
	const struct io_shard_index *ix = arg;
	return strcmp(ix->tensors[*(const uint32_t *)a].name, ix->tensors[*(const uint32_t *)b].name);
}

/* The highest committed step below step, or CKPT_ENOTFOUND; CKPT_ENOTFOUND too,
 * with its message, where a committed step is at or above step (docs/format.md
 * §3b, "Lifetime"): a step saved below the latest committed one references
 * nothing, for retention after another commit, or GC from another thread, may
 * remove its previous step before it commits, and nothing holds those files
 * until then. The latest committed step they never remove. */
static int prev_step_find(struct manifest *m, uint64_t step, uint64_t *out)
{
	int n = manifest_steps_list(m, false, NULL, 0);
	if (n <= 0)
		return n < 0 ? n : CKPT_ENOTFOUND;
	uint64_t *steps = ckpt_malloc((size_t)n * sizeof *steps);
	if (!steps)
		return ckpt_err(-ENOMEM, "list of %d committed steps", n);
	int got = manifest_steps_list(m, false, steps, (size_t)n);
	int rc = CKPT_ENOTFOUND;
	int have = got < n ? got : n;
	if (have > 0 && steps[have - 1] >= step) {
		rc = ckpt_err(CKPT_ENOTFOUND, "step %llu is committed, at or above this one: a "
		              "step saved below the latest references nothing",
		              (unsigned long long)steps[have - 1]);
		have = 0;
	}
	for (int i = have; rc == CKPT_ENOTFOUND && i-- > 0;)
		if (steps[i] < step) {
			*out = steps[i];
			rc = 0;
		}
	ckpt_free(steps);
	return got < 0 ? got : rc;
}

static void save_prev_reset(struct save_prev *p)
{
	memset(p, 0, sizeof *p);
	p->issue = p->drain = (struct save_prev_pos){ .item = SIZE_MAX, .t = -1 };
	p->changed_item = SIZE_MAX;
}

static void save_prev_close(struct save_prev *p)
{
	io_shard_reader_close(p->rd);     /* before the index it may borrow */
	io_index_free(p->ix);
	ckpt_free(p->by_name);
	ckpt_free(p->path);
	save_prev_reset(p);
}

/* This rank's index of the previous committed step, held to what the manifest
 * committed: the step's record COMMITTED, of this job, of this world and with an
 * attempt; the shard's footer the one committed for that attempt. Anything else
 * (none, another job's, another world, a damaged file) is not an error: the save is
 * then a full one, and says why (INFO). */
static int save_prev_open(ckpt_ctx *c, const ckpt_save *s, struct save_prev *p)
{
	save_prev_reset(p);
	struct manifest *m;
	struct manifest_step rec;
	struct manifest_shard sh;
	memset(&sh, 0, sizeof sh);
	uint64_t step = 0;
	uint32_t rank = (uint32_t)c->cfg.rank;
	struct io_shard_reader *rd = NULL;
	int rc = glue_manifest(c, &m);
	if (!rc) {
		ckpt_err_clear();         /* a message below is prev_step_find's own */
		rc = prev_step_find(m, s->step, &step);
	}
	if (rc == CKPT_ENOTFOUND) {
		/* The first step, or one below the latest: nothing to reference. */
		if (ckpt_err_msg()[0])
			ckpt_log(CKPT_LOG_INFO, "step %llu: a full save: %s",
			         (unsigned long long)s->step, ckpt_err_msg());
		ckpt_err_clear();
		return 0;
	}
	if (!rc)
		rc = manifest_step_get(m, step, &rec);
	if (!rc && (rec.state != CKPT_STATE_COMMITTED || !rec.save_id ||
	            rec.world != (uint32_t)c->cfg.world || strcmp(rec.job_id, c->cfg.job_id)))
		rc = ckpt_err(CKPT_ENOTFOUND, "step %llu is of job '%s', world %u%s: this save is "
		              "of job '%s', world %d", (unsigned long long)step, rec.job_id, rec.world,
		              rec.save_id ? "" : ", without an attempt id", c->cfg.job_id,
		              c->cfg.world);
	if (!rc)
		rc = manifest_shard_get(m, step, rank, &sh);
	char path[4400];
	if (!rc) {
		snprintf(path, sizeof path, "%s/%s", c->cfg.root, sh.path);
		if (!(p->path = ckpt_strdup(path)))
			rc = ckpt_err(-ENOMEM, "index of step %llu", (unsigned long long)step);
	}
	if (!rc && sh.index_len) {
		rc = io_index_decode(sh.index, sh.index_len, &p->ix);
	} else if (!rc) {
		uint8_t h[CKPT_HASH_BYTES];
		if (!(rc = io_shard_reader_open(c->save_engine, path, NULL, &rd)) &&
		    (io_shard_reader_footer_hash(rd, h) || memcmp(h, sh.footer_hash, sizeof h) ||
		     io_shard_reader_index(rd)->data_end != sh.footer_offset))
			rc = ckpt_err(CKPT_ECORRUPT, "%s: its footer is not the index committed for "
			              "rank %u", path, rank);
		/* The reader stays, on the index it decoded, for the block table. */
		if (!rc)
			p->ix = io_shard_reader_take_index(rd);
		else
			io_shard_reader_close(rd);
		p->rd = rc ? NULL : rd;
	}
	if (!rc && (p->ix->step != step || p->ix->rank != rank || p->ix->save_id != rec.save_id))
		rc = ckpt_err(CKPT_ECORRUPT, "the shard of rank %u committed for step %llu is of "
		              "step %llu rank %u attempt %016llx", rank, (unsigned long long)step,
		              (unsigned long long)p->ix->step, p->ix->rank,
		              (unsigned long long)p->ix->save_id);
	manifest_shard_free(&sh);
	if (!rc && !(p->by_name = ckpt_malloc((p->ix->ntensors ? p->ix->ntensors : 1) *
	                                      sizeof *p->by_name)))
		rc = ckpt_err(-ENOMEM, "index of step %llu", (unsigned long long)step);
	if (rc) {
		ckpt_log(rc == -ENOMEM ? CKPT_LOG_WARN : CKPT_LOG_INFO, "step %llu: a full save, "
		         "nothing referenced from step %llu: %s", (unsigned long long)s->step,
		         (unsigned long long)step, ckpt_err_msg());
		save_prev_close(p);
		ckpt_err_clear();
		return rc == -ENOMEM ? rc : 0;
	}
	for (uint32_t i = 0; i < p->ix->ntensors; i++)
		p->by_name[i] = i;
	qsort_r(p->by_name, p->ix->ntensors, sizeof *p->by_name, prev_name_cmp, p->ix);
	p->self = (struct io_ref_file){ .step = step, .save_id = rec.save_id, .rank = rank };
	return 0;
}

/* The tensor of the previous step that item it may reference: the same name, kind,
 * dtype, policy, flags and box in the same global shape; -1 if none. */
static int64_t save_prev_tensor(const struct save_prev *p, const struct save_item *it)
{
	const struct io_shard_index *ix = p->ix;
	size_t lo = 0, hi = ix->ntensors;
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		const struct io_tensor_entry *t = &ix->tensors[p->by_name[mid]];
		int c = strcmp(t->name, it->name);
		if (c < 0) {
			lo = mid + 1;
			continue;
		}
		if (c > 0) {
			hi = mid;
			continue;
		}
		if (t->kind != it->kind || t->dtype != it->dtype || t->policy != it->policy ||
		    t->flags != it->flags || t->ndim != it->ndim || t->raw_bytes != it->raw_bytes)
			return -1;
		for (unsigned d = 0; d < t->ndim; d++)
			if (t->global_shape[d] != it->global_shape[d] || t->offset[d] != it->offset[d] ||
			    t->extent[d] != it->extent[d])
				return -1;
		return p->by_name[mid];
	}
	return -1;
}

/* The previous step's chunk at item tag's [off, off + n), or -1: same tensor (by
 * save_prev_tensor), same offset and length. pos is the caller's place in it, for
 * chunks asked in issue order (a new item looks its tensor up once). */
static int64_t save_prev_find(struct save_prev *p, struct save_prev_pos *pos,
                              const ckpt_save *s, uint64_t tag, uint64_t off, size_t n)
{
	if (pos->item != tag) {
		pos->item = (size_t)tag;
		pos->t = save_prev_tensor(p, &s->items[tag]);
		pos->k = pos->t >= 0 ? p->ix->tensors[pos->t].first_chunk : 0;
	}
	if (pos->t < 0)
		return -1;
	const struct io_tensor_entry *t = &p->ix->tensors[pos->t];
	uint32_t end = t->first_chunk + t->nchunks;
	while (pos->k < end && p->ix->chunks[pos->k].raw_offset < off)
		pos->k++;
	if (pos->k >= end)
		return -1;
	const struct io_chunk_entry *c = &p->ix->chunks[pos->k];
	return c->raw_offset == off && c->raw_len == n ? (int64_t)pos->k : -1;
}

/* Is the chunk of item tag at [off, off + n) with hashes h the same as the previous
 * step's chunk at that place? Then *ref says where its bytes are (the file that
 * holds them: the previous step's own, or the one its chunk referenced in turn, so
 * that a read never takes more than one hop). Asked in the order chunks are
 * taken out of the pipe. */
static bool save_prev_match(struct save_cursor *cur, const ckpt_save *s, uint64_t tag,
                            uint64_t off, size_t n, const struct io_hashes *h,
                            struct io_chunk_ref *ref)
{
	struct save_prev *p = &cur->prev;
	if (!p->ix)
		return false;
	int64_t k = save_prev_find(p, &p->drain, s, tag, off, n);
	if (k < 0)
		return false;
	const struct io_chunk_entry *c = &p->ix->chunks[k];
	if (memcmp(c->hash, h->chunk, CKPT_HASH_BYTES))
		return false;
	/* A raw chunk of several blocks carries its block hashes into the new table. */
	if (c->codec == IO_CODEC_RAW && io_nblocks(n, IO_BLOCK_BYTES) &&
	    (!h->blocks || h->block_bytes != IO_BLOCK_BYTES))
		return false;
	uint32_t f = io_chunk_file(p->ix, (uint32_t)k);
	*ref = (struct io_chunk_ref){
		.file = f ? p->ix->files[f - 1] : p->self, .codec = c->codec,
		.file_offset = c->file_offset, .stored_len = c->stored_len, .hashes = h,
	};
	return true;
}

/* The previous step's block hashes of its chunk k (NULL for a chunk without any),
 * read from its block table on first need. false when they cannot be had: the table
 * is damaged or unreadable (said once, INFO; every chunk is then copied and hashed,
 * and compared after the copy as before) or of another block size. */
static bool save_prev_blocks(ckpt_ctx *c, struct save_prev *p, uint32_t k,
                             const uint8_t **out)
{
	*out = NULL;
	const struct io_chunk_entry *e = &p->ix->chunks[k];
	if (!io_chunk_nblocks(p->ix, e))
		return !io_nblocks(e->raw_len, IO_BLOCK_BYTES) || e->codec != IO_CODEC_RAW;
	if (p->no_blocks || p->ix->block_bytes != IO_BLOCK_BYTES)
		return false;
	int rc = 0;
	if (!p->rd)
		rc = io_shard_reader_open(c->save_engine, p->path, p->ix, &p->rd);
	if (!rc)
		rc = io_shard_reader_chunk_blocks(p->rd, k, out);
	if (rc) {
		ckpt_log(CKPT_LOG_INFO, "%s: block table not usable, every chunk is copied before "
		         "it is compared: %s", p->path, ckpt_err_msg());
		ckpt_err_clear();
		p->no_blocks = true;
		return false;
	}
	return true;
}

/*
 * The chunk at cur's place, n bytes, whose bytes are known without a copy: data
 * (hashed here, where it lies) or, data NULL, bytes whose hash is known. When that
 * hash equals the previous step's chunk at the same place, the chunk is issued as
 * stored (snapshot_pipe_issue_stored): it becomes a reference when taken out. 1 when
 * issued so, 0 when it must be copied, -EAGAIN (pipe full: checked before hashing),
 * or the pipe's error.
 */
static int save_prev_stored(ckpt_ctx *c, struct save_cursor *cur, const ckpt_save *s,
                            size_t n, const uint8_t *data, const uint8_t *hash)
{
	struct save_prev *p = &cur->prev;
	int64_t k = save_prev_find(p, &p->issue, s, cur->item, cur->off, n);
	const uint8_t *blocks;
	if (k < 0 || !save_prev_blocks(c, p, (uint32_t)k, &blocks))
		return 0;
	if (!snapshot_pipe_room(cur->pipe))
		return -EAGAIN;
	struct io_hashes h = { .block_bytes = IO_BLOCK_BYTES, .blocks = blocks,
	                       .tree = !c->hash_whole };
	if (data)
		io_chunk_hash(data, n, IO_BLOCK_BYTES, h.tree, h.chunk);
	else
		memcpy(h.chunk, hash, CKPT_HASH_BYTES);
	if (memcmp(h.chunk, p->ix->chunks[k].hash, CKPT_HASH_BYTES)) {
		p->changed_item = cur->item;
		p->changed_off = cur->off;
		return 0;
	}
	/* The block hashes are the previous step's for these bytes (the same bytes: the
	 * chunk's hash says so), as save_prev_match takes a copy's. */
	int rc = snapshot_pipe_issue_stored(cur->pipe, n, &h, cur->item);
	if (rc)
		return rc;
	if (data)
		p->inplace_chunks++;
	return 1;
}

/*
 * Before the chunk of host memory at cur's place, n bytes of item it, is copied:
 * hash it where it lies, in the caller's memory (read only, at memory speed: no pool
 * buffer, no copy), and when the hash equals the previous step's chunk at the same
 * place, issue it as stored (snapshot_pipe_issue_stored): it becomes a reference
 * when taken out, and its bytes are neither copied nor written. The hash that
 * decides is of the caller's bytes, taken before the pipe is sealed, so before the
 * snapshot point, as any copy's. Returns 1 when issued so, 0 when the chunk must be
 * copied (not host memory, nothing to compare with, changed), -EAGAIN (pipe full:
 * take a chunk out first; checked before hashing), or an error of the pipe.
 */
static int save_prev_inplace(ckpt_ctx *c, struct save_cursor *cur, const ckpt_save *s,
                             const struct save_item *it, size_t n)
{
	struct save_prev *p = &cur->prev;
	if (!p->ix || it->source || it->mem != CKPT_MEM_HOST)
		return 0;
	if (p->changed_item == cur->item && p->changed_off == cur->off)
		return 0;                 /* hashed already, and changed: copy it */
	return save_prev_stored(c, cur, s, n, (const uint8_t *)it->data + cur->off, NULL);
}

/*
 * A staged chunk at cur's place, n bytes: issued as stored when the compare-and-copy
 * found the staging pool's bytes unchanged and those bytes are the previous step's
 * chunk there (the hash they had when they were copied out equals that chunk's);
 * otherwise copied to the host from the staging pool like any device chunk, and
 * compared after the copy as before. 1 when issued (either way), -EAGAIN, errors.
 */
static int save_issue_staged(ckpt_ctx *c, struct save_cursor *cur, const ckpt_save *s,
                             size_t n)
{
	if (cur->stage_issue >= cur->stage_n)
		return ckpt_err(-EINVAL, "staged chunk %zu of %zu", cur->stage_issue, cur->stage_n);
	const struct save_staged *sc = &cur->staged[cur->stage_issue];
	int rc = 0;
	bool changed = true;
	if (sc->diffed && cur->prev.ix &&
	    !(rc = snapshot_pipe_stage_changed(cur->pipe, (uint32_t)cur->stage_issue, &changed)) &&
	    !changed && (rc = save_prev_stored(c, cur, s, n, NULL, sc->was)) == 1) {
		cur->unchanged_bytes += n;
		cur->stage_issue++;
		return 1;
	}
	if (rc < 0)
		return rc;
	rc = snapshot_pipe_issue(cur->pipe, sc->addr, n, CKPT_MEM_DEVICE, cur->item);
	if (rc)
		return rc;
	cur->stage_issue++;
	return 1;
}

/*
 * A direct save: a save through ckptd over tcp (or unix) of host memory only, raw,
 * whose state is larger than its pool. Copying each chunk into the pool before it
 * is sent would cross the memory bus once more for nothing the kernel's own copy
 * into the socket does not already do: a chunk sent is out of the caller's memory.
 * So the pool takes the state's tail, copied as its turn comes, while the chunks
 * before it are hashed where they lie and sent from there; the snapshot point comes
 * when the last of those has been sent and the tail copied, which is as soon as
 * with every chunk copied (the pool holds the same tail then), with one copy of
 * the state fewer on the rank's CPUs. Not over rdma, whose direct path RDMA-writes
 * from the registered pool; not compressed (compression reads the pool buffer).
 */
static bool save_direct_ok(const ckpt_ctx *c, const ckpt_save *s, const struct save_cursor *cur)
{
	if (!glue_remote(c) || c->cfg.zstd_level > 0 || c->cfg.transport == CKPT_TRANSPORT_RDMA ||
	    s->incremental || cur->gds || cur->stage_item != SIZE_MAX)
		return false;
	for (size_t i = 0; i < s->nitems; i++)
		if (s->items[i].mem != CKPT_MEM_HOST || s->items[i].source)
			return false;
	return true;
}

/* The tail: the last chunks of the state that the pool holds (all of them where the
 * state fits), taken whole as one arena and filled from its start, each chunk at
 * the next multiple of SAVE_TAIL_ALIGN. From the end of the state each regular
 * chunk goes in while it fits; the first that does not gives the tail its first piece, its last bytes
 * that fill what is left (the shard records it as a chunk of that length, and the
 * chunk before it ends where it begins). Carved so, the tail is the pool's bytes
 * whatever the state's chunks: given to the pool's buffers one chunk each, the
 * last pieces of a state's tensors (of any length below a chunk) and its small
 * tensors left part of every buffer, and the small buffers ran out before the
 * bytes did: 217 of 256 MiB a rank at 8 ranks of 1 GiB (docs/perf.md §6). The
 * chunks before the tail are the regular ones. A pool with a buffer out now (a
 * load on another thread of the same context) gives no arena: then every chunk of
 * a state larger than the pool is sent from the state, and the snapshot point
 * comes once the last has been sent; one that fits takes the buffers one chunk
 * each, as a save of another kind does. */
static int save_direct_plan(ckpt_ctx *c, const ckpt_save *s, struct save_cursor *cur)
{
	if (!save_direct_ok(c, s, cur))
		return 0;
	/* The stream asks ckptd for hashes after the bytes (it does not ask for the
	 * direct path over this transport), so its sender can hash a tree's blocks as it
	 * sends them: each block's bytes are read from memory once, by the hash, and
	 * the kernel's copy into the socket finds them in the CPU's cache. */
	cur->sender_hashes = !c->hash_whole;
	size_t chunk = c->cfg.chunk_bytes, n = 0, item = s->nitems;
	uint64_t room = io_pool_bytes(c->pool) / SAVE_TAIL_ALIGN * SAVE_TAIL_ALIGN, off = 0;
	uint64_t tail_bytes = 0;
	bool all = true;
	for (size_t i = s->nitems; all && i-- > 0;) {
		for (uint64_t end = s->items[i].raw_bytes; end > 0;) {
			size_t len = (size_t)(end - (end - 1) / chunk * chunk);   /* to its chunk's start */
			uint64_t padded = ckpt_align_up(len, SAVE_TAIL_ALIGN);
			if (padded > room) {        /* then len > room: both are multiples of 64 */
				all = false;
				if (room == 0)
					break;
				len = (size_t)room;                  /* the tail's first piece */
				padded = room;
			}
			n++;
			tail_bytes += len;
			room -= padded;
			end -= len;
			item = i;
			off = end;
			if (!all)
				break;
		}
	}
	if (n == 0 || io_pool_take_all(c->pool, &cur->arena)) {
		/* Nothing to save; or a buffer is out: a state that fits is copied chunk by
		 * chunk into buffers as they come free, a larger one sent from where it
		 * lies, every chunk. */
		if (n && !all) {
			cur->direct = true;
			cur->tail_item = s->nitems;
			ckpt_log(CKPT_LOG_DEBUG, "step %llu: sent from where it lies, every chunk (a "
			         "buffer of the pool is out: no tail)", (unsigned long long)s->step);
		}
		return 0;
	}
	/* A state that fits is the tail whole: every chunk copied, at copy speed, packed
	 * as closely as the chunks of a larger one's. */
	cur->direct = true;
	ckpt_log(CKPT_LOG_DEBUG, "step %llu: %s a tail of %zu chunk(s), %.1f MiB, copied into "
	         "the pool (%.1f MiB)", (unsigned long long)s->step,
	         all ? "the state whole is" : "sent from where it lies but for", n,
	         (double)tail_bytes / 1048576.0, (double)io_pool_bytes(c->pool) / 1048576.0);
	cur->tail_item = item;
	cur->tail_off = off;
	return 0;
}

/* Every chunk before the tail has been issued and appended: once the sender has
 * sent them, the caller's memory is released (the tail was copied before the pipe
 * was sealed). */
static void save_direct_release(ckpt_save *s, struct save_cursor *cur, struct save_sink *w)
{
	if (!cur->direct || !cur->sealed || cur->src_sealed || !w->rw ||
	    cur->src_drained != cur->src_issued)
		return;
	cur->src_sealed = true;
	remote_writer_src_seal(w->rw, save_snapshot_landed, s);
}

/* Take the oldest chunk out of the pipe once its copy landed, and append it. */
static int save_drain_one(ckpt_ctx *c, ckpt_save *s, struct save_cursor *cur,
                          struct save_sink *w)
{
	unsigned b;
	size_t n;
	uint64_t tag;
	struct io_hashes h;
	int rc = snapshot_pipe_next(cur->pipe, &b, &n, &h, &tag);
	if (rc < 0)
		return rc;
	/* Unhashed: the writer's compression workers hash it (save_stream). */
	const struct io_hashes *hashes = rc == 1 ? NULL : &h;
	/* From here this function owns buffer b until the writer takes it (where b is
	 * one of the pool's). */
	if ((rc = save_declare(w, s, (size_t)tag + 1, cur))) {
		if (b < io_pool_nslots(c->pool))
			io_pool_put(c->pool, b);
		return rc;
	}
	/* Chunks come out in issue order: item by item, each from its offset 0. */
	if (tag != cur->out_item)
		cur->out_off = 0;
	cur->out_item = (size_t)tag;
	const struct save_item *it = &s->items[tag];
	uint64_t off = cur->out_off;
	cur->out_off += n;
	if (hashes)
		save_stage_drained(c, cur, tag, off, hashes);
	struct io_chunk_ref ref;
	if (w->w && hashes && save_prev_match(cur, s, tag, off, n, hashes, &ref)) {
		rc = io_shard_writer_append_ref(w->w, (uint32_t)tag, n, &ref);
		/* The bytes are on disk already: the buffer, if the chunk was copied (it
		 * was not hashed in place), goes back unwritten. */
		if (b < io_pool_nslots(c->pool))
			io_pool_put(c->pool, b);
		if (!rc) {
			cur->prev.nrefs++;
			cur->prev.ref_bytes += n;
		}
		return rc;
	}
	if (b == SNAPSHOT_DST_BUF) {  /* a direct save's tail, sent from the pool's arena */
		/* Taken out in the order issued: where save_issue_direct put it. */
		const uint8_t *at = cur->arena + cur->arena_out;
		if (!w->rw)
			return ckpt_err(-EINVAL, "tensor '%s': chunk at %llu copied into the pool's "
			                "region with no stream to send it", it->name,
			                (unsigned long long)off);
		cur->arena_out += ckpt_align_up(n, SAVE_TAIL_ALIGN);
		rc = remote_writer_append_held(w->rw, (uint32_t)tag, at, n, &h);
		save_direct_release(s, cur, w);
		return rc;
	}
	if (b == SNAPSHOT_SRC_BUF) {  /* a direct save's, sent from where it lies */
		if (!w->rw)
			return ckpt_err(-EINVAL, "tensor '%s': chunk at %llu hashed in place with no "
			                "stream to send it", it->name, (unsigned long long)off);
		rc = remote_writer_append_src(w->rw, (uint32_t)tag, (const uint8_t *)it->data + off, n,
		                              hashes);
		if (!rc)
			cur->src_drained++;
		save_direct_release(s, cur, w);
		return rc;
	}
	if (b == SNAPSHOT_NO_BUF)     /* save_prev_inplace matched this very chunk */
		return ckpt_err(-EINVAL, "tensor '%s': chunk at %llu issued as stored in step %llu "
		                "and not found there when appended", it->name,
		                (unsigned long long)off, (unsigned long long)cur->prev.self.step);
	if (cur->gds && it->mem == CKPT_MEM_DEVICE && !it->source) {
		cur->out_src = (const uint8_t *)it->data + off;
		cur->out_host = io_pool_addr(c->pool, b);
		struct io_ext_write ext = { .write = save_gds_write, .arg = cur };
		return sink_append(w, (uint32_t)tag, b, n,
		                   &(struct io_append){ .hashes = &h, .ext = &ext });
	}
	return sink_append(w, (uint32_t)tag, b, n, &(struct io_append){ .hashes = hashes });
}

/* Stream the rest of the items through the pipe into the writer. */
static int save_stream(ckpt_ctx *c, ckpt_save *s, struct save_cursor *cur,
                       struct save_sink *w)
{
	int rc;
	for (;;) {
		/* A chunk of host memory is copied and hashed when it is issued, by this
		 * thread: hand each finished one to the disk as soon as the disk can take it
		 * without waiting, so that copying and writing overlap, and go on copying
		 * (up to the window) while it cannot. Device copies run on the stream
		 * meanwhile and are taken out when the window is full. A chunk found
		 * unchanged in place writes nothing: it is taken out whenever it is first. */
		while (snapshot_pipe_head_ready(cur->pipe) &&
		       (sink_ready(w) || snapshot_pipe_head_stored(cur->pipe)))
			if ((rc = save_drain_one(c, s, cur, w)))
				return rc;
		rc = save_issue(c, s, cur, 1);
		if (rc == 1)
			continue;
		if (rc != -EAGAIN)
			break;
		save_direct_release(s, cur, w);
		if ((rc = save_drain_one(c, s, cur, w)))
			return rc;
	}
	if (rc)
		return rc;
	save_direct_release(s, cur, w);
	while (snapshot_pipe_pending(cur->pipe))
		if ((rc = save_drain_one(c, s, cur, w)))
			return rc;
	save_direct_release(s, cur, w);
	return save_declare(w, s, s->nitems, cur);   /* trailing empty items */
}

/* A GPUDirect Storage save: asked for, available, raw, and with device tensors. */
static bool save_uses_gds(const ckpt_ctx *c, const ckpt_save *s)
{
	if (!(c->cfg.gds & CKPT_GDS_SAVE) || !snapshot_gds_on(c->snap) || c->cfg.zstd_level > 0 ||
	    glue_remote(c))
		return false;
	for (size_t i = 0; i < s->nitems; i++)
		if (s->items[i].mem == CKPT_MEM_DEVICE && !s->items[i].source)
			return true;
	return false;
}

static uint64_t save_size_hint(const ckpt_ctx *c, const ckpt_save *s)
{
	uint64_t total = IO_HEADER_BYTES + 2 * CKPT_ALIGN;
	for (size_t i = 0; i < s->nitems; i++) {
		uint64_t b = s->items[i].raw_bytes;
		uint64_t nchunks = (b + c->cfg.chunk_bytes - 1) / c->cfg.chunk_bytes;
		total += ckpt_align_up(b, CKPT_ALIGN) + nchunks * CKPT_ALIGN;
		total += 256 + strlen(s->items[i].name) + 64 * nchunks;   /* its footer records */
		total += b / IO_BLOCK_BYTES * CKPT_HASH_BYTES + CKPT_HASH_BYTES;  /* block hashes */
	}
	return total + CKPT_ALIGN;      /* the block table's header and padding */
}

/* ------------------------------------------------------------------ the device staging pool
 *
 * With ckpt_opts.device_pool_bytes a save copies the last part of its state that
 * fits into the device staging pool, device to device, before anything else; once
 * the chunks before that part are issued (the pinned path, as without a pool) the
 * caller's memory is released: the snapshot event is recorded and the landed
 * callback queued behind those copies, and every staged chunk is then copied to the
 * host, hashed and written from the pool, in the background. The last part, not the
 * first: the first chunks are issued at once in any case, into the host pool's
 * window, so staging the rest is what brings the release forward.
 */

/* Plan the staged chunks and queue their copies. Host items among them are copied
 * host to device first, before the fence (the worker copies host memory without
 * waiting for it, on the pinned path too); the device items after it. An
 * incremental save compare-and-copies a chunk that the pool still holds, by the
 * record of the last save, at the same place (same item name, offset, length,
 * offset in the pool) with its hash known. */
static int save_stage(ckpt_ctx *c, ckpt_save *s, struct save_cursor *cur)
{
	cur->stage_item = SIZE_MAX;
	if (!c->cfg.device_pool_bytes || cur->gds || !s->fence)
		return 0;
	bool diff = s->incremental && !glue_remote(c);
	uint64_t room = snapshot_stage_reserve(c->snap, c->cfg.device_pool_bytes);
	diff = diff && snapshot_stage_can_diff(c->snap);
	const uint64_t chunk = c->cfg.chunk_bytes, A = SNAPSHOT_STAGE_ALIGN;
	uint64_t used = 0;
	size_t nchunks = 0;
	for (size_t i = s->nitems; room && i-- > 0;) {
		const struct save_item *it = &s->items[i];
		if (it->source)
			break;                /* read by this thread when issued: not staged */
		if (!it->raw_bytes)
			continue;
		uint64_t fit = (room - used) / A * A;
		uint64_t nch = (it->raw_bytes + chunk - 1) / chunk;
		uint64_t k = it->raw_bytes <= fit ? 0 : (it->raw_bytes - fit + chunk - 1) / chunk;
		if (k >= nch)
			break;
		used += ckpt_align_up(it->raw_bytes - k * chunk, A);
		nchunks += (size_t)(nch - k);
		cur->stage_item = i;
		cur->stage_off = k * chunk;
		if (k)
			break;
	}
	if (cur->stage_item == SIZE_MAX)
		return 0;
	struct save_stage_rec *r = c->stage_rec;
	if (!r && !(r = c->stage_rec = ckpt_calloc(1, sizeof *r)))
		return ckpt_err(-ENOMEM, "device staging record");
	if (nchunks > r->cap) {
		struct stage_chunk *e = ckpt_realloc(r->c, nchunks * sizeof *e);
		if (!e)
			return ckpt_err(-ENOMEM, "device staging record of %zu chunks", nchunks);
		memset(e + r->cap, 0, (nchunks - r->cap) * sizeof *e);
		r->c = e;
		r->cap = nchunks;
	}
	if (!(cur->staged = ckpt_calloc(nchunks, sizeof *cur->staged)))
		return ckpt_err(-ENOMEM, "%zu staged chunks", nchunks);
	/* The record, chunk by chunk, in the pool's order: what was there decides the
	 * comparison; what will be there replaces it, its hash unknown until copied out. */
	uint64_t at = 0;
	size_t j = 0;
	for (size_t i = cur->stage_item; i < s->nitems; i++) {
		const struct save_item *it = &s->items[i];
		uint64_t off0 = i == cur->stage_item ? cur->stage_off : 0;
		for (uint64_t off = off0; off < it->raw_bytes; off += chunk, j++) {
			uint64_t len = it->raw_bytes - off < chunk ? it->raw_bytes - off : chunk;
			uint64_t where = at + (off - off0);
			struct stage_chunk *e = &r->c[j];
			bool same = j < r->n && e->known && e->off == off && e->len == len &&
			            e->at == where && !strcmp(e->name, it->name);
			struct save_staged *sc = &cur->staged[j];
			sc->diffed = diff && same && it->mem == CKPT_MEM_DEVICE &&
			             (uintptr_t)it->data % 16 == 0 && j < SNAPSHOT_STAGE_FLAGS;
			if (sc->diffed)
				memcpy(sc->was, e->hash, CKPT_HASH_BYTES);
			cur->stage_diffs |= sc->diffed;
			if (j >= r->n || strcmp(e->name, it->name)) {
				char *name = ckpt_strdup(it->name);
				if (!name)   /* nothing copied yet: the rest stays as it was */
					return ckpt_err(-ENOMEM, "device staging record");
				if (j < r->n)
					ckpt_free(e->name);
				e->name = name;
			}
			e->off = off;
			e->len = len;
			e->at = where;
			e->known = false;
			if (j >= r->n)
				r->n = j + 1;
		}
		at += ckpt_align_up(it->raw_bytes > off0 ? it->raw_bytes - off0 : 0, A);
	}
	for (size_t k = nchunks; k < r->n; k++) {
		ckpt_free(r->c[k].name);
		r->c[k].name = NULL;
	}
	r->n = nchunks;
	cur->stage_n = nchunks;
	/* The copies: host items, then (after the fence) device items, each item's run
	 * of chunks diffed or not in one call. */
	for (int pass = 0; pass < 2; pass++) {
		j = 0;
		for (size_t i = cur->stage_item; i < s->nitems; i++) {
			const struct save_item *it = &s->items[i];
			uint64_t off0 = i == cur->stage_item ? cur->stage_off : 0;
			uint64_t off = off0;
			bool host = it->mem != CKPT_MEM_DEVICE;
			while (off < it->raw_bytes) {
				size_t j0 = j;
				bool d = cur->staged[j].diffed;
				uint64_t end = off;
				while (end < it->raw_bytes && cur->staged[j].diffed == d) {
					end += it->raw_bytes - end < chunk ? it->raw_bytes - end : chunk;
					j++;
				}
				if (host == (pass == 0)) {
					const void *addr;
					int rc = snapshot_pipe_stage(cur->pipe, (const uint8_t *)it->data + off,
					                             (size_t)(end - off), it->mem,
					                             r->c[j0].at, d ? chunk : 0, (uint32_t)j0,
					                             &addr);
					if (rc)
						return ckpt_err_prefix(rc, "tensor '%s'", it->name);
					for (size_t k = j0; k < j; k++)
						cur->staged[k].addr = (const uint8_t *)addr +
						                      (r->c[k].off - off);
					cur->staged_bytes += end - off;
				}
				off = end;
			}
		}
	}
	ckpt_log(CKPT_LOG_DEBUG, "step %llu: %zu chunk(s), %llu bytes, staged on the device "
	         "from tensor '%s' at %llu%s", (unsigned long long)s->step, nchunks,
	         (unsigned long long)cur->staged_bytes, s->items[cur->stage_item].name,
	         (unsigned long long)cur->stage_off,
	         cur->stage_diffs ? "; some compared with what the pool held" : "");
	return 0;
}

/* A chunk taken out of the pipe at item tag's offset off: if staged, its hash is
 * now the record's (the bytes the pool holds there). */
static void save_stage_drained(ckpt_ctx *c, struct save_cursor *cur, uint64_t tag,
                               uint64_t off, const struct io_hashes *h)
{
	if (cur->stage_item == SIZE_MAX || tag < cur->stage_item ||
	    (tag == cur->stage_item && off < cur->stage_off) || cur->stage_drain >= cur->stage_n)
		return;
	struct stage_chunk *e = &c->stage_rec->c[cur->stage_drain++];
	memcpy(e->hash, h->chunk, CKPT_HASH_BYTES);
	e->known = true;
}

void save_run(ckpt_ctx *c, ckpt_save *s)
{
	char dir[4200] = "", path[4300] = "";
	struct save_sink sink = { 0 };
	struct io_shard_result res;
	memset(&res, 0, sizeof res);
	ckpt_err_clear();
	int rc = 0;
	bool voted = false;
	struct save_cursor cur;
	memset(&cur, 0, sizeof cur);
	uint64_t t_run = ckpt_now_ns();
	ckpt_log(CKPT_LOG_DEBUG, "step %llu: worker starts %.3f ms after submit",
	         (unsigned long long)s->step, (double)(t_run - s->t_submit) / 1e6);
	cur.ctx = c;
	cur.out_item = SIZE_MAX;
	cur.stage_item = SIZE_MAX;
	cur.gds = save_uses_gds(c, s);
	/* The pipe's window is the pool less what the writer needs beside it: the
	 * writes in flight and, when it compresses, its ring's chunks, each holding its
	 * raw buffer and a second one to compress into (lib/io/writer.c). A window of
	 * the rest would leave the compression workers without output buffers, and the
	 * chunks would be compressed one by one as writes gave buffers back. */
	unsigned beside = c->cfg.queue_depth;
	if (c->cfg.zstd_level > 0 && !glue_remote(c))
		beside += 4 * c->cfg.compress_threads;
	/* A raw stream to ckptd writes nothing here: the chunks its sender holds were
	 * taken out of the pipe, and the pipe waits for their buffers when it has none;
	 * the whole pool is the window (a direct save's tail takes all of it). A
	 * compressing one keeps buffers beside for its output. */
	if (glue_remote(c) && c->cfg.zstd_level == 0)
		beside = 0;
	unsigned window = snapshot_pipe_window(io_pool_nslots(c->pool), beside);
	if ((rc = snapshot_pipe_open(c->snap, c->pool, window, IO_BLOCK_BYTES, !c->hash_whole,
	                             &cur.pipe)))
		goto out;
	snapshot_pipe_after(cur.pipe, s->fence);
	if ((rc = save_stage(c, s, &cur)))
		goto out;
	if ((rc = save_direct_plan(c, s, &cur)))
		goto out;
	/* Who hashes device chunks, decided before the first is issued. One thread
	 * hashing every chunk (7-9 GB/s) would pace a save that writes little of what
	 * it hashes or sends faster than that. A save that compresses with workers
	 * leaves it to them, beside the compression; that is not possible where the
	 * save needs a chunk's hash when it is taken out: against the previous step,
	 * for the staging pool's record, to send it, or for GPUDirect Storage's
	 * writes. An incremental save, or one through ckptd, hashes on helpers instead
	 * (as many as compression workers: the same share of the CPUs). */
	if (!glue_remote(c) && c->cfg.zstd_level > 0 && c->cfg.compress_threads > 0 &&
	    !s->incremental && cur.stage_item == SIZE_MAX && !cur.gds)
		snapshot_pipe_leave_hashing(cur.pipe);
	else if (s->incremental || glue_remote(c))
		snapshot_pipe_hash_threads(cur.pipe, c->cfg.compress_threads);
	/* Device copies first, as many as the window takes, before any file is touched:
	 * the caller waits for the snapshot point (or the snapshot event) and for nothing
	 * else, and the copies run on the stream while the shard file is set up. Host
	 * memory is copied by this thread: only its first chunk here, the rest while the
	 * disk writes (save_stream), or copying would end before the first write starts. */
	rc = save_issue(c, s, &cur, SAVE_ISSUE_ASYNC);
	ckpt_log(CKPT_LOG_DEBUG, "step %llu: first issue pass %.3f ms: %s",
	         (unsigned long long)s->step, (double)(ckpt_now_ns() - t_run) / 1e6,
	         rc == -EAGAIN ? "window full" : rc == 1 && cur.released ? "caller released" :
	         rc == 1 ? "host memory next" :
	         rc ? "failed" : "all issued and sealed");
	if (rc && rc != -EAGAIN && rc != 1)
		goto out;
	if (!glue_remote(c)) {
		if (!c->save_engine &&
		    (rc = io_engine_create(c->pool, c->cfg.queue_depth, &c->save_engine)))
			goto out;
		if ((rc = step_dir_create(c, s->step, dir, sizeof dir)))
			goto out;
		if ((rc = ckpt_path_shard(path, sizeof path, c->cfg.root, s->step,
		                          (uint32_t)c->cfg.rank, s->save_id))) {
			rc = ckpt_err(rc, "shard path");
			goto out;
		}
	} else if (!c->remote &&
	           (rc = glue_remote_conn(c, (unsigned)c->cfg.rank % c->cfg.nckptd, &c->remote))) {
		goto out;           /* its ckptd is not back yet */
	}
	struct io_writer_opts wo = {
		.step = s->step, .rank = (uint32_t)c->cfg.rank, .world = (uint32_t)c->cfg.world,
		.save_id = s->save_id, .size_hint = save_size_hint(c, s),
		.zstd_level = c->cfg.zstd_level, .codec = c->cfg.compress_codec,
		.compress_threads = c->cfg.compress_threads, .block_bytes = IO_BLOCK_BYTES,
		.mode = c->cfg.file_mode, .tree = !c->hash_whole,
	};
	if (!glue_remote(c)) {
		/* Tests: the directory removed beneath the save here (below). */
		if ((rc = ckpt_fault(CKPT_FP_AFTER_STEP_DIR)) > 0)
			rc = 0;
		if (!rc)
			rc = io_shard_writer_open(c->save_engine, path, &wo, &sink.w);
		/* The step directory went between its creation and the file's: a collection
		 * of an earlier attempt of this step in another process (ckpt_catalog_gc,
		 * `ckpt-inspect gc`) found it empty and removed it. Made again; once the file
		 * is in it, no collection removes it. */
		for (int i = 0; rc == -ENOENT && i < 3; i++) {
			ckpt_log(CKPT_LOG_INFO, "step %llu: %s was removed before the shard file "
			         "was made in it; making it again", (unsigned long long)s->step, dir);
			if (!(rc = step_dir_create(c, s->step, dir, sizeof dir)))
				rc = io_shard_writer_open(c->save_engine, path, &wo, &sink.w);
		}
	} else {
		rc = remote_writer_open(c->remote, c->pool, &wo, c->cfg.chunk_bytes, &sink.rw);
		/* ckptd closes a connection idle past its --idle-ms, and a restarted ckptd has
		 * forgotten it: such a connection is over before the stream began. Once more
		 * on a new one. */
		if (rc && remote_broken(c->remote)) {
			ckpt_log(CKPT_LOG_INFO, "step %llu: %s closed this rank's connection (%s); "
			         "connecting again", (unsigned long long)s->step,
			         remote_name(c->remote), ckpt_err_msg());
			remote_close(c->remote);
			c->remote = NULL;
			rc = glue_remote_conn(c, (unsigned)c->cfg.rank % c->cfg.nckptd, &c->remote);
			if (!rc)
				rc = remote_writer_open(c->remote, c->pool, &wo, c->cfg.chunk_bytes,
				                        &sink.rw);
		}
	}
	if (rc)
		goto out;
	/* Saves through ckptd write whole shards: they are never incremental. */
	if (s->incremental && sink.w && (rc = save_prev_open(c, s, &cur.prev)))
		goto out;
	if ((rc = save_stream(c, s, &cur, &sink)))
		goto out;
	if (cur.prev.ix)
		ckpt_log(CKPT_LOG_DEBUG, "step %llu: %llu chunk(s), %llu bytes, referenced from "
		         "step %llu, %llu of them found unchanged in place (not copied)",
		         (unsigned long long)s->step, (unsigned long long)cur.prev.nrefs,
		         (unsigned long long)cur.prev.ref_bytes,
		         (unsigned long long)cur.prev.self.step,
		         (unsigned long long)cur.prev.inplace_chunks);
	if (cur.gds) {
		/* Every device byte is written: now the caller may change its tensors. */
		rc = snapshot_gds_file_close(c->snap, cur.gds_file);
		cur.gds_file = NULL;
		if (rc)
			goto out;
		save_publish_event(c, s, cur.gds_event);
		cur.gds_event = NULL;
		save_mark_snapshot(c, s);
	}
	/* Every chunk was taken out, so every copy has landed; this also waits for the
	 * landed callback, which marks the snapshot point. */
	snapshot_pipe_close(cur.pipe);
	cur.pipe = NULL;
	/* The tail's region goes back to the pool once the sender is done with it,
	 * not after ckptd's DURABLE and the commit (a load on another thread may wait
	 * for the pool's buffers). */
	if (sink.rw && cur.arena) {
		remote_writer_sent(sink.rw);
		io_pool_put_all(c->pool);
		cur.arena = NULL;
	}
	/* Durability point of this rank: data, footer, fdatasync (the directory entry
	 * since the file's creation); through ckptd, its DURABLE after the same. */
	rc = sink.rw ? remote_writer_finish(sink.rw, &res) : io_shard_writer_finish(sink.w, &res);
	sink.w = NULL;
	sink.rw = NULL;
	if (rc)
		goto out;
	pthread_mutex_lock(&c->lock);
	s->t_durable = ckpt_now_ns();
	s->stored_bytes = res.stored_bytes;
	s->ref_bytes = cur.prev.ref_bytes;
	s->staged_bytes = cur.staged_bytes;
	s->unchanged_bytes = cur.unchanged_bytes;
	pthread_mutex_unlock(&c->lock);

	/* The vote; with one rank this process is its own coordinator and decides now. */
	struct commit_vote v = {
		.rank = (uint32_t)c->cfg.rank, .step = s->step, .save_id = s->save_id,
		.index = res.footer, .index_len = res.footer_len, .file_size = res.file_size,
	};
	memcpy(v.footer_hash, res.footer_hash, sizeof v.footer_hash);
	/* The step keeps rank 0's metadata: the others' would be dropped, so they do
	 * not send it. */
	if (c->cfg.rank == 0) {
		v.meta = s->meta;
		v.meta_len = s->meta_len;
	}
	rc = commit_part_prepare(c->part, &v);
	voted = true;
	if (rc)
		/* Revoke the vote if the coordinator has not decided yet; the decision stands. */
		commit_part_abort(c->part, s->step, rc, ckpt_err_msg());
	/* From here the coordinator's decision is the outcome, whatever happened locally. */
	rc = commit_part_wait(c->part, s->step, (int)c->cfg.timeout_ms * 2);
out:
	/* Before the writer's abort and before save_finish: copies in flight must land
	 * before their buffers go back, and the landed callback must not outlive s. */
	snapshot_pipe_close(cur.pipe);
	/* Writes still queued read the caller's tensors: they finish before anything
	 * is released (their failure no longer matters: rc is already one). */
	snapshot_gds_file_close(c->snap, cur.gds_file);
	if (cur.gds_event)
		save_publish_event(c, s, cur.gds_event);   /* the save owns it: freed with s */
	save_prev_close(&cur.prev);
	ckpt_free(cur.staged);
	if (sink.w)
		io_shard_writer_abort(sink.w);
	remote_writer_abort(sink.rw);
	/* The stream's sender has stopped: nothing reads the tail's arena any more. */
	if (cur.arena)
		io_pool_put_all(c->pool);
	/* A stream that failed may have left its connection unusable (a ckptd that
	 * restarted): the next save connects again. */
	if (rc && glue_remote(c) && !voted) {
		remote_close(c->remote);
		c->remote = NULL;
	}
	/* Not committed: this rank's file is garbage now; remove it (GC would too). In
	 * doubt, the file stays: the step may be committed. The name is this attempt's
	 * own: no other process's file is ever removed here. */
	if (rc && rc != -EEXIST && rc != CKPT_EINDOUBT && res.index && path[0]) {
		if (unlink(path) == 0)
			ckpt_fsync_dir(dir);
	}
	/* A failure before the vote gives the attempt up: the coordinator stops waiting
	 * for this rank (a rank alone records it aborted). After the vote the decision
	 * was the outcome. */
	if (rc && !voted) {
		char why[1024];
		snprintf(why, sizeof why, "%s", ckpt_err_msg());
		/* ckptd refuses the stream of an attempt that was given up (its files
		 * removed): the coordinator decided first, and its decision, on its way to
		 * this rank, says why. */
		int d = rc == CKPT_EABORTED && glue_remote(c)
		        ? commit_part_decided(c->part, s->step, SAVE_DECISION_WAIT_MS) : -ETIMEDOUT;
		if (d != -ETIMEDOUT) {
			if (d)
				rc = d;
		} else {
			/* The abort is best effort and its own failure (the coordinator is gone
			 * too, as when the home ckptd dies) must not replace the cause. */
			commit_part_abort(c->part, s->step, rc, why);
			ckpt_err_restore(why);
		}
	}
	if (rc)
		ckpt_err_prefix(rc, "save of step %llu on rank %d", (unsigned long long)s->step,
		                c->cfg.rank);
	io_index_free(res.index);
	ckpt_free(res.footer);
	uint64_t step = s->step;
	save_finish(c, s, rc);
	/* s may be freed from here on. Retention runs after the outcome is published, so
	 * that ckpt_save_wait does not wait for it; this worker's next save, and
	 * ckpt_close, do. */
	if (!rc)
		retention_after_commit(c, step);
}
