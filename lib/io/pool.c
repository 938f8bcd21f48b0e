/*
 * pool.c — the staging buffer pool: nbufs buffers of buf_bytes in ONE mapping, so
 * that io_uring can register them as fixed buffers and a CUDA allocator can pin
 * them with one call (docs/gpu.md, "Design (lib/snapshot)").
 *
 * A buffer has exactly one owner at a time (snapshot copy, writer, engine, reader);
 * ownership passes with the index. The free list is a stack under a mutex, and a
 * condition variable wakes takers when a buffer comes back. Each buffer carries an
 * "owned" bit so that a double put, which would hand one buffer to two owners, is
 * caught at the put: it aborts in debug builds and is logged and ignored otherwise.
 *
 * A pool may have a second class of smaller buffers after the large ones, in the
 * same mapping (io_pool_create_classes): a taker that knows its size asks for one
 * that fits (io_pool_get_fit), so that a small chunk does not hold a buffer sized
 * for the largest. The small buffers' indices follow the large ones'; everything
 * that takes an index (put, addr, io_pool_len, the engine's registration) serves
 * both classes, while io_pool_get, io_pool_nbufs and io_pool_nfree speak of the
 * large class only, which is what their callers size their work by.
 *
 * Threads: every function is thread-safe.
 */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "io/io_internal.h"

struct io_pool {
	pthread_mutex_t lock;
	pthread_cond_t  freed;
	uint8_t        *base;
	size_t          buf_bytes, small_bytes, total;
	unsigned        nbufs, nfree;
	unsigned        nsmall, nsfree;
	unsigned       *free_stack;     /* nfree entries valid */
	unsigned       *sfree_stack;    /* the small class's: nsfree entries valid */
	bool           *owned;          /* owned[i]: buffer i is out of the pool */
	struct io_pool_alloc alloc;     /* alloc.alloc NULL: our own mmap */
};

int io_pool_create(size_t buf_bytes, unsigned nbufs, const struct io_pool_alloc *alloc,
                   struct io_pool **out)
{
	return io_pool_create_classes(buf_bytes, nbufs, 0, 0, alloc, out);
}

int io_pool_create_classes(size_t buf_bytes, unsigned nbufs, size_t small_bytes,
                           unsigned nsmall, const struct io_pool_alloc *alloc,
                           struct io_pool **out)
{
	*out = NULL;
	uint64_t total, stotal = 0;
	if (buf_bytes == 0 || buf_bytes % CKPT_ALIGN || nbufs == 0 ||
	    !ckpt_mul_u64(buf_bytes, nbufs, &total) || total > SIZE_MAX)
		return ckpt_err(-EINVAL, "io pool: %u buffers of %zu bytes (need a non-zero "
		                "multiple of %u)", nbufs, buf_bytes, CKPT_ALIGN);
	if (nsmall && (small_bytes == 0 || small_bytes % CKPT_ALIGN || small_bytes >= buf_bytes ||
	               nsmall > UINT_MAX - nbufs || !ckpt_mul_u64(small_bytes, nsmall, &stotal) ||
	               total + stotal > SIZE_MAX))
		return ckpt_err(-EINVAL, "io pool: %u small buffers of %zu bytes beside buffers of "
		                "%zu (need a non-zero multiple of %u, smaller)", nsmall, small_bytes,
		                buf_bytes, CKPT_ALIGN);
	struct io_pool *p = ckpt_calloc(1, sizeof *p);
	if (!p)
		return ckpt_err(-ENOMEM, "io pool");
	p->buf_bytes = buf_bytes;
	p->small_bytes = nsmall ? small_bytes : 0;
	p->total = (size_t)(total + stotal);
	p->nbufs = p->nfree = nbufs;
	p->nsmall = p->nsfree = nsmall;
	p->free_stack = ckpt_calloc(nbufs, sizeof *p->free_stack);
	p->sfree_stack = ckpt_calloc(nsmall ? nsmall : 1, sizeof *p->sfree_stack);
	p->owned = ckpt_calloc((size_t)nbufs + nsmall, sizeof *p->owned);
	if (alloc && alloc->alloc)
		p->alloc = *alloc;
	if (!p->free_stack || !p->sfree_stack || !p->owned)
		goto nomem;
	if (p->alloc.alloc) {
		p->base = p->alloc.alloc(p->total, p->alloc.arg);
		if (p->base && (uintptr_t)p->base % CKPT_ALIGN) {
			p->alloc.free(p->base, p->total, p->alloc.arg);
			ckpt_free(p->free_stack);
			ckpt_free(p->sfree_stack);
			ckpt_free(p->owned);
			ckpt_free(p);
			return ckpt_err(-EINVAL, "io pool: allocator returned unaligned memory");
		}
	} else {
		p->base = io_map_buffers(p->total);
	}
	if (!p->base)
		goto nomem;
	/* Hand out low indices first: tests and logs read more easily. */
	for (unsigned i = 0; i < nbufs; i++)
		p->free_stack[i] = nbufs - 1 - i;
	for (unsigned i = 0; i < nsmall; i++)
		p->sfree_stack[i] = nbufs + nsmall - 1 - i;
	pthread_mutex_init(&p->lock, NULL);
	ckpt_cond_init(&p->freed);
	*out = p;
	return 0;
nomem:
	ckpt_free(p->free_stack);
	ckpt_free(p->sfree_stack);
	ckpt_free(p->owned);
	ckpt_free(p);
	return ckpt_err(-ENOMEM, "io pool: %u buffers of %zu bytes", nbufs, buf_bytes);
}

void io_pool_destroy(struct io_pool *p)
{
	if (!p)
		return;
	if (p->nfree != p->nbufs || p->nsfree != p->nsmall)
		ckpt_log(CKPT_LOG_ERROR, "io pool: destroyed with %u of %u buffers still out",
		         p->nbufs + p->nsmall - p->nfree - p->nsfree, p->nbufs + p->nsmall);
	if (p->alloc.alloc)
		p->alloc.free(p->base, p->total, p->alloc.arg);
	else
		io_unmap_buffers(p->base, p->total);
	pthread_cond_destroy(&p->freed);
	pthread_mutex_destroy(&p->lock);
	ckpt_free(p->free_stack);
	ckpt_free(p->sfree_stack);
	ckpt_free(p->owned);
	ckpt_free(p);
}

int io_pool_get(struct io_pool *p, int timeout_ms)
{
	uint64_t deadline = ckpt_deadline_ms(timeout_ms);
	pthread_mutex_lock(&p->lock);
	while (p->nfree == 0) {
		if (ckpt_cond_wait_until(&p->freed, &p->lock, deadline) == ETIMEDOUT &&
		    p->nfree == 0) {
			pthread_mutex_unlock(&p->lock);
			return -ETIMEDOUT;
		}
	}
	unsigned idx = p->free_stack[--p->nfree];
	p->owned[idx] = true;
	pthread_mutex_unlock(&p->lock);
	return (int)idx;
}

void io_pool_put(struct io_pool *p, unsigned idx)
{
	pthread_mutex_lock(&p->lock);
	if (idx >= p->nbufs + p->nsmall || !p->owned[idx]) {
		pthread_mutex_unlock(&p->lock);
		ckpt_log(CKPT_LOG_ERROR, "io pool: buffer %u put back but not taken "
		         "(double put or bad index; ignored)", idx);
#ifndef NDEBUG
		abort();
#endif
		return;
	}
	p->owned[idx] = false;
	if (idx < p->nbufs)
		p->free_stack[p->nfree++] = idx;
	else
		p->sfree_stack[p->nsfree++] = idx;
	/* Takers of either class may wait: wake them all, each looks at its own. */
	pthread_cond_broadcast(&p->freed);
	pthread_mutex_unlock(&p->lock);
}

/* A small buffer where one fits and is free, else a large one: a small chunk never
 * waits for a large buffer while a small one is free, nor for a small one while a
 * large one is. */
int io_pool_get_fit(struct io_pool *p, size_t n, int timeout_ms)
{
	if (!p->nsmall || ckpt_align_up(n ? n : 1, CKPT_ALIGN) > p->small_bytes)
		return io_pool_get(p, timeout_ms);
	uint64_t deadline = ckpt_deadline_ms(timeout_ms);
	pthread_mutex_lock(&p->lock);
	while (p->nsfree == 0 && p->nfree == 0) {
		if (ckpt_cond_wait_until(&p->freed, &p->lock, deadline) == ETIMEDOUT &&
		    p->nsfree == 0 && p->nfree == 0) {
			pthread_mutex_unlock(&p->lock);
			return -ETIMEDOUT;
		}
	}
	unsigned idx = p->nsfree ? p->sfree_stack[--p->nsfree] : p->free_stack[--p->nfree];
	p->owned[idx] = true;
	pthread_mutex_unlock(&p->lock);
	return (int)idx;
}

void *io_pool_addr(const struct io_pool *p, unsigned idx)
{
	if (idx < p->nbufs)
		return p->base + (size_t)idx * p->buf_bytes;
	if (idx - p->nbufs < p->nsmall)
		return p->base + (size_t)p->nbufs * p->buf_bytes +
		       (size_t)(idx - p->nbufs) * p->small_bytes;
	return NULL;
}

size_t io_pool_len(const struct io_pool *p, unsigned idx)
{
	return idx < p->nbufs ? p->buf_bytes : idx - p->nbufs < p->nsmall ? p->small_bytes : 0;
}

unsigned io_pool_nslots(const struct io_pool *p) { return p->nbufs + p->nsmall; }

uint64_t io_pool_bytes_out(struct io_pool *p)
{
	pthread_mutex_lock(&p->lock);
	uint64_t n = (uint64_t)(p->nbufs - p->nfree) * p->buf_bytes +
	             (uint64_t)(p->nsmall - p->nsfree) * p->small_bytes;
	pthread_mutex_unlock(&p->lock);
	return n;
}

uint64_t io_pool_bytes(const struct io_pool *p) { return p->total; }

size_t io_pool_buf_bytes(const struct io_pool *p) { return p->buf_bytes; }
unsigned io_pool_nbufs(const struct io_pool *p) { return p->nbufs; }

unsigned io_pool_nfree(struct io_pool *p)
{
	pthread_mutex_lock(&p->lock);
	unsigned n = p->nfree;
	pthread_mutex_unlock(&p->lock);
	return n;
}

int io_pool_index_of(const struct io_pool *p, const void *addr, size_t len)
{
	uintptr_t a = (uintptr_t)addr, b = (uintptr_t)p->base;
	if (a < b || a - b >= p->total)
		return -1;
	size_t big = (size_t)p->nbufs * p->buf_bytes;
	if (a - b < big) {
		size_t idx = (a - b) / p->buf_bytes, in = (a - b) % p->buf_bytes;
		return len <= p->buf_bytes - in ? (int)idx : -1;
	}
	size_t idx = (a - b - big) / p->small_bytes, in = (a - b - big) % p->small_bytes;
	return len <= p->small_bytes - in ? (int)(p->nbufs + idx) : -1;
}

#define HUGE_BYTES ((size_t)2 << 20)

static void prefault(void *m, size_t bytes)
{
#ifdef MADV_POPULATE_WRITE
	if (madvise(m, bytes, MADV_POPULATE_WRITE) == 0)
		return;
#endif
	for (size_t o = 0; o < bytes; o += CKPT_ALIGN)
		((volatile uint8_t *)m)[o] = 0;
}

void *io_map_buffers(size_t bytes)
{
	if (!bytes || bytes % CKPT_ALIGN || bytes > SIZE_MAX - HUGE_BYTES)
		return NULL;
	/* Map a huge page more and trim both ends, so that the buffers start on a huge
	 * page boundary whatever the kernel's placement. */
	size_t span = bytes >= HUGE_BYTES ? bytes + HUGE_BYTES : bytes;
	uint8_t *m = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (m == MAP_FAILED)
		return NULL;
	uint8_t *base = m;
	if (span != bytes) {
		base = (uint8_t *)ckpt_align_up((uintptr_t)m, HUGE_BYTES);
		if (base > m)
			munmap(m, (size_t)(base - m));
		if (m + span > base + bytes)
			munmap(base + bytes, (size_t)(m + span - (base + bytes)));
	}
	/* Huge pages (advice only: THP may be off): a direct I/O of a whole buffer then
	 * needs a few segments, not one per 4 KiB page — the block layer caps a request
	 * at max_segments (often 128 or 254) segments, so with small pages a 16 MiB read
	 * is split into ~1 MiB requests; and there are fewer pages to fault and pin. */
	madvise(base, bytes, MADV_HUGEPAGE);
	/* Faulted in now, so that neither the first save nor RSS accounting pays later. */
	prefault(base, bytes);
	return base;
}

void io_unmap_buffers(void *m, size_t bytes)
{
	if (m)
		munmap(m, bytes);
}

void *io_aligned_alloc(size_t bytes)
{
	void *m = NULL;
	if (ckpt_posix_memalign(&m, CKPT_ALIGN, ckpt_align_up(bytes ? bytes : 1, CKPT_ALIGN)))
		return NULL;
	return m;
}
