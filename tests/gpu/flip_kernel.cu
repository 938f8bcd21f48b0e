/*
 * flip_kernel.cu — the CUDA kernels of the tests: the "optimizer step" of
 * test_gpu_event and test_gpu_order, which rewrites every byte of a tensor (bitwise
 * not) on a stream, and the gate of test_gpu_order, which holds back what is queued
 * behind it on its stream until the host opens it. Compiled by nvcc only where
 * CMake has the CUDA language; test_gpu_event falls back to cudaMemsetAsync on the
 * same stream otherwise, test_gpu_order skips.
 */
#include <cuda_runtime.h>
#include <stddef.h>

__global__ static void flip_bytes(unsigned char *p, size_t n)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x)
		p[i] = (unsigned char)~p[i];
}

/* Queue the kernel on s; returns the launch's cudaError_t as an int. */
extern "C" int test_flip_bytes(void *p, size_t n, cudaStream_t s)
{
	flip_bytes<<<1024, 256, 0, s>>>((unsigned char *)p, n);
	return (int)cudaGetLastError();
}

/* Nanoseconds of the GPU's global timer: wall-clock time whatever the SM clock. */
__device__ static unsigned long long gpu_ns(void)
{
	unsigned long long t;
	asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
	return t;
}

__global__ static void gate(const volatile unsigned *open, unsigned long long timeout_ns)
{
	unsigned long long t0 = gpu_ns();
	while (!*open && gpu_ns() - t0 < timeout_ns)
		__nanosleep(10000);
}

/* Queue on s a one-thread kernel that returns once *open (mapped host memory) is
 * nonzero, or after timeout_ns (so that a test that fails before opening it cannot
 * hang the GPU); returns the launch's cudaError_t as an int. */
extern "C" int test_gate(const unsigned *open, unsigned long long timeout_ns, cudaStream_t s)
{
	gate<<<1, 1, 0, s>>>(open, timeout_ns);
	return (int)cudaGetLastError();
}
