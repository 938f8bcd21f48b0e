/*
 * manifest_open.c — opening a manifest, and creating one: the checks that come
 * before LMDB maps data.mdb, the atomic creation of a new environment, and moving a
 * damaged one aside (docs/format.md §8.1, §8.6).
 *
 * Why check before mapping: LMDB maps data.mdb and trusts its meta page. A file cut
 * short (8 KiB of a 1 MiB manifest) makes the first read past its end a SIGBUS that
 * kills the process — every tool and every rank; and a data.mdb of 0 bytes is taken
 * by LMDB for a new environment and initialised, silently replacing the manifest of
 * a root that holds committed steps. So the meta pages are read with pread and
 * checked against the file's size first; a file that fails is CKPT_ENOMANIFEST,
 * never mapped.
 *
 * Why create atomically: a new environment is made in a directory of its own beside
 * the manifest directory D (D.new-*; D is <root>/manifest by default), its databases
 * and meta records committed and synced, and only then renamed to D. A manifest
 * directory therefore always holds a complete environment, and one that does not is
 * damage, never a creation that stopped half-way: nothing here ever initialises an
 * existing directory.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "manifest/manifest_internal.h"

/* The map is address space, not disk: data.mdb grows only as pages are used, so
 * a large map costs nothing and postpones MDB_MAP_FULL (then we grow, m_grow). */
#define MAP_SIZE_INITIAL  ((size_t)(sizeof(size_t) >= 8 ? (64ull << 30) : (1ull << 30)))
#define MAP_SIZE_FALLBACK ((size_t)(1ull << 30))   /* when the address space is limited */
#define MAX_DBS           4u      /* meta, steps, shards, and one spare for a later format */
#define MAX_READERS       1022u   /* with MDB_NOTLS each live read txn holds a slot */

/* ------------------------------------------------------------------ data.mdb before mapping
 * LMDB 0.9's meta page (mdb.c: MDB_page header, then MDB_meta), the first two pages
 * of data.mdb, on a 64-bit build. Offsets in bytes from the page's start. */
#define LMDB_MAGIC         0xBEEFC0DEu
#define LMDB_DATA_VERSION  1u
#define LMDB_P_META        0x08u
#define LMDB_P_INVALID     UINT64_MAX
#define META_OFF_FLAGS     10u     /* mp_flags (u16) */
#define META_OFF_MAGIC     16u     /* mm_magic (u32) */
#define META_OFF_VERSION   20u     /* mm_version (u32) */
#define META_OFF_PSIZE     40u     /* mm_dbs[FREE_DBI].md_pad: the page size (u32) */
#define META_OFF_FREE_ROOT 80u     /* mm_dbs[FREE_DBI].md_root */
#define META_OFF_MAIN_ROOT 128u    /* mm_dbs[MAIN_DBI].md_root */
#define META_OFF_LAST_PG   136u    /* mm_last_pg */
#define META_OFF_TXNID     144u    /* mm_txnid */
#define META_BYTES         152u

struct lmdb_meta { uint64_t last_pg, txnid, free_root, main_root; uint32_t psize; };

/* The offsets above are those of a 64-bit build; elsewhere LMDB checks alone. */
#define LMDB_LAYOUT_KNOWN (sizeof(size_t) == 8 && sizeof(void *) == 8)

/* Read and check one meta page at off. 0, or a reason in why. */
static int meta_read(int fd, off_t off, struct lmdb_meta *m, char *why, size_t cap)
{
	uint8_t p[META_BYTES];
	ssize_t n;
	do
		n = pread(fd, p, sizeof p, off);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return -errno;
	if ((size_t)n < sizeof p) {
		snprintf(why, cap, "its meta page at offset %lld is cut short", (long long)off);
		return 1;
	}
	uint32_t magic = ckpt_get_le32(p + META_OFF_MAGIC);
	uint32_t version = ckpt_get_le32(p + META_OFF_VERSION);
	if (!(ckpt_get_le16(p + META_OFF_FLAGS) & LMDB_P_META) || magic != LMDB_MAGIC ||
	    version != LMDB_DATA_VERSION) {
		snprintf(why, cap, "no LMDB meta page at offset %lld (magic 0x%08x, version %u)",
		         (long long)off, magic, version);
		return 1;
	}
	m->psize = ckpt_get_le32(p + META_OFF_PSIZE);
	m->free_root = ckpt_get_le64(p + META_OFF_FREE_ROOT);
	m->main_root = ckpt_get_le64(p + META_OFF_MAIN_ROOT);
	m->last_pg = ckpt_get_le64(p + META_OFF_LAST_PG);
	m->txnid = ckpt_get_le64(p + META_OFF_TXNID);
	return 0;
}

/* ------------------------------------------------------------------ the directory */

/* A manifest directory as this file uses it: without trailing slashes, its parent
 * (where creations and damaged copies go, and whose entry for it is synced) and its
 * last component. */
struct m_path {
	char        dir[PATH_MAX];
	char        parent[PATH_MAX];
	const char *base;               /* into dir */
};

/* 0, -EINVAL (empty, "/", or ending in "." or ".."), -ENAMETOOLONG. */
static int m_path_split(const char *dir, struct m_path *p)
{
	size_t n = dir ? strlen(dir) : 0;
	while (n > 1 && dir[n - 1] == '/')
		n--;
	if (n >= sizeof p->dir)
		return ckpt_err(-ENAMETOOLONG, "manifest %.200s...: path too long", dir);
	memcpy(p->dir, dir ? dir : "", n);
	p->dir[n] = '\0';
	char *slash = strrchr(p->dir, '/');
	p->base = slash ? slash + 1 : p->dir;
	if (!*p->base || !strcmp(p->base, ".") || !strcmp(p->base, ".."))
		return ckpt_err(-EINVAL, "manifest directory '%s': not a directory that can hold "
		                "a manifest", dir ? dir : "");
	if (!slash)
		snprintf(p->parent, sizeof p->parent, ".");
	else if (slash == p->dir)
		snprintf(p->parent, sizeof p->parent, "/");
	else
		snprintf(p->parent, sizeof p->parent, "%.*s", (int)(slash - p->dir), p->dir);
	return 0;
}

int manifest_check_file(const char *dir)
{
	char path[PATH_MAX];
	if (snprintf(path, sizeof path, "%s/data.mdb", dir) >= (int)sizeof path)
		return ckpt_err(-ENAMETOOLONG, "manifest %s: path too long", dir);
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0) {
		if (errno == ENOENT || errno == ENOTDIR)
			return -ENOENT;
		if (errno == ELOOP)
			return ckpt_err(CKPT_ENOMANIFEST, "manifest %s: %s is a symbolic link", dir,
			                path);
		return ckpt_err(-errno, "manifest %s: open %s", dir, path);
	}
	struct stat st;
	char why[160] = "";
	int rc = fstat(fd, &st) < 0 ? -errno : 0;
	struct lmdb_meta m0, m1;
	memset(&m0, 0, sizeof m0);
	memset(&m1, 0, sizeof m1);
	if (rc == 0 && !S_ISREG(st.st_mode))
		snprintf(why, sizeof why, "it is not a regular file");
	else if (rc == 0 && st.st_size == 0)
		snprintf(why, sizeof why, "it is empty (0 bytes)");
	else if (rc == 0 && LMDB_LAYOUT_KNOWN && (rc = meta_read(fd, 0, &m0, why, sizeof why)) == 0) {
		if (m0.psize < 512 || m0.psize > 65536 || (m0.psize & (m0.psize - 1)))
			snprintf(why, sizeof why, "its page size %u is not a power of two in [512, "
			         "65536]", m0.psize);
		else
			rc = meta_read(fd, (off_t)m0.psize, &m1, why, sizeof why);
		/* LMDB uses the meta page of the newer transaction; every page it names
		 * must lie inside the file, or reading it is a SIGBUS. */
		const struct lmdb_meta *m = m1.txnid > m0.txnid ? &m1 : &m0;
		uint64_t npages, need;
		if (rc || why[0])
			;
		else if (m1.psize != m0.psize)
			snprintf(why, sizeof why, "its meta pages disagree on the page size (%u, %u)",
			         m0.psize, m1.psize);
		else if (m->last_pg < 1 || !ckpt_add_u64(m->last_pg, 1, &npages) ||
		         !ckpt_mul_u64(npages, m0.psize, &need) || need > (uint64_t)st.st_size)
			snprintf(why, sizeof why, "it is %lld bytes but its meta page (transaction "
			         "%llu) names page %llu, of %u bytes: the file was cut short",
			         (long long)st.st_size, (unsigned long long)m->txnid,
			         (unsigned long long)m->last_pg, m0.psize);
		else if ((m->free_root != LMDB_P_INVALID && m->free_root > m->last_pg) ||
		         (m->main_root != LMDB_P_INVALID && m->main_root > m->last_pg))
			snprintf(why, sizeof why, "its meta page names a root page past its last "
			         "page %llu", (unsigned long long)m->last_pg);
	}
	if (rc > 0)
		rc = 0;                     /* meta_read: the reason is in why */
	close(fd);
	if (rc < 0)
		return ckpt_err(rc, "manifest %s: read %s", dir, path);
	if (why[0])
		return ckpt_err(CKPT_ENOMANIFEST, "manifest %s: %s is damaged: %s", dir, path, why);
	return 0;
}

/* ------------------------------------------------------------------ the environment */

static int m_env_open(struct manifest *m, const char *dir, size_t mapsize, mode_t mode)
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
			rc = mdb_env_open(env, dir, eflags, mode);
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
			         "locks (safe only while no process writes this manifest)", m->dir);
			continue;
		}
		if (rc == ENOMEM && mapsize > MAP_SIZE_FALLBACK) {
			mapsize = MAP_SIZE_FALLBACK;  /* limited address space (ulimit -v) */
			continue;
		}
		if (rc == MDB_INVALID || rc == MDB_VERSION_MISMATCH || rc == MDB_CORRUPTED)
			return ckpt_err(CKPT_ENOMANIFEST, "manifest %s: %s is not a usable LMDB "
			                "environment: %s", m->dir, dir, mdb_strerror(rc));
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

/* Open the named databases and check the format record; with create (a new,
 * empty environment only), make them and the meta records in one transaction. */
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
		if (rc == MDB_NOTFOUND || rc == MDB_INCOMPATIBLE)
			code = ckpt_err(CKPT_ENOMANIFEST, "manifest %s: LMDB environment without a "
			                "'%s' database: not a libckpt manifest, or a damaged one",
			                m->dir, names[i]);
		else if (rc)
			code = manifest_fail(m, rc, "open database '%s'", names[i]);
	}
	MDB_val key = { 6, (void *)"format" }, val;
	if (!code && create) {
		if (!(code = m_meta_init(m, txn)))
			m->format = MANIFEST_FORMAT_VERSION;
	} else if (!code) {
		rc = mdb_get(txn, m->dbi_meta, &key, &val);
		if (rc == MDB_NOTFOUND)
			code = ckpt_err(CKPT_ENOMANIFEST, "manifest %s: no format record", m->dir);
		else if (rc)
			code = manifest_fail(m, rc, "read format record");
		else if (val.mv_size != 4)
			code = ckpt_err(CKPT_ENOMANIFEST, "manifest %s: format record of %zu bytes",
			                m->dir, val.mv_size);
		else {
			uint32_t v = ckpt_get_le32(val.mv_data);
			if (v == 0)
				code = ckpt_err(CKPT_ENOMANIFEST, "manifest %s: format version 0", m->dir);
			else if (v > MANIFEST_FORMAT_VERSION)
				code = ckpt_err(CKPT_EVERSION, "manifest %s: format version %u (this build "
				                "reads <= %u)", m->dir, v, MANIFEST_FORMAT_VERSION);
			else
				m->format = v;   /* raised by the first write (manifest_write) */
		}
	}
	if (code) {
		mdb_txn_abort(txn);
		return code;
	}
	/* Committing (even the read-only transaction) is what makes the dbi handles
	 * live in the environment for every later transaction; with create it is the
	 * synced commit of the new databases. */
	rc = mdb_txn_commit(txn);
	return rc ? manifest_fail(m, rc, "commit opening transaction") : 0;
}

static struct manifest *m_alloc(const char *dir, bool rdonly)
{
	size_t dl = strlen(dir);
	struct manifest *m = ckpt_calloc(1, sizeof *m + dl + 1);
	if (!m)
		return NULL;
	memcpy(m->dir, dir, dl + 1);
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
		return NULL;
	}
	if (pthread_mutex_init(&m->attempts_lock, NULL) != 0) {
		pthread_rwlock_destroy(&m->resize_lock);
		ckpt_free(m);
		return NULL;
	}
	return m;
}

/* Is dir empty, or holding only LMDB's lock file? */
static bool m_dir_is_fresh(const char *dir)
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

/* Remove a directory holding only an LMDB environment's two files. */
static void m_env_dir_remove(const char *dir)
{
	char p[PATH_MAX];
	static const char *const files[] = { "data.mdb", "lock.mdb" };
	for (size_t i = 0; i < CKPT_ARRAY_SIZE(files); i++)
		if (snprintf(p, sizeof p, "%s/%s", dir, files[i]) < (int)sizeof p)
			unlink(p);
	rmdir(dir);
}

/*
 * Create the manifest directory p->dir atomically (see the top of the file): a
 * complete, synced environment in <dir>.new-<pid>-<random>, renamed into place, then
 * the parent synced so that the name is durable before any commit can be reported.
 * Another creator that wins the rename is not an error: its manifest is opened.
 */
static int m_create(const struct m_path *p, mode_t fmode, mode_t dmode)
{
	char tmp[PATH_MAX];
	uint32_t r = 0;
	if (getrandom(&r, sizeof r, 0) != (ssize_t)sizeof r)
		r = (uint32_t)ckpt_now_ns();
	if (snprintf(tmp, sizeof tmp, "%s%s%d-%08x", p->dir, MANIFEST_NEW_SUFFIX, (int)getpid(),
	             r) >= (int)sizeof tmp)
		return ckpt_err(-ENAMETOOLONG, "manifest %s: path too long", p->dir);
	if (mkdir(tmp, dmode) < 0)
		return ckpt_err(-errno, "manifest %s: create %s", p->dir, tmp);
	struct manifest *m = m_alloc(p->dir, false);
	int rc = m ? 0 : ckpt_err(-ENOMEM, "manifest %s: out of memory", p->dir);
	if (!rc)
		rc = m_env_open(m, tmp, MAP_SIZE_FALLBACK, fmode);
	if (!rc)
		rc = m_dbs_open(m, true);
	/* LMDB synced data.mdb in the commit; the directory entries of its files are
	 * synced here, the directory's own entry after the rename. */
	if (!rc)
		rc = ckpt_fsync_dir(tmp);
	manifest_close(m);
	if (!rc && rename(tmp, p->dir) < 0) {
		if (errno != EEXIST && errno != ENOTEMPTY)
			rc = ckpt_err(-errno, "manifest %s: rename %s to %s", p->dir, tmp, p->dir);
		m_env_dir_remove(tmp);       /* another creator won: its manifest stands */
	} else if (rc) {
		m_env_dir_remove(tmp);
	}
	if (!rc)
		rc = ckpt_fsync_dir(p->parent);
	return rc;
}

void manifest_creation_leftovers_remove(const char *dir)
{
	struct m_path p;
	char prefix[NAME_MAX + sizeof MANIFEST_NEW_SUFFIX];
	if (m_path_split(dir, &p) ||
	    snprintf(prefix, sizeof prefix, "%s%s", p.base, MANIFEST_NEW_SUFFIX) >= (int)sizeof prefix)
		return;
	DIR *d = opendir(p.parent);
	if (!d)
		return;
	struct dirent *e;
	char path[PATH_MAX];
	while ((e = readdir(d))) {
		if (strncmp(e->d_name, prefix, strlen(prefix)) ||
		    snprintf(path, sizeof path, "%s/%s", p.parent, e->d_name) >= (int)sizeof path)
			continue;
		m_env_dir_remove(path);
		if (access(path, F_OK) < 0 && errno == ENOENT)
			ckpt_log(CKPT_LOG_INFO, "%s: removed an unfinished manifest creation", path);
	}
	closedir(d);
}

int manifest_set_aside(const char *dir, char *moved_to, size_t cap)
{
	struct m_path p;
	int rc = m_path_split(dir, &p);
	if (rc)
		return rc;
	char stamp[32];
	time_t now = time(NULL);
	struct tm tm;
	gmtime_r(&now, &tm);
	strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%SZ", &tm);
	for (int i = 0; i < 100; i++) {
		int n = i ? snprintf(moved_to, cap, "%s%s%s-%d", p.dir, MANIFEST_DAMAGED_SUFFIX, stamp, i)
		          : snprintf(moved_to, cap, "%s%s%s", p.dir, MANIFEST_DAMAGED_SUFFIX, stamp);
		if (n < 0 || (size_t)n >= cap)
			return ckpt_err(-ENAMETOOLONG, "manifest %s: path too long", p.dir);
		/* RENAME_NOREPLACE: never over an earlier damaged copy. */
		if (renameat2(AT_FDCWD, p.dir, AT_FDCWD, moved_to, RENAME_NOREPLACE) == 0)
			return ckpt_fsync_dir(p.parent);
		if (errno != EEXIST)
			return ckpt_err(-errno, "manifest %s: move it aside to %s", p.dir, moved_to);
	}
	return ckpt_err(-EEXIST, "manifest %s: too many damaged manifests set aside", p.dir);
}

/* ------------------------------------------------------------------ open, close */

int manifest_open(const char *root, unsigned flags, struct manifest **out)
{
	char dir[PATH_MAX];
	if (!root || !*root)
		return manifest_open_map(root, flags, 0, out);   /* its -EINVAL */
	if (ckpt_path_manifest_dir(dir, sizeof dir, root))
		return ckpt_err(-ENAMETOOLONG, "manifest of %s: path too long", root);
	return manifest_open_map(dir, flags, 0, out);
}

int manifest_open_dir(const char *dir, unsigned flags, struct manifest **out)
{
	return manifest_open_map(dir, flags, 0, out);
}

int manifest_open_map(const char *dir, unsigned flags, size_t map_bytes, struct manifest **out)
{
	if (!out)
		return ckpt_err(-EINVAL, "manifest_open: out is NULL");
	*out = NULL;
	bool rdonly = flags & MANIFEST_RDONLY, create = flags & MANIFEST_CREATE;
	if (!dir || !*dir || (rdonly && create) ||
	    (flags & ~(unsigned)(MANIFEST_RDONLY | MANIFEST_CREATE | MANIFEST_GROUP_ACCESS)))
		return ckpt_err(-EINVAL, "manifest_open: bad directory or flags 0x%x", flags);
	mode_t fmode = flags & MANIFEST_GROUP_ACCESS ? 0640 : 0600;
	mode_t dmode = flags & MANIFEST_GROUP_ACCESS ? 0750 : 0700;

	struct m_path p;
	int rc = m_path_split(dir, &p);
	if (rc)
		return rc;
	struct stat st;
	if (create && lstat(p.dir, &st) == 0 && S_ISDIR(st.st_mode) && m_dir_is_fresh(p.dir))
		/* An older build's creation that stopped before data.mdb (it created the
		 * environment in place): nothing to lose; create it anew. */
		m_env_dir_remove(p.dir);
	if (lstat(p.dir, &st) < 0) {
		int e = errno;
		if (e == ENOTDIR)
			return ckpt_err(CKPT_ENOTROOT, "manifest %s: its parent %s is not a directory",
			                p.dir, p.parent);
		if (e != ENOENT || !create)
			return ckpt_err(-e, "manifest %s: %s", p.dir, e == ENOENT ?
			                "no manifest (no such directory)" : "stat");
		if ((rc = m_create(&p, fmode, dmode)))
			return rc;
	} else if (!S_ISDIR(st.st_mode)) {
		return ckpt_err(CKPT_ENOMANIFEST, "manifest %s: it exists and is not a directory",
		                p.dir);
	}
	/* Never mapped before it is checked (see the top of the file). */
	rc = manifest_check_file(p.dir);
	if (rc == -ENOENT)
		return ckpt_err(CKPT_ENOMANIFEST, "manifest %s: no data.mdb in it", p.dir);
	if (rc)
		return rc;

	struct manifest *m = m_alloc(p.dir, rdonly);
	if (!m)
		return ckpt_err(-ENOMEM, "manifest %s: out of memory", p.dir);
	/* LMDB wants a multiple of the page size; it raises a map smaller than the
	 * data already in data.mdb to fit. */
	size_t mapsize = map_bytes ? (size_t)ckpt_align_up(map_bytes, 4096) : MAP_SIZE_INITIAL;
	rc = m_env_open(m, p.dir, mapsize, fmode);
	if (!rc && !rdonly)
		mdb_reader_check(m->env, NULL);   /* drop slots of dead readers: they pin pages */
	if (!rc)
		rc = m_dbs_open(m, false);
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
	pthread_mutex_destroy(&m->attempts_lock);
	ckpt_free(m);
}
