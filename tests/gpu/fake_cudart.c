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
 * libckpt launches, the staging pool's compare-and-copy (lib/snapshot/
 * stage_kernel.cu), is loaded from its PTX text (checked for its name) and run by
 * a C version of the same code with the same grid: its block-per-segment flags and
 * its tail are what the C side of libckpt depends on.
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
	/* The PTX of stage_kernel.cu: its entry must be there. */
	if (!code || !strstr(code, ".entry ckpt_stage_diff("))
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
	if (lib != (cudaLibrary_t)&the_library || strcmp(name, "ckpt_stage_diff"))
		return cudaErrorSymbolNotFound;
	*k = (cudaKernel_t)&the_kernel;
	return cudaSuccess;
}

/* stage_kernel.cu's ckpt_stage_diff, block by block. */
static void stage_diff(dim3 grid, dim3 block, const uint8_t *src, uint8_t *dst,
                       unsigned long long nbytes, unsigned seg_words, unsigned chunk_segs,
                       unsigned *flags)
{
	unsigned long long words = nbytes / 16;
	for (unsigned b = 0; b < grid.x; b++) {
		unsigned long long lo = (unsigned long long)b * seg_words;
		unsigned long long hi = lo + seg_words < words ? lo + seg_words : words;
		int diff = 0;
		for (unsigned long long i = lo; i < hi; i++)
			if (memcmp(src + 16 * i, dst + 16 * i, 16)) {
				memcpy(dst + 16 * i, src + 16 * i, 16);
				diff = 1;
			}
		if (b == grid.x - 1)
			for (unsigned long long i = words * 16; i < nbytes; i++)
				if (src[i] != dst[i]) {
					dst[i] = src[i];
					diff = 1;
				}
		if (diff)
			flags[b / chunk_segs] = 1;
	}
	(void)block;
}

FAKE_API cudaError_t cudaLaunchKernel(const void *func, dim3 grid, dim3 block, void **args,
                                      size_t shmem, cudaStream_t s)
{
	(void)shmem;
	(void)s;
	if (func != (const void *)&the_kernel || grid.y != 1 || grid.z != 1 || !grid.x ||
	    block.x == 0 || block.x > 1024)
		return cudaErrorInvalidValue;
	const uint8_t *src = *(const uint8_t **)args[0];
	uint8_t *dst = *(uint8_t **)args[1];
	/* The kernel reads 16-byte words: both must be aligned, as on the device. */
	if ((uintptr_t)src % 16 || (uintptr_t)dst % 16 || range_kind(src) != 2 ||
	    range_kind(dst) != 2)
		return cudaErrorMisalignedAddress;
	stage_diff(grid, block, src, dst, *(unsigned long long *)args[2], *(unsigned *)args[3],
	           *(unsigned *)args[4], *(unsigned **)args[5]);
	__atomic_add_fetch(&launches, 1, __ATOMIC_RELAXED);
	return cudaSuccess;
}

/* For tests: how many compare-and-copy kernels ran. */
FAKE_API unsigned long long fake_cudart_kernel_launches(void);
FAKE_API unsigned long long fake_cudart_kernel_launches(void)
{
	return __atomic_load_n(&launches, __ATOMIC_RELAXED);
}
