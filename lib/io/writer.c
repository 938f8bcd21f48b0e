/*
 * writer.c — the shard writer: one rank's shard file of one step (docs/format.md §2-§5).
 *
 * Layout: a 4 KiB header block, then the chunks at 4 KiB-aligned offsets (each
 * padded with zeros to 4 KiB, as O_DIRECT needs), then (version 2) the block table,
 * then the footer (the encoded shard index) at data_end, zero padding, and a
 * 64-byte trailer that ends the file on a 4 KiB boundary.
 *
 * Version 2 keeps, besides each chunk's hash, the hash of every block_bytes block
 * of every raw chunk longer than one block, so that a reader needing part of a
 * chunk can read and verify just the blocks that hold it. The hashes come from the
 * caller's copy pass when it computed them (struct io_append's hashes), and
 * are collected here in chunk order; finish writes them as one table after the
 * last chunk, in the same request as footer and trailer.
 *
 * A chunk arrives in a pool buffer that the writer owns from then on. It is hashed
 * and (optionally) compressed in place of a copy: the raw bytes are never moved;
 * compression writes into a second pool buffer and the raw one goes back at once
 * when compression wins.
 *
 * Compression runs on a small group of worker threads of the writer's own, so that
 * a save that compresses is not slower than the disk: one thread compresses at a
 * few hundred MB/s, a disk takes several GB/s. Chunks wait in a ring in append
 * order; workers take them in that order, and the appending thread retires them in
 * that order too, once each is done: only then is its stored length known, and
 * with it its place in the file. So the file and the index are laid out exactly as
 * when compression ran inline: chunks contiguous, in append order. A chunk in the
 * ring holds its raw buffer and its output buffer; the ring's size bounds them, and
 * whoever waits for a pool buffer held by the ring waits for a worker, which needs
 * nothing to finish. Block hashes of chunks in the ring wait at the end of the
 * table, and are dropped when their chunk is stored compressed.
 *
 * Writes go to the engine with up to its depth in flight;
 * each completion returns its buffer to the pool, so a shard larger than the pool
 * streams through it. The first error (write failure or injected fault) is kept
 * with its message and returned by the next append or by finish; buffers still
 * return on every path.
 *
 * Format 4 adds references: a chunk whose bytes are already in an earlier step's
 * shard file (its caller found the same hash at the same place there) is recorded
 * with that file's place of them and not written again (io_shard_writer_append_ref).
 * The header, written at open, is written again by finish with version 4 when the
 * shard holds a reference, so that header, index and trailer say the same version
 * and a build that knows only version 3 refuses the file at its trailer.
 *
 * Durability order (docs/format.md §8.6; the vote depends on it): at open, the file is
 * created, and its header's write and its directory's fsync are queued on the
 * engine, so that its entry is made durable as the first chunks are written; in
 * finish, every write and that fsync completed -> footer and trailer written ->
 * file truncated to its size -> fdatasync(file). Only then does finish return 0: the
 * rank votes only once data, footer, size and name are all durable.
 *
 * Why the directory first: on ext4 an fsync of a directory commits the whole
 * running journal transaction, which holds the file's block allocations, extent
 * conversions and size too. Synced after the data, the directory would make the
 * fdatasync redundant there, and a lost fdatasync would show on no test on ext4,
 * only on file systems that sync less eagerly. Synced at open, it commits the
 * entry (and the header), and the fdatasync is the one sync that covers the data,
 * footer and size: without it they are lost in a power cut (tests/crash shows
 * both). The cost is the same one directory sync per file, moved.
 *
 * Why queued rather than done in open: both wait for the disk, and the disk may be
 * busy with other writers' chunks (ckptd's other streams, the other ranks of a
 * node): a synchronous 4 KiB write and a journal commit behind them held open for
 * up to hundreds of milliseconds, and with it the stream's first chunk (ckptd
 * answers OPEN once its writer is open). The kernel's workers run the fsync, and
 * finish waits for both as for any write.
 *
 * Threads: a writer belongs to the thread that owns its engine; its compression
 * workers touch only the ring (under its lock) and the buffers of the jobs they took.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "io/io_internal.h"

#define COOKIE_TAIL   (1ull << 63)      /* the footer+trailer write */
#define COOKIE_PART   (1ull << 62)      /* only the chunk's last block (io_ext_write) */
#define COOKIE_KMASK  0x3fffffffu       /* chunk number bits above the buffer's */

/* One chunk between append and its write. */
struct w_job {
	uint32_t    k;             /* its chunk entry */
	unsigned    raw;           /* pool buffer of its raw bytes */
	int         out;           /* pool buffer to compress into, or -1: stored raw */
	size_t      len;
	int         dtype;
	uint64_t    nb;            /* its block hashes at the end of the table */
	const struct io_ext_write *ext;
	/* hashed by its worker (append had no hashes): its chunk hash, and its block
	 * hashes in the slot's own store when it is stored raw; retire takes them */
	bool        hash_here;
	uint8_t     hash[CKPT_HASH_BYTES];
	uint8_t    *blocks;
	/* set by whoever compresses it */
	size_t      clen;          /* stored size when compressed; 0: raw */
	uint8_t     used;          /* the codec of the compressed bytes */
	bool        done;
};

struct io_shard_writer {
	struct io_engine *e;
	struct io_pool   *pool;
	int               fd;
	char             *path;
	uint64_t          step;
	uint32_t          rank, world;
	uint64_t          save_id;         /* 0: a version 1 or 2 file */
	int               zstd_level;
	uint8_t           codec;           /* what to compress with (zstd_level > 0) */
	bool              bytegroup;       /* a chunk stored bytegroup: trailer version 4 */
	/* the ring of chunks between append and write: seq numbers, slot = seq % jcap;
	 * [head, take) taken by a worker (or done), [take, tail) waiting for one */
	struct w_job     *jobs;
	unsigned          jcap;
	uint8_t          *jblocks;         /* per slot: block hashes of a chunk hashed there */
	size_t            jblocks_per;     /* bytes of one slot's */
	uint64_t          jhead, jtake, jtail;
	pthread_t        *threads;
	unsigned          nthreads;        /* 0: compression runs in append */
	bool              stop;            /* workers exit once the ring is empty */
	pthread_mutex_t   jlock;
	pthread_cond_t    jwork, jdone;
	uint64_t          next_off;        /* where the next chunk goes */
	uint32_t          version;         /* format version of the file: 2 with block hashes */
	uint32_t          block_bytes;     /* 0: no block hashes (version 1) */
	bool              tree;            /* chunk hashes over block hashes (version 5) */
	uint8_t          *blocks;          /* block hashes of the chunks so far, in order */
	uint64_t          nblocks, bcap;   /* of written chunks; capacity */
	uint64_t          bend;            /* end of those and of the ring's chunks' */
	struct io_tensor_entry *tensors;
	uint64_t         *appended;        /* raw bytes appended per tensor */
	uint32_t          ntensors, tcap;
	uint32_t         *names;           /* open-addressing set of tensor index + 1 */
	uint32_t          names_cap;       /* power of two, > 2 * ntensors */
	struct io_chunk_entry *chunks;
	uint32_t          nchunks, ccap;
	uint32_t         *chunk_file;      /* per chunk: 0 here, f + 1 in files[f] (format 4) */
	struct io_ref_file *files;         /* the files references point into */
	uint32_t          nfiles, fcap;
	int64_t           cur;             /* tensor receiving chunks, or -1 */
	unsigned          inflight;        /* requests on the engine: writes, open's two */
	unsigned          open_inflight;   /* of which open's */
	uint8_t          *hdr;             /* the header block open queued */
	int               dirfd;           /* the directory open queued an fsync of, or -1 */
	bool              tail_done;
	int64_t           tail_res;
	uint64_t          logical, stored;
	uint64_t          nrefs, ref_bytes;  /* chunks appended as references, their raw bytes */
	int               err;             /* first failure; sticky */
	char              err_msg[1024];
	/* Where a compressing writer's time went (CKPT_LOG=debug at finish): since
	 * open; the workers compressing (summed); the appending thread waiting for the
	 * ring's oldest chunk, for an output buffer, and queueing writes (which waits
	 * for the disk when its depth is full). For every writer: when its first
	 * chunk's write was queued, and the steps of finish (the last writes drained,
	 * the footer written, fdatasync done), each since open. */
	uint64_t          t_open, ns_wait_done, ns_wait_buf, ns_write;
	_Atomic uint64_t  ns_compress;
	uint64_t          t_first_write, t_finish, t_drained, t_footer, t_synced;
};

/* Keep the first failure; the message is in this thread's buffer (ckpt_err). */
static int w_fail(struct io_shard_writer *w, int code)
{
	if (!w->err) {
		w->err = code;
		snprintf(w->err_msg, sizeof w->err_msg, "%s", ckpt_err_msg());
	}
	return w->err;
}

static int w_error(struct io_shard_writer *w)
{
	ckpt_err_restore(w->err_msg);
	return w->err;
}

/* The compression workers (below, with the ring); open starts them, w_free stops them. */
static void w_start_workers(struct io_shard_writer *w, unsigned n);
static void w_stop_workers(struct io_shard_writer *w);

/* ------------------------------------------------------------------ completions */

static void w_write_done(void *owner, uint64_t cookie, int64_t res)
{
	struct io_shard_writer *w = owner;
	w->inflight--;
	if (cookie & COOKIE_TAIL) {
		w->tail_done = true;
		w->tail_res = res;
		return;
	}
	uint32_t buf = (uint32_t)cookie, k = (uint32_t)(cookie >> 32) & COOKIE_KMASK;
	io_pool_put(w->pool, buf);
	const struct io_chunk_entry *c = &w->chunks[k];
	uint64_t want = ckpt_align_up(c->stored_len, CKPT_ALIGN);
	if (cookie & COOKIE_PART)
		want -= ckpt_align_down(c->stored_len, CKPT_ALIGN);
	if (res < 0) {
		ckpt_err((int)res, "write %s at offset %llu (%llu bytes)", w->path,
		         (unsigned long long)c->file_offset, (unsigned long long)want);
		w_fail(w, (int)res);
	} else if ((uint64_t)res != want) {
		ckpt_err(-EIO, "write %s at offset %llu: %lld of %llu bytes", w->path,
		         (unsigned long long)c->file_offset, (long long)res,
		         (unsigned long long)want);
		w_fail(w, -EIO);
	} else if (!w->err) {
		int rc = ckpt_fault(CKPT_FP_AFTER_CHUNK_WRITE);
		if (rc < 0) {
			ckpt_err_prefix(rc, "write %s at offset %llu", w->path,
			                (unsigned long long)c->file_offset);
			w_fail(w, rc);
		}
	}
}

/* Wait for every write of this writer. */
static int w_drain(struct io_shard_writer *w)
{
	while (w->inflight) {
		int rc = io_engine_reap(w->e, true);
		if (rc < 0)
			return w_fail(w, rc);
	}
	return w->err;
}

/* ------------------------------------------------------------------ open */

static void header_fill(const struct io_shard_writer *w, uint8_t *h);

#define OPEN_HEADER  0u    /* open's cookies (w_open_done) */
#define OPEN_DIRSYNC 1u

static void w_open_done(void *owner, uint64_t cookie, int64_t res)
{
	struct io_shard_writer *w = owner;
	w->inflight--;
	w->open_inflight--;
	if (cookie == OPEN_DIRSYNC) {
		if (res < 0) {
			ckpt_err((int)res, "fsync the directory of %s", w->path);
			w_fail(w, (int)res);
		}
	} else if (res != IO_HEADER_BYTES) {
		ckpt_err(res < 0 ? (int)res : -EIO, "write %s header at offset 0%s", w->path,
		         res < 0 ? "" : ": short write");
		w_fail(w, res < 0 ? (int)res : -EIO);
	}
}

/* Queue the header's write and the fsync of path's directory. skip (a test knob of
 * the fault table) leaves the fsync out. */
static int queue_open_writes(struct io_shard_writer *w)
{
	if (!(w->hdr = io_aligned_alloc(IO_HEADER_BYTES)))
		return ckpt_err(-ENOMEM, "%s: header block", w->path);
	header_fill(w, w->hdr);
	int rc = io_engine_queue(w->e, IO_OP_WRITE, w->fd, w->hdr, IO_HEADER_BYTES, 0,
	                         w_open_done, w, OPEN_HEADER);
	if (rc)
		return ckpt_err(rc, "queue the write of %s header", w->path);
	w->inflight++;
	w->open_inflight++;
	if ((rc = ckpt_fault(CKPT_FP_BEFORE_DIR_FSYNC)) < 0)
		return ckpt_err_prefix(rc, "%s", w->path);
	if (rc == CKPT_FA_SKIP)
		return 0;
	char dir[4096];
	const char *slash = strrchr(w->path, '/');
	size_t n = !slash ? 1 : slash == w->path ? 1 : (size_t)(slash - w->path);
	if (n >= sizeof dir)
		return ckpt_err(-ENAMETOOLONG, "directory of %s", w->path);
	memcpy(dir, slash ? w->path : ".", n);
	dir[n] = '\0';
	if ((w->dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0)
		return ckpt_err(-errno, "open directory %s for fsync", dir);
	if ((rc = io_engine_queue(w->e, IO_OP_FSYNC, w->dirfd, NULL, 0, 0, w_open_done, w,
	                          OPEN_DIRSYNC)))
		return ckpt_err(rc, "queue the fsync of directory %s", dir);
	w->inflight++;
	w->open_inflight++;
	return 0;
}

/* The header block (IO_HEADER_BYTES at h) of w's file as it stands. */
static void header_fill(const struct io_shard_writer *w, uint8_t *h)
{
	memset(h, 0, IO_HEADER_BYTES);
	memcpy(h, IO_HEADER_MAGIC, IO_MAGIC_BYTES);
	ckpt_put_le32(h + IO_HDR_OFF_VERSION, w->version);
	ckpt_put_le32(h + IO_HDR_OFF_LEN, IO_HEADER_BYTES);
	ckpt_put_le64(h + IO_HDR_OFF_STEP, w->step);
	ckpt_put_le32(h + IO_HDR_OFF_RANK, w->rank);
	ckpt_put_le32(h + IO_HDR_OFF_WORLD, w->world);
	ckpt_put_le64(h + IO_HDR_OFF_CTIME, ckpt_wall_ns());
	ckpt_put_le64(h + IO_HDR_OFF_SAVE_ID, w->save_id);   /* 0 before version 3 */
	ckpt_put_le64(h + IO_HDR_OFF_HASH, XXH3_64bits(h, IO_HDR_OFF_HASH));
}

/* The header written again in finish (version 4), once open's write has completed:
 * one 4 KiB synchronous write, out of the pool (whose buffers the caller may all
 * hold). */
static int write_header(struct io_shard_writer *w)
{
	uint8_t *h = io_aligned_alloc(IO_HEADER_BYTES);
	if (!h)
		return ckpt_err(-ENOMEM, "%s: header block", w->path);
	header_fill(w, h);
	ssize_t n;
	do
		n = pwrite(w->fd, h, IO_HEADER_BYTES, 0);
	while (n < 0 && errno == EINTR);
	int rc = n == (ssize_t)IO_HEADER_BYTES ? 0
	         : ckpt_err(n < 0 ? -errno : -EIO, "write %s header at offset 0", w->path);
	ckpt_free(h);
	return rc;
}

static void w_free(struct io_shard_writer *w)
{
	w_stop_workers(w);
	pthread_mutex_destroy(&w->jlock);
	pthread_cond_destroy(&w->jwork);
	pthread_cond_destroy(&w->jdone);
	ckpt_free(w->threads);
	ckpt_free(w->jobs);
	ckpt_free(w->jblocks);
	if (w->fd >= 0)
		close(w->fd);
	if (w->dirfd >= 0)
		close(w->dirfd);
	ckpt_free(w->hdr);
	for (uint32_t i = 0; i < w->ntensors; i++)
		ckpt_free((char *)w->tensors[i].name);
	ckpt_free(w->tensors);
	ckpt_free(w->appended);
	ckpt_free(w->names);
	ckpt_free(w->chunks);
	ckpt_free(w->chunk_file);
	ckpt_free(w->files);
	ckpt_free(w->blocks);
	ckpt_free(w->path);
	ckpt_free(w);
}

/* After open(O_CREAT | O_EXCL | O_DIRECT) failed with EINVAL. Some file systems
 * (tmpfs before Linux 6.6) refuse O_DIRECT only after they created the file: the
 * file is then this call's own (O_EXCL passed, so it did not exist), empty, and
 * opened again without O_CREAT; where nothing was created, it is created without
 * O_DIRECT. Anything else there is not this writer's: EEXIST. */
static int w_open_created(const char *path, mode_t mode)
{
	int fd = open(path, O_WRONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0)
		return errno == ENOENT ? open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode) : -1;
	struct stat st;
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size != 0 || st.st_nlink != 1 ||
	    st.st_uid != geteuid()) {
		close(fd);
		errno = EEXIST;
		return -1;
	}
	return fd;
}

int io_shard_writer_open(struct io_engine *e, const char *path, const struct io_writer_opts *o,
                         struct io_shard_writer **out)
{
	*out = NULL;
	uint32_t block_bytes = o->block_bytes;
	if (block_bytes && (block_bytes < IO_MIN_BLOCK_BYTES || block_bytes > IO_MAX_CHUNK_BYTES ||
	                    (block_bytes & (block_bytes - 1))))
		return ckpt_err(-EINVAL, "%s: block size %u is not a power of two in [%u, %llu]",
		                path, block_bytes, IO_MIN_BLOCK_BYTES,
		                (unsigned long long)IO_MAX_CHUNK_BYTES);
	if (o->world == 0 || o->rank >= o->world)
		return ckpt_err(-EINVAL, "%s: rank %u outside world %u", path, o->rank, o->world);
	if (o->zstd_level < 0 || o->zstd_level > 22)
		return ckpt_err(-EINVAL, "%s: zstd level %d outside [0, 22]", path, o->zstd_level);
	if (o->save_id && !block_bytes)
		return ckpt_err(-EINVAL, "%s: a save id needs format 3, which has block hashes", path);
	bool bytegroup = o->zstd_level > 0 && o->codec == IO_CODEC_BYTEGROUP;
	if (o->zstd_level > 0 && o->codec != IO_CODEC_RAW && o->codec != IO_CODEC_ZSTD && !bytegroup)
		return ckpt_err(-EINVAL, "%s: compression codec %u unknown", path, o->codec);
	if (o->tree && !o->save_id)
		return ckpt_err(-EINVAL, "%s: tree hashes need format %u, which has a save id", path,
		                IO_TREE_VERSION);
	if (bytegroup && !o->save_id)
		return ckpt_err(-EINVAL, "%s: bytegroup needs format %u, which has a save id", path,
		                IO_BYTEGROUP_VERSION);
	if (!io_engine_pool(e))
		return ckpt_err(-EINVAL, "%s: the engine has no buffer pool", path);
	struct io_shard_writer *w = ckpt_calloc(1, sizeof *w);
	if (!w || !(w->path = ckpt_strdup(path))) {
		ckpt_free(w);
		return ckpt_err(-ENOMEM, "%s: writer", path);
	}
	w->fd = -1;                        /* w_free before the file is open */
	w->dirfd = -1;
	w->e = e;
	w->pool = io_engine_pool(e);
	w->step = o->step;
	w->rank = o->rank;
	w->world = o->world;
	w->save_id = o->save_id;
	w->zstd_level = o->zstd_level;
	w->codec = bytegroup ? IO_CODEC_BYTEGROUP : IO_CODEC_ZSTD;
	w->block_bytes = block_bytes;
	/* The lowest version that can hold what this writer may write; the header is
	 * written now, before any chunk, so the choice is the options'. */
	w->tree = o->tree;
	w->version = o->tree ? IO_TREE_VERSION : bytegroup ? IO_BYTEGROUP_VERSION
	             : o->save_id ? 3 : block_bytes ? 2 : 1;
	pthread_mutex_init(&w->jlock, NULL);
	pthread_cond_init(&w->jwork, NULL);
	pthread_cond_init(&w->jdone, NULL);
	unsigned nt = o->zstd_level > 0 ? o->compress_threads : 0;
	w->jcap = nt ? 2 * nt : 1;
	w->jblocks_per = nt && block_bytes ? (size_t)io_nblocks(io_pool_buf_bytes(w->pool),
	                                                        block_bytes) * CKPT_HASH_BYTES : 0;
	if (!(w->jobs = ckpt_calloc(w->jcap, sizeof *w->jobs)) ||
	    (w->jblocks_per && !(w->jblocks = ckpt_malloc(w->jcap * w->jblocks_per)))) {
		w_free(w);
		return ckpt_err(-ENOMEM, "%s: writer", path);
	}
	w->next_off = IO_HEADER_BYTES;
	w->cur = -1;
	/* O_EXCL: never truncate a file that is not this writer's (a stale process's
	 * attempt, or a committed shard): names are unique per attempt (paths.c). */
	mode_t mode = o->mode ? (mode_t)o->mode : 0600;
	w->fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_DIRECT, mode);
	if (w->fd < 0 && errno == EINVAL) {
		/* tmpfs (before Linux 6.6) and some FUSE file systems refuse O_DIRECT: same
		 * format, page cache. */
		ckpt_log(CKPT_LOG_INFO, "%s: O_DIRECT refused, using buffered I/O", path);
		w->fd = w_open_created(path, mode);
	}
	if (w->fd < 0) {
		int rc = ckpt_err(-errno, "create shard file %s%s", path,
		                  errno == EEXIST ? ": it exists already (not this writer's)" : "");
		w_free(w);
		return rc;
	}
	int rc = 0;
	/* Extending O_DIRECT writes serialise on the inode size update: size it first
	 * (io.h: preallocate). */
	bool sized = o->size_hint && o->preallocate &&
	             fallocate(w->fd, 0, 0, (off_t)o->size_hint) == 0;
	if (o->size_hint && !sized && ftruncate(w->fd, (off_t)o->size_hint) < 0)
		rc = ckpt_err(-errno, "ftruncate %s to %llu", path, (unsigned long long)o->size_hint);
	/* The header, and the name durable with the first chunks rather than after the
	 * data (see the top of this file): the vote still follows, since finish waits
	 * for both. */
	if (!rc)
		rc = queue_open_writes(w);
	if (rc) {
		char msg[sizeof w->err_msg];
		snprintf(msg, sizeof msg, "%s", ckpt_err_msg());
		w_drain(w);          /* what was queued completes before its memory goes */
		ckpt_err_restore(msg);
		unlink(path);
		w_free(w);
		return rc;
	}
	w_start_workers(w, nt);
	w->t_open = ckpt_now_ns();
	*out = w;
	return 0;
}

/* ------------------------------------------------------------------ tensors */

static uint32_t name_slot(const struct io_shard_writer *w, const char *name, bool *found)
{
	uint32_t mask = w->names_cap - 1, i = (uint32_t)XXH3_64bits(name, strlen(name)) & mask;
	for (;; i = (i + 1) & mask) {
		uint32_t v = w->names[i];
		if (!v || !strcmp(w->tensors[v - 1].name, name)) {
			*found = v != 0;
			return i;
		}
	}
}

static int names_grow(struct io_shard_writer *w)
{
	uint32_t cap = w->names_cap ? w->names_cap * 2 : 64;
	uint32_t *old = w->names, ocap = w->names_cap;
	w->names = ckpt_calloc(cap, sizeof *w->names);
	if (!w->names) {
		w->names = old;
		return -ENOMEM;
	}
	w->names_cap = cap;
	for (uint32_t i = 0; i < ocap; i++) {
		if (old[i]) {
			bool found;
			w->names[name_slot(w, w->tensors[old[i] - 1].name, &found)] = old[i];
		}
	}
	ckpt_free(old);
	return 0;
}

static int tensor_desc_check(const struct io_shard_writer *w, const struct io_tensor_desc *t)
{
	const char *n = t->name ? t->name : "";
	if (ckpt_name_check(t->name, t->name ? strlen(t->name) : 0))
		return ckpt_err(CKPT_ENAME, "%s: invalid tensor name '%s'", w->path, n);
	if (t->kind < 1 || t->kind > CKPT_KIND_MAX_ || t->dtype < 1 ||
	    t->dtype > CKPT_DTYPE_MAX_ || t->policy < 1 || t->policy > CKPT_POLICY_MAX_ ||
	    (t->flags & ~(unsigned)IO_TENSOR_BLOB))
		return ckpt_err(-EINVAL, "tensor '%s': kind %u, dtype %u, policy %u or flags 0x%x "
		                "unknown", n, t->kind, t->dtype, t->policy, t->flags);
	if (t->ndim > CKPT_MAX_NDIM || (t->ndim && (!t->global_shape || !t->offset || !t->extent)))
		return ckpt_err(CKPT_ESHAPE, "tensor '%s': ndim %u", n, t->ndim);
	if ((t->flags & IO_TENSOR_BLOB) && (t->dtype != CKPT_U8 || t->ndim != 1))
		return ckpt_err(-EINVAL, "blob '%s': must be u8 with ndim 1", n);
	uint64_t elems, bytes;
	for (unsigned d = 0; d < t->ndim; d++)
		if (!ckpt_range_ok(t->offset[d], t->extent[d], t->global_shape[d]))
			return ckpt_err(CKPT_ESHAPE, "tensor '%s': dim %u: offset %llu + extent %llu "
			                "outside shape %llu", n, d, (unsigned long long)t->offset[d],
			                (unsigned long long)t->extent[d],
			                (unsigned long long)t->global_shape[d]);
	if (!ckpt_shape_elems(t->ndim, t->global_shape, &elems) ||
	    !ckpt_shape_elems(t->ndim, t->extent, &elems) ||
	    !ckpt_mul_u64(elems, ckpt_dtype_size(t->dtype), &bytes))
		return ckpt_err(CKPT_ESHAPE, "tensor '%s': size overflows 64 bits", n);
	if (bytes != t->raw_bytes)
		return ckpt_err(CKPT_ESHAPE, "tensor '%s': raw_bytes %llu, extent holds %llu", n,
		                (unsigned long long)t->raw_bytes, (unsigned long long)bytes);
	return 0;
}

int io_shard_writer_add_tensor(struct io_shard_writer *w, const struct io_tensor_desc *t)
{
	int rc = tensor_desc_check(w, t);
	if (rc)
		return rc;
	if (w->ntensors >= INT32_MAX)
		return ckpt_err(-EINVAL, "%s: too many tensors", w->path);
	if ((uint64_t)(w->ntensors + 1) * 2 >= w->names_cap && names_grow(w))
		return ckpt_err(-ENOMEM, "%s: tensor table", w->path);
	bool found;
	uint32_t slot = name_slot(w, t->name, &found);
	if (found)
		return ckpt_err(-EEXIST, "%s: tensor '%s' added twice", w->path, t->name);
	if (w->ntensors == w->tcap) {
		uint32_t cap = w->tcap ? w->tcap * 2 : 16;
		struct io_tensor_entry *nt = ckpt_realloc(w->tensors, cap * sizeof *nt);
		if (nt)
			w->tensors = nt;
		uint64_t *na = nt ? ckpt_realloc(w->appended, cap * sizeof *na) : NULL;
		if (!na)
			return ckpt_err(-ENOMEM, "%s: tensor table", w->path);
		w->appended = na;
		w->tcap = cap;
	}
	struct io_tensor_entry *e = &w->tensors[w->ntensors];
	memset(e, 0, sizeof *e);
	if (!(e->name = ckpt_strdup(t->name)))
		return ckpt_err(-ENOMEM, "%s: tensor table", w->path);
	e->name_len = (uint16_t)strlen(t->name);
	e->kind = t->kind;
	e->dtype = t->dtype;
	e->policy = t->policy;
	e->flags = t->flags;
	e->ndim = t->ndim;
	for (unsigned d = 0; d < t->ndim; d++) {
		e->global_shape[d] = t->global_shape[d];
		e->offset[d] = t->offset[d];
		e->extent[d] = t->extent[d];
	}
	e->raw_bytes = t->raw_bytes;
	e->first_chunk = w->nchunks;   /* reset at its first chunk; right for empty ones */
	w->appended[w->ntensors] = 0;
	w->names[slot] = w->ntensors + 1;
	return (int)w->ntensors++;
}

/* ------------------------------------------------------------------ append */

/* Order rules: a tensor's chunks are consecutive and in raw order. */
static int append_check(struct io_shard_writer *w, uint32_t t, size_t len)
{
	if (t >= w->ntensors)
		return ckpt_err(-EINVAL, "%s: append to tensor %u of %u", w->path, t, w->ntensors);
	struct io_tensor_entry *te = &w->tensors[t];
	if (len == 0 || len > io_pool_buf_bytes(w->pool))
		return ckpt_err(-EINVAL, "tensor '%s': chunk of %zu bytes (pool buffers hold %zu)",
		                te->name, len, io_pool_buf_bytes(w->pool));
	if ((int64_t)t != w->cur) {
		if (w->appended[t])
			return ckpt_err(-EINVAL, "tensor '%s': chunks not consecutive", te->name);
		if (w->cur >= 0 && w->appended[w->cur] != w->tensors[w->cur].raw_bytes)
			return ckpt_err(-EINVAL, "tensor '%s': started before '%s' was complete",
			                te->name, w->tensors[w->cur].name);
	}
	if (len > te->raw_bytes - w->appended[t])
		return ckpt_err(-EINVAL, "tensor '%s': %zu more bytes past its %llu", te->name, len,
		                (unsigned long long)te->raw_bytes);
	if (w->nchunks == UINT32_MAX)
		return ckpt_err(-EINVAL, "%s: too many chunks", w->path);
	if (w->nchunks == w->ccap) {
		uint32_t cap = w->ccap ? (w->ccap > UINT32_MAX / 2 ? UINT32_MAX : w->ccap * 2) : 64;
		struct io_chunk_entry *nc = ckpt_realloc(w->chunks, (size_t)cap * sizeof *nc);
		if (nc)
			w->chunks = nc;
		uint32_t *nf = nc ? ckpt_realloc(w->chunk_file, (size_t)cap * sizeof *nf) : NULL;
		if (!nf)
			return ckpt_err(-ENOMEM, "%s: chunk table", w->path);
		w->chunk_file = nf;
		w->ccap = cap;
	}
	return 0;
}

/* ------------------------------------------------------------------ compression ring */

static struct w_job *job_at(const struct io_shard_writer *w, uint64_t seq)
{
	return &w->jobs[seq % w->jcap];
}

/* Compress job j (in a worker, or in append without workers): its own buffers only. */
static void job_compress(struct io_shard_writer *w, struct w_job *j)
{
	const uint8_t *raw = io_pool_addr(w->pool, j->raw);
	/* A tree's hash is made of its block hashes: they come in the same pass. */
	if (j->hash_here && w->tree)
		io_copy_hash128_blocks(NULL, raw, j->len, w->block_bytes, true, j->hash, j->blocks);
	else if (j->hash_here)
		io_hash128(raw, j->len, j->hash);
	/* cap len - 1: compression counts only if it is strictly smaller. */
	j->clen = io_chunk_encode(w->codec, w->zstd_level, j->dtype,
	                          io_pool_addr(w->pool, (unsigned)j->out), j->len - 1,
	                          raw, j->len, &j->used);
	/* Block hashes only for a chunk stored raw: a compressed one is read whole. */
	if (j->hash_here && !w->tree && !j->clen && j->nb) {
		uint8_t again[CKPT_HASH_BYTES];
		io_copy_hash128_blocks(NULL, raw, j->len, w->block_bytes, false, again, j->blocks);
	}
}

static void *w_worker(void *arg)
{
	struct io_shard_writer *w = arg;
	pthread_mutex_lock(&w->jlock);
	for (;;) {
		while (!w->stop && w->jtake == w->jtail)
			pthread_cond_wait(&w->jwork, &w->jlock);
		if (w->jtake == w->jtail)
			break;                 /* stopping, and nothing left to take */
		struct w_job *j = job_at(w, w->jtake++);
		if (j->done)
			continue;              /* stored raw: nothing to compress */
		pthread_mutex_unlock(&w->jlock);
		uint64_t t0 = ckpt_now_ns();
		job_compress(w, j);
		atomic_fetch_add_explicit(&w->ns_compress, ckpt_now_ns() - t0, memory_order_relaxed);
		pthread_mutex_lock(&w->jlock);
		j->done = true;
		pthread_cond_broadcast(&w->jdone);
	}
	pthread_mutex_unlock(&w->jlock);
	return NULL;
}

/* Workers for a writer that compresses: as many as asked for that start (none
 * starting is not an error: append compresses then). */
static void w_start_workers(struct io_shard_writer *w, unsigned n)
{
	if (!n || !(w->threads = ckpt_calloc(n, sizeof *w->threads)))
		return;
	for (unsigned i = 0; i < n; i++) {
		int rc = ckpt_thread_create(&w->threads[i], NULL, w_worker, w);
		if (rc) {
			ckpt_log(CKPT_LOG_WARN, "%s: compression thread %u of %u: %s; going on with %u",
			         w->path, i + 1, n, ckpt_strerror(-rc), i);
			break;
		}
		w->nthreads++;
	}
}

/* Stop the workers once the ring is empty (every path: finish, abort, open failed). */
static void w_stop_workers(struct io_shard_writer *w)
{
	if (!w->nthreads)
		return;
	pthread_mutex_lock(&w->jlock);
	w->stop = true;
	pthread_cond_broadcast(&w->jwork);
	pthread_mutex_unlock(&w->jlock);
	for (unsigned i = 0; i < w->nthreads; i++)
		pthread_join(w->threads[i], NULL);
	w->nthreads = 0;
}

/* Queue chunk k's stored bytes (in pool buffer wbuf) at the end of the file. */
static int w_write_chunk(struct io_shard_writer *w, uint32_t k, unsigned wbuf,
                         const struct io_ext_write *ext)
{
	struct io_chunk_entry *c = &w->chunks[k];
	uint8_t *p = io_pool_addr(w->pool, wbuf);
	uint64_t padded = ckpt_align_up(c->stored_len, CKPT_ALIGN);
	if (padded > io_pool_len(w->pool, wbuf)) {
		/* A small buffer taken for a chunk that does not fit it (io_pool_get_fit). */
		io_pool_put(w->pool, wbuf);
		return w_fail(w, ckpt_err(-EINVAL, "%s: chunk of %llu bytes in pool buffer %u of "
		                          "%zu", w->path, (unsigned long long)c->stored_len, wbuf,
		                          io_pool_len(w->pool, wbuf)));
	}
	memset(p + c->stored_len, 0, (size_t)(padded - c->stored_len));
	c->file_offset = w->next_off;
	w->next_off += padded;
	w->stored += c->stored_len;
	/* An external writer (GPUDirect Storage) writes the whole 4 KiB blocks from its
	 * own copy of the bytes, here and now; the partial last block, zero-padded, goes
	 * out from the pool buffer like any chunk. */
	uint64_t done = ext ? ckpt_align_down(c->raw_len, CKPT_ALIGN) : 0;
	int rc;
	if (ext && k > COOKIE_KMASK) {
		io_pool_put(w->pool, wbuf);
		return w_fail(w, ckpt_err(-EINVAL, "%s: chunk %u: too many chunks for an external "
		                          "write", w->path, k));
	}
	if (done && (rc = ext->write(ext->arg, w->fd, w->path, c->file_offset, (size_t)done))) {
		io_pool_put(w->pool, wbuf);
		return w_fail(w, rc);
	}
	if (done == padded) {
		io_pool_put(w->pool, wbuf);
		return 0;
	}
	if (!w->t_first_write)
		w->t_first_write = ckpt_now_ns();
	rc = io_engine_queue(w->e, IO_OP_WRITE, w->fd, p + done, (size_t)(padded - done),
	                     c->file_offset + done, w_write_done, w,
	                     (uint64_t)k << 32 | wbuf | (done ? COOKIE_PART : 0));
	if (rc < 0) {
		io_pool_put(w->pool, wbuf);
		ckpt_err(rc, "queue write %s at offset %llu", w->path,
		         (unsigned long long)(c->file_offset + done));
		return w_fail(w, rc);
	}
	w->inflight++;
	return 0;
}

/* The oldest job, done: its stored form decided, its place in the file taken and
 * its write queued (or, once the writer failed, its buffers given back). */
static void w_retire_head(struct io_shard_writer *w)
{
	struct w_job *j = job_at(w, w->jhead);
	struct io_chunk_entry *c = &w->chunks[j->k];
	unsigned wbuf = j->raw;
	if (j->out >= 0 && j->clen) {
		io_pool_put(w->pool, j->raw);   /* the raw copy is no longer needed */
		wbuf = (unsigned)j->out;
		c->codec = j->used;
		c->stored_len = j->clen;
		w->bytegroup |= j->used == IO_CODEC_BYTEGROUP;
	} else if (j->out >= 0) {
		io_pool_put(w->pool, (unsigned)j->out);
	}
	if (j->hash_here) {
		memcpy(c->hash, j->hash, CKPT_HASH_BYTES);
		if (c->codec == IO_CODEC_RAW && j->nb)
			memcpy(w->blocks + w->nblocks * CKPT_HASH_BYTES, j->blocks,
			       (size_t)j->nb * CKPT_HASH_BYTES);
	}
	/* Its block hashes sit right after those of the chunks written before it. */
	if (c->codec == IO_CODEC_RAW) {
		w->nblocks += j->nb;
	} else if (j->nb) {
		/* compressed chunks are read whole: no blocks */
		uint8_t *at = w->blocks + w->nblocks * CKPT_HASH_BYTES;
		memmove(at, at + j->nb * CKPT_HASH_BYTES,
		        (size_t)(w->bend - w->nblocks - j->nb) * CKPT_HASH_BYTES);
		w->bend -= j->nb;
	}
	w->jhead++;
	if (w->err) {
		io_pool_put(w->pool, wbuf);
	} else {
		uint64_t t0 = ckpt_now_ns();
		w_write_chunk(w, j->k, wbuf, j->ext);
		w->ns_write += ckpt_now_ns() - t0;
	}
}

/* Retire the jobs that are done, oldest first; with wait, wait for the oldest
 * first. Returns how many were retired. */
static unsigned w_retire(struct io_shard_writer *w, bool wait)
{
	unsigned n = 0;
	if (w->nthreads)
		pthread_mutex_lock(&w->jlock);
	while (w->jhead != w->jtail) {
		struct w_job *j = job_at(w, w->jhead);
		if (!j->done) {
			if (!wait || n || !w->nthreads)
				break;
			uint64_t t0 = ckpt_now_ns();
			pthread_cond_wait(&w->jdone, &w->jlock);   /* only with workers */
			w->ns_wait_done += ckpt_now_ns() - t0;
			continue;
		}
		if (w->nthreads)
			pthread_mutex_unlock(&w->jlock);
		w_retire_head(w);          /* may reap, which never touches the ring */
		n++;
		if (w->nthreads)
			pthread_mutex_lock(&w->jlock);
	}
	if (w->nthreads)
		pthread_mutex_unlock(&w->jlock);
	return n;
}

/* Everything in the ring retired (written, or released after a failure). */
static void w_retire_all(struct io_shard_writer *w)
{
	while (w->jhead != w->jtail)
		w_retire(w, true);
}

/* Put job j at the end of the ring (room was made by the caller): a worker
 * compresses it, or this thread now when there are none, or nobody when it has no
 * output buffer. */
static void w_push(struct io_shard_writer *w, const struct w_job *j)
{
	struct w_job *slot = job_at(w, w->jtail);
	*slot = *j;
	bool compress = slot->out >= 0;
	slot->done = !compress || !w->nthreads;
	if (compress && !w->nthreads)
		job_compress(w, slot);
	if (!w->nthreads) {
		w->jtail++;
		w->jtake = w->jtail;
		return;
	}
	pthread_mutex_lock(&w->jlock);
	/* A chunk stored raw is done already. When every chunk before it is taken, no
	 * worker needs to: take it now, so that take never falls behind head once it
	 * is retired (its slot may hold the next chunk by the time a worker looks).
	 * Otherwise the worker that finishes the chunk before it takes it, under the
	 * same hold of the lock that marks that one done, before it can be retired. */
	if (!compress && w->jtake == w->jtail)
		w->jtake++;
	w->jtail++;
	if (compress)
		pthread_cond_signal(&w->jwork);
	pthread_mutex_unlock(&w->jlock);
}

/* A second pool buffer for compressing a chunk into, or -1: raw is stored. When
 * the pool is empty and this writer's ring or writes hold buffers, their return is
 * waited for (backpressure); when they hold none, raw is always correct. */
static int w_out_buffer(struct io_shard_writer *w)
{
	uint64_t t0 = 0;
	for (;;) {
		int ob = io_pool_get(w->pool, 0);
		if (t0 && (ob >= 0 || w->err))
			w->ns_wait_buf += ckpt_now_ns() - t0;
		if (ob >= 0 || w->err)
			return ob;
		if (!t0)
			t0 = ckpt_now_ns();
		if (w->jhead != w->jtail)
			w_retire(w, true);
		else if (!w->inflight || io_engine_reap(w->e, true) < 0)
			return -1;
	}
}

/* Room for nb more block hashes at bend; NULL on -ENOMEM (message recorded). */
static uint8_t *blocks_reserve(struct io_shard_writer *w, uint64_t nb)
{
	if (w->bend + nb > w->bcap) {
		uint64_t cap = w->bcap ? w->bcap : 256;
		while (cap < w->bend + nb)
			cap *= 2;
		uint8_t *p = cap <= SIZE_MAX / CKPT_HASH_BYTES
			? ckpt_realloc(w->blocks, (size_t)cap * CKPT_HASH_BYTES) : NULL;
		if (!p) {
			ckpt_err(-ENOMEM, "%s: block hash table of %llu entries", w->path,
			         (unsigned long long)cap);
			return NULL;
		}
		w->blocks = p;
		w->bcap = cap;
	}
	return w->blocks + w->bend * CKPT_HASH_BYTES;
}

unsigned io_shard_writer_pending(const struct io_shard_writer *w)
{
	/* jhead and jtail move only on this thread (the workers take and mark). */
	return (unsigned)(w->jtail - w->jhead) + w->inflight - w->open_inflight;
}

bool io_shard_writer_ready(struct io_shard_writer *w)
{
	if (w->err)
		return true;
	int r = io_engine_reap(w->e, false);
	if (r < 0) {
		w_fail(w, r);
		return true;
	}
	w_retire(w, false);
	/* With compression the ring takes the chunk (and its worker overlaps the
	 * caller's next copy); without, the engine's queue must have room. */
	if (w->nthreads)
		return w->jtail - w->jhead < w->jcap;
	return io_engine_inflight(w->e) < io_engine_depth(w->e);
}

int io_shard_writer_append(struct io_shard_writer *w, uint32_t t, unsigned buf, size_t len,
                           const struct io_append *opt)
{
	const struct io_hashes *h = opt ? opt->hashes : NULL;
	const struct io_ext_write *ext = opt ? opt->ext : NULL;
	if (ext && (!ext->write || !h)) {
		io_pool_put(w->pool, buf);
		return ckpt_err(-EINVAL, "%s: external chunk write without a writer or hash", w->path);
	}
	if (h && h->tree != w->tree) {
		io_pool_put(w->pool, buf);
		return ckpt_err(-EINVAL, "%s: a chunk hashed %s for a file of version %u", w->path,
		                h->tree ? "as a tree" : "whole", w->version);
	}
	uint8_t *raw = io_pool_addr(w->pool, buf);
	if (!raw)
		return ckpt_err(-EINVAL, "%s: append of pool buffer %u (not in the pool)", w->path,
		                buf);
	bool encoded = opt && opt->codec != IO_CODEC_RAW;
	if (encoded && ((opt->codec != IO_CODEC_ZSTD && opt->codec != IO_CODEC_BYTEGROUP) || !h ||
	                ext || opt->stored_len == 0 || opt->stored_len > len ||
	                opt->stored_len > io_pool_buf_bytes(w->pool) ||
	                (opt->codec == IO_CODEC_BYTEGROUP && !w->save_id))) {
		io_pool_put(w->pool, buf);
		return ckpt_err(-EINVAL, "%s: encoded chunk (codec %u, %zu of %zu bytes) without its "
		                "hash, or of a size or codec the writer cannot take", w->path,
		                opt->codec, opt->stored_len, len);
	}
	if (w->err) {
		io_pool_put(w->pool, buf);
		return w_error(w);
	}
	int rc = append_check(w, t, len);
	if (!rc && encoded && opt->codec == IO_CODEC_BYTEGROUP &&
	    !io_bytegroup_width(w->tensors[t].dtype))
		rc = ckpt_err(-EINVAL, "tensor '%s': a bytegroup chunk of dtype %s", w->tensors[t].name,
		              ckpt_dtype_name(w->tensors[t].dtype));
	/* A full ring, or an external write (it needs its place in the file now): the
	 * chunks before it go first. Before the block hashes are reserved: a retire
	 * moves those of the ring's chunks. */
	if (!rc && ext)
		w_retire_all(w);
	else if (!rc && w->jtail - w->jhead == w->jcap)
		w_retire(w, true);
	uint64_t nb = encoded ? 0 : io_nblocks(len, w->block_bytes);
	uint8_t *bdst = NULL;
	if (!rc && nb && !(bdst = blocks_reserve(w, nb)))
		rc = -ENOMEM;
	if (rc) {
		io_pool_put(w->pool, buf);
		return rc;
	}
	struct io_tensor_entry *te = &w->tensors[t];
	struct io_chunk_entry *c = &w->chunks[w->nchunks];
	memset(c, 0, sizeof *c);
	w->chunk_file[w->nchunks] = 0;
	c->tensor = t;
	c->raw_offset = w->appended[t];
	c->raw_len = len;
	/* The identity of a chunk is the hash of its raw bytes, taken while this
	 * thread is the buffer's only owner; so are its block hashes, kept in case the
	 * chunk is stored raw (decided when it leaves the ring). Without hashes from
	 * the caller, a chunk that a worker compresses is hashed by that worker (below):
	 * hashing is then as parallel as compressing, not this thread's. */
	bool later = !h && w->nthreads && w->zstd_level > 0 && !ext && !encoded && len > 1;
	if (later) {
		/* its hashes come at retire */
	} else if (!h) {
		io_copy_hash128_blocks(NULL, raw, len, w->block_bytes, w->tree, c->hash, bdst);
	} else {
		memcpy(c->hash, h->chunk, CKPT_HASH_BYTES);
		if (nb && h->blocks && h->block_bytes == w->block_bytes) {
			memcpy(bdst, h->blocks, (size_t)nb * CKPT_HASH_BYTES);
		} else if (nb) {
			uint8_t again[CKPT_HASH_BYTES];
			io_copy_hash128_blocks(NULL, raw, len, w->block_bytes, w->tree, again, bdst);
		}
	}
	c->codec = encoded ? opt->codec : IO_CODEC_RAW;
	c->stored_len = encoded ? opt->stored_len : len;
	if (encoded && opt->codec == IO_CODEC_BYTEGROUP)
		w->bytegroup = true;
	uint32_t k = w->nchunks;
	if ((int64_t)t != w->cur) {
		te->first_chunk = k;
		w->cur = t;
	}
	te->nchunks++;
	w->nchunks++;
	w->appended[t] += len;
	w->logical += len;
	w->bend += nb;
	struct w_job j = { .k = k, .raw = buf, .out = -1, .len = len, .dtype = te->dtype,
	                   .nb = nb, .ext = ext };
	if (w->zstd_level > 0 && !ext && !encoded && len > 1)
		j.out = w_out_buffer(w);
	if (later && j.out >= 0) {
		j.hash_here = true;
		j.blocks = w->jblocks ? w->jblocks + (w->jtail % w->jcap) * w->jblocks_per : NULL;
	} else if (later) {
		/* Stored raw with no worker involved: hashed here after all. Its block
		 * hashes are the table's last nb (a retire may have moved them). */
		io_copy_hash128_blocks(NULL, raw, len, w->block_bytes, w->tree, c->hash,
		                       nb ? w->blocks + (w->bend - nb) * CKPT_HASH_BYTES : NULL);
	}
	w_push(w, &j);
	w_retire(w, false);
	/* Completions are only handled inside our calls. Return finished buffers now,
	 * and never return with the pool empty while our ring or writes hold part of
	 * it: the producer of the next chunk (maybe this thread) would wait on the pool
	 * for a buffer that only a retire or a reap here can give back. */
	int r = io_engine_reap(w->e, false);
	while (r >= 0 && io_pool_nfree(w->pool) == 0 && !w->err) {
		if (w->jhead != w->jtail)
			w_retire(w, true);
		else if (w->inflight)
			r = io_engine_reap(w->e, true);
		else
			break;
	}
	if (r < 0)
		w_fail(w, r);
	return w->err ? w_error(w) : 0;
}

/* The number (1-based) of file f in the writer's table of referenced files, added
 * when new; 0 on -ENOMEM (message recorded). */
static uint32_t ref_file_number(struct io_shard_writer *w, const struct io_ref_file *f)
{
	for (uint32_t i = 0; i < w->nfiles; i++)
		if (w->files[i].step == f->step && w->files[i].save_id == f->save_id &&
		    w->files[i].rank == f->rank)
			return i + 1;
	if (w->nfiles == w->fcap) {
		uint32_t cap = w->fcap ? w->fcap * 2 : 4;
		struct io_ref_file *n = ckpt_realloc(w->files, (size_t)cap * sizeof *n);
		if (!n) {
			ckpt_err(-ENOMEM, "%s: table of referenced files", w->path);
			return 0;
		}
		w->files = n;
		w->fcap = cap;
	}
	w->files[w->nfiles] = *f;
	return ++w->nfiles;
}

int io_shard_writer_append_ref(struct io_shard_writer *w, uint32_t t, size_t len,
                               const struct io_chunk_ref *ref)
{
	if (w->err)
		return w_error(w);
	if (!ref || !ref->hashes)
		return ckpt_err(-EINVAL, "%s: reference without its hashes", w->path);
	/* A reference is a format-4 record, which has the save id of format 3; and it
	 * points back in time only (the decoder's rule). */
	if (!w->save_id || ref->file.step >= w->step)
		return ckpt_err(-EINVAL, "%s: reference to step %llu from step %llu%s", w->path,
		                (unsigned long long)ref->file.step, (unsigned long long)w->step,
		                w->save_id ? "" : " (a file without a save id cannot hold one)");
	if ((ref->codec != IO_CODEC_RAW && ref->codec != IO_CODEC_ZSTD &&
	     ref->codec != IO_CODEC_BYTEGROUP) ||
	    ref->file_offset < IO_HEADER_BYTES || ref->file_offset % CKPT_ALIGN ||
	    (ref->codec == IO_CODEC_RAW ? ref->stored_len != len
	                                : !ref->stored_len || ref->stored_len > len))
		return ckpt_err(-EINVAL, "%s: reference to a chunk at offset %llu (%llu bytes, codec "
		                "%u) that cannot hold %zu raw bytes", w->path,
		                (unsigned long long)ref->file_offset,
		                (unsigned long long)ref->stored_len, ref->codec, len);
	int rc = append_check(w, t, len);
	if (rc)
		return rc;
	/* The chunks before it leave the ring first: their block hashes take their
	 * places in the table (a compressed one gives its reserved places back), and
	 * this chunk's follow them. */
	w_retire_all(w);
	if (w->err)
		return w_error(w);
	/* The referenced chunk's blocks are this chunk's (the same bytes): its hashes go
	 * into this file's block table, so that a partial read of it is checked as any. */
	const struct io_hashes *h = ref->hashes;
	if (h->tree != w->tree)
		return ckpt_err(-EINVAL, "%s: a reference hashed %s for a file of version %u", w->path,
		                h->tree ? "as a tree" : "whole", w->version);
	uint64_t nb = ref->codec == IO_CODEC_RAW ? io_nblocks(len, w->block_bytes) : 0;
	uint8_t *bdst = NULL;
	if (nb && (!h->blocks || h->block_bytes != w->block_bytes))
		return ckpt_err(-EINVAL, "%s: reference without the block hashes of its chunk",
		                w->path);
	if (nb && !(bdst = blocks_reserve(w, nb)))
		return -ENOMEM;
	uint32_t f = ref_file_number(w, &ref->file);
	if (!f)
		return -ENOMEM;
	if (nb)
		memcpy(bdst, h->blocks, (size_t)nb * CKPT_HASH_BYTES);
	struct io_tensor_entry *te = &w->tensors[t];
	struct io_chunk_entry *c = &w->chunks[w->nchunks];
	memset(c, 0, sizeof *c);
	c->tensor = t;
	c->codec = ref->codec;
	c->raw_offset = w->appended[t];
	c->raw_len = len;
	c->file_offset = ref->file_offset;
	c->stored_len = ref->stored_len;
	memcpy(c->hash, h->chunk, CKPT_HASH_BYTES);
	w->chunk_file[w->nchunks] = f;
	w->nblocks += nb;
	w->bend += nb;
	if ((int64_t)t != w->cur) {
		te->first_chunk = w->nchunks;
		w->cur = t;
	}
	te->nchunks++;
	w->nchunks++;
	w->appended[t] += len;
	w->logical += len;
	w->nrefs++;
	w->ref_bytes += len;
	return 0;
}

/* ------------------------------------------------------------------ finish */

static void put_trailer(uint8_t *t, const struct io_shard_writer *w, uint64_t footer_off,
                        uint64_t footer_len, const uint8_t *footer_hash)
{
	memset(t, 0, IO_TRAILER_BYTES);
	memcpy(t, IO_TRAILER_MAGIC, IO_MAGIC_BYTES);
	/* A writer that did not ask for bytegroup may still have been given bytegroup
	 * chunks (ckptd's): the trailer, written last, says the version they need. */
	ckpt_put_le32(t + IO_TRL_OFF_VERSION, w->bytegroup && w->version < IO_BYTEGROUP_VERSION
	                                      ? IO_BYTEGROUP_VERSION : w->version);
	ckpt_put_le32(t + IO_TRL_OFF_FLAGS, 0);
	ckpt_put_le64(t + IO_TRL_OFF_FOOTER, footer_off);
	ckpt_put_le64(t + IO_TRL_OFF_FLEN, footer_len);
	memcpy(t + IO_TRL_OFF_FHASH, footer_hash, CKPT_HASH_BYTES);
	ckpt_put_le64(t + IO_TRL_OFF_STEP, w->step);
	ckpt_put_le64(t + IO_TRL_HASHED, XXH3_64bits(t, IO_TRL_HASHED));
}

/* Write [block table + padding] + footer + padding + trailer in one request from an
 * aligned buffer, at next_off; the footer starts tlen_padded bytes later. */
static int write_tail(struct io_shard_writer *w, const void *table, size_t tlen,
                      uint64_t tlen_padded, const void *footer, size_t flen,
                      const uint8_t *fhash, uint64_t tail_len)
{
	int b = -1;
	uint8_t *p = NULL;
	if (tail_len <= io_pool_buf_bytes(w->pool) && (b = io_pool_get(w->pool, 0)) >= 0)
		p = io_pool_addr(w->pool, (unsigned)b);
	else if (!(p = io_aligned_alloc((size_t)tail_len)))
		return ckpt_err(-ENOMEM, "%s: footer buffer of %llu bytes", w->path,
		                (unsigned long long)tail_len);
	if (tlen)
		memcpy(p, table, tlen);
	memset(p + tlen, 0, (size_t)(tlen_padded - tlen));
	memcpy(p + tlen_padded, footer, flen);
	memset(p + tlen_padded + flen, 0, (size_t)(tail_len - tlen_padded - flen));
	put_trailer(p + tail_len - IO_TRAILER_BYTES, w, w->next_off + tlen_padded, flen, fhash);
	w->tail_done = false;
	int rc = io_engine_queue(w->e, IO_OP_WRITE, w->fd, p, (size_t)tail_len, w->next_off,
	                         w_write_done, w, COOKIE_TAIL);
	if (rc == 0) {
		w->inflight++;
		while (!w->tail_done && rc >= 0)
			rc = io_engine_reap(w->e, true);
		if (rc >= 0 && w->tail_res != (int64_t)tail_len)
			rc = w->tail_res < 0 ? (int)w->tail_res : -EIO;
		rc = rc < 0 ? rc : 0;
	}
	if (rc)
		ckpt_err(rc, "write %s footer at offset %llu (%llu bytes)", w->path,
		         (unsigned long long)w->next_off, (unsigned long long)tail_len);
	if (b >= 0)
		io_pool_put(w->pool, (unsigned)b);
	else
		ckpt_free(p);
	return rc;
}

static int finish_steps(struct io_shard_writer *w, struct io_shard_result *res)
{
	int rc = w_drain(w);
	if (rc)
		return w_error(w);
	w->t_drained = ckpt_now_ns();
	for (uint32_t i = 0; i < w->ntensors; i++)
		if (w->appended[i] != w->tensors[i].raw_bytes)
			return ckpt_err(-EINVAL, "%s: tensor '%s' has %llu of %llu bytes", w->path,
			                w->tensors[i].name, (unsigned long long)w->appended[i],
			                (unsigned long long)w->tensors[i].raw_bytes);
	struct io_shard_index ix = {
		.step = w->step, .rank = w->rank, .world = w->world, .data_end = w->next_off,
		.save_id = w->save_id,
		.ntensors = w->ntensors, .nchunks = w->nchunks,
		.tensors = w->tensors, .chunks = w->chunks, .block_bytes = w->block_bytes,
		.tree = w->tree, .nfiles = w->nfiles, .files = w->files,
		.chunk_file = w->nfiles ? w->chunk_file : NULL,
	};
	/* References make the file version 4: its header says so too (written at open
	 * with the options' version; written again here, before the sync that covers
	 * it), and so do index and trailer. */
	if (w->nfiles && w->version < 4) {
		w->version = 4;
		if ((rc = write_header(w)))
			return rc;
	}
	/* The block table, when some chunk has blocks, goes right after the last chunk;
	 * the footer names it by place and hash, and starts after it. */
	void *table = NULL;
	size_t tlen = 0;
	uint64_t tpad = 0;
	if (w->nblocks) {
		if ((rc = io_blocks_encode(w->block_bytes, w->blocks, w->nblocks, &table, &tlen)))
			return ckpt_err_prefix(rc, "%s", w->path);
		tpad = ckpt_align_up(tlen, CKPT_ALIGN);
		ix.blocks_offset = w->next_off;
		ix.blocks_len = tlen;
		io_hash128(table, tlen, ix.blocks_hash);
		ix.data_end = w->next_off + tpad;
	}
	if ((rc = io_index_encode(&ix, &res->footer, &res->footer_len))) {
		ckpt_free(table);
		return rc;
	}
	if (res->footer_len > IO_MAX_FOOTER_BYTES) {
		ckpt_free(table);
		return ckpt_err(-EFBIG, "%s: footer of %zu bytes exceeds the format's limit",
		                w->path, res->footer_len);
	}
	io_hash128(res->footer, res->footer_len, res->footer_hash);
	uint64_t tail_len = tpad + ckpt_align_up(res->footer_len + IO_TRAILER_BYTES, CKPT_ALIGN);
	res->file_size = w->next_off + tail_len;
	rc = write_tail(w, table, tlen, tpad, res->footer, res->footer_len, res->footer_hash,
	                tail_len);
	ckpt_free(table);
	if (rc)
		return rc;
	w->t_footer = ckpt_now_ns();
	if ((rc = ckpt_fault(CKPT_FP_AFTER_FOOTER_WRITE)) < 0)
		return ckpt_err_prefix(rc, "%s", w->path);
	/* size_hint may have been larger than the shard: cut the file to its trailer. */
	if (ftruncate(w->fd, (off_t)res->file_size) < 0)
		return ckpt_err(-errno, "ftruncate %s to %llu", w->path,
		                (unsigned long long)res->file_size);
	if ((rc = ckpt_fault(CKPT_FP_BEFORE_FDATASYNC)) < 0)
		return ckpt_err_prefix(rc, "%s", w->path);
	/* The data, footer and size are durable after this, the name since open: the
	 * vote (PREPARE) may follow. skip (a test knob of the fault table) removes this
	 * sync, for the power-cut campaign to catch. */
	if (rc != CKPT_FA_SKIP && fdatasync(w->fd) < 0)
		return ckpt_err(-errno, "fdatasync %s", w->path);
	w->t_synced = ckpt_now_ns();
	if ((rc = ckpt_fault(CKPT_FP_AFTER_FDATASYNC)) < 0)
		return ckpt_err_prefix(rc, "%s", w->path);
	/* Decoding what we wrote is cheap and proves the footer is readable. */
	if ((rc = io_index_decode(res->footer, res->footer_len, &res->index)))
		return ckpt_err_prefix(rc, "%s: footer written by this writer", w->path);
	res->logical_bytes = w->logical;
	res->stored_bytes = w->stored;
	res->ref_chunks = w->nrefs;
	res->ref_bytes = w->ref_bytes;
	return 0;
}

int io_shard_writer_finish(struct io_shard_writer *w, struct io_shard_result *res)
{
	memset(res, 0, sizeof *res);
	w->t_finish = ckpt_now_ns();
	/* Every chunk out of the ring and into a write (or back to the pool). */
	w_retire_all(w);
	unsigned nt = w->nthreads;
	w_stop_workers(w);
	if (nt)
		ckpt_log(CKPT_LOG_DEBUG, "%s: %u chunk(s), %llu of %llu bytes stored, %.3f s since "
		         "open; %u compression thread(s) busy %.3f s in all; the appender waited "
		         "%.3f s for compression, %.3f s for output buffers, %.3f s queueing writes",
		         w->path, w->nchunks, (unsigned long long)w->stored,
		         (unsigned long long)w->logical, (double)(ckpt_now_ns() - w->t_open) / 1e9, nt,
		         (double)atomic_load(&w->ns_compress) / 1e9, (double)w->ns_wait_done / 1e9,
		         (double)w->ns_wait_buf / 1e9, (double)w->ns_write / 1e9);
	int rc = finish_steps(w, res);
	if (!rc) {
#define SINCE_OPEN(t) ((t) ? (double)((t) - w->t_open) / 1e9 : -1.0)
		ckpt_log(CKPT_LOG_DEBUG, "%s: %llu bytes stored, durable %.3f s after open: first "
		         "write queued at %.3f s, finish called at %.3f s, writes drained at %.3f "
		         "s, footer written at %.3f s, fdatasync done at %.3f s", w->path,
		         (unsigned long long)w->stored, SINCE_OPEN(w->t_synced),
		         SINCE_OPEN(w->t_first_write), SINCE_OPEN(w->t_finish),
		         SINCE_OPEN(w->t_drained), SINCE_OPEN(w->t_footer), SINCE_OPEN(w->t_synced));
#undef SINCE_OPEN
	}
	if (rc) {
		ckpt_free(res->footer);
		io_index_free(res->index);
		memset(res, 0, sizeof *res);
		/* The file can never be voted for: remove it now rather than leave it to GC. */
		w_drain(w);
		unlink(w->path);
	}
	w_free(w);
	return rc;
}

void io_shard_writer_abort(struct io_shard_writer *w)
{
	if (!w)
		return;
	/* The ring's buffers go back through their writes or, failed, at once: a
	 * failure keeps what is already queued from being written. */
	if (!w->err)
		w->err = CKPT_EABORTED;   /* no message: the caller's stays this thread's */
	w_retire_all(w);
	w_drain(w);
	unlink(w->path);
	w_free(w);
}
