/*
 * bench_d2h.c — the copy engine's limit for the snapshot: device-to-host bandwidth
 * into pinned memory, measured the way lib/snapshot copies (chunks of CHUNK bytes
 * cudaMemcpyAsync'd on one non-blocking stream into anonymous memory pinned with
 * cudaHostRegister), and for reference into cudaHostAlloc memory in one copy and
 * into pageable memory. Best of REPS. Prints one JSON object.
 *
 *   bench_d2h [MiB total (1024)] [MiB per chunk (16)] [reps (5)]
 *
 * Exit 77 without a device.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include <cuda_runtime_api.h>

#define CUDA_OK(call) do {                                                           \
	cudaError_t e_ = (call);                                                         \
	if (e_ != cudaSuccess) {                                                         \
		fprintf(stderr, "bench_d2h: %s: %s\n", #call, cudaGetErrorString(e_));        \
		exit(1);                                                                     \
	}                                                                                \
} while (0)

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Best bandwidth (bytes/s) of copying total bytes from dev into host, chunk at a time. */
static double copy_bw(void *host, const void *dev, size_t total, size_t chunk, cudaStream_t s,
                      int reps)
{
	double best = 0;
	for (int r = 0; r < reps; r++) {
		double t0 = now();
		for (size_t off = 0; off < total; off += chunk) {
			size_t n = total - off < chunk ? total - off : chunk;
			CUDA_OK(cudaMemcpyAsync((char *)host + off, (const char *)dev + off, n,
			                        cudaMemcpyDeviceToHost, s));
		}
		CUDA_OK(cudaStreamSynchronize(s));
		double bw = (double)total / (now() - t0);
		if (bw > best)
			best = bw;
	}
	return best;
}

int main(int argc, char **argv)
{
	size_t total = (size_t)(argc > 1 ? atol(argv[1]) : 1024) << 20;
	size_t chunk = (size_t)(argc > 2 ? atol(argv[2]) : 16) << 20;
	int reps = argc > 3 ? atoi(argv[3]) : 5;
	int n = 0;
	if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
		printf("SKIP bench_d2h: no CUDA device\n");
		return 77;
	}
	struct cudaDeviceProp p;
	CUDA_OK(cudaGetDeviceProperties(&p, 0));
	void *dev;
	CUDA_OK(cudaMalloc(&dev, total));
	CUDA_OK(cudaMemset(dev, 0x3C, total));
	cudaStream_t s;
	CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

	/* As the pool: anonymous, huge-page advised, faulted in, then registered. */
	void *reg = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (reg == MAP_FAILED) { perror("mmap"); return 1; }
	madvise(reg, total, MADV_HUGEPAGE);
	memset(reg, 0, total);
	CUDA_OK(cudaHostRegister(reg, total, cudaHostRegisterPortable));
	copy_bw(reg, dev, total, chunk, s, 1);            /* warm-up */
	double bw_reg = copy_bw(reg, dev, total, chunk, s, reps);
	double bw_reg_whole = copy_bw(reg, dev, total, total, s, reps);
	CUDA_OK(cudaHostUnregister(reg));

	void *ha;
	CUDA_OK(cudaHostAlloc(&ha, total, cudaHostAllocPortable));
	copy_bw(ha, dev, total, total, s, 1);
	double bw_alloc = copy_bw(ha, dev, total, total, s, reps);
	CUDA_OK(cudaFreeHost(ha));

	/* Pageable: the same (now unregistered) mapping; fewer reps, it is slow. */
	double bw_page = copy_bw(reg, dev, total, chunk, s, reps > 2 ? 2 : reps);
	munmap(reg, total);
	CUDA_OK(cudaFree(dev));
	printf("{\"device\": \"%s\", \"bytes\": %zu, \"chunk_bytes\": %zu, "
	       "\"pinned_registered_chunked_Bps\": %.0f, \"pinned_registered_whole_Bps\": %.0f, "
	       "\"pinned_hostalloc_whole_Bps\": %.0f, \"pageable_chunked_Bps\": %.0f}\n",
	       p.name, total, chunk, bw_reg, bw_reg_whole, bw_alloc, bw_page);
	return 0;
}
