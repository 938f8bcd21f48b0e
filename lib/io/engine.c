/*
 * engine.c — the io_uring engine under the shard writer and reader.
 *
 * One ring of `depth` entries and a table of `depth` request slots; a request's
 * slot number is its user_data. The engine owns the hard parts of the ring so its
 * users do not: a short transfer is resubmitted for the remainder (O_DIRECT
 * writes can be cut short, e.g. near ENOSPC or a file size limit), resuming at the
 * last 4 KiB boundary reached so that O_DIRECT alignment holds; -EAGAIN/-EINTR
 * are retried; and
 * each request's done callback runs exactly once with the total or -errno.
 * liburing's -errno returns are the engine's own convention, so they pass through.
 *
 * The pool's buffers are registered as fixed buffers when the kernel allows it
 * (it can refuse: RLIMIT_MEMLOCK, old kernels); requests whose memory lies inside
 * one pool buffer then use READ_FIXED/WRITE_FIXED, which saves the per-I/O page
 * pinning. Other memory (footer, oversized chunks) uses plain reads and writes.
 *
 * Threads: an engine belongs to one thread at a time (io.h).
 */
#include <errno.h>
#include <liburing.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include "io/io_internal.h"

#define IO_MAX_SQE_BYTES  (1u << 30)   /* the kernel caps one rw at ~2 GiB anyway */
#define IO_MAX_RETRIES    10000u       /* -EAGAIN forever means something is wrong */
#define IO_MAX_STALLS     8u           /* short writes without aligned progress */
#define IO_IGNORE_DATA    UINT64_MAX   /* user_data of a neutralised sqe */

struct io_req {
	bool       busy;
	enum io_op op;
	int        fd;
	int        fixed;         /* registered buffer index, or -1 */
	uint8_t   *addr;
	size_t     len, done;
	uint64_t   off;
	unsigned   retries, stalls;
	bool       aligned;       /* addr, off and len all multiples of CKPT_ALIGN */
	io_done_fn fn;
	void      *owner;
	uint64_t   cookie;
};

struct io_engine {
	struct io_uring ring;
	struct io_pool *pool;
	bool            registered;
	bool            offload;        /* IOSQE_ASYNC on every request */
	unsigned        depth, inflight, nfree;
	uint64_t        finished;       /* requests whose done has run */
	struct io_req  *reqs;
	unsigned       *free_slots;
};

int io_engine_create(struct io_pool *pool, unsigned depth, struct io_engine **out)
{
	*out = NULL;
	if (depth == 0 || depth > 4096)
		return ckpt_err(-EINVAL, "io engine: depth %u outside [1, 4096]", depth);
	struct io_engine *e = ckpt_calloc(1, sizeof *e);
	if (!e)
		return ckpt_err(-ENOMEM, "io engine");
	e->pool = pool;
	e->depth = e->nfree = depth;
	e->reqs = ckpt_calloc(depth, sizeof *e->reqs);
	e->free_slots = ckpt_calloc(depth, sizeof *e->free_slots);
	if (!e->reqs || !e->free_slots) {
		ckpt_free(e->reqs);
		ckpt_free(e->free_slots);
		ckpt_free(e);
		return ckpt_err(-ENOMEM, "io engine");
	}
	for (unsigned i = 0; i < depth; i++)
		e->free_slots[i] = depth - 1 - i;
	/* The CQ is twice the SQ by default: with at most depth requests in flight it
	 * cannot overflow. */
	int rc = io_uring_queue_init(depth, &e->ring, 0);
	if (rc < 0) {
		ckpt_free(e->reqs);
		ckpt_free(e->free_slots);
		ckpt_free(e);
		return ckpt_err(rc == -EPERM ? -ENOSYS : rc, "io engine: io_uring_queue_init(%u)",
		                depth);
	}
	if (pool) {
		unsigned n = io_pool_nslots(pool);
		struct iovec *iov = ckpt_calloc(n, sizeof *iov);
		rc = -ENOMEM;
		if (iov) {
			for (unsigned i = 0; i < n; i++) {
				iov[i].iov_base = io_pool_addr(pool, i);
				iov[i].iov_len = io_pool_len(pool, i);
			}
			rc = io_uring_register_buffers(&e->ring, iov, n);
			ckpt_free(iov);
		}
		e->registered = rc == 0;
		if (!e->registered)
			ckpt_log(CKPT_LOG_INFO, "io engine: fixed buffers not registered (%s); "
			         "using plain reads and writes", ckpt_strerror(rc));
	}
	*out = e;
	return 0;
}

void io_engine_destroy(struct io_engine *e)
{
	if (!e)
		return;
	/* Requests still in flight would complete into freed memory: drain them. */
	while (e->inflight)
		if (io_engine_reap(e, true) < 0)
			break;
	io_uring_queue_exit(&e->ring);
	ckpt_free(e->reqs);
	ckpt_free(e->free_slots);
	ckpt_free(e);
}

struct io_pool *io_engine_pool(const struct io_engine *e) { return e->pool; }
unsigned io_engine_inflight(const struct io_engine *e) { return e->inflight; }
unsigned io_engine_depth(const struct io_engine *e) { return e->depth; }

/* The ring's caps on its kernel workers: [0] bounded (regular files, block
 * devices), [1] unbounded (the rest); set where non-zero, and read back. */
static int iowq_caps(struct io_engine *e, unsigned cap[2])
{
	int rc = io_uring_register_iowq_max_workers(&e->ring, cap);
	return rc < 0 ? rc : 0;
}

int io_engine_workers(struct io_engine *e, unsigned out[2])
{
	out[0] = out[1] = 0;   /* zeros ask, and change nothing */
	return iowq_caps(e, out);
}

int io_engine_offload(struct io_engine *e, unsigned workers)
{
	e->offload = true;
	return iowq_caps(e, (unsigned[2]){ workers, workers });
}

/* Prepare and submit the remaining part of request slot. 0 or -errno (then the
 * sqe has been turned into an ignored no-op). */
static int req_submit(struct io_engine *e, unsigned slot)
{
	struct io_req *r = &e->reqs[slot];
	struct io_uring_sqe *sqe = io_uring_get_sqe(&e->ring);
	if (!sqe) {
		/* Only sqes we failed to submit can fill the SQ; push them out first. */
		io_uring_submit(&e->ring);
		sqe = io_uring_get_sqe(&e->ring);
		if (!sqe)
			return -EBUSY;
	}
	size_t left = r->len - r->done;
	unsigned n = left > IO_MAX_SQE_BYTES ? IO_MAX_SQE_BYTES : (unsigned)left;
	uint8_t *a = r->addr + r->done;
	uint64_t off = r->off + r->done;
	if (r->op == IO_OP_FSYNC) {
		io_uring_prep_fsync(sqe, r->fd, 0);
	} else if (r->op == IO_OP_WRITE) {
		if (r->fixed >= 0)
			io_uring_prep_write_fixed(sqe, r->fd, a, n, off, r->fixed);
		else
			io_uring_prep_write(sqe, r->fd, a, n, off);
	} else {
		if (r->fixed >= 0)
			io_uring_prep_read_fixed(sqe, r->fd, a, n, off, r->fixed);
		else
			io_uring_prep_read(sqe, r->fd, a, n, off);
	}
	io_uring_sqe_set_data64(sqe, slot);
	if (e->offload)
		sqe->flags |= IOSQE_ASYNC;
	int rc;
	do
		rc = io_uring_submit(&e->ring);
	while (rc == -EINTR);
	if (rc < 0) {
		io_uring_prep_nop(sqe);
		io_uring_sqe_set_data64(sqe, IO_IGNORE_DATA);
		return rc;
	}
	return 0;
}

int io_engine_queue(struct io_engine *e, enum io_op op, int fd, void *addr, size_t len,
                    uint64_t off, io_done_fn done, void *owner, uint64_t cookie)
{
	while (e->nfree == 0) {
		int rc = io_engine_reap(e, true);
		if (rc < 0)
			return rc;
	}
	unsigned slot = e->free_slots[--e->nfree];
	struct io_req *r = &e->reqs[slot];
	*r = (struct io_req){
		.busy = true, .op = op, .fd = fd, .addr = addr, .len = len, .off = off,
		.fn = done, .owner = owner, .cookie = cookie, .fixed = -1,
	};
	r->aligned = (uintptr_t)addr % CKPT_ALIGN == 0 && off % CKPT_ALIGN == 0 &&
	             len % CKPT_ALIGN == 0;
	if (e->registered && e->pool && op != IO_OP_FSYNC)
		r->fixed = io_pool_index_of(e->pool, addr, len);
	int rc = req_submit(e, slot);
	if (rc < 0) {
		r->busy = false;
		e->free_slots[e->nfree++] = slot;
		return rc;
	}
	e->inflight++;
	return 0;
}

static void req_finish(struct io_engine *e, unsigned slot, int64_t res)
{
	struct io_req *r = &e->reqs[slot];
	io_done_fn fn = r->fn;
	void *owner = r->owner;
	uint64_t cookie = r->cookie;
	/* Free the slot before the callback so that it may queue the next request. */
	r->busy = false;
	e->free_slots[e->nfree++] = slot;
	e->inflight--;
	e->finished++;
	fn(owner, cookie, res);
}

/* One completion of slot: account it, resubmit a remainder, or finish. */
static void req_complete(struct io_engine *e, unsigned slot, int res)
{
	struct io_req *r = &e->reqs[slot];
	if ((res == -EAGAIN || res == -EINTR) && ++r->retries < IO_MAX_RETRIES)
		goto again;
	if (res < 0 || r->op == IO_OP_FSYNC) {
		req_finish(e, slot, res < 0 ? res : 0);
		return;
	}
	if (res == 0) {
		/* A read at end of file reports what it got; a write of 0 bytes would
		 * loop forever, so it is an I/O error. */
		req_finish(e, slot, r->op == IO_OP_READ ? (int64_t)r->done : -EIO);
		return;
	}
	size_t done = r->done + (size_t)res;
	if (done >= r->len) {
		req_finish(e, slot, (int64_t)r->len);
		return;
	}
	/* Short: go on from the last 4 KiB boundary reached, so that an O_DIRECT
	 * request stays aligned (transferring a few bytes twice is harmless). */
	if (r->aligned)
		done -= done % CKPT_ALIGN;
	if (done == r->done) {
		/* No aligned progress. For a read that means end of file within the
		 * block: report what arrived. A write gets a few more tries. */
		if (r->op == IO_OP_READ) {
			req_finish(e, slot, (int64_t)(r->done + (size_t)res));
			return;
		}
		if (++r->stalls >= IO_MAX_STALLS) {
			req_finish(e, slot, -EIO);
			return;
		}
	}
	r->done = done;
again:;
	int rc = req_submit(e, slot);
	if (rc < 0)
		req_finish(e, slot, rc);
}

int io_engine_reap(struct io_engine *e, bool wait)
{
	uint64_t before = e->finished;
	if (!e->inflight)
		return 0;
	struct io_uring_cqe *cqe;
	if (wait) {
		int rc;
		do
			rc = io_uring_wait_cqe(&e->ring, &cqe);
		while (rc == -EINTR || rc == -EAGAIN);
		if (rc < 0)
			return ckpt_err(rc, "io engine: waiting for completions");
	}
	while (io_uring_peek_cqe(&e->ring, &cqe) == 0) {
		uint64_t slot = io_uring_cqe_get_data64(cqe);
		int res = cqe->res;
		io_uring_cqe_seen(&e->ring, cqe);
		if (slot >= e->depth || !e->reqs[slot].busy)
			continue;   /* a neutralised sqe */
		req_complete(e, (unsigned)slot, res);
	}
	return (int)(e->finished - before);
}
