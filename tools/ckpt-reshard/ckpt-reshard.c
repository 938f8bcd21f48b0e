/*
 * ckpt-reshard — rewrite a committed checkpoint for another number of ranks, or
 * export its consolidated tensors to safetensors; public API only:
 *
 *   ckpt-reshard ROOT STEP|latest --world N --out ROOT2 [--step S2] [--chunk SIZE]
 *                [--compress none|zstd[:L]] [--pool SIZE] [--rank-map LIST |
 *                --drop-rank-bound] [--port P] [--quiet] [--json]
 *   ckpt-reshard ROOT STEP|latest --export-safetensors FILE [--kind KIND]
 *                [--buffer SIZE] [--quiet] [--json]
 *
 * Writing N shard files means N ranks saving: the tool forks N rank processes (rank
 * r of world N, the environment a launcher would give), each of which loads its new
 * box of every sharded tensor from the source — resharding is a property of load —
 * and saves it; rank 0 is the commit coordinator, exactly as in a training job. So
 * the output is a checkpoint like any other, committed only when every new rank's
 * shard is durable. Replicated items are saved once (by new rank 0); rank-bound
 * items only with an explicit map (--rank-map) or dropped (--drop-rank-bound).
 *
 * Memory: a rank process pulls its share from the source while the new shard is
 * written (a source callback, with a read-ahead thread), so its bound is two pools
 * (source reads, output), the read-ahead ring and a chunk of scratch, whatever its
 * share. docs/ckpt-reshard.md says so.
 *
 * Every option value is parsed strictly (toolutil.h); under --json stdout holds one
 * JSON object whatever happens.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ckpt/catalog.h"
#include "reshard.h"
#include "toolutil.h"

static void usage(FILE *f)
{
	fprintf(f,
	"usage: ckpt-reshard ROOT STEP|latest --world N --out ROOT2 [--step S2] [--chunk SIZE]\n"
	"                    [--compress none|zstd[:L]] [--pool SIZE]\n"
	"                    [--rank-map LIST | --drop-rank-bound] [--port P] [--quiet] [--json]\n"
	"       ckpt-reshard ROOT STEP|latest --export-safetensors FILE [--kind KIND]\n"
	"                    [--buffer SIZE] [--quiet] [--json]\n"
	"\n"
	"  --world N              new number of ranks; every sharded tensor is split evenly\n"
	"                         along its first dimension (one shard file per new rank)\n"
	"  --out ROOT2            output checkpoint root (another root than ROOT)\n"
	"  --step S2              step number in ROOT2 (default: the source step)\n"
	"  --chunk SIZE           chunk size of the output (default: the source's largest chunk,\n"
	"                         so that the same bytes keep the same chunk hashes)\n"
	"  --compress C           none (default) or zstd[:LEVEL]\n"
	"  --pool SIZE            staging pool of each rank process, for its output and for its\n"
	"                         source reads (library default); the read-ahead holds two\n"
	"                         windows of half of it (16 to 128 MiB each)\n"
	"  --rank-map LIST        N comma-separated saved ranks: new rank i takes the rank-bound\n"
	"                         items (RNG state, data position) of saved rank LIST[i]; '-' for none\n"
	"  --drop-rank-bound      leave rank-bound items out of the output\n"
	"  --port P               commit coordinator port for the N rank processes (default: a\n"
	"                         free one)\n"
	"  --export-safetensors FILE  write the consolidated tensors to one safetensors file\n"
	"  --kind KIND            export only tensors of one kind: model, optimizer, rng,\n"
	"                         scheduler, extra (default: all)\n"
	"  --buffer SIZE          export read buffer (default 64M; at least one row of a tensor)\n"
	"  --quiet                no progress display\n"
	"  --json                 one JSON document on stdout, also on failure\n"
	"  --help                 this text\n"
	"SIZE takes K, M, G, T suffixes.\n"
	"\n"
	"exit status: 0 ok; 1 failure; 2 usage; 3 no such step; 4 not a checkpoint root;\n"
	"5 the output root already holds the step; 6 N does not fit a tensor's first\n"
	"dimension; 7 rank-bound items without --rank-map or --drop-rank-bound; 8 saving with\n"
	"N ranks is not available in this build. See docs/ckpt-reshard.md.\n");
}

int reshard_exit_for(int rc)
{
	switch (rc) {
	case 0:              return RX_OK;
	case CKPT_ENOTFOUND: return RX_NOSTEP;
	case CKPT_ENOTROOT:
	case -ENOENT:
	case -ENOTDIR:       return RX_NOTROOT;
	case -EEXIST:        return RX_EXISTS;
	case CKPT_ENODEV:    return RX_NODEV;
	case CKPT_ERANKBOUND: return RX_RANKBOUND;
	default:             return RX_FAIL;
	}
}

static int open_ctx(const char *root, int rank, int world, unsigned flags,
                    const struct reshard_args *a, ckpt_ctx **c)
{
	struct ckpt_opts o;
	ckpt_opts_init(&o, sizeof o);
	o.root = root;
	o.rank = rank;
	o.world = world;
	o.flags = flags;
	o.pool_bytes = a->pool;       /* the source's read buffers too: --pool bounds both */
	if (!(flags & CKPT_OPEN_READONLY)) {
		o.chunk_bytes = a->chunk;
		o.zstd_level = a->zstd_level;
		o.coord_addr = "127.0.0.1";
		o.coord_port = a->port;
		if (a->job[0])
			o.job_id = a->job;
	}
	return ckpt_open(&o, c);
}

int reshard_open_source(const struct reshard_args *a, ckpt_ctx **c)
{
	struct stat st;
	*c = NULL;
	if (stat(a->root, &st) < 0) {
		int rc = -errno;
		return tool_fail(reshard_exit_for(rc), rc, "%s: %s", a->root, strerror(-rc));
	}
	int rc = open_ctx(a->root, 0, 1, CKPT_OPEN_READONLY, a, c);
	if (rc)
		return tool_fail(reshard_exit_for(rc), rc, "%s", ckpt_last_error());
	return 0;
}

/* ------------------------------------------------------------------ the plan */

/* One item of the source step and what the new ranks do with it. */
struct item {
	struct ckpt_tensor_info ti;
	char    *name;
	bool     blob;
	/* rank-bound: box of each saved rank's piece (from the chunk list) */
	uint64_t (*rb_off)[CKPT_MAX_NDIM], (*rb_ext)[CKPT_MAX_NDIM];
	bool    *rb_have;
};

struct plan {
	struct item *items;
	size_t       n;
	uint32_t     src_world;
	uint64_t     src_step;
	uint64_t     max_chunk;
	uint64_t     bytes;
};

static void plan_free(struct plan *p)
{
	for (size_t i = 0; i < p->n; i++) {
		free(p->items[i].name);
		free(p->items[i].rb_off);
		free(p->items[i].rb_ext);
		free(p->items[i].rb_have);
	}
	free(p->items);
}

/* Even split of rows over world: the first rows % world ranks get one more. */
static void split(uint64_t rows, unsigned rank, unsigned world, uint64_t *off, uint64_t *ext)
{
	uint64_t base = rows / world, rem = rows % world;
	*ext = base + (rank < rem);
	*off = rank * base + (rank < rem ? rank : rem);
}

static int plan_build(ckpt_load *l, struct plan *p, uint32_t src_world)
{
	int n = ckpt_load_count(l);
	if (n < 0)
		return n;
	p->items = calloc((size_t)n + 1, sizeof *p->items);
	if (!p->items)
		return -ENOMEM;
	p->src_world = src_world;
	p->src_step = ckpt_load_step(l);
	for (int i = 0; i < n; i++) {
		struct item *it = &p->items[p->n];
		int rc = ckpt_load_info(l, (unsigned)i, &it->ti, sizeof it->ti);
		if (rc)
			return rc;
		if (!(it->name = strdup(it->ti.name)))
			return -ENOMEM;
		it->ti.name = it->name;
		p->n++;
		it->blob = ckpt_load_is_blob(l, (unsigned)i) == 1;
		int nch = ckpt_load_chunks(l, (unsigned)i, NULL, 0, sizeof(struct ckpt_chunk_info));
		if (nch < 0)
			return nch;
		struct ckpt_chunk_info *ch = calloc((size_t)nch + 1, sizeof *ch);
		if (!ch)
			return -ENOMEM;
		ckpt_load_chunks(l, (unsigned)i, ch, (size_t)nch, sizeof(struct ckpt_chunk_info));
		for (int k = 0; k < nch; k++)
			if (ch[k].raw_len > p->max_chunk)
				p->max_chunk = ch[k].raw_len;
		if (it->ti.policy == CKPT_RANK_BOUND && !it->blob) {
			it->rb_off = calloc(src_world, sizeof *it->rb_off);
			it->rb_ext = calloc(src_world, sizeof *it->rb_ext);
			it->rb_have = calloc(src_world, sizeof *it->rb_have);
			if (!it->rb_off || !it->rb_ext || !it->rb_have) {
				free(ch);
				return -ENOMEM;
			}
			for (int k = 0; k < nch; k++) {
				uint32_t r = ch[k].rank;
				if (r >= src_world)
					continue;
				it->rb_have[r] = true;
				memcpy(it->rb_off[r], ch[k].box_offset, sizeof it->rb_off[r]);
				memcpy(it->rb_ext[r], ch[k].box_extent, sizeof it->rb_ext[r]);
			}
		}
		free(ch);
	}
	return 0;
}

/* ------------------------------------------------------------------ a new rank */

/* What a rank process tells the parent, through a pipe. */
struct report {
	int      rank;
	int      done;               /* 0: progress; 1: final */
	int      rc;
	uint64_t bytes_done, bytes_total;
	char     msg[900];
};

static void send_report(int fd, const struct report *r)
{
	ssize_t n = write(fd, r, sizeof *r);
	(void)n;   /* a parent that is gone cannot be told anything */
}

/* The new box of item it for rank r of N; false: this rank saves nothing of it. */
static bool new_box(const struct reshard_args *a, const struct plan *p, const struct item *it,
                    unsigned r, uint64_t *off, uint64_t *ext, int *saved_rank)
{
	*saved_rank = -1;
	unsigned ndim = it->ti.ndim;
	for (unsigned d = 0; d < ndim; d++) {
		off[d] = 0;
		ext[d] = it->ti.global_shape[d];
	}
	switch (it->ti.policy) {
	case CKPT_SHARDED:
		if (ndim == 0)
			return r == 0;
		split(it->ti.global_shape[0], r, a->world, &off[0], &ext[0]);
		return true;
	case CKPT_REPLICATED:
		return r == 0;         /* one copy is the whole value */
	default:
		if (!a->rank_map || a->rank_map[r] < 0)
			return false;
		*saved_rank = a->rank_map[r];
		if (!it->blob) {
			if (!it->rb_have || (uint32_t)*saved_rank >= p->src_world ||
			    !it->rb_have[*saved_rank])
				return false;
			memcpy(off, it->rb_off[*saved_rank], ndim * sizeof *off);
			memcpy(ext, it->rb_ext[*saved_rank], ndim * sizeof *ext);
		}
		return true;
	}
}

struct rank_item {
	const struct item *it;
	uint64_t off[CKPT_MAX_NDIM], ext[CKPT_MAX_NDIM];
	int      saved_rank;
	void    *data;
	size_t   len;
};

/* Read-ahead of the source. The save worker pulls each tensor's bytes in order
 * (tensor_fill); loaded there, one output chunk at a time, the source reads would
 * wait for the writes and run one or two chunks deep. Instead a thread loads what
 * the worker will pull next, in the order it pulls (items in order, rows in order),
 * into a ring of PF_SLOTS windows of about f->window bytes, each ONE batch load of
 * up to PF_SEGS pieces of any number of tensors (so small tensors still keep many
 * reads in flight), while the new shard is written; tensor_fill copies out of the
 * ring. Memory: the ring (PF_SLOTS x max(window, one row)) on top of the two
 * pools. A pull the ring does not hold (not expected: the order is the API's) is
 * loaded directly. */
#define PF_SLOTS  2u
#define PF_SEGS   64u
#define PF_WINDOW ((uint64_t)128 << 20)   /* at most; half of --pool when smaller */
#define PF_WINDOW_MIN ((uint64_t)16 << 20)

struct pf_seg {
	size_t   item;                    /* index into the rank's items */
	uint64_t off, len;                /* bytes [off, off+len) of the item's box */
	uint64_t at;                      /* where they are in the slot's buffer */
};

struct pf_slot {
	struct pf_seg seg[PF_SEGS];
	unsigned nseg, cur;               /* cur: the first piece not yet taken */
	uint8_t *buf;
	size_t   cap;
	int      rc;
};

/* What every tensor of a rank shares while it is pulled. */
struct fill_shared {
	ckpt_load     *l;
	struct report *rep;
	int            fd;
	uint64_t       since;             /* bytes since the last progress report */
	/* the direct path's scratch (worker thread only) */
	uint8_t       *scratch;
	size_t         cap;
	/* read-ahead */
	const struct rank_item *items;
	size_t         nitems;
	uint64_t       window;            /* bytes per window */
	pthread_t      th;
	bool           started, stop, done;
	pthread_mutex_t lock;             /* the fields below */
	pthread_mutex_t load_lock;        /* around every ckpt_load_tensors of l */
	pthread_cond_t cv;
	uint64_t       made, used;        /* windows loaded, windows released */
	struct pf_slot slot[PF_SLOTS];
	char           err[512];          /* the first read-ahead failure, in words */
};

/* One tensor of a new rank, pulled from the source: sh->items[idx]. */
struct fill_state {
	struct fill_shared *sh;
	size_t              idx;
};

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

static int prefetch_start(struct fill_shared *f)
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

static void prefetch_stop(struct fill_shared *f)
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
static int tensor_fill(void *arg, uint64_t off, void *dst, size_t len)
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

static int rank_run(const struct reshard_args *a, const struct plan *p, unsigned r, int fd,
                    struct report *rep)
{
	ckpt_ctx *src = NULL, *dst = NULL;
	ckpt_load *l = NULL;
	ckpt_save *s = NULL;
	struct rank_item *ri = calloc(p->n + 1, sizeof *ri);
	size_t nri = 0;
	int rc = ri ? 0 : -ENOMEM;
	const char *stage = "plan";
	/* This rank's share, and its memory. */
	for (size_t i = 0; !rc && i < p->n; i++) {
		struct rank_item *x = &ri[nri];
		x->it = &p->items[i];
		if (!new_box(a, p, x->it, r, x->off, x->ext, &x->saved_rank))
			continue;
		uint64_t len = x->it->blob ? 0 : ckpt_dtype_size(x->it->ti.dtype);
		for (unsigned d = 0; !x->it->blob && d < x->it->ti.ndim; d++)
			len *= x->ext[d];
		x->len = (size_t)len;
		nri++;
		rep->bytes_total += len;
	}
	stage = "open the source";
	if (!rc)
		/* A reader of the source: rank-bound items are named by their saved rank. */
		rc = open_ctx(a->root, 0, 1, CKPT_OPEN_READONLY, a, &src);
	if (!rc)
		rc = ckpt_load_open(src, p->src_step, &l);
	/* Blobs: their size is known only by asking. */
	for (size_t i = 0; !rc && i < nri; i++) {
		struct rank_item *x = &ri[i];
		if (!x->it->blob)
			continue;
		stage = "read a blob";
		size_t len = 0;
		int q = x->saved_rank >= 0 ?
			ckpt_load_blob_rank(l, x->it->name, x->saved_rank, NULL, 0, &len) :
			ckpt_load_blob(l, x->it->name, NULL, 0, &len);
		if (q && q != -ENOSPC) {
			rc = q;
			break;
		}
		x->len = len;
		rep->bytes_total += len;
	}
	/* Blobs are small: read them now. Tensors are pulled chunk by chunk while the
	 * new shard is written (tensor_fill, fed by the read-ahead), so memory stays
	 * bounded by the two pools, the ring and one chunk of scratch, whatever this
	 * rank's share. */
	for (size_t i = 0; !rc && i < nri; i++) {
		struct rank_item *x = &ri[i];
		if (!x->it->blob)
			continue;
		stage = "read a blob";
		if (!(x->data = malloc(x->len ? x->len : 1))) {
			rc = -ENOMEM;
			break;
		}
		size_t got = 0;
		rc = x->saved_rank >= 0 ?
			ckpt_load_blob_rank(l, x->it->name, x->saved_rank, x->data, x->len, &got) :
			ckpt_load_blob(l, x->it->name, x->data, x->len, &got);
		rep->bytes_done += x->len;
	}
	stage = "open the output";
	if (!rc)
		rc = open_ctx(a->out, (int)r, (int)a->world, CKPT_OPEN_NO_GC, a, &dst);
	stage = "save";
	if (!rc)
		rc = ckpt_save_begin(dst, a->have_out_step ? a->out_step : p->src_step, &s);
	struct fill_shared shared = { .l = l, .rep = rep, .fd = fd, .items = ri, .nitems = nri,
	                              .window = PF_WINDOW };
	if (a->pool && a->pool / 2 < PF_WINDOW)
		shared.window = a->pool / 2 > PF_WINDOW_MIN ? a->pool / 2 : PF_WINDOW_MIN;
	struct fill_state *fs = calloc(nri + 1, sizeof *fs);
	if (!fs && !rc)
		rc = -ENOMEM;
	stage = "start the read-ahead";
	if (!rc)
		rc = prefetch_start(&shared);
	stage = "save";
	for (size_t i = 0; !rc && i < nri; i++) {
		const struct rank_item *x = &ri[i];
		const struct ckpt_tensor_info *t = &x->it->ti;
		if (x->it->blob) {
			rc = ckpt_save_add_blob(s, t->name, t->kind, t->policy, x->data, x->len);
			continue;
		}
		fs[i] = (struct fill_state){ .sh = &shared, .idx = i };
		struct ckpt_tensor ct = {
			.name = t->name, .kind = t->kind, .dtype = t->dtype, .policy = t->policy,
			.ndim = t->ndim, .global_shape = t->global_shape, .offset = x->off,
			.extent = x->ext, .mem = CKPT_MEM_HOST,
		};
		rc = ckpt_save_add_tensor_source(s, &ct, tensor_fill, &fs[i]);
	}
	if (!rc)
		rc = ckpt_save_submit(s);
	if (!rc)
		rc = ckpt_save_wait(s, -1);
	prefetch_stop(&shared);
	if (rc)
		snprintf(rep->msg, sizeof rep->msg, "rank %u: %s: %s", r, stage,
		         shared.err[0] ? shared.err : ckpt_last_error());
	ckpt_save_free(s);
	free(shared.scratch);
	free(fs);
	ckpt_load_close(l);
	ckpt_close(src);
	ckpt_close(dst);
	for (size_t i = 0; ri && i < nri; i++)
		free(ri[i].data);
	free(ri);
	return rc;
}

/* ------------------------------------------------------------------ the parent */

/* A free TCP port for the coordinator of the N rank processes. */
static unsigned free_port(void)
{
	int s = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof sa;
	unsigned port = 0;
	if (s >= 0 && bind(s, (struct sockaddr *)&sa, sizeof sa) == 0 &&
	    getsockname(s, (struct sockaddr *)&sa, &len) == 0)
		port = ntohs(sa.sin_port);
	if (s >= 0)
		close(s);
	return port;
}

/* Refuse what would fail later, before any process starts: exit code or 0. */
static int preflight(const struct reshard_args *a, const struct plan *p)
{
	for (size_t i = 0; i < p->n; i++) {
		const struct item *it = &p->items[i];
		if (it->ti.policy == CKPT_SHARDED && it->ti.ndim && it->ti.global_shape[0] < a->world) {
			char q[300];
			return tool_fail(RX_WORLD, -EINVAL, "--world %u: tensor '%s' has only %" PRIu64
			                 " rows in its first dimension; it cannot be split over %u ranks",
			                 a->world, tool_quote(it->name, q, sizeof q),
			                 it->ti.global_shape[0], a->world);
		}
	}
	/* The names go to stderr one a line, and into the JSON error as one list. */
	char list[1024] = "";
	size_t nrb = 0, used = 0;
	for (size_t i = 0; i < p->n; i++) {
		if (p->items[i].ti.policy != CKPT_RANK_BOUND || a->rank_map || a->drop_rank_bound)
			continue;
		if (!nrb++)
			fprintf(stderr, "ckpt-reshard: the step holds rank-bound state, which belongs to "
			        "one saved rank and is not resharded; map saved ranks to new ones with "
			        "--rank-map (when that is safe for your job) or leave it out with "
			        "--drop-rank-bound:\n");
		char q[300];
		tool_quote(p->items[i].name, q, sizeof q);
		fprintf(stderr, "  %s (%s)\n", q, ckpt_kind_name(p->items[i].ti.kind));
		if (used < sizeof list)
			used += (size_t)snprintf(list + used, sizeof list - used, "%s%s (%s)",
			                         nrb > 1 ? ", " : "", q, ckpt_kind_name(p->items[i].ti.kind));
	}
	if (nrb)
		return tool_fail_json(RX_RANKBOUND, CKPT_ERANKBOUND, "the step holds %zu rank-bound "
		                      "item(s), which need --rank-map or --drop-rank-bound: %s", nrb,
		                      list);
	for (unsigned r = 0; a->rank_map && r < a->world; r++) {
		if (a->rank_map[r] >= (int)p->src_world)
			return tool_usage("--rank-map: saved rank %d does not exist (the step was saved "
			                  "by %u ranks)", a->rank_map[r], p->src_world);
	}
	/* The output root: not the source, and not already holding the step. */
	char r1[PATH_MAX], r2[PATH_MAX];
	if (realpath(a->root, r1) && realpath(a->out, r2) && !strcmp(r1, r2))
		return tool_usage("--out is the source root; write to another root");
	struct stat st;
	if (stat(a->out, &st) == 0) {
		ckpt_ctx *c;
		int rc = open_ctx(a->out, 0, 1, CKPT_OPEN_READONLY, a, &c);
		if (rc == CKPT_ENOTROOT) {
			/* No manifest yet: an empty directory becomes a root; anything else is
			 * somebody's data, and the rank processes would be refused anyway. */
			DIR *d = opendir(a->out);
			struct dirent *e;
			const char *found = NULL;
			while (d && (e = readdir(d)))
				if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
					found = e->d_name;
					break;
				}
			int x = 0;
			if (found) {
				char q[300];
				x = tool_fail(RX_NOTROOT, CKPT_ENOTROOT, "--out %s is not empty and not a "
				              "checkpoint root (found '%s')", a->out, tool_quote(found, q, sizeof q));
			}
			if (d)
				closedir(d);
			if (x)
				return x;
		} else if (rc) {
			return tool_fail(reshard_exit_for(rc), rc, "--out %s: %s", a->out,
			                 ckpt_last_error());
		} else {
			struct ckpt_step_info si;
			uint64_t s2 = a->have_out_step ? a->out_step : p->src_step;
			rc = ckpt_step_info(c, s2, &si, sizeof si);
			ckpt_close(c);
			if (rc == 0 && si.state == CKPT_STATE_COMMITTED)
				return tool_fail(RX_EXISTS, -EEXIST, "%s already holds step %" PRIu64 "; choose "
				                 "another --step or root", a->out, s2);
		}
	}
	return 0;
}

static int run_reshard(struct reshard_args *a)
{
	ckpt_ctx *c = NULL;
	ckpt_load *l = NULL;
	struct plan p;
	memset(&p, 0, sizeof p);
	int x = reshard_open_source(a, &c);
	if (x)
		return x;
	int rc = ckpt_load_open(c, a->latest ? CKPT_LATEST : a->step, &l);
	struct ckpt_step_info si;
	if (!rc)
		rc = ckpt_step_info(c, ckpt_load_step(l), &si, sizeof si);
	if (!rc)
		rc = plan_build(l, &p, si.world);
	char msg[1024];
	snprintf(msg, sizeof msg, "%s", rc == -ENOMEM ? "out of memory for the plan" :
	         ckpt_last_error());
	/* No context may be open across fork (the manifest and io_uring do not survive it). */
	ckpt_load_close(l);
	ckpt_close(c);
	if (rc) {
		plan_free(&p);
		return tool_fail(reshard_exit_for(rc), rc, "%s", msg);
	}
	x = preflight(a, &p);
	if (x) {
		plan_free(&p);
		return x;
	}
	if (!a->chunk && p.max_chunk)
		a->chunk = (p.max_chunk + 4095) / 4096 * 4096;
	if (!a->port)
		a->port = free_port();
	/* A job id of this run's own: should another job take the port between
	 * free_port and the coordinator's bind, ranks that reach it are refused as
	 * another job (a specific error) instead of joining it. */
	if (!getenv("CKPT_JOB_ID"))
		snprintf(a->job, sizeof a->job, "ckpt-reshard-%ld-%u", (long)getpid(), a->port);
	/* The job is this run's own: its ranks share a fresh secret, so that nothing
	 * else that reaches the port can join it (the job id alone is guessable). */
	if (tool_job_secret()) {
		plan_free(&p);
		return RX_FAIL;
	}
	int fds[2];
	if (pipe(fds) < 0) {
		rc = -errno;
		plan_free(&p);
		return tool_fail(RX_FAIL, rc, "pipe: %s", strerror(-rc));
	}
	double t0 = tool_now();
	pid_t *pids = calloc(a->world, sizeof *pids);
	struct report *last = calloc(a->world, sizeof *last);
	if (!pids || !last) {
		free(pids);
		free(last);
		close(fds[0]);
		close(fds[1]);
		plan_free(&p);
		return tool_fail(RX_FAIL, -ENOMEM, "out of memory for %u rank processes", a->world);
	}
	unsigned started = 0;
	for (unsigned r = 0; r < a->world; r++, started++) {
		fflush(NULL);
		pids[r] = fork();
		if (pids[r] < 0) {
			fprintf(stderr, "ckpt-reshard: fork: %s\n", strerror(errno));
			break;
		}
		if (pids[r] == 0) {
			close(fds[0]);
			struct report rep;
			memset(&rep, 0, sizeof rep);
			rep.rank = (int)r;
			rep.rc = rank_run(a, &p, r, fds[1], &rep);
			rep.done = 1;
			send_report(fds[1], &rep);
			_exit(rep.rc ? 1 : 0);
		}
	}
	close(fds[1]);
	struct tool_progress pr;
	tool_progress_start(&pr, "reshard", a->quiet || a->json);
	struct report rep;
	while (read(fds[0], &rep, sizeof rep) == (ssize_t)sizeof rep) {
		if (rep.rank < 0 || (unsigned)rep.rank >= a->world)
			continue;
		last[rep.rank] = rep;
		uint64_t done = 0, total = 0;
		for (unsigned r = 0; r < a->world; r++) {
			done += last[r].bytes_done;
			total += last[r].bytes_total;
		}
		tool_progress_update(&pr, done, total);
	}
	tool_progress_end(&pr);
	close(fds[0]);
	int worst = 0;
	for (unsigned r = 0; r < started; r++) {
		int st;
		waitpid(pids[r], &st, 0);
		if (!last[r].done) {
			last[r].rc = -ECHILD;
			snprintf(last[r].msg, sizeof last[r].msg, "rank %u died without a report", r);
		}
		if (last[r].rc && (!worst || last[r].rc == CKPT_ENODEV))
			worst = last[r].rc;
	}
	if (started < a->world && !worst)
		worst = -EAGAIN;
	double dt = tool_now() - t0;
	uint64_t bytes = 0;
	for (unsigned r = 0; r < a->world; r++)
		bytes += last[r].bytes_done;
	uint64_t s2 = a->have_out_step ? a->out_step : p.src_step;
	char b[32];
	x = worst == CKPT_ENODEV ? RX_NODEV : worst == -EEXIST ? RX_EXISTS :
	    worst == CKPT_ENOTROOT ? RX_NOTROOT : worst ? RX_FAIL : RX_OK;
	/* The first failing rank's message stands for the run in the JSON error. */
	msg[0] = '\0';
	for (unsigned r = 0; r < a->world && worst && !msg[0]; r++)
		if (last[r].rc)
			snprintf(msg, sizeof msg, "%s", last[r].msg);
	if (worst && !msg[0])
		snprintf(msg, sizeof msg, "only %u of %u rank processes started", started, a->world);
	if (a->json) {
		printf("{\"op\":\"reshard\",\"ok\":%s,\"from_step\":%" PRIu64 ",\"to_step\":%" PRIu64
		       ",\"source_world\":%u,\"world\":%u,\"out\":", worst ? "false" : "true",
		       p.src_step, s2, p.src_world, a->world);
		tool_json_str(stdout, a->out);
		printf(",\"items\":%zu,\"bytes\":%" PRIu64 ",\"seconds\":%.6f,\"ranks\":[", p.n, bytes, dt);
		for (unsigned r = 0; r < a->world; r++) {
			printf("%s{\"rank\":%u,\"ok\":%s,\"bytes\":%" PRIu64, r ? "," : "", r,
			       last[r].rc ? "false" : "true", last[r].bytes_done);
			if (last[r].rc) {
				printf(",\"error\":");
				tool_json_str(stdout, last[r].msg);
			}
			printf("}");
		}
		printf("]");
		if (worst)
			tool_json_fail_fields(stdout, msg, worst, x);
		printf("}\n");
	} else if (!worst) {
		printf("resharded step %" PRIu64 " (world %u) into %s step %" PRIu64 " (world %u): %zu "
		       "items, %s in %.3f s\n", p.src_step, p.src_world, a->out, s2, a->world, p.n,
		       tool_bytes(bytes, b), dt);
	}
	for (unsigned r = 0; r < a->world && worst; r++) {
		if (last[r].rc)
			fprintf(stderr, "ckpt-reshard: %s\n", last[r].msg);
	}
	if (worst == CKPT_ENODEV)
		fprintf(stderr, "ckpt-reshard: saving with %u ranks needs the distributed commit, which "
		        "this build does not have yet\n", a->world);
	free(pids);
	free(last);
	plan_free(&p);
	return x;
}

/* ------------------------------------------------------------------ main */

static int parse_rank_map(struct reshard_args *a, const char *s)
{
	size_t n = 1;
	for (const char *q = s; *q; q++)
		n += *q == ',';
	a->rank_map = calloc(n, sizeof *a->rank_map);
	if (!a->rank_map)
		return -1;
	char *dup = strdup(s), *save = NULL;
	size_t i = 0;
	if (!dup)
		return -1;
	for (char *tok = strtok_r(dup, ",", &save); tok; tok = strtok_r(NULL, ",", &save), i++) {
		uint64_t v;
		if (!strcmp(tok, "-"))
			a->rank_map[i] = -1;
		else if (tool_parse_u64(tok, &v) || v > INT_MAX) {
			free(dup);
			return -1;
		} else
			a->rank_map[i] = (int)v;
	}
	free(dup);
	return i == n ? (int)n : -1;
}

int main(int argc, char **argv)
{
	tool_init("ckpt-reshard", NULL);
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
			usage(stdout);
			return RX_OK;
		}
	}
	struct reshard_args a;
	memset(&a, 0, sizeof a);
	static const struct option opts[] = {
		{ "world", required_argument, 0, 'w' }, { "out", required_argument, 0, 'o' },
		{ "step", required_argument, 0, 's' }, { "chunk", required_argument, 0, 'C' },
		{ "compress", required_argument, 0, 'c' }, { "pool", required_argument, 0, 'P' },
		{ "rank-map", required_argument, 0, 'm' }, { "drop-rank-bound", no_argument, 0, 'd' },
		{ "port", required_argument, 0, 'p' },
		{ "export-safetensors", required_argument, 0, 'e' }, { "kind", required_argument, 0, 'k' },
		{ "buffer", required_argument, 0, 'b' }, { "quiet", no_argument, 0, 'q' },
		{ "json", no_argument, 0, 'j' }, { "help", no_argument, 0, 'h' }, { 0, 0, 0, 0 },
	};
	/* --json anywhere: every error, usage errors included, is then a JSON object, whose
	 * op says which job was asked for. */
	a.json = tool_scan_has(argc, argv, 1, opts, 'j');
	tool_set_json(a.json);
	tool_set_op(tool_scan_has(argc, argv, 1, opts, 'e') ? "export" : "reshard");
	const char *pos[2];
	int npos = 0, ch;
	bool have_world = false, have_pool = false, compress = false;
	const char *map = NULL;
	uint64_t v;
	optind = 0;
	opterr = 0;
	while ((ch = getopt_long(argc, argv, ":", opts, NULL)) != -1) {
		switch (ch) {
		case 'w':
			if (tool_parse_u64_range(optarg, 1, 65536, &v))
				return tool_usage("--world '%s': a number of ranks from 1 to 65536", optarg);
			a.world = (unsigned)v;
			have_world = true;
			break;
		case 'o': a.out = optarg; break;
		case 's':
			if (tool_parse_u64_range(optarg, 0, CKPT_LATEST - 1, &a.out_step))
				return tool_usage("--step '%s': a step number from 0 to %" PRIu64, optarg,
				                  (uint64_t)CKPT_LATEST - 1);
			a.have_out_step = true;
			break;
		case 'C':
			if (tool_parse_size_opt("--chunk", optarg, TOOL_CHUNK_UNIT, TOOL_MAX_CHUNK,
			                   TOOL_CHUNK_UNIT, &a.chunk))
				return RX_USAGE;
			break;
		case 'P':
			/* At least two chunks of the smallest size: the library's own floor. */
			if (tool_parse_size_opt("--pool", optarg, 2 * TOOL_CHUNK_UNIT, SIZE_MAX, 0, &a.pool))
				return RX_USAGE;
			have_pool = true;
			break;
		case 'b':
			if (tool_parse_size_opt("--buffer", optarg, 1, SIZE_MAX, 0, &a.buffer))
				return RX_USAGE;
			break;
		case 'c':
			if (tool_parse_compress(optarg, &a.zstd_level))
				return tool_usage("--compress '%s': none, zstd or zstd:LEVEL with LEVEL 1 to 22",
				                  optarg);
			compress = true;
			break;
		case 'm': map = optarg; break;
		case 'd': a.drop_rank_bound = true; break;
		case 'p':
			if (tool_parse_u64_range(optarg, 1, 65535, &v))
				return tool_usage("--port '%s': a port from 1 to 65535", optarg);
			a.port = (unsigned)v;
			break;
		case 'e': a.export_file = optarg; break;
		case 'k': {
			static const char *kinds[] = { "model", "optimizer", "rng", "scheduler", "extra" };
			a.kind = 0;
			for (int k = 0; k < 5; k++)
				if (!strcmp(optarg, kinds[k]))
					a.kind = k + 1;
			if (!a.kind)
				return tool_usage("--kind '%s': model, optimizer, rng, scheduler or extra",
				                  optarg);
			break;
		}
		case 'q': a.quiet = true; break;
		case 'j': a.json = true; break;
		case '?':
		case ':':
			return tool_getopt_error(ch, argv, opts);
		default: usage(stderr); return tool_usage("unexpected option");
		}
	}
	for (; optind < argc; optind++) {
		if (npos == 2) {
			char q[256];
			return tool_usage("too many arguments ('%s')", tool_quote(argv[optind], q, sizeof q));
		}
		pos[npos++] = argv[optind];
	}
	if (npos != 2) {
		usage(stderr);
		return tool_usage("ROOT and STEP are required");
	}
	a.root = pos[0];
	if (!strcmp(pos[1], "latest"))
		a.latest = true;
	else if (tool_parse_u64_range(pos[1], 0, CKPT_LATEST - 1, &a.step)) {
		char q[256];
		return tool_usage("'%s' is not a step (a number from 0 to %" PRIu64 ", or latest)",
		                  tool_quote(pos[1], q, sizeof q), (uint64_t)CKPT_LATEST - 1);
	}
	if (a.export_file) {
		/* Options of the reshard job would be ignored here: refused instead. */
		if (have_world || a.out || map || a.drop_rank_bound || a.have_out_step || a.chunk ||
		    a.port || compress)
			return tool_usage("--export-safetensors does not combine with --world, --out, "
			                  "--step, --chunk, --compress, --port, --rank-map or "
			                  "--drop-rank-bound");
		return reshard_export_safetensors(&a);
	}
	if (!have_world || !a.out)
		return tool_usage("--world N and --out ROOT2 are required (or --export-safetensors "
		                  "FILE)");
	if (a.kind)
		return tool_usage("--kind applies to --export-safetensors only");
	if (a.buffer)
		return tool_usage("--buffer applies to --export-safetensors only");
	if (map && a.drop_rank_bound)
		return tool_usage("--rank-map and --drop-rank-bound exclude each other");
	if (a.chunk && have_pool && a.pool < 2 * a.chunk)
		return tool_usage("--pool %" PRIu64 " is smaller than two chunks of --chunk %" PRIu64,
		                  a.pool, a.chunk);
	if (map && parse_rank_map(&a, map) != (int)a.world) {
		free(a.rank_map);
		return tool_usage("--rank-map '%s': %u comma-separated saved ranks (numbers, or '-')",
		                  map, a.world);
	}
	int x = run_reshard(&a);
	free(a.rank_map);
	return x;
}
