/*
 * manifest.c — the LMDB manifest of a checkpoint root: opening the environment,
 * transactions, and the operations of manifest.h (the commit above all).
 *
 * The manifest decides visibility (DESIGN §3): a step is visible iff its COMMITTED
 * step record is here, and manifest_commit writes that record together with every
 * rank's shard record in one synced LMDB write transaction. Record layouts live in
 * manifest_record.c; this file owns LMDB and converts every MDB_* code into a
 * ckpt code at its boundary (mdb_code) — no caller ever sees an MDB value.
 *
 * Threads: a struct manifest is shared by any number of threads. The environment
 * is opened with MDB_NOTLS, so a read transaction is bound to its MDB_txn, not to
 * the thread; every function here begins and ends its own transaction before it
 * returns, so no transaction is ever used by two threads. Writers are serialised
 * by LMDB's writer mutex. The only lock of ours is resize_lock (manifest_internal.h).
 */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "manifest/manifest_internal.h"

/* The map is address space, not disk: data.mdb grows only as pages are used, so
 * a large map costs nothing and postpones MDB_MAP_FULL (then we grow, m_grow). */
#define MAP_SIZE_INITIAL  ((size_t)(sizeof(size_t) >= 8 ? (64ull << 30) : (1ull << 30)))
#define MAP_SIZE_FALLBACK ((size_t)(1ull << 30))   /* when the address space is limited */
#define MAX_DBS           4u      /* meta, steps, shards, and one spare for a later format */
#define MAX_READERS       1022u   /* with MDB_NOTLS each live read txn holds a slot */
#define FILE_MODE         0644

/* ------------------------------------------------------------------ errors */

/* An MDB_* code or positive errno -> ckpt code. */
static int mdb_code(int rc)
{
	switch (rc) {
	case 0:                    return 0;
	case MDB_NOTFOUND:         return CKPT_ENOTFOUND;
	case MDB_KEYEXIST:         return -EEXIST;
	case MDB_MAP_FULL:         return -ENOSPC;
	case MDB_TXN_FULL:         return -E2BIG;
	case MDB_INVALID:
	case MDB_VERSION_MISMATCH:
	case MDB_INCOMPATIBLE:     return CKPT_EFORMAT;
	case MDB_CORRUPTED:
	case MDB_PAGE_NOTFOUND:    return CKPT_ECORRUPT;
	case MDB_READERS_FULL:
	case MDB_MAP_RESIZED:      return -EAGAIN;
	case MDB_BAD_VALSIZE:      return -EINVAL;
	case MDB_PANIC:            return -EIO;
	default:
		if (rc > 0)
			return -rc;
		return -EIO;            /* other MDB_* codes are our misuse: report as I/O failure */
	}
}

/* Record an LMDB failure with the root named, and return the converted code. */
static int m_fail(const struct manifest *m, int rc, const char *fmt, ...) CKPT_PRINTF(3, 4);
static int m_fail(const struct manifest *m, int rc, const char *fmt, ...)
{
	char what[256];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(what, sizeof what, fmt, ap);
	va_end(ap);
	int code = mdb_code(rc);
	/* mdb_strerror of an errno calls strerror (not thread-safe): name errnos ourselves. */
	const char *why = rc > 0 ? ckpt_strerror(-rc) : mdb_strerror(rc);
	return ckpt_err(code, "manifest %s: %s: %s", m->root, what, why);
}

/* ------------------------------------------------------------------ transactions */

static int m_grow(struct manifest *m);

/* Begin a transaction; on success the read side of resize_lock is held until
 * m_txn_end. Returns an MDB code (not converted). */
static int m_txn_begin(struct manifest *m, unsigned flags, MDB_txn **txn)
{
	for (int tries = 0;; tries++) {
		pthread_rwlock_rdlock(&m->resize_lock);
		int rc = mdb_txn_begin(m->env, NULL, flags, txn);
		if (rc == 0)
			return 0;
		pthread_rwlock_unlock(&m->resize_lock);
		if (rc != MDB_MAP_RESIZED || tries > 0)
			return rc;
		/* Another process (a tool, or a previous writer) grew the map beyond ours:
		 * adopt its size, which LMDB allows only with no transaction active here. */
		pthread_rwlock_wrlock(&m->resize_lock);
		mdb_env_set_mapsize(m->env, 0);
		pthread_rwlock_unlock(&m->resize_lock);
	}
}

static void m_txn_abort(struct manifest *m, MDB_txn *txn)
{
	mdb_txn_abort(txn);
	pthread_rwlock_unlock(&m->resize_lock);
}

static int m_txn_commit(struct manifest *m, MDB_txn *txn)
{
	int rc = mdb_txn_commit(txn);   /* frees txn whatever the outcome */
	pthread_rwlock_unlock(&m->resize_lock);
	return rc;
}

/* Double the map. Called with no transaction of ours active in this thread; the
 * write side waits for other threads' transactions to end. */
static int m_grow(struct manifest *m)
{
	pthread_rwlock_wrlock(&m->resize_lock);
	MDB_envinfo info;
	int rc = mdb_env_info(m->env, &info);
	if (rc == 0) {
		size_t next = info.me_mapsize > SIZE_MAX / 2 ? 0 : info.me_mapsize * 2;
		rc = next ? mdb_env_set_mapsize(m->env, next) : MDB_MAP_FULL;
		if (rc == 0)
			ckpt_log(CKPT_LOG_INFO, "manifest %s: map grown to %zu bytes", m->root, next);
	}
	pthread_rwlock_unlock(&m->resize_lock);
	return rc;
}

/* The body of a write transaction: 0 or a ckpt code (message recorded). */
typedef int (*m_write_fn)(struct manifest *m, MDB_txn *txn, void *arg);

/*
 * Run fn in one write transaction and commit it durably. On a full map (-ENOSPC
 * from fn, or MDB_MAP_FULL from the commit) the map is grown and the whole
 * transaction run again, once; fn must therefore be repeatable from scratch
 * (it is: the aborted attempt changed nothing).
 */
static int m_write(struct manifest *m, m_write_fn fn, void *arg, const char *what)
{
	if (m->rdonly)
		return ckpt_err(CKPT_ESTATE, "manifest %s: opened read-only, cannot %s", m->root, what);
	for (int attempt = 0;; attempt++) {
		MDB_txn *txn;
		int rc = m_txn_begin(m, 0, &txn);
		if (rc)
			return m_fail(m, rc, "begin write transaction to %s", what);
		int code = fn(m, txn, arg);
		if (code < 0) {
			m_txn_abort(m, txn);
			if (code == -ENOSPC && attempt == 0 && m_grow(m) == 0)
				continue;
			return code;
		}
		/*
		 * Durability: mdb_txn_commit writes the dirty pages, fdatasync()s data.mdb,
		 * and only then writes the new meta page through a descriptor opened with
		 * O_DSYNC; it returns after that write. The meta page is the commit point:
		 * a crash before it leaves the previous meta (none of this transaction
		 * visible), after it the whole transaction. The first sync guarantees the
		 * meta page never points at pages that are not yet on disk. This is why
		 * the environment is never opened with MDB_NOSYNC or MDB_NOMETASYNC.
		 */
		rc = m_txn_commit(m, txn);
		if (rc == 0)
			return 0;
		if (rc == MDB_MAP_FULL && attempt == 0 && m_grow(m) == 0)
			continue;
		return m_fail(m, rc, "commit %s", what);
	}
}

/* ------------------------------------------------------------------ opening */

/* Is dir empty, or holding only LMDB's lock file (a creation that stopped before
 * data.mdb)? */
static bool dir_is_fresh(const char *dir)
{
	DIR *d = opendir(dir);
	if (!d)
		return false;
	bool fresh = true;
	struct dirent *e;
	while ((e = readdir(d))) {
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") ||
		    !strcmp(e->d_name, "lock.mdb"))
			continue;
		fresh = false;
		break;
	}
	closedir(d);
	return fresh;
}

static int m_env_open(struct manifest *m, const char *dir, size_t mapsize)
{
	unsigned eflags = MDB_NOTLS | (m->rdonly ? MDB_RDONLY : 0u);
	for (;;) {
		MDB_env *env;
		int rc = mdb_env_create(&env);
		if (rc)
			return m_fail(m, rc, "create LMDB environment");
		rc = mdb_env_set_maxdbs(env, MAX_DBS);
		if (!rc)
			rc = mdb_env_set_maxreaders(env, MAX_READERS);
		if (!rc)
			rc = mdb_env_set_mapsize(env, mapsize);
		if (!rc)
			rc = mdb_env_open(env, dir, eflags, FILE_MODE);
		if (rc == 0) {
			m->env = env;
			return 0;
		}
		mdb_env_close(env);            /* LMDB: a failed open must be closed */
		if ((rc == EACCES || rc == EROFS) && m->rdonly && !(eflags & MDB_NOLOCK)) {
			/*
			 * Even MDB_RDONLY opens lock.mdb for writing (reader slots). On a
			 * directory we cannot write (a read-only mount, another user's root)
			 * fall back to MDB_NOLOCK. Caveat: we then take no reader slot, so a
			 * writer in another process could recycle pages we are reading; this
			 * is only safe when nobody writes the manifest meanwhile.
			 */
			eflags |= MDB_NOLOCK;
			m->nolock = true;
			ckpt_log(CKPT_LOG_WARN, "manifest %s: lock file not writable; reading without "
			         "locks (safe only while no process writes this manifest)", m->root);
			continue;
		}
		if (rc == ENOMEM && mapsize > MAP_SIZE_FALLBACK) {
			mapsize = MAP_SIZE_FALLBACK;  /* limited address space (ulimit -v) */
			continue;
		}
		return m_fail(m, rc, "open LMDB environment %s", dir);
	}
}

/* Write the meta records of a new manifest (inside the creating transaction). */
static int m_meta_init(struct manifest *m, MDB_txn *txn)
{
	uint8_t fmt[4], created[8];
	ckpt_put_le32(fmt, MANIFEST_FORMAT_VERSION);
	ckpt_put_le64(created, ckpt_wall_ns());
	MDB_val k1 = { 6, (void *)"format" }, v1 = { sizeof fmt, fmt };
	MDB_val k2 = { 7, (void *)"created" }, v2 = { sizeof created, created };
	int rc = mdb_put(txn, m->dbi_meta, &k1, &v1, 0);
	if (!rc)
		rc = mdb_put(txn, m->dbi_meta, &k2, &v2, 0);
	return rc ? m_fail(m, rc, "write meta records") : 0;
}

/* Open the named databases and check the format record; with create, make what
 * is missing (all in one transaction, so a half-created manifest cannot exist). */
static int m_dbs_open(struct manifest *m, bool create)
{
	MDB_txn *txn;
	/* No other thread has the handle yet: no resize_lock needed. */
	int rc = mdb_txn_begin(m->env, NULL, create ? 0u : MDB_RDONLY, &txn);
	if (rc)
		return m_fail(m, rc, "begin transaction");
	unsigned dflags = create ? MDB_CREATE : 0u;
	static const char *const names[] = { "meta", "steps", "shards" };
	MDB_dbi *dbis[] = { &m->dbi_meta, &m->dbi_steps, &m->dbi_shards };
	int code = 0;
	for (size_t i = 0; i < CKPT_ARRAY_SIZE(names) && !code; i++) {
		rc = mdb_dbi_open(txn, names[i], dflags, dbis[i]);
		if (rc == MDB_NOTFOUND)
			code = ckpt_err(CKPT_EFORMAT, "manifest %s: LMDB environment without a '%s' "
			                "database: not a libckpt manifest", m->root, names[i]);
		else if (rc)
			code = m_fail(m, rc, "open database '%s'", names[i]);
	}
	MDB_val key = { 6, (void *)"format" }, val;
	if (!code) {
		rc = mdb_get(txn, m->dbi_meta, &key, &val);
		if (rc == MDB_NOTFOUND && create) {
			MDB_stat st;
			rc = mdb_stat(txn, m->dbi_steps, &st);
			if (rc)
				code = m_fail(m, rc, "stat steps database");
			else if (st.ms_entries != 0)
				code = ckpt_err(CKPT_EFORMAT, "manifest %s: steps recorded but no format "
				                "record", m->root);
			else
				code = m_meta_init(m, txn);
		} else if (rc == MDB_NOTFOUND) {
			code = ckpt_err(CKPT_EFORMAT, "manifest %s: no format record", m->root);
		} else if (rc) {
			code = m_fail(m, rc, "read format record");
		} else if (val.mv_size != 4) {
			code = ckpt_err(CKPT_EFORMAT, "manifest %s: format record of %zu bytes",
			                m->root, val.mv_size);
		} else {
			uint32_t v = ckpt_get_le32(val.mv_data);
			if (v == 0)
				code = ckpt_err(CKPT_EFORMAT, "manifest %s: format version 0", m->root);
			else if (v > MANIFEST_FORMAT_VERSION)
				code = ckpt_err(CKPT_EVERSION, "manifest %s: format version %u (this build "
				                "reads <= %u)", m->root, v, MANIFEST_FORMAT_VERSION);
		}
	}
	if (code) {
		mdb_txn_abort(txn);
		return code;
	}
	/* Committing (even the read-only transaction) is what makes the dbi handles
	 * live in the environment for every later transaction. */
	rc = mdb_txn_commit(txn);
	return rc ? m_fail(m, rc, "commit opening transaction") : 0;
}

int manifest_open(const char *root, unsigned flags, struct manifest **out)
{
	return manifest_open_map(root, flags, 0, out);
}

int manifest_open_map(const char *root, unsigned flags, size_t map_bytes, struct manifest **out)
{
	if (!out)
		return ckpt_err(-EINVAL, "manifest_open: out is NULL");
	*out = NULL;
	bool rdonly = flags & MANIFEST_RDONLY, create = flags & MANIFEST_CREATE;
	if (!root || !*root || (rdonly && create) ||
	    (flags & ~(unsigned)(MANIFEST_RDONLY | MANIFEST_CREATE)))
		return ckpt_err(-EINVAL, "manifest_open: bad root or flags 0x%x", flags);

	char dir[PATH_MAX], data[PATH_MAX];
	if (snprintf(dir, sizeof dir, "%s/%s", root, CKPT_MANIFEST_DIR) >= (int)sizeof dir ||
	    snprintf(data, sizeof data, "%s/data.mdb", dir) >= (int)sizeof data)
		return ckpt_err(-ENAMETOOLONG, "manifest %s: path too long", root);

	struct stat st;
	bool made_dir = false;
	if (stat(dir, &st) < 0) {
		int e = errno;
		if (e != ENOENT || !create)
			return ckpt_err(-e, "manifest %s: %s", root, e == ENOENT ?
			                "no manifest (missing root or manifest directory)" : "stat");
		if (mkdir(dir, 0755) < 0 && errno != EEXIST)
			return ckpt_err(-errno, "manifest %s: create %s", root, dir);
		made_dir = true;
	} else if (!S_ISDIR(st.st_mode)) {
		return ckpt_err(CKPT_ENOTROOT, "manifest %s: %s exists and is not a directory",
		                root, dir);
	}
	bool new_env = false;
	if (stat(data, &st) < 0) {
		int e = errno;
		if (e != ENOENT)
			return ckpt_err(-e, "manifest %s: stat %s", root, data);
		if (!create || !dir_is_fresh(dir))
			return ckpt_err(CKPT_ENOTROOT, "manifest %s: %s has no data.mdb: not a manifest",
			                root, dir);
		new_env = true;
	} else if (!S_ISREG(st.st_mode)) {
		return ckpt_err(CKPT_ENOTROOT, "manifest %s: %s is not a regular file", root, data);
	}

	size_t rl = strlen(root);
	struct manifest *m = calloc(1, sizeof *m + rl + 1);
	if (!m)
		return ckpt_err(-ENOMEM, "manifest %s: out of memory", root);
	memcpy(m->root, root, rl + 1);
	m->rdonly = rdonly;
	if (pthread_rwlock_init(&m->resize_lock, NULL) != 0) {
		free(m);
		return ckpt_err(-ENOMEM, "manifest %s: rwlock", root);
	}
	/* LMDB wants a multiple of the page size; it raises a map smaller than the
	 * data already in data.mdb to fit. */
	size_t mapsize = map_bytes ? (size_t)ckpt_align_up(map_bytes, 4096) : MAP_SIZE_INITIAL;
	int rc = m_env_open(m, dir, mapsize);
	if (!rc && !rdonly)
		mdb_reader_check(m->env, NULL);   /* drop slots of dead readers: they pin pages */
	if (!rc && (made_dir || new_env)) {
		/*
		 * Durability: LMDB syncs data.mdb but never the directory that names it.
		 * Sync <root>/manifest (new data.mdb) and <root> (new manifest/) before
		 * the first commit can be acknowledged, or a power cut could lose the
		 * whole environment along with commits it had reported durable.
		 */
		rc = ckpt_fsync_dir(dir);
		if (!rc && made_dir)
			rc = ckpt_fsync_dir(root);
	}
	if (!rc)
		rc = m_dbs_open(m, create);
	if (rc) {
		manifest_close(m);
		return rc;
	}
	*out = m;
	return 0;
}

void manifest_close(struct manifest *m)
{
	if (!m)
		return;
	if (m->env)
		mdb_env_close(m->env);
	pthread_rwlock_destroy(&m->resize_lock);
	free(m);
}

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
		return ckpt_err(CKPT_ENOTFOUND, "manifest %s: step %llu: no such step", m->root,
		                (unsigned long long)step);
	if (rc)
		return m_fail(m, rc, "step %llu: read step record", (unsigned long long)step);
	rc = manifest_step_decode(val.mv_data, val.mv_size, step, out, NULL, 0);
	return rc ? ckpt_err_prefix(rc, "manifest %s", m->root) : 0;
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
		return m_fail(m, rc, "step %llu: write step record", (unsigned long long)rec->step);
	manifest_step_encode(rec, note, val.mv_data);
	return 0;
}

/* Delete every shard record of step; the count deleted, or a negative code. */
static int shards_delete(struct manifest *m, MDB_txn *txn, uint64_t step)
{
	int n = 0;
	for (;;) {
		/* Re-seek after each delete rather than rely on cursor-after-delete rules. */
		uint8_t k[MANIFEST_SHARD_KEY_BYTES];
		manifest_shard_key(k, step, 0);
		MDB_val key = { sizeof k, k }, val;
		MDB_cursor *cur;
		int rc = mdb_cursor_open(txn, m->dbi_shards, &cur);
		if (rc)
			return m_fail(m, rc, "step %llu: open cursor", (unsigned long long)step);
		rc = mdb_cursor_get(cur, &key, &val, MDB_SET_RANGE);
		bool mine = rc == 0 && key.mv_size == MANIFEST_SHARD_KEY_BYTES &&
		            ckpt_get_be64(key.mv_data) == step;
		if (mine)
			rc = mdb_cursor_del(cur, 0);
		mdb_cursor_close(cur);
		if (rc == MDB_NOTFOUND || (rc == 0 && !mine))
			return n;
		if (rc)
			return m_fail(m, rc, "step %llu: delete shard records", (unsigned long long)step);
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

	/* Saving a committed step again is an error, never an overwrite (DESIGN §6).
	 * Checked inside the write transaction, so no other writer can slip in. */
	struct manifest_step old;
	int rc = step_read(m, txn, step, &old);
	if (rc == 0 && old.state == CKPT_STATE_COMMITTED)
		return ckpt_err(-EEXIST, "manifest %s: step %llu is already committed", m->root, s);
	if (rc != 0 && rc != CKPT_ENOTFOUND)
		return ckpt_err_prefix(rc, "cannot commit over the existing record");

	/* An ABORTED/INFLIGHT record is replaced; it has no shard records, but clear
	 * the range anyway so that exactly world shard records exist afterwards. */
	rc = shards_delete(m, txn, step);
	if (rc < 0)
		return rc;

	for (uint32_t i = 0; i < a->nshards; i++) {
		const struct manifest_shard *sh = &a->shards[i];
		uint8_t k[MANIFEST_SHARD_KEY_BYTES];
		manifest_shard_key(k, step, sh->rank);
		MDB_val key = { sizeof k, k };
		MDB_val val = { manifest_shard_rec_size(sh), NULL };
		rc = mdb_put(txn, m->dbi_shards, &key, &val, MDB_RESERVE);
		if (rc)
			return m_fail(m, rc, "step %llu rank %u: write shard record", s, sh->rank);
		manifest_shard_encode(sh, val.mv_data);
	}
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
		return ckpt_err_prefix(rc, "manifest %s", m->root);
	if (r.world == 0 || nshards != r.world)
		return ckpt_err(-EINVAL, "manifest %s: step %llu: %u shard records for world %u",
		                m->root, s, nshards, r.world);

	/* Every rank 0..world-1 exactly once: a bitmap, since world may be large. */
	uint8_t *seen = calloc((size_t)r.world / 8 + 1, 1);
	if (!seen)
		return ckpt_err(-ENOMEM, "manifest %s: step %llu: out of memory", m->root, s);
	for (uint32_t i = 0; i < nshards && !rc; i++) {
		uint32_t rank = shards[i].rank;
		if (rank >= r.world)
			rc = ckpt_err(-EINVAL, "manifest %s: step %llu: rank %u outside world %u",
			              m->root, s, rank, r.world);
		else if (seen[rank / 8] & (1u << (rank % 8)))
			rc = ckpt_err(-EINVAL, "manifest %s: step %llu: rank %u given twice",
			              m->root, s, rank);
		else if ((rc = manifest_shard_check(r.step, &shards[i])) != 0)
			rc = ckpt_err_prefix(rc, "manifest %s", m->root);
		else
			seen[rank / 8] |= (uint8_t)(1u << (rank % 8));
	}
	free(seen);
	if (rc)
		return rc;

	struct commit_arg a = { &r, shards, nshards };
	return m_write(m, commit_txn, &a, "commit step");
}

/* ------------------------------------------------------------------ aborts, trust, delete */

struct abort_arg { uint64_t step; uint32_t world; const char *why; };

static int abort_txn(struct manifest *m, MDB_txn *txn, void *varg)
{
	const struct abort_arg *a = varg;
	struct manifest_step old;
	int rc = step_read(m, txn, a->step, &old);
	if (rc == 0 && old.state == CKPT_STATE_COMMITTED)
		return ckpt_err(-EEXIST, "manifest %s: step %llu is committed; not recording an abort",
		                m->root, (unsigned long long)a->step);
	if (rc != 0 && rc != CKPT_ENOTFOUND)
		return rc;
	struct manifest_step r;
	memset(&r, 0, sizeof r);
	r.step = a->step;
	r.state = CKPT_STATE_ABORTED;
	r.world = a->world;
	r.commit_time_ns = ckpt_wall_ns();
	rc = shards_delete(m, txn, a->step);
	return rc < 0 ? rc : step_write(m, txn, &r, a->why);
}

int manifest_record_abort(struct manifest *m, uint64_t step, uint32_t world, const char *why)
{
	if (!m)
		return ckpt_err(-EINVAL, "manifest_record_abort: NULL manifest");
	struct abort_arg a = { step, world, why };
	return m_write(m, abort_txn, &a, "record an aborted step");
}

struct trust_arg { uint64_t step; uint32_t trust; };

static int trust_txn(struct manifest *m, MDB_txn *txn, void *varg)
{
	const struct trust_arg *a = varg;
	struct manifest_step r;
	int rc = step_read(m, txn, a->step, &r);
	if (rc)
		return rc;
	if (r.state != CKPT_STATE_COMMITTED)
		return ckpt_err(CKPT_ENOTFOUND, "manifest %s: step %llu is not committed",
		                m->root, (unsigned long long)a->step);
	r.trust = a->trust;
	return step_write(m, txn, &r, NULL);
}

int manifest_set_trust(struct manifest *m, uint64_t step, uint32_t trust)
{
	if (!m)
		return ckpt_err(-EINVAL, "manifest_set_trust: NULL manifest");
	if (trust != CKPT_TRUST_COMMITTED && trust != CKPT_TRUST_VERIFIED)
		return ckpt_err(-EINVAL, "manifest %s: step %llu: bad trust level %u", m->root,
		                (unsigned long long)step, trust);
	struct trust_arg a = { step, trust };
	return m_write(m, trust_txn, &a, "set trust");
}

static int delete_txn(struct manifest *m, MDB_txn *txn, void *varg)
{
	uint64_t step = *(const uint64_t *)varg;
	uint8_t k[MANIFEST_STEP_KEY_BYTES];
	manifest_step_key(k, step);
	MDB_val key = { sizeof k, k };
	int rc = mdb_del(txn, m->dbi_steps, &key, NULL);
	if (rc && rc != MDB_NOTFOUND)
		return m_fail(m, rc, "step %llu: delete step record", (unsigned long long)step);
	bool had_step = rc == 0;
	/* Shard records go in the same transaction: a reader never finds a step
	 * without its shards, nor shard records that outlive their step. */
	int n = shards_delete(m, txn, step);
	if (n < 0)
		return n;
	if (!had_step && n == 0)
		return ckpt_err(CKPT_ENOTFOUND, "manifest %s: step %llu: no such step", m->root,
		                (unsigned long long)step);
	return 0;
}

int manifest_step_delete(struct manifest *m, uint64_t step)
{
	if (!m)
		return ckpt_err(-EINVAL, "manifest_step_delete: NULL manifest");
	return m_write(m, delete_txn, &step, "delete step");
}

/* ------------------------------------------------------------------ readers */

int manifest_step_get(struct manifest *m, uint64_t step, struct manifest_step *out)
{
	if (!m || !out)
		return ckpt_err(-EINVAL, "manifest_step_get: NULL argument");
	MDB_txn *txn;
	int rc = m_txn_begin(m, MDB_RDONLY, &txn);
	if (rc)
		return m_fail(m, rc, "step %llu: begin read transaction", (unsigned long long)step);
	rc = step_read(m, txn, step, out);
	m_txn_abort(m, txn);
	return rc;
}

/* Walk the steps database (ascending, or descending from the end) and call fn on
 * each decoded record until fn returns non-zero (returned) or the end (0). */
typedef int (*step_visit_fn)(const struct manifest_step *r, void *arg);

static int steps_walk(struct manifest *m, bool descending, step_visit_fn fn, void *arg)
{
	MDB_txn *txn;
	int rc = m_txn_begin(m, MDB_RDONLY, &txn);
	if (rc)
		return m_fail(m, rc, "begin read transaction");
	MDB_cursor *cur;
	rc = mdb_cursor_open(txn, m->dbi_steps, &cur);
	if (rc) {
		m_txn_abort(m, txn);
		return m_fail(m, rc, "open cursor");
	}
	MDB_val key, val;
	int ret = 0;
	MDB_cursor_op op = descending ? MDB_LAST : MDB_FIRST;
	while ((rc = mdb_cursor_get(cur, &key, &val, op)) == 0) {
		op = descending ? MDB_PREV : MDB_NEXT;
		if (key.mv_size != MANIFEST_STEP_KEY_BYTES) {
			ret = ckpt_err(CKPT_EFORMAT, "manifest %s: steps database holds a key of %zu bytes",
			               m->root, key.mv_size);
			break;
		}
		struct manifest_step r;
		uint64_t step = ckpt_get_be64(key.mv_data);
		/* A record we cannot read stops the walk with its error rather than being
		 * skipped: skipping could make "latest" silently roll back training. */
		ret = manifest_step_decode(val.mv_data, val.mv_size, step, &r, NULL, 0);
		if (ret) {
			ckpt_err_prefix(ret, "manifest %s", m->root);
			break;
		}
		if ((ret = fn(&r, arg)) != 0)
			break;
	}
	if (ret == 0 && rc != MDB_NOTFOUND)
		ret = m_fail(m, rc, "walk steps database");
	mdb_cursor_close(cur);
	m_txn_abort(m, txn);
	return ret;
}

static int latest_visit(const struct manifest_step *r, void *arg)
{
	if (r->state != CKPT_STATE_COMMITTED)
		return 0;                    /* aborted and in-flight steps are invisible */
	*(uint64_t *)arg = r->step;
	return 1;
}

int manifest_step_latest(struct manifest *m, uint64_t *step)
{
	if (!m || !step)
		return ckpt_err(-EINVAL, "manifest_step_latest: NULL argument");
	uint64_t found = 0;
	int rc = steps_walk(m, true, latest_visit, &found);
	if (rc < 0)
		return rc;
	if (rc == 0)
		return ckpt_err(CKPT_ENOTFOUND, "manifest %s: no committed step", m->root);
	*step = found;
	return 0;
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
		return ckpt_err(-EOVERFLOW, "manifest %s: %zu steps do not fit an int", m->root,
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
	int rc = m_txn_begin(m, MDB_RDONLY, &txn);
	if (rc)
		return m_fail(m, rc, "step %llu rank %u: begin read transaction", s, rank);
	uint8_t k[MANIFEST_SHARD_KEY_BYTES];
	manifest_shard_key(k, step, rank);
	MDB_val key = { sizeof k, k }, val;
	rc = mdb_get(txn, m->dbi_shards, &key, &val);
	if (rc) {
		m_txn_abort(m, txn);
		if (rc == MDB_NOTFOUND)
			return ckpt_err(CKPT_ENOTFOUND, "manifest %s: step %llu rank %u: no shard record",
			                m->root, s, rank);
		return m_fail(m, rc, "step %llu rank %u: read shard record", s, rank);
	}
	struct manifest_shard sh;
	size_t pl;
	rc = manifest_shard_decode(val.mv_data, val.mv_size, step, rank, &sh, &pl);
	if (rc) {
		m_txn_abort(m, txn);
		return ckpt_err_prefix(rc, "manifest %s", m->root);
	}
	/* LMDB's pointers die with the transaction: copy index and path out, into one
	 * block (index first, so it keeps malloc's alignment). Sizes are bounded by
	 * the decoder (index <= MANIFEST_MAX_INDEX, path <= MANIFEST_MAX_PATH). */
	uint8_t *block = malloc(sh.index_len + pl + 1);
	if (!block) {
		m_txn_abort(m, txn);
		return ckpt_err(-ENOMEM, "manifest %s: step %llu rank %u: %zu bytes for the shard "
		                "index", m->root, s, rank, sh.index_len);
	}
	memcpy(block, sh.index, sh.index_len);
	memcpy(block + sh.index_len, sh.path, pl);
	block[sh.index_len + pl] = '\0';
	m_txn_abort(m, txn);
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
	free(s->owned_);
	memset(s, 0, sizeof *s);
}
