/*
 * snapshot_internal.h — private to lib/snapshot: the snapshot object and the small
 * device backend under the pipeline. cuda.c implements the backend with the CUDA
 * runtime, which cudart.c loads on demand; host.c implements it for builds without
 * CUDA (every device call then fails with CKPT_ENODEV). pipe.c, the window logic, is
 * the same in both builds.
 */
#ifndef CKPT_SNAPSHOT_INTERNAL_H
#define CKPT_SNAPSHOT_INTERNAL_H

#include <pthread.h>

#include "snapshot/snapshot.h"

#ifdef CKPT_HAVE_CUDA
#include "snapshot/cudart.h"
#include "snapshot/stage_kernel.h"
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
	struct snap_gds *gds;          /* GPUDirect Storage, once enabled (gds.c) */
	/* While a chunk read by GPUDirect Storage is handed out: its verified host copy
	 * [mirror_host, +mirror_len) is also at mirror_dev (snapshot_copy_out uses it). */
	const uint8_t *mirror_host, *mirror_dev;
	size_t       mirror_len;
	/* The device staging pool (stage.c), on the bound device. */
	uint8_t     *stage;            /* NULL: none (yet) */
	size_t       stage_bytes;
	bool         stage_tried;      /* the allocation failed once: not again */
	bool         kernel_tried;     /* the kernel was looked for */
	cudaLibrary_t stage_lib;       /* the staging kernel's, or NULL */
	cudaKernel_t stage_kernel;
	struct stage_batch *batch;     /* ranges queued for its next launch (worker's) */
	unsigned     batch_blocks;     /* the grid they make */
#endif
};

#ifdef CKPT_HAVE_CUDA
/* Release GPUDirect Storage (gds.c); no-op when it was never enabled. */
void snap_gds_destroy(struct snapshot *sn);
/* Release the staging pool and the kernel (stage.c); no-op without them. */
void snap_stage_destroy(struct snapshot *sn);
#endif

/* ---- the device backend (cuda.c, or host.c without CUDA) ----
 * slot indexes the per-slot events; callers guarantee slot < the n of the last
 * successful snap_dev_prepare(sn, n). Called from the pipe's thread (the save
 * worker), which prepare and seal leave with the bound device current. */

/* Create the save stream and at least n slot events (bound device). */
int  snap_dev_prepare(struct snapshot *sn, unsigned n);
/* Make the save stream wait for fence (snapshot_fence) before what is queued next. */
int  snap_dev_after(struct snapshot *sn, void *fence);
/* Queue the D2H copy of n bytes and record slot's event after it. */
int  snap_dev_copy(struct snapshot *sn, void *dst, const void *src, size_t n, unsigned slot);
/* Make the calling thread's current device the save's (a hashing helper's, before
 * it waits for events). */
int  snap_dev_bind_thread(struct snapshot *sn);
/* Wait for slot's event (that chunk only). */
int  snap_dev_wait(struct snapshot *sn, unsigned slot);
/* Create and record *event on the save stream; enqueue landed(arg) after it. */
int  snap_dev_seal(struct snapshot *sn, void **event, void (*landed)(void *), void *arg);
/* The staging pool (stage.c): queue on the save stream the copy of n bytes of src
 * (device memory, or host memory with !device) to the pool's offset off, or with
 * chunk_bytes > 0 the compare-and-copy marking flags [flag, ...) (cleared first by
 * snap_dev_stage_clear); read n flags back, waiting. */
int  snap_dev_stage(struct snapshot *sn, uint64_t off, const void *src, size_t n,
                    bool device, size_t chunk_bytes, uint32_t flag, const void **staged);
/* Launch what snap_dev_stage batched (device memory, with the kernel: one launch for
 * up to STAGE_BATCH_MAX ranges); before anything that depends on those copies. */
int  snap_dev_stage_flush(struct snapshot *sn);
int  snap_dev_stage_clear(struct snapshot *sn);
int  snap_dev_stage_flags(struct snapshot *sn, uint32_t *flags, uint32_t n);
/* Wait for everything queued on the save stream (errors are logged, not returned:
 * the caller is already tearing down). */
void snap_dev_quiesce(struct snapshot *sn);

#endif /* CKPT_SNAPSHOT_INTERNAL_H */
