/*
 * fake_cudart.c — a stand-in for the CUDA runtime on host memory, so that libckpt's
 * device path runs in every build, sanitizers included, where there is no GPU: the
 * CUDA test programs are linked against it (the *_fake tests of gpu.cmake) and
 * libckpt loads it as its runtime (CKPT_CUDART names this library's file).
 *
 * One "device" (0). cudaMalloc gives host memory that cudaPointerGetAttributes calls
 * device memory; cudaHostRegister marks host memory pinned. Every operation queued
 * on a stream runs when it is queued, in the calling thread: copies are memmove,
 * host functions are called, events are complete once recorded. The one kernel
 * libckpt launches, the staging pool's batched copy and compare-and-copy
 * (lib/snapshot/stage_kernel.cu), is loaded from its PTX text (checked for its
 * name) and run by a C version of the same code with the same grid, after checking
 * the batch the C side of libckpt built: ranges in grid order, each its number of
 * blocks, aligned; its block-per-segment flags and its tails.
 *
 * What it cannot show: ordering between streams (everything is done when queued),
 * and the PTX itself (tests/gpu on a GPU run that).
 */
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "snapshot/stage_kernel.h"   /* the kernel's argument */

#define FAKE_API __attribute__((visibility("default")))

/* Device allocations and registered host ranges, for cudaPointerGetAttributes. */
struct range { uintptr_t lo, hi; bool device; };
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct range *ranges;
static size_t nranges, cap;
static int current_device;

static int range_add(void *p, size_t n, bool device)
{
	pthread_mutex_lock(&lock);
	if (nranges == cap) {
		size_t c = cap ? cap * 2 : 64;
		struct range *r = realloc(ranges, c * sizeof *r);
		if (!r) {
			pthread_mutex_unlock(&lock);
			return -1;
		}
		ranges = r;
		cap = c;
	}
	ranges[nranges++] = (struct range){ (uintptr_t)p, (uintptr_t)p + (n ? n : 1), device };
	pthread_mutex_unlock(&lock);
	return 0;
}

static bool range_del(const void *p, bool device)
{
	bool found = false;
	pthread_mutex_lock(&lock);
	for (size_t i = 0; i < nranges; i++)
		if (ranges[i].lo == (uintptr_t)p && ranges[i].device == device) {
			ranges[i] = ranges[--nranges];
			found = true;
			break;
		}
	pthread_mutex_unlock(&lock);
	return found;
}

/* 2: device, 1: registered host, 0: neither. */
static int range_kind(const void *p)
{
	int k = 0;
	pthread_mutex_lock(&lock);
	for (size_t i = 0; i < nranges && !k; i++)
		if ((uintptr_t)p >= ranges[i].lo && (uintptr_t)p < ranges[i].hi)
			k = ranges[i].device ? 2 : 1;
	pthread_mutex_unlock(&lock);
	return k;
}

FAKE_API cudaError_t cudaGetDeviceCount(int *n) { *n = 1; return cudaSuccess; }
FAKE_API cudaError_t cudaGetDevice(int *d) { *d = current_device; return cudaSuccess; }
FAKE_API cudaError_t cudaSetDevice(int d)
{
	if (d != 0)
		return cudaErrorInvalidDevice;
	current_device = d;
	return cudaSuccess;
}
FAKE_API cudaError_t cudaGetLastError(void) { return cudaSuccess; }
FAKE_API const char *cudaGetErrorName(cudaError_t e)
{
	return e == cudaSuccess ? "cudaSuccess" : "cudaErrorFake";
}
FAKE_API const char *cudaGetErrorString(cudaError_t e)
{
	return e == cudaSuccess ? "no error" : "error of the stand-in CUDA runtime";
}
FAKE_API cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int d)
{
	if (d != 0)
		return cudaErrorInvalidDevice;
	memset(p, 0, sizeof *p);
	snprintf(p->name, sizeof p->name, "stand-in device (host memory, tests/gpu/fake_cudart.c)");
	return cudaSuccess;
}
FAKE_API cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }

FAKE_API cudaError_t cudaMalloc(void **p, size_t n)
{
	*p = aligned_alloc(256, (n + 255) / 256 * 256 + 256);
	if (!*p)
		return cudaErrorMemoryAllocation;
	memset(*p, 0xA5, n);     /* resident, as device memory is, and not zero */
	if (range_add(*p, n, true)) {
		free(*p);
		*p = NULL;
		return cudaErrorMemoryAllocation;
	}
	return cudaSuccess;
}
FAKE_API cudaError_t cudaFree(void *p)
{
	if (!p)
		return cudaSuccess;
	if (!range_del(p, true))
		return cudaErrorInvalidValue;
	free(p);
	return cudaSuccess;
}
FAKE_API cudaError_t cudaHostRegister(void *p, size_t n, unsigned flags)
{
	(void)flags;
	return range_add(p, n, false) ? cudaErrorMemoryAllocation : cudaSuccess;
}
FAKE_API cudaError_t cudaHostUnregister(void *p)
{
	return range_del(p, false) ? cudaSuccess : cudaErrorInvalidValue;
}
FAKE_API cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *p)
{
	memset(a, 0, sizeof *a);
	int k = range_kind(p);
	a->type = k == 2 ? cudaMemoryTypeDevice : k == 1 ? cudaMemoryTypeHost
	                                                 : cudaMemoryTypeUnregistered;
	a->device = k ? 0 : -1;
	a->devicePointer = k == 2 ? (void *)p : NULL;
	a->hostPointer = k == 1 ? (void *)p : NULL;
	return cudaSuccess;
}

/* Streams, events and libraries are tokens: everything is done when queued. */
struct token { int what; };
static cudaError_t token_new(void **out, int what)
{
	struct token *t = malloc(sizeof *t);
	if (!t)
		return cudaErrorMemoryAllocation;
	t->what = what;
	*out = t;
	return cudaSuccess;
}
FAKE_API cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned f)
{
	(void)f;
	return token_new((void **)s, 1);
}
FAKE_API cudaError_t cudaStreamDestroy(cudaStream_t s) { free(s); return cudaSuccess; }
FAKE_API cudaError_t cudaStreamSynchronize(cudaStream_t s) { (void)s; return cudaSuccess; }
FAKE_API cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned f)
{
	(void)s;
	(void)f;
	return e ? cudaSuccess : cudaErrorInvalidResourceHandle;
}
FAKE_API cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned f)
{
	(void)f;
	return token_new((void **)e, 2);
}
FAKE_API cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
	(void)s;
	return e ? cudaSuccess : cudaErrorInvalidResourceHandle;
}
FAKE_API cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
	return e ? cudaSuccess : cudaErrorInvalidResourceHandle;
}
FAKE_API cudaError_t cudaEventDestroy(cudaEvent_t e) { free(e); return cudaSuccess; }

FAKE_API cudaError_t cudaMemcpy(void *d, const void *s, size_t n, enum cudaMemcpyKind k)
{
	(void)k;
	memmove(d, s, n);
	return cudaSuccess;
}
FAKE_API cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, enum cudaMemcpyKind k,
                                     cudaStream_t st)
{
	(void)k;
	(void)st;
	memmove(d, s, n);
	return cudaSuccess;
}
FAKE_API cudaError_t cudaMemset(void *p, int v, size_t n)
{
	memset(p, v, n);
	return cudaSuccess;
}
FAKE_API cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s)
{
	(void)s;
	memset(p, v, n);
	return cudaSuccess;
}
FAKE_API cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void *arg)
{
	(void)s;
	fn(arg);
	return cudaSuccess;
}

/* ---- the staging pool's kernel */

static struct token the_library = { 3 }, the_kernel = { 4 };
static unsigned long long launches;

FAKE_API cudaError_t cudaLibraryLoadData(cudaLibrary_t *lib, const void *code,
                                         enum cudaJitOption *jo, void **jv, unsigned njo,
                                         enum cudaLibraryOption *lo, void **lv, unsigned nlo)
{
	(void)jo; (void)jv; (void)njo; (void)lo; (void)lv; (void)nlo;
	/* The PTX of stage_kernel.cu: its entry must be there. FAKE_CUDART_NO_KERNEL: a
	 * runtime that cannot compile it (as a driver older than the PTX). */
	if (getenv("FAKE_CUDART_NO_KERNEL"))
		return cudaErrorUnsupportedPtxVersion;
	if (!code || !strstr(code, ".entry ckpt_stage("))
		return cudaErrorInvalidPtx;
	*lib = (cudaLibrary_t)&the_library;
	return cudaSuccess;
}
FAKE_API cudaError_t cudaLibraryUnload(cudaLibrary_t lib)
{
	return lib == (cudaLibrary_t)&the_library ? cudaSuccess : cudaErrorInvalidValue;
}
FAKE_API cudaError_t cudaLibraryGetKernel(cudaKernel_t *k, cudaLibrary_t lib, const char *name)
{
	if (lib != (cudaLibrary_t)&the_library || strcmp(name, "ckpt_stage"))
		return cudaErrorSymbolNotFound;
	*k = (cudaKernel_t)&the_kernel;
	return cudaSuccess;
}

/* stage_kernel.cu's ckpt_stage, block by block: the same arithmetic. */
static void stage_block(const struct stage_batch *b, unsigned block)
{
	unsigned lo = 0, hi = b->n;
	while (hi - lo > 1) {
		unsigned mid = (lo + hi) / 2;
		if (b->r[mid].first_block <= block)
			lo = mid;
		else
			hi = mid;
	}
	const struct stage_range *r = &b->r[lo];
	const uint8_t *src = (const uint8_t *)(uintptr_t)r->src;
	uint8_t *dst = (uint8_t *)(uintptr_t)r->dst;
	unsigned long long nbytes = r->nbytes, words = nbytes / 16;
	unsigned long long blk = block - r->first_block;
	unsigned long long w0 = blk * b->seg_words;
	unsigned long long w1 = w0 + b->seg_words < words ? w0 + b->seg_words : words;
	bool last = (blk + 1) * b->seg_words * 16 >= nbytes;
	int diff = 0;
	for (unsigned long long i = w0; i < w1; i++)
		if (memcmp(src + 16 * i, dst + 16 * i, 16)) {
			memcpy(dst + 16 * i, src + 16 * i, 16);
			diff = 1;
		}
	if (last)
		for (unsigned long long i = words * 16; i < nbytes; i++)
			if (src[i] != dst[i]) {
				dst[i] = src[i];
				diff = 1;
			}
	if (diff && r->flag != STAGE_NO_FLAG)
		((unsigned *)(uintptr_t)b->flags)[r->flag + blk / b->chunk_segs] = 1;
}

FAKE_API cudaError_t cudaLaunchKernel(const void *func, dim3 grid, dim3 block, void **args,
                                      size_t shmem, cudaStream_t s)
{
	(void)shmem;
	(void)s;
	if (func != (const void *)&the_kernel || grid.y != 1 || grid.z != 1 || !grid.x ||
	    block.x == 0 || block.x > 1024)
		return cudaErrorInvalidValue;
	const struct stage_batch *b = args[0];
	if (!b->n || b->n > STAGE_BATCH_MAX || !b->seg_words || b->r[0].first_block)
		return cudaErrorInvalidValue;
	/* The ranges cover the grid in order, each its ceil(nbytes / segment) blocks;
	 * the kernel reads 16-byte words: every address aligned, as on the device. */
	unsigned long long seg = 16ull * b->seg_words;
	for (unsigned k = 0; k < b->n; k++) {
		const struct stage_range *r = &b->r[k];
		unsigned long long end = k + 1 < b->n ? b->r[k + 1].first_block : grid.x;
		if (!r->nbytes || end - r->first_block != (r->nbytes + seg - 1) / seg ||
		    (r->flag != STAGE_NO_FLAG && !b->chunk_segs))
			return cudaErrorInvalidValue;
		if (r->src % 16 || r->dst % 16 || range_kind((const void *)(uintptr_t)r->src) != 2 ||
		    range_kind((const void *)(uintptr_t)r->dst) != 2)
			return cudaErrorMisalignedAddress;
	}
	for (unsigned x = 0; x < grid.x; x++)
		stage_block(b, x);
	__atomic_add_fetch(&launches, 1, __ATOMIC_RELAXED);
	return cudaSuccess;
}

/* For tests: how many staging kernels ran. */
FAKE_API unsigned long long fake_cudart_kernel_launches(void);
FAKE_API unsigned long long fake_cudart_kernel_launches(void)
{
	return __atomic_load_n(&launches, __ATOMIC_RELAXED);
}
