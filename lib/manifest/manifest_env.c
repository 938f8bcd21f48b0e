/*
 * manifest_env.c — the manifest's LMDB transactions (with map growth), the space
 * reserved in data.mdb, and the conversion of MDB_* codes.
 *
 * Every MDB_* code is converted into a ckpt code here (mdb_code, manifest_fail):
 * no caller of lib/manifest ever sees an MDB value. Opening and creating the
 * environment is manifest_open.c's, the operations of manifest.h (the commit above
 * all) are in manifest.c, the record layouts in manifest_record.c.
 *
 * Threads: a struct manifest is shared by any number of threads. The environment
 * is opened with MDB_NOTLS, so a read transaction is bound to its MDB_txn, not to
 * the thread; every operation begins and ends its own transaction before it
 * returns, so no transaction is ever used by two threads. Writers are serialised
 * by LMDB's writer mutex. The only lock of ours is resize_lock (manifest_internal.h).
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "manifest/manifest_internal.h"

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

/* Record an LMDB failure with the manifest named, and return the converted code. */
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
	return ckpt_err(code, "manifest %s: %s: %s", m->dir, what, why);
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
			ckpt_log(CKPT_LOG_INFO, "manifest %s: map grown to %zu bytes", m->dir, next);
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
		return ckpt_err(CKPT_ESTATE, "manifest %s: opened read-only, cannot %s", m->dir, what);
	for (int attempt = 0;; attempt++) {
		MDB_txn *txn;
		int rc = manifest_txn_begin(m, 0, &txn);
		if (rc)
			return manifest_fail(m, rc, "begin write transaction to %s", what);
		/* A manifest of an older format is upgraded by its first write: the records
		 * written from now on are of this build's versions, which older builds
		 * refuse one by one; the format record makes them refuse the whole manifest
		 * at open instead (docs/format.md §8.5). */
		int code = 0;
		if (__atomic_load_n(&m->format, __ATOMIC_RELAXED) < MANIFEST_FORMAT_VERSION) {
			uint8_t fmt[4];
			ckpt_put_le32(fmt, MANIFEST_FORMAT_VERSION);
			MDB_val k = { 6, (void *)"format" }, v = { sizeof fmt, fmt };
			int prc = mdb_put(txn, m->dbi_meta, &k, &v, 0);
			if (prc)
				code = manifest_fail(m, prc, "upgrade the format record");
		}
		if (!code)
			code = fn(m, txn, arg);
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
		if (rc == 0) {
			__atomic_store_n(&m->format, MANIFEST_FORMAT_VERSION, __ATOMIC_RELAXED);
			return 0;
		}
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
		return ckpt_err(-errno, "manifest %s: stat data.mdb", m->dir);
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
		                m->dir);
	if (slack == 0)
		return 0;
	if (slack > MANIFEST_MAX_RESERVE)
		return ckpt_err(-EINVAL, "manifest %s: reserve of %llu bytes is more than the %llu "
		                "allowed", m->dir, (unsigned long long)slack,
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
				                m->dir, (unsigned long long)(want - size));
			else
				off += (uint64_t)w;
		}
		if (!code && fdatasync(fd) < 0)
			code = ckpt_err(-errno, "manifest %s: sync reserved space", m->dir);
		/* A failure leaves zeros past LMDB's last page: harmless. */
	}
	manifest_txn_abort(m, txn);
	return code;
}
