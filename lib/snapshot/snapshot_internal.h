/*
 * snapshot_internal.h — private to lib/snapshot: the snapshot object and the small
 * device backend under the pipeline. cuda.c implements the backend with the CUDA
 * runtime; host.c implements it for builds without CUDA (every device call then
 * fails with CKPT_ENODEV). pipe.c, the window logic, is the same in both builds.
 */
#ifndef CKPT_SNAPSHOT_INTERNAL_H
#define CKPT_SNAPSHOT_INTERNAL_H

#include <pthread.h>

#include "snapshot/snapshot.h"

#ifdef CKPT_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

/* Fields after create are written under lock only (lazy creation, binding). */
struct snapshot {
	bool     device;               /* device mode: see snapshot.h */
	bool     pool_pinned;          /* set by the pool allocator */
	struct io_pool_alloc alloc;
#ifdef CKPT_HAVE_CUDA
	pthread_mutex_t lock;
	int          home;             /* current device at create: the pool's registration */
	int          bound;            /* device of saves' copies; -1: none yet (then home) */
	cudaStream_t save_stream;      /* D2H copies of the save pipeline */
	cudaStream_t load_stream;      /* H2D copies of loads */
	cudaEvent_t *events;           /* one per window slot, created on first use */
	unsigned     nevents;
	bool         load_queued;      /* copies queued on load_stream since the last wait */
#endif
};

/* ---- the device backend (cuda.c, or host.c without CUDA) ----
 * slot indexes the per-slot events; callers guarantee slot < the n of the last
 * successful snap_dev_prepare(sn, n). Called from the pipe's thread (the save
 * worker), which prepare and seal leave with the bound device current. */

/* Create the save stream and at least n slot events (bound device). */
int  snap_dev_prepare(struct snapshot *sn, unsigned n);
/* Queue the D2H copy of n bytes and record slot's event after it. */
int  snap_dev_copy(struct snapshot *sn, void *dst, const void *src, size_t n, unsigned slot);
/* Wait for slot's event (that chunk only). */
int  snap_dev_wait(struct snapshot *sn, unsigned slot);
/* Create and record *event on the save stream; enqueue landed(arg) after it. */
int  snap_dev_seal(struct snapshot *sn, void **event, void (*landed)(void *), void *arg);
/* Wait for everything queued on the save stream (errors are logged, not returned:
 * the caller is already tearing down). */
void snap_dev_quiesce(struct snapshot *sn);

#endif /* CKPT_SNAPSHOT_INTERNAL_H */
