/*
 * readahead.h — what a new rank's save pulls from the source (readahead.c): its items
 * with their new boxes, the read-ahead ring that loads them ahead of the save, and
 * the progress reports a rank process sends to the parent through a pipe.
 *
 * Threads: a fill_shared belongs to one rank process; its read-ahead thread and the
 * save's worker meet under its lock, as stated per field.
 */
#ifndef CKPT_RESHARD_READAHEAD_H
#define CKPT_RESHARD_READAHEAD_H

#include <pthread.h>

#include "plan.h"

/* What a rank process tells the parent, through a pipe. */
struct report {
	int      rank;
	int      done;               /* 0: progress; 1: final */
	int      rc;
	uint64_t bytes_done, bytes_total;
	char     msg[900];
};

/* Write r to the parent's pipe (a parent that is gone cannot be told anything). */
void send_report(int fd, const struct report *r);

/* One item a new rank saves: its box, and the bytes of a blob (read whole). */
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

/* Start the read-ahead thread over f->items (f filled in but for the thread's
 * fields): 0 or a negative errno. */
int  prefetch_start(struct fill_shared *f);
/* Stop it and free the ring; a no-op when it did not start. */
void prefetch_stop(struct fill_shared *f);
/* ckpt_source_fn for one item; arg is its struct fill_state. */
int  tensor_fill(void *arg, uint64_t off, void *dst, size_t len);

#endif
