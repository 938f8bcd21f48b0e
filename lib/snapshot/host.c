/*
 * host.c — the snapshot object as every build sees it, and the whole of it in
 * builds without CUDA: host memory only, the pool's default memory (page-aligned,
 * pre-faulted, from lib/io), memcpy on load, and a device backend whose every call
 * fails with CKPT_ENODEV (pipe.c never reaches it, because device pointers are
 * refused when the tensor is added).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "snapshot/snapshot_internal.h"

bool snapshot_has_device(const struct snapshot *sn) { return sn && sn->device; }
bool snapshot_pool_pinned(const struct snapshot *sn) { return sn && sn->pool_pinned; }

const struct io_pool_alloc *snapshot_pool_alloc(struct snapshot *sn)
{
	return sn && sn->device ? &sn->alloc : NULL;
}

#ifndef CKPT_HAVE_CUDA
#define NO_CUDA "device memory: this libckpt was built without CUDA"

int snapshot_create(struct snapshot **out)
{
	*out = ckpt_calloc(1, sizeof **out);
	return *out ? 0 : ckpt_err(-ENOMEM, "snapshot state");
}

void snapshot_destroy(struct snapshot *sn)
{
	ckpt_free(sn);
}

int snapshot_mem_kind(struct snapshot *sn, const void *p, int mem, int *device)
{
	CKPT_UNUSED(sn);
	CKPT_UNUSED(p);
	*device = -1;
	if (mem == CKPT_MEM_AUTO || mem == CKPT_MEM_HOST)
		return CKPT_MEM_HOST;
	if (mem == CKPT_MEM_DEVICE)
		return ckpt_err(CKPT_ENODEV, NO_CUDA);
	return ckpt_err(-EINVAL, "unknown memory kind %d", mem);
}

int snapshot_bind(struct snapshot *sn, int device)
{
	CKPT_UNUSED(sn);
	return device < 0 ? 0 : ckpt_err(CKPT_ENODEV, NO_CUDA);
}

int snapshot_copy_out(struct snapshot *sn, void *dst, const void *src, size_t n, int mem)
{
	CKPT_UNUSED(sn);
	if (mem == CKPT_MEM_DEVICE)
		return ckpt_err(CKPT_ENODEV, NO_CUDA);
	memcpy(dst, src, n);
	return 0;
}

int snapshot_copy_out_wait(struct snapshot *sn)
{
	CKPT_UNUSED(sn);
	return 0;
}

void snapshot_event_destroy(struct snapshot *sn, void *event)
{
	CKPT_UNUSED(sn);
	CKPT_UNUSED(event);
}

int snapshot_fence(struct snapshot *sn, void *stream, void **fence)
{
	CKPT_UNUSED(sn);
	CKPT_UNUSED(stream);
	*fence = NULL;        /* no device tensor can be added: nothing to order */
	return 0;
}

int snap_dev_after(struct snapshot *sn, void *fence)
{
	CKPT_UNUSED(sn);
	CKPT_UNUSED(fence);
	return ckpt_err(CKPT_ENODEV, NO_CUDA);
}

int snap_dev_prepare(struct snapshot *sn, unsigned n)
{
	CKPT_UNUSED(sn);
	CKPT_UNUSED(n);
	return ckpt_err(CKPT_ENODEV, NO_CUDA);
}

int snap_dev_copy(struct snapshot *sn, void *dst, const void *src, size_t n, unsigned slot)
{
	CKPT_UNUSED(sn);
	CKPT_UNUSED(dst);
	CKPT_UNUSED(src);
	CKPT_UNUSED(n);
	CKPT_UNUSED(slot);
	return ckpt_err(CKPT_ENODEV, NO_CUDA);
}

int snap_dev_wait(struct snapshot *sn, unsigned slot)
{
	CKPT_UNUSED(sn);
	CKPT_UNUSED(slot);
	return ckpt_err(CKPT_ENODEV, NO_CUDA);
}

int snap_dev_seal(struct snapshot *sn, void **event, void (*landed)(void *), void *arg)
{
	CKPT_UNUSED(sn);
	CKPT_UNUSED(landed);
	CKPT_UNUSED(arg);
	*event = NULL;
	return ckpt_err(CKPT_ENODEV, NO_CUDA);
}

int snap_dev_bind_thread(struct snapshot *sn)
{
	CKPT_UNUSED(sn);
	return 0;
}

void snap_dev_quiesce(struct snapshot *sn)
{
	CKPT_UNUSED(sn);
}

/* No device: no staging pool, and the pipe never reaches the rest. */
size_t snapshot_stage_reserve(struct snapshot *sn, size_t bytes)
{
	CKPT_UNUSED(sn);
	CKPT_UNUSED(bytes);
	return 0;
}

bool snapshot_stage_can_diff(const struct snapshot *sn)
{
	CKPT_UNUSED(sn);
	return false;
}

size_t snapshot_stage_room(const struct snapshot *sn)
{
	CKPT_UNUSED(sn);
	return 0;
}

int snap_dev_stage(struct snapshot *sn, uint64_t off, const void *src, size_t n, bool device,
                   size_t chunk_bytes, uint32_t flag, const void **staged)
{
	CKPT_UNUSED(sn);
	CKPT_UNUSED(off);
	CKPT_UNUSED(src);
	CKPT_UNUSED(n);
	CKPT_UNUSED(device);
	CKPT_UNUSED(chunk_bytes);
	CKPT_UNUSED(flag);
	*staged = NULL;
	return ckpt_err(CKPT_ENODEV, NO_CUDA);
}

int snap_dev_stage_flush(struct snapshot *sn)
{
	CKPT_UNUSED(sn);
	return 0;
}

int snap_dev_stage_clear(struct snapshot *sn)
{
	CKPT_UNUSED(sn);
	return ckpt_err(CKPT_ENODEV, NO_CUDA);
}

int snap_dev_stage_flags(struct snapshot *sn, uint32_t *flags, uint32_t n)
{
	CKPT_UNUSED(sn);
	CKPT_UNUSED(flags);
	CKPT_UNUSED(n);
	return ckpt_err(CKPT_ENODEV, NO_CUDA);
}
/* GPUDirect Storage needs a device: never enabled here, so the glue never calls the
 * rest (they answer -ENOTSUP should it do so). */
int snapshot_gds_enable(struct snapshot *sn)
{
	CKPT_UNUSED(sn);
	return ckpt_err(CKPT_ENODEV, "GPUDirect Storage: " NO_CUDA);
}

bool snapshot_gds_on(const struct snapshot *sn)
{
	CKPT_UNUSED(sn);
	return false;
}

void snapshot_gds_counters(struct snapshot *sn, uint64_t out[5])
{
	CKPT_UNUSED(sn);
	memset(out, 0, 5 * sizeof *out);
}

int snapshot_gds_read_batch(struct snapshot *sn, struct io_pool *pool,
                            const struct io_read_req *reqs, size_t n, io_chunk_cb cb)
{
	CKPT_UNUSED(sn);
	CKPT_UNUSED(pool);
	CKPT_UNUSED(reqs);
	CKPT_UNUSED(n);
	CKPT_UNUSED(cb);
	return ckpt_err(-ENOTSUP, "GPUDirect Storage: " NO_CUDA);
}

int snapshot_gds_file_open(struct snapshot *sn, const char *path, void **file)
{
	CKPT_UNUSED(sn);
	CKPT_UNUSED(path);
	*file = NULL;
	return ckpt_err(-ENOTSUP, "GPUDirect Storage: " NO_CUDA);
}

int snapshot_gds_file_close(struct snapshot *sn, void *file)
{
	CKPT_UNUSED(sn);
	CKPT_UNUSED(file);
	return 0;
}

int snapshot_gds_write(void *file, const void *src, size_t n, uint64_t off)
{
	CKPT_UNUSED(file);
	CKPT_UNUSED(src);
	CKPT_UNUSED(n);
	CKPT_UNUSED(off);
	return ckpt_err(-ENOTSUP, "GPUDirect Storage: " NO_CUDA);
}
#endif /* !CKPT_HAVE_CUDA */
