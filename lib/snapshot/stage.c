/*
 * stage.c — the device staging pool (snapshot.h): one cudaMalloc on the bound
 * device, the copies into it, and the compare-and-copy that finds which chunks did
 * not change since the pool last held them.
 *
 * The copies from device memory are one kernel launch per batch of up to
 * STAGE_BATCH_MAX ranges (stage_kernel.h), queued as the save plans them and
 * launched before the snapshot event is recorded: the caller's stall is one launch,
 * not one CUDA call per tensor. Host memory, a source not aligned to 16 bytes, or a
 * runtime that cannot load the kernel take cudaMemcpyAsync, one call a range.
 *
 * The kernel is the library's only one. libckpt is C and loads the runtime on
 * demand (cudart.c); the kernel travels as PTX text (stage_ptx.h, generated from
 * stage_kernel.cu by scripts/gen-stage-ptx.sh) that the runtime compiles for the
 * device when first loaded (cudaLibraryLoadData, CUDA 12 and later). Where it
 * cannot be loaded — an older runtime or driver — the staging pool still works with
 * cudaMemcpyAsync, and only the comparison is off.
 *
 * Memory: the pool is exactly the bytes asked for; its last SNAPSHOT_STAGE_FLAG_BYTES
 * hold one 32-bit flag per compared chunk. Nothing else is allocated on the device.
 *
 * Built only with CKPT_HAVE_CUDA; host.c stands in otherwise.
 */
#include <errno.h>
#include <string.h>

#include "snapshot/snapshot_internal.h"
#include "snapshot/stage_ptx.h"

/* Threads per block of the kernel (each moves 16 bytes a step) and the most bytes
 * one block covers: blocks of up to 256 KiB keep the flag stores few (one per block
 * that found a difference) and the grid large enough to fill the device. A launch's
 * grid stays below 2^30 blocks (the limit is 2^31 - 1). */
#define STAGE_THREADS   256u
#define STAGE_SEG_MAX   (256u << 10)
#define STAGE_GRID_MAX  (1u << 30)

static void stage_load_kernel(struct snapshot *sn)
{
	sn->kernel_tried = true;
	const char *why = NULL;
	cudaError_t e = cudaSuccess;
	if (!cudart.LibraryLoadData || !cudart.LibraryGetKernel || !cudart.LaunchKernel ||
	    !cudart.MemsetAsync || !cudart.LibraryUnload) {
		why = "this CUDA runtime has no cudaLibraryLoadData (CUDA 12 or later needed)";
	} else if ((e = cudart.LibraryLoadData(&sn->stage_lib, stage_ptx, NULL, NULL, 0, NULL, NULL,
	                                       0)) != cudaSuccess) {
		sn->stage_lib = NULL;
		why = "cudaLibraryLoadData";
	} else if ((e = cudart.LibraryGetKernel(&sn->stage_kernel, sn->stage_lib, "ckpt_stage")) !=
	           cudaSuccess) {
		cudart.LibraryUnload(sn->stage_lib);
		sn->stage_lib = NULL;
		why = "cudaLibraryGetKernel";
	}
	if (!why)
		return;
	ckpt_log(CKPT_LOG_INFO, "device staging pool: no staging kernel (one copy call a range, no "
	         "on-device comparison): %s%s%s", why, e != cudaSuccess ? ": " : "",
	         e != cudaSuccess ? cudart.GetErrorString(e) : "");
	(void)cudart.GetLastError();
}

size_t snapshot_stage_reserve(struct snapshot *sn, size_t bytes)
{
	if (!sn->device || bytes <= SNAPSHOT_STAGE_FLAG_BYTES)
		return 0;
	pthread_mutex_lock(&sn->lock);
	int dev = sn->bound;
	pthread_mutex_unlock(&sn->lock);
	if (dev < 0)
		return 0;
	if (!sn->stage && !sn->stage_tried) {
		/* On the bound device, not the thread's current one: the save stream's
		 * creation makes it the worker's current device (snap_dev_prepare). */
		if (snap_dev_prepare(sn, 0)) {
			ckpt_log(CKPT_LOG_WARN, "device staging pool not allocated: %s",
			         ckpt_err_msg());
			ckpt_err_clear();
			return 0;
		}
		sn->stage_tried = true;
		void *m = NULL;
		cudaError_t e = cudart.Malloc(&m, bytes);
		if (e != cudaSuccess) {
			ckpt_log(CKPT_LOG_WARN, "device staging pool of %zu bytes on CUDA device %d not "
			         "allocated (%s: %s): saves take the pinned path", bytes, dev,
			         cudart.GetErrorName(e), cudart.GetErrorString(e));
			(void)cudart.GetLastError();
			return 0;
		}
		if (!(sn->batch = ckpt_calloc(1, sizeof *sn->batch))) {
			cudart.Free(m);
			ckpt_log(CKPT_LOG_WARN, "device staging pool: no memory for its batch: saves "
			         "take the pinned path");
			return 0;
		}
		sn->stage = m;
		sn->stage_bytes = bytes;
		ckpt_log(CKPT_LOG_INFO, "device staging pool: %zu bytes on CUDA device %d", bytes, dev);
	}
	if (!sn->stage)
		return 0;
	if (!sn->kernel_tried)
		stage_load_kernel(sn);
	return snapshot_stage_room(sn);
}

size_t snapshot_stage_room(const struct snapshot *sn)
{
	return sn->stage ? sn->stage_bytes - SNAPSHOT_STAGE_FLAG_BYTES : 0;
}

bool snapshot_stage_can_diff(const struct snapshot *sn)
{
	return sn->stage && sn->stage_lib;
}

void snap_stage_destroy(struct snapshot *sn)
{
	/* After the save stream was synchronised: nothing reads the pool any more. */
	if (sn->stage)
		cudart.Free(sn->stage);
	if (sn->stage_lib)
		cudart.LibraryUnload(sn->stage_lib);
	ckpt_free(sn->batch);
	sn->stage = NULL;
	sn->stage_lib = NULL;
	sn->batch = NULL;
	(void)cudart.GetLastError();
}

/* The largest power of two <= STAGE_SEG_MAX that divides chunk_bytes (a multiple of
 * 4096): a block never spans two chunks. */
static size_t stage_seg(size_t chunk_bytes)
{
	size_t seg = STAGE_SEG_MAX;
	while (seg > 16 && chunk_bytes % seg)
		seg >>= 1;
	return seg;
}

int snap_dev_stage_flush(struct snapshot *sn)
{
	struct stage_batch *b = sn->batch;   /* there with the pool */
	if (!b || !b->n)
		return 0;
	b->flags = (unsigned long long)(uintptr_t)(sn->stage + sn->stage_bytes -
	                                           SNAPSHOT_STAGE_FLAG_BYTES);
	unsigned blocks = sn->batch_blocks, n = b->n;
	void *args[] = { b };
	/* The argument is copied at the launch: the batch is free again once it returns. */
	cudaError_t e = cudart.LaunchKernel((const void *)sn->stage_kernel,
	                                    (dim3){ blocks, 1, 1 }, (dim3){ STAGE_THREADS, 1, 1 },
	                                    args, 0, sn->save_stream);
	b->n = 0;
	sn->batch_blocks = 0;
	return e == cudaSuccess ? 0 : snap_cuda_err(e, "copy %u range(s) into the device staging "
	                                            "pool (%u blocks)", n, blocks);
}

int snap_dev_stage(struct snapshot *sn, uint64_t off, const void *src, size_t n, bool device,
                   size_t chunk_bytes, uint32_t flag, const void **staged)
{
	uint8_t *dst = sn->stage + off;
	*staged = dst;
	if (!device || !sn->stage_lib || (uintptr_t)src % 16) {
		if (chunk_bytes)
			return ckpt_err(-EINVAL, "staging pool: no comparison possible for %zu bytes at "
			                "%p", n, src);
		cudaError_t e = cudart.MemcpyAsync(dst, src, n, cudaMemcpyDefault, sn->save_stream);
		return e == cudaSuccess ? 0 : snap_cuda_err(e, "copy %zu bytes from %p into the "
		                                            "device staging pool", n, src);
	}
	/* One block size for the whole batch: a compared range needs one that divides
	 * its chunks; a copied one takes any. */
	struct stage_batch *b = sn->batch;
	size_t seg = chunk_bytes ? stage_seg(chunk_bytes) : b->n ? (size_t)b->seg_words * 16 :
	             STAGE_SEG_MAX;
	uint64_t blocks = (n + seg - 1) / seg;
	if (blocks >= STAGE_GRID_MAX)
		return ckpt_err(-EINVAL, "staging pool: a range of %zu bytes", n);
	unsigned chunk_segs = chunk_bytes ? (unsigned)(chunk_bytes / seg) : 0;
	if (b->n && (b->n == STAGE_BATCH_MAX || sn->batch_blocks + blocks >= STAGE_GRID_MAX ||
	             seg != (size_t)b->seg_words * 16 ||
	             (chunk_segs && b->chunk_segs && chunk_segs != b->chunk_segs))) {
		int rc = snap_dev_stage_flush(sn);
		if (rc)
			return rc;
	}
	if (!b->n) {
		b->seg_words = (unsigned)(seg / 16);
		b->chunk_segs = 0;
	}
	if (chunk_segs)
		b->chunk_segs = chunk_segs;
	b->r[b->n++] = (struct stage_range){
		.src = (unsigned long long)(uintptr_t)src, .dst = (unsigned long long)(uintptr_t)dst,
		.nbytes = n, .first_block = sn->batch_blocks,
		.flag = chunk_bytes ? flag : STAGE_NO_FLAG,
	};
	sn->batch_blocks += (unsigned)blocks;
	return 0;
}

int snap_dev_stage_clear(struct snapshot *sn)
{
	cudaError_t e = cudart.MemsetAsync(sn->stage + sn->stage_bytes - SNAPSHOT_STAGE_FLAG_BYTES,
	                                   0, SNAPSHOT_STAGE_FLAG_BYTES, sn->save_stream);
	return e == cudaSuccess ? 0 : snap_cuda_err(e, "clear the staging pool's flags");
}

int snap_dev_stage_flags(struct snapshot *sn, uint32_t *flags, uint32_t n)
{
	/* Queued behind the comparisons on the same stream; the host waits here. */
	int rc = snap_dev_stage_flush(sn);
	if (rc)
		return rc;
	cudaError_t e = cudart.MemcpyAsync(flags, sn->stage + sn->stage_bytes -
	                                   SNAPSHOT_STAGE_FLAG_BYTES, (size_t)n * sizeof *flags,
	                                   cudaMemcpyDefault, sn->save_stream);
	if (e == cudaSuccess)
		e = cudart.StreamSynchronize(sn->save_stream);
	return e == cudaSuccess ? 0 : snap_cuda_err(e, "read the staging pool's flags");
}
