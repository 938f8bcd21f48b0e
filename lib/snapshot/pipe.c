/*
 * pipe.c — the snapshot pipeline of a save: a ring of at most `window` chunks
 * whose copies into pool buffers are in flight, issued ahead of the writer and
 * taken out strictly in issue order (the shard writer wants a tensor's chunks in
 * order, and the order of the file is the order of the caller's items).
 *
 * Why a window and not the whole pool: the buffers outside the window carry the
 * writes in flight. A pipe that took every free buffer would leave the writer one
 * buffer at a time, and the disk, the bound of a durable save, would idle.
 *
 * A chunk of an incremental save found unchanged where it lies (the caller hashed
 * it in place) takes its place in that order without a buffer or a copy: it has
 * nothing to land, and it keeps the order of the file. Such chunks do not count
 * against the window, which bounds buffers: the ring has PIPE_STORED_AHEAD more
 * slots for them, so that the caller hashes on while a copied chunk ahead of them
 * waits for the disk (otherwise hashing and writing would take turns).
 *
 * Why issue returns -EAGAIN instead of blocking for a buffer when chunks are
 * pending: buffers come back only when the writer reaps its completions, which it
 * does inside its own calls on this same thread. Blocking here would wait for a
 * reap that nobody runs; taking a chunk out and appending it is what frees one.
 *
 * Hashing helpers (snapshot_pipe_hash_threads): a device chunk is hashed from its
 * pool buffer once its copy has landed. One thread doing that for every chunk
 * paces a save whose writes are few (an incremental one that finds most chunks
 * unchanged, after hashing them all) at about 7-9 GB/s. With helpers, device chunks
 * are queued to them as they are issued; each waits for its chunk's event, hashes
 * it and marks it done, and snapshot_pipe_next waits for that mark, in issue order
 * as before. The helpers see only their queue and the slots in it, under hlock;
 * a slot is reused only after next took it out, by which time its helper is done
 * with it and with its event.
 *
 * Threads: one thread per pipe (snapshot.h), plus its hashing helpers.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "snapshot/snapshot_internal.h"

struct pipe_slot {
	unsigned buf;
	size_t   len;
	uint64_t tag;
	bool     device;                 /* copy in flight on the stream; hash at next() */
	uint8_t  hash[CKPT_HASH_BYTES];  /* host chunks: computed while copying */
	uint8_t *blocks;                 /* its block hashes, computed with the chunk's */
	bool     no_blocks;              /* a stored chunk given without block hashes */
	bool     unhashed;               /* issued in place for its consumer to hash */
	unsigned ev;                     /* a device copy's event (of window events) */
	bool     hashed;                 /* helpers: done (under hlock) */
	int      hrc;                    /* helpers: its failure, or 0 */
};

#define PIPE_STORED_AHEAD 256u

struct snapshot_pipe {
	struct snapshot  *sn;
	struct io_pool   *pool;
	unsigned          window, head, count;   /* ring: slots [head, head+count) */
	unsigned          cap;                   /* ring slots: window + PIPE_STORED_AHEAD */
	unsigned          buffered;              /* pending chunks that hold a buffer */
	unsigned          ev_next;               /* next device event, mod window */
	struct pipe_slot *slots;
	uint8_t          *block_store;           /* the slots' block hashes */
	uint32_t          block_bytes;           /* 0: no block hashes */
	bool              tree;                  /* chunk hashes over block hashes */
	bool              prepared;              /* device backend ready for window slots */
	void             *fence;                 /* the first device copy waits for it */
	uint64_t          device_chunks;
	bool              sealed;
	/* The device staging pool: copies queued into it, the release (the snapshot
	 * event, once every read of the caller's memory is queued), the compare-and-copy
	 * flags: cleared on the device before the first comparison, read back once. */
	uint64_t          staged;
	bool              released;
	bool              leave_hashing;         /* device chunks come out unhashed */
	bool              flags_cleared;
	uint32_t          nflags;                /* flags [0, nflags) in use */
	uint32_t         *flags;                 /* read back; NULL until then */
	/* Hashing helpers: want of them, started at the first device chunk; their
	 * queue of slot indexes [hq_head, hq_tail) (mod cap); the first failure's
	 * message. hq_*, hstop, the slots' hashed and hrc, herr are under hlock. */
	unsigned          hwant, nh;
	pthread_t        *hthreads;
	pthread_mutex_t   hlock;
	pthread_cond_t    hwork, hdone;
	unsigned         *hq;
	uint64_t          hq_head, hq_tail;
	bool              hstop;
	char              herr[512];
};

unsigned snapshot_pipe_window(unsigned nbufs, unsigned queue_depth)
{
	if (nbufs > queue_depth + 1)
		return nbufs - queue_depth;
	return nbufs > 1 ? nbufs - 1 : 1;
}

int snapshot_pipe_open(struct snapshot *sn, struct io_pool *pool, unsigned window,
                       uint32_t block_bytes, bool tree, struct snapshot_pipe **out)
{
	*out = NULL;
	if (!sn || !pool || window == 0)
		return ckpt_err(-EINVAL, "snapshot pipe: no snapshot, pool or window");
	if (window > io_pool_nslots(pool))
		window = io_pool_nslots(pool);
	/* A chunk is at most one pool buffer: room for that many block hashes a slot. */
	size_t per = (size_t)io_nblocks(io_pool_buf_bytes(pool), block_bytes) * CKPT_HASH_BYTES;
	struct snapshot_pipe *p = ckpt_calloc(1, sizeof *p);
	unsigned cap = window + PIPE_STORED_AHEAD;
	if (!p || !(p->slots = ckpt_calloc(cap, sizeof *p->slots)) ||
	    (per && !(p->block_store = ckpt_malloc(per * cap)))) {
		if (p)
			ckpt_free(p->slots);
		ckpt_free(p);
		return ckpt_err(-ENOMEM, "snapshot pipe of %u slots", cap);
	}
	for (unsigned i = 0; per && i < cap; i++)
		p->slots[i].blocks = p->block_store + i * per;
	p->cap = cap;
	p->block_bytes = block_bytes;
	p->tree = tree && block_bytes;
	p->sn = sn;
	p->pool = pool;
	p->window = window;
	pthread_mutex_init(&p->hlock, NULL);
	pthread_cond_init(&p->hwork, NULL);
	pthread_cond_init(&p->hdone, NULL);
	*out = p;
	return 0;
}

void snapshot_pipe_hash_threads(struct snapshot_pipe *p, unsigned n)
{
	if (!p->leave_hashing && !p->nh)
		p->hwant = n > SNAPSHOT_PIPE_MAX_HASHERS ? SNAPSHOT_PIPE_MAX_HASHERS : n;
}

static void *pipe_hasher(void *arg)
{
	struct snapshot_pipe *p = arg;
	/* Events are waited for on the save's device, as on the pipe's own thread. */
	int bound = snap_dev_bind_thread(p->sn);
	char msg[sizeof p->herr] = "";
	if (bound)
		snprintf(msg, sizeof msg, "%s", ckpt_err_msg());
	pthread_mutex_lock(&p->hlock);
	for (;;) {
		while (!p->hstop && p->hq_head == p->hq_tail)
			pthread_cond_wait(&p->hwork, &p->hlock);
		if (p->hstop)
			break;
		struct pipe_slot *s = &p->slots[p->hq[p->hq_head++ % p->cap]];
		pthread_mutex_unlock(&p->hlock);
		int rc = bound ? bound : snap_dev_wait(p->sn, s->ev);
		if (rc && !bound)
			snprintf(msg, sizeof msg, "%s", ckpt_err_msg());
		if (!rc)
			io_copy_hash128_blocks(NULL, io_pool_addr(p->pool, s->buf), s->len,
			                       p->block_bytes, p->tree, s->hash, s->blocks);
		pthread_mutex_lock(&p->hlock);
		s->hrc = rc;
		if (rc && !p->herr[0])
			snprintf(p->herr, sizeof p->herr, "%s", msg);
		s->hashed = true;
		pthread_cond_broadcast(&p->hdone);
	}
	pthread_mutex_unlock(&p->hlock);
	return NULL;
}

/* Start the helpers wanted, at the first device chunk (the device is bound then).
 * None starting is not an error: next() hashes, as without them. */
static void pipe_start_hashers(struct snapshot_pipe *p)
{
	unsigned n = p->hwant;
	p->hwant = 0;
	if (!n || !(p->hq = ckpt_calloc(p->cap, sizeof *p->hq)) ||
	    !(p->hthreads = ckpt_calloc(n, sizeof *p->hthreads)))
		return;
	for (unsigned i = 0; i < n; i++) {
		int rc = ckpt_thread_create(&p->hthreads[i], NULL, pipe_hasher, p);
		if (rc) {
			ckpt_log(CKPT_LOG_WARN, "snapshot pipe: hashing thread %u of %u: %s; going on "
			         "with %u", i + 1, n, ckpt_strerror(-rc), i);
			break;
		}
		p->nh++;
	}
}

static void pipe_stop_hashers(struct snapshot_pipe *p)
{
	if (p->nh) {
		pthread_mutex_lock(&p->hlock);
		p->hstop = true;
		pthread_cond_broadcast(&p->hwork);
		pthread_mutex_unlock(&p->hlock);
		for (unsigned i = 0; i < p->nh; i++)
			pthread_join(p->hthreads[i], NULL);
		p->nh = 0;
	}
	ckpt_free(p->hthreads);
	ckpt_free(p->hq);
	p->hthreads = NULL;
	p->hq = NULL;
}

void snapshot_pipe_after(struct snapshot_pipe *p, void *fence) { p->fence = fence; }
unsigned snapshot_pipe_pending(const struct snapshot_pipe *p) { return p->count; }
bool snapshot_pipe_head_ready(const struct snapshot_pipe *p)
{
	return p->count && !p->slots[p->head].device;
}
uint64_t snapshot_pipe_device_chunks(const struct snapshot_pipe *p) { return p->device_chunks; }

/* The buffer for the next chunk of n bytes, or -EAGAIN when the window is full (or
 * the pool is empty while chunks of ours are pending: taking one out frees one). */
static int pipe_take(struct snapshot_pipe *p, size_t n)
{
	if (p->sealed)
		return ckpt_err(-EINVAL, "snapshot pipe: issue after seal");
	if (n == 0 || n > io_pool_buf_bytes(p->pool))
		return ckpt_err(-EINVAL, "snapshot pipe: chunk of %zu bytes (buffers hold %zu)", n,
		                io_pool_buf_bytes(p->pool));
	if (p->buffered == p->window || p->count == p->cap)
		return -EAGAIN;
	/* One that fits: in a pool of several classes (io_pool_create_halving) a short
	 * chunk takes a short buffer; in one of a single class, any. */
	int b = io_pool_get_fit(p->pool, n, 0);
	if (b < 0) {
		if (p->count)
			return -EAGAIN;
		/* Nothing of ours pending: the buffers are with the writer's writes, which
		 * its last append left with at least one free or none in flight, or with
		 * a load running on another thread, which gives them back by itself. */
		b = io_pool_get_fit(p->pool, n, -1);
		if (b < 0)
			return ckpt_err(b, "snapshot pipe: buffer pool");
	}
	return b;
}

/* Before the save's first device copy (into the pool or the staging pool). */
static int pipe_prepare(struct snapshot_pipe *p)
{
	if (p->prepared)
		return 0;
	/* Events for every slot at once: creating them is the slow part of the first
	 * device save, and doing it here keeps it out of the copy loop. */
	int rc = snap_dev_prepare(p->sn, p->window);
	/* Once, before the first copy: every later copy of the save is behind it on the
	 * same stream. */
	if (!rc && p->fence)
		rc = snap_dev_after(p->sn, p->fence);
	if (!rc)
		p->prepared = true;
	return rc;
}

/* The slot after the pending ones, set up for a chunk of n bytes in buf (a pool
 * buffer, SNAPSHOT_NO_BUF or SNAPSHOT_SRC_BUF), of host memory and with block
 * hashes until the caller says otherwise; the caller fills in its hashes and
 * counts it. */
static struct pipe_slot *slot_new(struct snapshot_pipe *p, unsigned buf, size_t n, uint64_t tag)
{
	struct pipe_slot *s = &p->slots[(p->head + p->count) % p->cap];
	s->buf = buf;
	s->len = n;
	s->tag = tag;
	s->device = false;
	s->no_blocks = false;
	s->unhashed = false;
	return s;
}

int snapshot_pipe_issue(struct snapshot_pipe *p, const void *src, size_t n, int mem,
                        uint64_t tag)
{
	if (mem != CKPT_MEM_HOST && mem != CKPT_MEM_DEVICE)
		return ckpt_err(-EINVAL, "snapshot pipe: memory kind %d not resolved", mem);
	int rc;
	if (mem == CKPT_MEM_DEVICE && (rc = pipe_prepare(p)))
		return rc;
	int b = pipe_take(p, n);
	if (b < 0)
		return b;
	struct pipe_slot *s = slot_new(p, (unsigned)b, n, tag);
	void *dst = io_pool_addr(p->pool, (unsigned)b);
	s->device = mem == CKPT_MEM_DEVICE;
	if (s->device) {
		/* Events are the window's: at most window device copies are pending, taken
		 * out in order, so the one window copies back is done with its event. */
		s->ev = p->ev_next;
		p->ev_next = (p->ev_next + 1) % p->window;
		rc = snap_dev_copy(p->sn, dst, src, n, s->ev);
		if (rc) {
			/* The copy may have been queued before the event failed: wait for the
			 * stream before the buffer can go to another owner. */
			snap_dev_quiesce(p->sn);
			io_pool_put(p->pool, (unsigned)b);
			return rc;
		}
		p->device_chunks++;
		if (p->hwant)
			pipe_start_hashers(p);
		if (p->nh) {
			pthread_mutex_lock(&p->hlock);
			s->hashed = false;
			s->hrc = 0;
			p->hq[p->hq_tail++ % p->cap] = (p->head + p->count) % p->cap;
			pthread_cond_signal(&p->hwork);
			pthread_mutex_unlock(&p->hlock);
		}
	} else {
		/* Host memory: the copy is done when this returns, hashed (the chunk and its
		 * blocks) on the way so the bytes cross the memory bus once. */
		io_copy_hash128_blocks(dst, src, n, p->block_bytes, p->tree, s->hash,
		                       s->blocks);
	}
	p->count++;
	p->buffered++;
	return 0;
}

int snapshot_pipe_issue_fill(struct snapshot_pipe *p, snapshot_fill_fn fill, void *arg,
                             uint64_t off, size_t n, uint64_t tag)
{
	int b = pipe_take(p, n);
	if (b < 0)
		return b;
	void *dst = io_pool_addr(p->pool, (unsigned)b);
	int rc = fill(arg, off, dst, n);
	if (rc) {
		io_pool_put(p->pool, (unsigned)b);
		return rc;
	}
	struct pipe_slot *s = slot_new(p, (unsigned)b, n, tag);
	/* The source wrote into a buffer nobody else owns: hash it while it is warm
	 * (chunk and blocks in one pass). */
	io_copy_hash128_blocks(NULL, dst, n, p->block_bytes, p->tree, s->hash, s->blocks);
	p->count++;
	p->buffered++;
	return 0;
}

int snapshot_pipe_issue_stored(struct snapshot_pipe *p, size_t n, const struct io_hashes *h,
                               uint64_t tag)
{
	if (p->sealed)
		return ckpt_err(-EINVAL, "snapshot pipe: issue after seal");
	uint64_t nb = h->blocks ? io_nblocks(n, p->block_bytes) : 0;
	/* The slot's block store holds a pool buffer's worth: so must the chunk. */
	if (n == 0 || n > io_pool_buf_bytes(p->pool) || (nb && h->block_bytes != p->block_bytes) ||
	    h->tree != p->tree)
		return ckpt_err(-EINVAL, "snapshot pipe: stored chunk of %zu bytes (buffers hold "
		                "%zu; block hashes of %u bytes; hashed %s)", n,
		                io_pool_buf_bytes(p->pool), nb ? h->block_bytes : p->block_bytes,
		                h->tree ? "as a tree" : "whole");
	if (p->count == p->cap)
		return -EAGAIN;
	struct pipe_slot *s = slot_new(p, SNAPSHOT_NO_BUF, n, tag);
	s->no_blocks = !h->blocks;
	memcpy(s->hash, h->chunk, CKPT_HASH_BYTES);
	if (nb)
		memcpy(s->blocks, h->blocks, (size_t)nb * CKPT_HASH_BYTES);
	p->count++;
	return 0;
}

/* A host chunk without a pool buffer of the pipe's: hashed where it lies (dst NULL;
 * or left to its consumer, hash false) or on its way into dst. */
static int pipe_issue_unbuffered(struct snapshot_pipe *p, unsigned mark, void *dst,
                                 const void *src, size_t n, bool hash, uint64_t tag)
{
	if (p->sealed)
		return ckpt_err(-EINVAL, "snapshot pipe: issue after seal");
	/* The slot's block store holds a pool buffer's worth: so must the chunk. */
	if (n == 0 || n > io_pool_buf_bytes(p->pool))
		return ckpt_err(-EINVAL, "snapshot pipe: chunk of %zu bytes %s (buffers hold %zu)",
		                n, dst ? "copied beside the pool's buffers" : "in place",
		                io_pool_buf_bytes(p->pool));
	if (p->count == p->cap)
		return -EAGAIN;
	struct pipe_slot *s = slot_new(p, mark, n, tag);
	if (hash)
		io_copy_hash128_blocks(dst, src, n, p->block_bytes, p->tree, s->hash, s->blocks);
	s->unhashed = !hash;
	p->count++;
	return 0;
}

int snapshot_pipe_issue_inplace(struct snapshot_pipe *p, const void *src, size_t n, bool hash,
                                uint64_t tag)
{
	return pipe_issue_unbuffered(p, SNAPSHOT_SRC_BUF, NULL, src, n, hash, tag);
}

int snapshot_pipe_issue_into(struct snapshot_pipe *p, void *dst, const void *src, size_t n,
                             uint64_t tag)
{
	if (!dst)
		return ckpt_err(-EINVAL, "snapshot pipe: chunk of %zu bytes copied into nowhere", n);
	return pipe_issue_unbuffered(p, SNAPSHOT_DST_BUF, dst, src, n, true, tag);
}

/* A pending chunk that holds a pool buffer (not stored, not in place, not copied
 * into the caller's memory). */
static bool slot_buffered(const struct pipe_slot *s)
{
	return s->buf != SNAPSHOT_NO_BUF && s->buf != SNAPSHOT_SRC_BUF && s->buf != SNAPSHOT_DST_BUF;
}

bool snapshot_pipe_room(const struct snapshot_pipe *p) { return p->count < p->cap; }
bool snapshot_pipe_head_stored(const struct snapshot_pipe *p)
{
	return p->count && p->slots[p->head].buf == SNAPSHOT_NO_BUF;
}

int snapshot_pipe_next(struct snapshot_pipe *p, unsigned *buf, size_t *len,
                       struct io_hashes *h, uint64_t *tag)
{
	if (!p->count)
		return ckpt_err(-ENOENT, "snapshot pipe: nothing pending");
	struct pipe_slot *s = &p->slots[p->head];
	bool unhashed = s->unhashed;
	if (s->device && p->nh) {
		/* Its helper waited for the copy and hashed it. */
		pthread_mutex_lock(&p->hlock);
		while (!s->hashed)
			pthread_cond_wait(&p->hdone, &p->hlock);
		int rc = s->hrc;
		if (rc)
			ckpt_err_restore(p->herr);
		pthread_mutex_unlock(&p->hlock);
		if (rc)
			return rc;
		s->device = false;
	} else if (s->device) {
		/* This chunk's event only: later copies keep running meanwhile. */
		int rc = snap_dev_wait(p->sn, s->ev);
		if (rc)
			return rc;
		/* Hashed from the pinned buffer after the copy landed, never on the device:
		 * the hashes must describe the bytes that go to the disk. */
		unhashed = p->leave_hashing;
		if (!unhashed)
			io_copy_hash128_blocks(NULL, io_pool_addr(p->pool, s->buf), s->len,
			                       p->block_bytes, p->tree, s->hash, s->blocks);
		s->device = false;
	}
	*buf = s->buf;
	*len = s->len;
	*tag = s->tag;
	if (unhashed) {
		memset(h, 0, sizeof *h);
	} else {
		memcpy(h->chunk, s->hash, CKPT_HASH_BYTES);
		h->block_bytes = s->no_blocks ? 0 : p->block_bytes;
		h->tree = p->tree;
		h->blocks = s->no_blocks ? NULL : s->blocks;
	}
	if (slot_buffered(s))
		p->buffered--;
	p->head = (p->head + 1) % p->cap;
	p->count--;
	return unhashed ? 1 : 0;
}

void snapshot_pipe_leave_hashing(struct snapshot_pipe *p)
{
	if (!p->nh) {
		p->leave_hashing = true;
		p->hwant = 0;
	}
}

int snapshot_pipe_stage(struct snapshot_pipe *p, const void *src, size_t n, int mem,
                        uint64_t off, size_t chunk_bytes, uint32_t flag, const void **staged)
{
	*staged = NULL;
	size_t room = snapshot_stage_room(p->sn);
	uint64_t nflags = chunk_bytes ? (n + chunk_bytes - 1) / chunk_bytes : 0;
	if (p->released || p->sealed || n == 0 || off % SNAPSHOT_STAGE_ALIGN || off > room ||
	    n > room - off || (mem != CKPT_MEM_HOST && mem != CKPT_MEM_DEVICE))
		return ckpt_err(-EINVAL, "staging pool: %zu bytes at offset %llu (it holds %zu)%s", n,
		                (unsigned long long)off, room,
		                p->released || p->sealed ? ", after the release" : "");
	if (chunk_bytes && (mem != CKPT_MEM_DEVICE || (uintptr_t)src % 16 || chunk_bytes % 4096 ||
	                    !snapshot_stage_can_diff(p->sn) || flag > SNAPSHOT_STAGE_FLAGS ||
	                    nflags > SNAPSHOT_STAGE_FLAGS - flag))
		return ckpt_err(-EINVAL, "staging pool: no comparison possible for %zu bytes at %p "
		                "(flags %u..%llu of %u)", n, src, flag,
		                (unsigned long long)(flag + nflags), SNAPSHOT_STAGE_FLAGS);
	int rc = pipe_prepare(p);
	if (!rc && chunk_bytes && !p->flags_cleared && !(rc = snap_dev_stage_clear(p->sn)))
		p->flags_cleared = true;
	if (!rc)
		rc = snap_dev_stage(p->sn, off, src, n, mem == CKPT_MEM_DEVICE, chunk_bytes, flag,
		                    staged);
	if (rc) {
		/* Copies queued before may still read the caller's memory. */
		snap_dev_quiesce(p->sn);
		return rc;
	}
	p->staged += n;
	if (chunk_bytes && flag + nflags > p->nflags)
		p->nflags = (uint32_t)(flag + nflags);
	return 0;
}

/* The snapshot event and landed(arg) once every copy queued so far has landed: in
 * device mode always an event, so that a caller's stream can wait on it whatever
 * its tensors were; with no device copies it completes at once and landed runs here. */
static int pipe_mark(struct snapshot_pipe *p, void **event, void (*landed)(void *), void *arg)
{
	if (!snapshot_has_device(p->sn)) {
		landed(arg);
		return 0;
	}
	bool queued = p->device_chunks || p->staged;
	/* The staging copies batched so far are launched before the event. */
	int rc = p->staged ? snap_dev_stage_flush(p->sn) : 0;
	if (rc) {
		snap_dev_quiesce(p->sn);
		return rc;
	}
	rc = snap_dev_seal(p->sn, event, queued ? landed : NULL, arg);
	if (rc == 0 && !queued)
		landed(arg);
	return rc;
}

int snapshot_pipe_release(struct snapshot_pipe *p, void **event, void (*landed)(void *),
                          void *arg)
{
	*event = NULL;
	if (p->released || p->sealed)
		return ckpt_err(-EINVAL, "snapshot pipe: released twice, or after the seal");
	p->released = true;
	return pipe_mark(p, event, landed, arg);
}

int snapshot_pipe_stage_changed(struct snapshot_pipe *p, uint32_t flag, bool *changed)
{
	*changed = true;
	if (flag >= p->nflags)
		return ckpt_err(-EINVAL, "staging pool: flag %u of %u compared", flag, p->nflags);
	if (!p->flags) {
		uint32_t *f = ckpt_malloc((size_t)p->nflags * sizeof *f);
		if (!f)
			return ckpt_err(-ENOMEM, "%u staging flags", p->nflags);
		int rc = snap_dev_stage_flags(p->sn, f, p->nflags);
		if (rc) {
			ckpt_free(f);
			return rc;
		}
		p->flags = f;
	}
	*changed = p->flags[flag] != 0;
	return 0;
}

int snapshot_pipe_seal(struct snapshot_pipe *p, void **event, void (*landed)(void *),
                       void *arg)
{
	*event = NULL;
	if (p->sealed)
		return ckpt_err(-EINVAL, "snapshot pipe: sealed twice");
	p->sealed = true;
	if (p->released)
		return 0;                 /* the event and landed came with the release */
	return pipe_mark(p, event, landed, arg);
}

void snapshot_pipe_close(struct snapshot_pipe *p)
{
	if (!p)
		return;
	/* Copies may still be landing in buffers we are about to give back, and the
	 * landed callback may still hold its argument: wait for both. */
	/* Helpers first: they may be hashing a buffer about to go back. */
	pipe_stop_hashers(p);
	if (p->device_chunks || p->sealed || p->staged || p->released)
		snap_dev_quiesce(p->sn);
	while (p->count) {
		if (slot_buffered(&p->slots[p->head]))
			io_pool_put(p->pool, p->slots[p->head].buf);
		p->head = (p->head + 1) % p->cap;
		p->count--;
	}
	ckpt_free(p->slots);
	ckpt_free(p->block_store);
	ckpt_free(p->flags);
	pthread_mutex_destroy(&p->hlock);
	pthread_cond_destroy(&p->hwork);
	pthread_cond_destroy(&p->hdone);
	ckpt_free(p);
}
