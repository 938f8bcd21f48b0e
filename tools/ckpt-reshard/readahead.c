/*
 * readahead.c — the source side of a new rank's save: tensor_fill, the callback
 * through which the save pulls each tensor's bytes, fed by a read-ahead thread
 * (readahead.h), and the progress reports a rank sends to the parent.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "readahead.h"

void send_report(int fd, const struct report *r)
{
	ssize_t n = write(fd, r, sizeof *r);
	(void)n;   /* a parent that is gone cannot be told anything */
}


/* Bytes of one row (first-dimension index) of x's box; the whole value when 0-d. */
static uint64_t row_bytes(const struct rank_item *x)
{
	const struct ckpt_tensor_info *t = &x->it->ti;
	if (t->ndim == 0)
		return x->len;
	uint64_t rowb = ckpt_dtype_size(t->dtype);
	for (unsigned d = 1; d < t->ndim; d++)
		rowb *= x->ext[d];
	return rowb;
}

/* The request for rows [r0, r0 + nrows) of x's box (the whole value when 0-d) into
 * dst; o and e hold its box. */
static struct ckpt_load_req rows_req(const struct rank_item *x, uint64_t r0, uint64_t nrows,
                                     void *dst, uint64_t *o, uint64_t *e)
{
	const struct ckpt_tensor_info *t = &x->it->ti;
	unsigned nd = t->ndim;
	struct ckpt_load_req q = { .name = t->name, .dtype = t->dtype, .ndim = nd,
	                           .mem = CKPT_MEM_HOST, .saved_rank = x->saved_rank, .dst = dst };
	if (nd) {
		memcpy(o, x->off, nd * sizeof *o);
		memcpy(e, x->ext, nd * sizeof *e);
		o[0] += r0;
		e[0] = nrows;
		q.offset = o;
		q.extent = e;
	}
	return q;
}

static int load_locked(struct fill_shared *f, const struct ckpt_load_req *q, size_t n)
{
	pthread_mutex_lock(&f->load_lock);
	int rc = ckpt_load_tensors(f->l, q, n, NULL);
	pthread_mutex_unlock(&f->load_lock);
	return rc;
}

/* Plan the next window from the cursor (item *i, byte *off) into sl; false when
 * there is nothing left. */
static bool window_plan(const struct fill_shared *f, size_t *i, uint64_t *off,
                        struct pf_slot *sl)
{
	uint64_t bytes = 0;
	sl->nseg = sl->cur = 0;
	while (*i < f->nitems && sl->nseg < PF_SEGS) {
		const struct rank_item *x = &f->items[*i];
		uint64_t rowb = x->it->blob || !x->len ? 0 : row_bytes(x);
		if (!rowb || *off >= x->len) {
			(*i)++;
			*off = 0;
			continue;
		}
		uint64_t rows = (x->len - *off) / rowb, fit = (f->window - bytes) / rowb;
		if (!fit && bytes)
			break;                    /* the window is full */
		uint64_t n = fit && fit < rows ? fit : (fit ? rows : 1);
		sl->seg[sl->nseg++] = (struct pf_seg){ .item = *i, .off = *off, .len = n * rowb,
		                                       .at = bytes };
		bytes += n * rowb;
		*off += n * rowb;
	}
	return sl->nseg > 0;
}

static int window_load(struct fill_shared *f, struct pf_slot *sl)
{
	const struct pf_seg *last = &sl->seg[sl->nseg - 1];
	uint64_t bytes = last->at + last->len;
	if (sl->cap < bytes) {
		uint8_t *b = bytes <= SIZE_MAX ? realloc(sl->buf, (size_t)bytes) : NULL;
		if (!b)
			return -ENOMEM;
		sl->buf = b;
		sl->cap = (size_t)bytes;
	}
	struct ckpt_load_req q[PF_SEGS];
	uint64_t o[PF_SEGS][CKPT_MAX_NDIM], e[PF_SEGS][CKPT_MAX_NDIM];
	for (unsigned k = 0; k < sl->nseg; k++) {
		const struct pf_seg *g = &sl->seg[k];
		const struct rank_item *x = &f->items[g->item];
		uint64_t rowb = row_bytes(x);
		q[k] = rows_req(x, g->off / rowb, g->len / rowb, sl->buf + g->at, o[k], e[k]);
	}
	return load_locked(f, q, sl->nseg);
}

static void *prefetch_main(void *arg)
{
	struct fill_shared *f = arg;
	size_t i = 0;
	uint64_t off = 0;
	for (;;) {
		pthread_mutex_lock(&f->lock);
		while (!f->stop && f->made - f->used == PF_SLOTS)
			pthread_cond_wait(&f->cv, &f->lock);
		bool stop = f->stop;
		struct pf_slot *sl = &f->slot[f->made % PF_SLOTS];
		pthread_mutex_unlock(&f->lock);
		/* The slot is this thread's until made moves past it. */
		if (stop || !window_plan(f, &i, &off, sl))
			break;
		sl->rc = window_load(f, sl);
		pthread_mutex_lock(&f->lock);
		if (sl->rc && !f->err[0])
			snprintf(f->err, sizeof f->err, "read the source: %s",
			         sl->rc == -ENOMEM ? "out of memory for the read-ahead" :
			         ckpt_last_error());
		f->made++;
		pthread_cond_broadcast(&f->cv);
		pthread_mutex_unlock(&f->lock);
		if (sl->rc)
			break;
	}
	pthread_mutex_lock(&f->lock);
	f->done = true;
	pthread_cond_broadcast(&f->cv);
	pthread_mutex_unlock(&f->lock);
	return NULL;
}

int prefetch_start(struct fill_shared *f)
{
	pthread_mutex_init(&f->lock, NULL);
	pthread_mutex_init(&f->load_lock, NULL);
	pthread_cond_init(&f->cv, NULL);
	int rc = pthread_create(&f->th, NULL, prefetch_main, f);
	f->started = rc == 0;
	if (rc) {
		pthread_cond_destroy(&f->cv);
		pthread_mutex_destroy(&f->load_lock);
		pthread_mutex_destroy(&f->lock);
	}
	return -rc;
}

void prefetch_stop(struct fill_shared *f)
{
	if (!f->started)
		return;
	pthread_mutex_lock(&f->lock);
	f->stop = true;
	pthread_cond_broadcast(&f->cv);
	pthread_mutex_unlock(&f->lock);
	pthread_join(f->th, NULL);
	for (unsigned i = 0; i < PF_SLOTS; i++)
		free(f->slot[i].buf);
	pthread_cond_destroy(&f->cv);
	pthread_mutex_destroy(&f->load_lock);
	pthread_mutex_destroy(&f->lock);
	f->started = false;
}

/* Copy what the ring holds of [off, off+len) of item idx into dst, releasing the
 * pieces and windows the worker is past; returns the bytes copied (0: the ring does
 * not hold off), or a negative code that the read-ahead met. */
static int64_t prefetch_take(struct fill_shared *f, size_t idx, uint64_t off, uint8_t *dst,
                             uint64_t len)
{
	uint64_t got = 0;
	pthread_mutex_lock(&f->lock);
	while (got < len) {
		while (f->made == f->used && !f->done)
			pthread_cond_wait(&f->cv, &f->lock);
		if (f->made == f->used)
			break;
		struct pf_slot *sl = &f->slot[f->used % PF_SLOTS];
		if (sl->rc) {
			int rc = sl->rc;
			pthread_mutex_unlock(&f->lock);
			return rc;
		}
		if (sl->cur == sl->nseg) {
			f->used++;                /* every piece taken or passed */
			pthread_cond_broadcast(&f->cv);
			continue;
		}
		const struct pf_seg *g = &sl->seg[sl->cur];
		uint64_t at = off + got;
		if (g->item < idx || (g->item == idx && g->off + g->len <= at)) {
			sl->cur++;                /* behind the worker: not wanted any more */
			continue;
		}
		if (g->item > idx || g->off > at)
			break;                    /* not in the ring */
		uint64_t n = g->off + g->len - at < len - got ? g->off + g->len - at : len - got;
		pthread_mutex_unlock(&f->lock);
		/* The slot stays the worker's until used moves past it. */
		memcpy(dst + got, sl->buf + g->at + (at - g->off), (size_t)n);
		pthread_mutex_lock(&f->lock);
		got += n;
		if (at + n == g->off + g->len)
			sl->cur++;
	}
	pthread_mutex_unlock(&f->lock);
	return (int64_t)got;
}

/* ckpt_source_fn: bytes [off, off+len) of the new box, row-major: from the ring, or
 * else the rows that hold them, loaded here (one batch read over the source
 * shards). */
int tensor_fill(void *arg, uint64_t off, void *dst, size_t len)
{
	const struct fill_state *fs = arg;
	struct fill_shared *f = fs->sh;
	const struct rank_item *x = &f->items[fs->idx];
	int64_t got = f->started ? prefetch_take(f, fs->idx, off, dst, len) : 0;
	if (got < 0)
		return (int)got;
	uint64_t at = off + (uint64_t)got, rest = len - (uint64_t)got;
	if (rest) {
		uint64_t rowb = row_bytes(x), o[CKPT_MAX_NDIM], e[CKPT_MAX_NDIM];
		uint64_t r0 = at / rowb, r1 = (at + rest - 1) / rowb;
		size_t need = (size_t)((r1 - r0 + 1) * rowb);
		if (need > f->cap) {
			uint8_t *n = realloc(f->scratch, need);
			if (!n)
				return -ENOMEM;
			f->scratch = n;
			f->cap = need;
		}
		struct ckpt_load_req q = rows_req(x, r0, r1 - r0 + 1, f->scratch, o, e);
		int rc = load_locked(f, &q, 1);
		if (rc)
			return rc;
		memcpy((uint8_t *)dst + got, f->scratch + (at - r0 * rowb), (size_t)rest);
	}
	f->rep->bytes_done += len;
	f->since += len;
	if (f->since >= (64u << 20)) {
		f->since = 0;
		send_report(f->fd, f->rep);
	}
	return 0;
}
