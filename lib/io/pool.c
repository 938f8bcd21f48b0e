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
 * A pool may have several classes of buffers, each smaller than the one before,
 * in the same mapping (io_pool_create_sized): a taker that knows its size asks for
 * one that fits (io_pool_get_fit), so that a chunk shorter than the largest (a
 * tensor's last piece, a bias) does not hold a buffer sized for the largest. The
 * classes' indices follow one another, the largest class first; everything that
 * takes an index (put, addr, io_pool_len, the engine's registration) serves every
 * class, while io_pool_get, io_pool_nbufs and io_pool_nfree speak of the largest
 * class only, which is what their callers size their work by.
 *
 * Threads: every function is thread-safe.
 */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "io/io_internal.h"

struct pool_class {
	size_t    bytes;          /* each buffer's */
	size_t    off;            /* the class's first buffer, from base */
	unsigned  first, n;       /* its indices: [first, first + n) */
	unsigned  nfree;
	unsigned *stack;          /* free indices: nfree entries valid */
};

struct io_pool {
	pthread_mutex_t   lock;
	pthread_cond_t    freed;
	uint8_t          *base;
	size_t            total;
	unsigned          nclass, nslots;
	struct pool_class cls[IO_POOL_MAX_CLASSES];   /* largest first */
	unsigned         *stacks;   /* the classes' free stacks, one allocation */
	bool             *owned;    /* owned[i]: buffer i is out of the pool */
	struct io_pool_alloc alloc; /* alloc.alloc NULL: our own mmap */
};

int io_pool_create(size_t buf_bytes, unsigned nbufs, const struct io_pool_alloc *alloc,
                   struct io_pool **out)
{
	struct io_pool_class c = { buf_bytes, nbufs };
	return io_pool_create_sized(&c, 1, alloc, out);
}

int io_pool_create_classes(size_t buf_bytes, unsigned nbufs, size_t small_bytes,
                           unsigned nsmall, const struct io_pool_alloc *alloc,
                           struct io_pool **out)
{
	struct io_pool_class c[2] = { { buf_bytes, nbufs }, { small_bytes, nsmall } };
	return io_pool_create_sized(c, nsmall ? 2 : 1, alloc, out);
}

/* Why halving classes: a tensor's last piece is anywhere from a few bytes to a
 * whole chunk; held in a buffer of the chunk's size it wastes up to all of one, and
 * a state of many tensors then fills the pool with a third more than its bytes (or,
 * where the pool is smaller than the state, keeps few of its bytes in it). With
 * classes a factor of two apart a chunk wastes less than half its buffer, and when
 * its class is empty it takes one of the next larger class that has one free, not a
 * whole chunk's. The smaller classes share a quarter of the pool, the same number
 * of buffers each (the last pieces of a state's tensors are about as often of one
 * size as of another); the largest class keeps the rest. A pool of a few large
 * buffers keeps every buffer for any chunk: there the classes would cost a large
 * buffer of the few. */
int io_pool_create_halving(size_t buf_bytes, uint64_t pool_bytes,
                           const struct io_pool_alloc *alloc, struct io_pool **out)
{
	*out = NULL;
	if (buf_bytes == 0 || pool_bytes / buf_bytes == 0 || pool_bytes / buf_bytes > UINT_MAX)
		return ckpt_err(-EINVAL, "io pool: %llu bytes in buffers of %zu",
		                (unsigned long long)pool_bytes, buf_bytes);
	struct io_pool_class cls[IO_POOL_MAX_CLASSES];
	unsigned ncls = 1;
	uint64_t per_round = 0;     /* bytes of one buffer of each smaller class */
	cls[0] = (struct io_pool_class){ buf_bytes, (unsigned)(pool_bytes / buf_bytes) };
	for (size_t b = buf_bytes / 2; ncls < IO_POOL_MAX_CLASSES; b /= 2) {
		size_t bytes = ckpt_align_up(b, CKPT_ALIGN);
		if (bytes < IO_POOL_HALVING_MIN || bytes >= cls[ncls - 1].bytes)
			break;
		cls[ncls++] = (struct io_pool_class){ bytes, 0 };
		per_round += bytes;
	}
	uint64_t nbig = (pool_bytes - pool_bytes / IO_POOL_HALVING_SHARE) / buf_bytes;
	if (ncls == 1 || nbig < IO_POOL_HALVING_MIN_BIG)
		return io_pool_create_sized(cls, 1, alloc, out);
	/* The smaller classes take what the largest leaves, as many rounds as fit, and
	 * no more buffers in all than io_uring registers. */
	uint64_t rounds = (pool_bytes - nbig * buf_bytes) / per_round;
	uint64_t max_rounds = nbig < IO_POOL_MAX_SLOTS ? (IO_POOL_MAX_SLOTS - nbig) / (ncls - 1) : 0;
	if (rounds > max_rounds) {
		rounds = max_rounds;
		nbig = (pool_bytes - rounds * per_round) / buf_bytes;
	}
	if (rounds == 0 || nbig > UINT_MAX)
		return io_pool_create_sized(cls, 1, alloc, out);
	cls[0].count = (unsigned)nbig;
	for (unsigned c = 1; c < ncls; c++)
		cls[c].count = (unsigned)rounds;
	return io_pool_create_sized(cls, ncls, alloc, out);
}

/* ------------------------------------------------------------------ memory at hand
 * A pool is faulted in whole when it is made (io_map_buffers), so one larger than
 * the memory this process may still use does not fail later and alone: the kernel's
 * OOM killer picks a process, ours or another of the machine's, while the pages come
 * in. So the pool is refused at once where that is known: the machine's
 * MemAvailable, and every memory cgroup limit above this process less what the
 * cgroup uses (cgroup v2 memory.max and memory.current; v1 memory.limit_in_bytes
 * and memory.usage_in_bytes), the least of them. */

#define MEM_UNLIMITED (UINT64_C(1) << 60)   /* v1 says "no limit" with about 2^63 */

/* The first unsigned number of file path (after prefix, where given: a line that
 * starts with it), into *v; false where there is none ("max" included). */
static bool read_u64(const char *path, const char *prefix, uint64_t *v)
{
	FILE *f = fopen(path, "re");
	if (!f)
		return false;
	char line[256];
	bool ok = false;
	size_t n = prefix ? strlen(prefix) : 0;
	while (!ok && fgets(line, sizeof line, f))
		if (!prefix || !strncmp(line, prefix, n))
			ok = sscanf(line + n, " %" SCNu64, v) == 1;
	fclose(f);
	return ok;
}

/* Fold into *avail the room of the cgroup top/rel and of each one above it, up to
 * the hierarchy's mount point top; why names the least. */
static void cgroup_room(const char *top, const char *rel, const char *limit_file,
                        const char *usage_file, uint64_t *avail, char *why, size_t cap)
{
	char dir[PATH_MAX];
	if (snprintf(dir, sizeof dir, "%s%s", top, rel) >= (int)sizeof dir)
		return;
	size_t toplen = strlen(top);
	for (unsigned depth = 0; depth < 64; depth++) {
		char lp[PATH_MAX + 32], up[PATH_MAX + 32];
		uint64_t limit, used;
		snprintf(lp, sizeof lp, "%s/%s", dir, limit_file);
		snprintf(up, sizeof up, "%s/%s", dir, usage_file);
		if (read_u64(lp, NULL, &limit) && limit < MEM_UNLIMITED &&
		    read_u64(up, NULL, &used)) {
			uint64_t room = used < limit ? limit - used : 0;
			if (room < *avail) {
				*avail = room;
				snprintf(why, cap, "%s %" PRIu64 " less %" PRIu64 " in use", lp, limit, used);
			}
		}
		char *slash = strrchr(dir, '/');
		if (!slash || (size_t)(slash - dir) < toplen)
			break;
		*slash = '\0';
	}
}

/* What this process may still fault in, and which figure says so, into why; false
 * where nothing is known. */
static bool memory_at_hand(uint64_t *avail, char *why, size_t cap)
{
	uint64_t kib;
	*avail = UINT64_MAX;
	if (read_u64("/proc/meminfo", "MemAvailable:", &kib) && kib < UINT64_MAX / 1024) {
		*avail = kib * 1024;
		snprintf(why, cap, "MemAvailable in /proc/meminfo");
	}
	FILE *f = fopen("/proc/self/cgroup", "re");
	char line[PATH_MAX + 64];
	while (f && fgets(line, sizeof line, f)) {
		line[strcspn(line, "\n")] = '\0';
		char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
		if (!c2 || c2[1] != '/')
			continue;
		*c2 = '\0';
		const char *ctrl = c1 + 1, *rel = c2 + 1;
		if (!strcmp(line, "0") && !*ctrl) {
			cgroup_room("/sys/fs/cgroup", rel, "memory.max", "memory.current", avail, why,
			            cap);
		} else {
			/* v1: "memory" among the line's controllers */
			for (const char *t = ctrl; *t;) {
				size_t n = strcspn(t, ",");
				if (n == 6 && !strncmp(t, "memory", 6))
					cgroup_room("/sys/fs/cgroup/memory", rel, "memory.limit_in_bytes",
					            "memory.usage_in_bytes", avail, why, cap);
				t += n + (t[n] == ',');
			}
		}
	}
	if (f)
		fclose(f);
	return *avail != UINT64_MAX;
}

static void pool_free_tables(struct io_pool *p)
{
	ckpt_free(p->stacks);
	ckpt_free(p->owned);
	ckpt_free(p);
}

int io_pool_create_sized(const struct io_pool_class *cls, unsigned ncls,
                         const struct io_pool_alloc *alloc, struct io_pool **out)
{
	*out = NULL;
	if (ncls == 0 || ncls > IO_POOL_MAX_CLASSES)
		return ckpt_err(-EINVAL, "io pool: %u buffer classes (1 to %u)", ncls,
		                IO_POOL_MAX_CLASSES);
	uint64_t total = 0, slots = 0;
	for (unsigned c = 0; c < ncls; c++) {
		uint64_t bytes;
		if (cls[c].bytes == 0 || cls[c].bytes % CKPT_ALIGN || cls[c].count == 0 ||
		    (c && cls[c].bytes >= cls[c - 1].bytes) ||
		    !ckpt_mul_u64(cls[c].bytes, cls[c].count, &bytes) ||
		    !ckpt_add_u64(total, bytes, &total) || total > SIZE_MAX ||
		    (slots += cls[c].count) > INT_MAX)
			return ckpt_err(-EINVAL, "io pool: class %u of %u buffers of %zu bytes (each "
			                "class needs buffers, a non-zero multiple of %u bytes, each "
			                "smaller than the class before)", c, cls[c].count, cls[c].bytes,
			                CKPT_ALIGN);
	}
	uint64_t avail;
	char why[PATH_MAX + 96] = "";
	if (memory_at_hand(&avail, why, sizeof why) && total > avail)
		return ckpt_err(-ENOMEM, "io pool of %" PRIu64 " bytes: more than this process may "
		                "still use (%" PRIu64 " bytes: %s); the pool is faulted in whole "
		                "when it is made", total, avail, why);
	struct io_pool *p = ckpt_calloc(1, sizeof *p);
	if (!p)
		return ckpt_err(-ENOMEM, "io pool");
	p->total = (size_t)total;
	p->nclass = ncls;
	p->nslots = (unsigned)slots;
	p->stacks = ckpt_calloc(p->nslots, sizeof *p->stacks);
	p->owned = ckpt_calloc(p->nslots, sizeof *p->owned);
	if (alloc && alloc->alloc)
		p->alloc = *alloc;
	if (!p->stacks || !p->owned)
		goto nomem;
	size_t off = 0;
	unsigned first = 0;
	for (unsigned c = 0; c < ncls; c++) {
		struct pool_class *k = &p->cls[c];
		*k = (struct pool_class){ .bytes = cls[c].bytes, .off = off, .first = first,
		                          .n = cls[c].count, .nfree = cls[c].count,
		                          .stack = p->stacks + first };
		/* Hand out low indices first: tests and logs read more easily. */
		for (unsigned i = 0; i < k->n; i++)
			k->stack[i] = first + k->n - 1 - i;
		off += (size_t)k->n * k->bytes;
		first += k->n;
	}
	if (p->alloc.alloc) {
		p->base = p->alloc.alloc(p->total, p->alloc.arg);
		if (p->base && (uintptr_t)p->base % CKPT_ALIGN) {
			p->alloc.free(p->base, p->total, p->alloc.arg);
			pool_free_tables(p);
			return ckpt_err(-EINVAL, "io pool: allocator returned unaligned memory");
		}
	} else {
		p->base = io_map_buffers(p->total);
	}
	if (!p->base)
		goto nomem;
	pthread_mutex_init(&p->lock, NULL);
	ckpt_cond_init(&p->freed);
	*out = p;
	return 0;
nomem:
	pool_free_tables(p);
	return ckpt_err(-ENOMEM, "io pool: %u buffers of %zu bytes in %u class(es), %llu bytes",
	                (unsigned)slots, cls[0].bytes, ncls, (unsigned long long)total);
}

static unsigned pool_nfree_all(const struct io_pool *p)
{
	unsigned n = 0;
	for (unsigned c = 0; c < p->nclass; c++)
		n += p->cls[c].nfree;
	return n;
}

void io_pool_destroy(struct io_pool *p)
{
	if (!p)
		return;
	unsigned nfree = pool_nfree_all(p);
	if (nfree != p->nslots)
		ckpt_log(CKPT_LOG_ERROR, "io pool: destroyed with %u of %u buffers still out",
		         p->nslots - nfree, p->nslots);
	if (p->alloc.alloc)
		p->alloc.free(p->base, p->total, p->alloc.arg);
	else
		io_unmap_buffers(p->base, p->total);
	pthread_cond_destroy(&p->freed);
	pthread_mutex_destroy(&p->lock);
	pool_free_tables(p);
}

/* The smallest class with a free buffer among classes [0, fit] (those whose
 * buffers hold what the taker needs), or -1. Under lock. */
static int pool_class_free(const struct io_pool *p, unsigned fit)
{
	for (int c = (int)fit; c >= 0; c--)
		if (p->cls[c].nfree)
			return c;
	return -1;
}

/* Take a buffer of class fit or, where none is free, of the smallest larger class
 * that has one; wait up to timeout_ms while none of them has. */
static int pool_take(struct io_pool *p, unsigned fit, int timeout_ms)
{
	uint64_t deadline = ckpt_deadline_ms(timeout_ms);
	pthread_mutex_lock(&p->lock);
	int c;
	while ((c = pool_class_free(p, fit)) < 0) {
		if (ckpt_cond_wait_until(&p->freed, &p->lock, deadline) == ETIMEDOUT &&
		    (c = pool_class_free(p, fit)) < 0) {
			pthread_mutex_unlock(&p->lock);
			return -ETIMEDOUT;
		}
	}
	struct pool_class *k = &p->cls[c];
	unsigned idx = k->stack[--k->nfree];
	p->owned[idx] = true;
	pthread_mutex_unlock(&p->lock);
	return (int)idx;
}

int io_pool_get(struct io_pool *p, int timeout_ms)
{
	return pool_take(p, 0, timeout_ms);
}

/* The class of buffer idx (idx < nslots). */
static unsigned pool_class_of(const struct io_pool *p, unsigned idx)
{
	unsigned c = p->nclass - 1;
	while (c > 0 && idx < p->cls[c].first)
		c--;
	return c;
}

void io_pool_put(struct io_pool *p, unsigned idx)
{
	pthread_mutex_lock(&p->lock);
	if (idx >= p->nslots || !p->owned[idx]) {
		pthread_mutex_unlock(&p->lock);
		ckpt_log(CKPT_LOG_ERROR, "io pool: buffer %u put back but not taken "
		         "(double put or bad index; ignored)", idx);
#ifndef NDEBUG
		abort();
#endif
		return;
	}
	p->owned[idx] = false;
	struct pool_class *k = &p->cls[pool_class_of(p, idx)];
	k->stack[k->nfree++] = idx;
	/* Takers of any class may wait: wake them all, each looks at its own. */
	pthread_cond_broadcast(&p->freed);
	pthread_mutex_unlock(&p->lock);
}

int io_pool_take_all(struct io_pool *p, uint8_t **base)
{
	pthread_mutex_lock(&p->lock);
	if (pool_nfree_all(p) != p->nslots) {
		pthread_mutex_unlock(&p->lock);
		return -EBUSY;
	}
	for (unsigned c = 0; c < p->nclass; c++)
		p->cls[c].nfree = 0;
	for (unsigned i = 0; i < p->nslots; i++)
		p->owned[i] = true;
	pthread_mutex_unlock(&p->lock);
	*base = p->base;
	return 0;
}

void io_pool_put_all(struct io_pool *p)
{
	for (unsigned i = p->nslots; i-- > 0;)    /* low indices handed out first again */
		io_pool_put(p, i);
}

/* The smallest class whose buffers hold n bytes padded: a short chunk never waits
 * for a large buffer while a smaller one that holds it is free, nor for its own
 * class while a larger one is free. */
int io_pool_get_fit(struct io_pool *p, size_t n, int timeout_ms)
{
	size_t need = ckpt_align_up(n ? n : 1, CKPT_ALIGN);
	unsigned fit = p->nclass - 1;
	while (fit > 0 && p->cls[fit].bytes < need)
		fit--;
	return pool_take(p, fit, timeout_ms);
}

void *io_pool_addr(const struct io_pool *p, unsigned idx)
{
	if (idx >= p->nslots)
		return NULL;
	const struct pool_class *k = &p->cls[pool_class_of(p, idx)];
	return p->base + k->off + (size_t)(idx - k->first) * k->bytes;
}

size_t io_pool_len(const struct io_pool *p, unsigned idx)
{
	return idx < p->nslots ? p->cls[pool_class_of(p, idx)].bytes : 0;
}

unsigned io_pool_nslots(const struct io_pool *p) { return p->nslots; }

unsigned io_pool_nclasses(const struct io_pool *p) { return p->nclass; }

int io_pool_class_info(struct io_pool *p, unsigned c, struct io_pool_class *out,
                       unsigned *nfree)
{
	if (c >= p->nclass)
		return -EINVAL;
	pthread_mutex_lock(&p->lock);
	*out = (struct io_pool_class){ p->cls[c].bytes, p->cls[c].n };
	if (nfree)
		*nfree = p->cls[c].nfree;
	pthread_mutex_unlock(&p->lock);
	return 0;
}

uint64_t io_pool_bytes_out(struct io_pool *p)
{
	uint64_t n = 0;
	pthread_mutex_lock(&p->lock);
	for (unsigned c = 0; c < p->nclass; c++)
		n += (uint64_t)(p->cls[c].n - p->cls[c].nfree) * p->cls[c].bytes;
	pthread_mutex_unlock(&p->lock);
	return n;
}

uint64_t io_pool_bytes(const struct io_pool *p) { return p->total; }

size_t io_pool_buf_bytes(const struct io_pool *p) { return p->cls[0].bytes; }
unsigned io_pool_nbufs(const struct io_pool *p) { return p->cls[0].n; }

unsigned io_pool_nfree(struct io_pool *p)
{
	pthread_mutex_lock(&p->lock);
	unsigned n = p->cls[0].nfree;
	pthread_mutex_unlock(&p->lock);
	return n;
}

int io_pool_index_of(const struct io_pool *p, const void *addr, size_t len)
{
	uintptr_t a = (uintptr_t)addr, b = (uintptr_t)p->base;
	if (a < b || a - b >= p->total)
		return -1;
	size_t at = (size_t)(a - b);
	unsigned c = p->nclass - 1;
	while (c > 0 && at < p->cls[c].off)
		c--;
	const struct pool_class *k = &p->cls[c];
	size_t idx = (at - k->off) / k->bytes, in = (at - k->off) % k->bytes;
	return len <= k->bytes - in ? (int)(k->first + idx) : -1;
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
