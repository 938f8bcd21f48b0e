/*
 * flip_kernel.cu — the one CUDA kernel of the tests: the "optimizer step" of
 * test_gpu_event, which rewrites every byte of a tensor (bitwise not) on a stream.
 * Compiled by nvcc only where CMake has the CUDA language; the test falls back to
 * cudaMemsetAsync on the same stream otherwise.
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
