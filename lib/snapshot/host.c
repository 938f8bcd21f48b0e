/*
 * host.c — the snapshot stage for host memory (and the fallback of every build
 * without CUDA): a fused copy and hash into the pool buffer, so the data crosses
 * the memory bus once on its way to the disk.
 */
#include <string.h>

#include "snapshot/snapshot.h"

#ifndef CKPT_HAVE_CUDA
int snapshot_mem_kind(const void *p, int mem)
{
	CKPT_UNUSED(p);
	return mem == CKPT_MEM_AUTO ? CKPT_MEM_HOST : mem;
}

int snapshot_copy_in(void *dst, const void *src, size_t n, int mem,
                     uint8_t hash[CKPT_HASH_BYTES])
{
	if (mem == CKPT_MEM_DEVICE)
		return ckpt_err(CKPT_ENODEV, "device memory: this libckpt was built without CUDA");
	io_copy_hash128(dst, src, n, hash);
	return 0;
}

int snapshot_copy_out(void *dst, const void *src, size_t n, int mem)
{
	if (mem == CKPT_MEM_DEVICE)
		return ckpt_err(CKPT_ENODEV, "device memory: this libckpt was built without CUDA");
	memcpy(dst, src, n);
	return 0;
}
#endif
