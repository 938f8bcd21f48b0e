/*
 * gpu_test.h — what the CUDA test programs share. They are plain C programs, not
 * Check suites, so that they build where Check is missing (the GPU machine); each
 * exits 0 (pass), 1 (fail, with file:line and the reason) or 77 (skipped: no CUDA
 * device here, reason printed).
 */
#ifndef CKPT_GPU_TEST_H
#define CKPT_GPU_TEST_H

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "ckpt/catalog.h"
#include "ckpt/ckpt.h"
#include "ckpt/cuda.h"
#include "testutil.h"

#define GT_SKIP 77

#define CHECK(cond, ...) do {                                                        \
	if (!(cond)) {                                                                   \
		fprintf(stderr, "%s:%d: FAIL: %s: ", __FILE__, __LINE__, #cond);              \
		fprintf(stderr, __VA_ARGS__);                                                \
		fprintf(stderr, " (CKPT_TEST_SEED=%llu)\n", (unsigned long long)tu_seed());  \
		exit(1);                                                                     \
	}                                                                                \
} while (0)

#define CUDA_OK(call) do {                                                           \
	cudaError_t e_ = (call);                                                         \
	CHECK(e_ == cudaSuccess, "%s", cudaGetErrorString(e_));                         \
} while (0)

#define CKPT_OK(c, call) do {                                                        \
	(void)(c);          /* the message is per thread (ckpt_last_error) */             \
	int rc_ = (call);                                                                \
	CHECK(rc_ == 0, "%s: %s", ckpt_strerror(rc_), ckpt_last_error());              \
} while (0)

/* Exit 77 unless a CUDA device is usable; print which one otherwise. */
static inline void gt_require_device(const char *test)
{
	int n = 0;
	cudaError_t e = cudaGetDeviceCount(&n);
	if (e != cudaSuccess || n == 0) {
		printf("SKIP %s: no CUDA device (%s)\n", test,
		       e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
		exit(GT_SKIP);
	}
	struct cudaDeviceProp p;
	CUDA_OK(cudaGetDeviceProperties(&p, 0));
	CUDA_OK(cudaSetDevice(0));
	printf("%s: device 0 of %d: %s\n", test, n, p.name);
}

/* A context on root for one rank, with a device: fails if libckpt saw none. */
static inline ckpt_ctx *gt_open(const char *root, size_t chunk, size_t pool)
{
	struct ckpt_opts o;
	ckpt_opts_init(&o, sizeof o);
	o.root = root;
	o.rank = 0;
	o.world = 1;
	o.chunk_bytes = chunk;
	o.pool_bytes = pool;
	ckpt_ctx *c = NULL;
	int rc = ckpt_open(&o, &c);
	CHECK(rc == 0, "open %s: %s", root, ckpt_last_error());
	CHECK(ckpt_cuda_available(c) == 1, "a device is present but libckpt works on host memory");
	return c;
}

/* Device copy of n seeded bytes; the host reference stays in *host (malloc'd). */
static inline void *gt_device_data(size_t n, uint64_t stream, uint8_t **host)
{
	*host = malloc(n ? n : 1);
	CHECK(*host, "malloc %zu", n);
	tu_fill(*host, n, tu_seed(), stream);
	void *d = NULL;
	CUDA_OK(cudaMalloc(&d, n ? n : 1));
	CUDA_OK(cudaMemcpy(d, *host, n, cudaMemcpyHostToDevice));
	return d;
}

/* Does device memory d hold exactly the n bytes at want? */
static inline int gt_device_equals(const void *d, const void *want, size_t n)
{
	uint8_t *h = malloc(n ? n : 1);
	CHECK(h, "malloc %zu", n);
	CUDA_OK(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost));
	int eq = !memcmp(h, want, n);
	free(h);
	return eq;
}

/* Load tensor name (whole) into host memory and compare with want. */
static inline void gt_check_host_load(ckpt_ctx *c, ckpt_load *l, const char *name, int dtype,
                                      unsigned ndim, const void *want, size_t n)
{
	uint8_t *got = malloc(n + 1);
	CHECK(got, "malloc");
	memset(got, 0x5A, n + 1);
	CKPT_OK(c, ckpt_load_tensor(l, name, dtype, ndim, NULL, NULL, got, CKPT_MEM_HOST));
	CHECK(!memcmp(got, want, n), "'%s' (%zu bytes) differs from what was saved", name, n);
	CHECK(got[n] == 0x5A, "'%s': bytes written past the box", name);
	free(got);
}

static inline double gt_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

#endif
