/*
 * manifest_env.c — the manifest's LMDB environment: opening and creating it,
 * transactions (with map growth), and the conversion of MDB_* codes.
 *
 * Every MDB_* code is converted into a ckpt code here (mdb_code, manifest_fail):
 * no caller of lib/manifest ever sees an MDB value. The operations of manifest.h
 * (the commit above all) are in manifest.c, the record layouts in
 * manifest_record.c.
 *
 * Threads: a struct manifest is shared by any number of threads. The environment
 * is opened with MDB_NOTLS, so a read transaction is bound to its MDB_txn, not to
 * the thread; every operation begins and ends its own transaction before it
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
int manifest_fail(const struct manifest *m, int rc, const char *fmt, ...)
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

/* Begin a transaction; on success the read side of resize_lock is held until
 * m_txn_end. Returns an MDB code (not converted). */
int manifest_txn_begin(struct manifest *m, unsigned flags, MDB_txn **txn)
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

void manifest_txn_abort(struct manifest *m, MDB_txn *txn)
{
	mdb_txn_abort(txn);
	pthread_rwlock_unlock(&m->resize_lock);
}

int manifest_txn_commit(struct manifest *m, MDB_txn *txn)
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

/*
 * Run fn in one write transaction and commit it durably. On a full map (-ENOSPC
 * from fn, or MDB_MAP_FULL from the commit) the map is grown and the whole
 * transaction run again, once; fn must therefore be repeatable from scratch
 * (it is: the aborted attempt changed nothing).
 */
int manifest_write(struct manifest *m, manifest_write_fn fn, void *arg, const char *what)
{
	if (m->rdonly)
		return ckpt_err(CKPT_ESTATE, "manifest %s: opened read-only, cannot %s", m->root, what);
	for (int attempt = 0;; attempt++) {
		MDB_txn *txn;
		int rc = manifest_txn_begin(m, 0, &txn);
		if (rc)
			return manifest_fail(m, rc, "begin write transaction to %s", what);
		int code = fn(m, txn, arg);
		if (code < 0) {
			manifest_txn_abort(m, txn);
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
		rc = manifest_txn_commit(m, txn);
		if (rc == 0)
			return 0;
		if (rc == MDB_MAP_FULL && attempt == 0 && m_grow(m) == 0)
			continue;
		return manifest_fail(m, rc, "commit %s", what);
	}
}

/* ------------------------------------------------------------------ reserve */

#define MANIFEST_MAX_RESERVE (1ull << 34)   /* 16 GiB: far beyond any commit's growth */

/* Zeros for manifest_reserve's writes. */
static const uint8_t zero_block[64 << 10];

/* Where LMDB's used pages end, data.mdb's size, the map's size and the file's
 * descriptor (LMDB's). 0 or a ckpt code (message recorded). */
static int space_get(struct manifest *m, uint64_t *used, uint64_t *size, uint64_t *mapsize,
                     int *fd_out)
{
	MDB_envinfo info;
	MDB_stat st;
	mdb_filehandle_t fd;
	struct stat fst;
	int rc;
	if ((rc = mdb_env_info(m->env, &info)) || (rc = mdb_env_stat(m->env, &st)) ||
	    (rc = mdb_env_get_fd(m->env, &fd)))
		return manifest_fail(m, rc, "size of data.mdb");
	if (fstat(fd, &fst) < 0)
		return ckpt_err(-errno, "manifest %s: stat data.mdb", m->root);
	*used = ((uint64_t)info.me_last_pgno + 1) * st.ms_psize;
	*size = (uint64_t)fst.st_size;
	if (mapsize)
		*mapsize = info.me_mapsize;
	if (fd_out)
		*fd_out = fd;
	return 0;
}

int manifest_file_space(struct manifest *m, uint64_t *used, uint64_t *size)
{
	if (!m || !used || !size)
		return ckpt_err(-EINVAL, "manifest_file_space: NULL argument");
	return space_get(m, used, size, NULL, NULL);
}

/*
 * Keep data.mdb written with zeros at least `slack` bytes past LMDB's last used
 * page (refilled to 2 x slack when less than slack is left). A commit whose new
 * pages land inside that region changes no file metadata, so its fdatasync
 * flushes the pages and nothing else; a commit that extends the file must also
 * persist the new size (and, on ext4 without a journal, write the inode
 * synchronously inside the fdatasync). The zeros are written (not fallocate'd:
 * an unwritten extent turns written at the commit, a metadata change again) and
 * synced here, off the commit's path. Runs inside a write transaction that it
 * aborts, so that no commit of this or another process writes pages past the end
 * of the file meanwhile; LMDB never reads past its last page, and on reopen sees
 * the zeros as unused space.
 */
int manifest_reserve(struct manifest *m, uint64_t slack)
{
	if (!m)
		return ckpt_err(-EINVAL, "manifest_reserve: NULL manifest");
	if (m->rdonly)
		return ckpt_err(CKPT_ESTATE, "manifest %s: opened read-only, cannot reserve space",
		                m->root);
	if (slack == 0)
		return 0;
	if (slack > MANIFEST_MAX_RESERVE)
		return ckpt_err(-EINVAL, "manifest %s: reserve of %llu bytes is more than the %llu "
		                "allowed", m->root, (unsigned long long)slack,
		                (unsigned long long)MANIFEST_MAX_RESERVE);
	MDB_txn *txn;
	int rc = manifest_txn_begin(m, 0, &txn);
	if (rc)
		return manifest_fail(m, rc, "begin write transaction to reserve space");
	uint64_t used = 0, size = 0, mapsize = 0;
	int fd = -1;
	int code = space_get(m, &used, &size, &mapsize, &fd);
	/* Never past the map: LMDB could not use it (and would raise its map to it). */
	uint64_t want = ckpt_align_up(used + 2 * slack, 1u << 20);
	if (want > mapsize)
		want = mapsize;
	if (!code && size < used + slack && size < want) {
		for (uint64_t off = size; off < want && !code;) {
			size_t n = want - off < sizeof zero_block ? (size_t)(want - off)
			                                            : sizeof zero_block;
			ssize_t w = pwrite(fd, zero_block, n, (off_t)off);
			if (w < 0 && errno == EINTR)
				continue;
			if (w <= 0)
				code = ckpt_err(w < 0 ? -errno : -EIO,
				                "manifest %s: reserve %llu bytes in data.mdb",
				                m->root, (unsigned long long)(want - size));
			else
				off += (uint64_t)w;
		}
		if (!code && fdatasync(fd) < 0)
			code = ckpt_err(-errno, "manifest %s: sync reserved space", m->root);
		/* A failure leaves zeros past LMDB's last page: harmless. */
	}
	manifest_txn_abort(m, txn);
	return code;
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
			return manifest_fail(m, rc, "create LMDB environment");
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
		return manifest_fail(m, rc, "open LMDB environment %s", dir);
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
	return rc ? manifest_fail(m, rc, "write meta records") : 0;
}

/* Open the named databases and check the format record; with create, make what
 * is missing (all in one transaction, so a half-created manifest cannot exist). */
static int m_dbs_open(struct manifest *m, bool create)
{
	MDB_txn *txn;
	/* No other thread has the handle yet: no resize_lock needed. */
	int rc = mdb_txn_begin(m->env, NULL, create ? 0u : MDB_RDONLY, &txn);
	if (rc)
		return manifest_fail(m, rc, "begin transaction");
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
			code = manifest_fail(m, rc, "open database '%s'", names[i]);
	}
	MDB_val key = { 6, (void *)"format" }, val;
	if (!code) {
		rc = mdb_get(txn, m->dbi_meta, &key, &val);
		if (rc == MDB_NOTFOUND && create) {
			MDB_stat st;
			rc = mdb_stat(txn, m->dbi_steps, &st);
			if (rc)
				code = manifest_fail(m, rc, "stat steps database");
			else if (st.ms_entries != 0)
				code = ckpt_err(CKPT_EFORMAT, "manifest %s: steps recorded but no format "
				                "record", m->root);
			else if (!(code = m_meta_init(m, txn)))
				m->format = MANIFEST_FORMAT_VERSION;
		} else if (rc == MDB_NOTFOUND) {
			code = ckpt_err(CKPT_EFORMAT, "manifest %s: no format record", m->root);
		} else if (rc) {
			code = manifest_fail(m, rc, "read format record");
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
			else
				m->format = v;   /* a manifest keeps the format it was made with */
		}
	}
	if (code) {
		mdb_txn_abort(txn);
		return code;
	}
	/* Committing (even the read-only transaction) is what makes the dbi handles
	 * live in the environment for every later transaction. */
	rc = mdb_txn_commit(txn);
	return rc ? manifest_fail(m, rc, "commit opening transaction") : 0;
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
		if (e == ENOTDIR)
			return ckpt_err(CKPT_ENOTROOT, "manifest %s: the root is not a directory", root);
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
	struct manifest *m = ckpt_calloc(1, sizeof *m + rl + 1);
	if (!m)
		return ckpt_err(-ENOMEM, "manifest %s: out of memory", root);
	memcpy(m->root, root, rl + 1);
	m->rdonly = rdonly;
	/* Writer-preferring, so that growing the map is not starved by a steady
	 * stream of readers (nothing here takes the read side recursively). */
	pthread_rwlockattr_t attr;
	pthread_rwlockattr_init(&attr);
	pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
	int lrc = pthread_rwlock_init(&m->resize_lock, &attr);
	pthread_rwlockattr_destroy(&attr);
	if (lrc != 0) {
		ckpt_free(m);
		return ckpt_err(-lrc, "manifest %s: rwlock", root);
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
	ckpt_free(m);
}
