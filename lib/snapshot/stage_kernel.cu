/*
 * stage_kernel.cu — the one kernel of libckpt: the copies into the device staging
 * pool (lib/snapshot/stage.c), a whole batch of ranges in one launch, each copied or
 * compare-and-copied. The library is C and never needs nvcc: this file is compiled
 * to PTX once (scripts/gen-stage-ptx.sh, with a CUDA toolkit) and the PTX text is
 * kept in stage_ptx.h, which the CUDA runtime compiles for the device at the first
 * use (cudaLibraryLoadData).
 *
 * ckpt_stage (stage_kernel.h): the block finds its range (the last whose first
 * block is at or below its own) and covers words [i * seg_words, (i + 1) *
 * seg_words) of it, i its block within the range (a range is ceil(nbytes / (16 *
 * seg_words)) blocks); the range's last block also the bytes after the last whole
 * word. A copy keeps four loads in flight per thread. A
 * compare-and-copy writes only the words that differ, and a block that found any
 * raises flags[flag + i / chunk_segs] (cleared before). The batch is a
 * __grid_constant__ parameter: read in place, never copied per thread.
 */
#include "stage_kernel.h"

extern "C" __global__ void ckpt_stage(const __grid_constant__ struct stage_batch b)
{
	unsigned lo = 0, hi = b.n;
	while (hi - lo > 1) {
		unsigned mid = (lo + hi) / 2;
		if (b.r[mid].first_block <= blockIdx.x)
			lo = mid;
		else
			hi = mid;
	}
	const struct stage_range *r = &b.r[lo];
	const uint4 *__restrict__ src = (const uint4 *)r->src;
	uint4 *__restrict__ dst = (uint4 *)r->dst;
	unsigned long long nbytes = r->nbytes, words = nbytes / 16;
	unsigned long long blk = blockIdx.x - r->first_block;
	unsigned long long w0 = blk * b.seg_words;
	unsigned long long w1 = w0 + b.seg_words < words ? w0 + b.seg_words : words;
	/* The range is ceil(nbytes / (16 * seg_words)) blocks: the tail's block is the
	 * one its bytes fall in, so its flag is its chunk's. */
	bool last = (blk + 1) * b.seg_words * 16 >= nbytes;
	unsigned long long i = w0 + threadIdx.x, step = blockDim.x;
	if (r->flag == STAGE_NO_FLAG) {
		for (; i + 3 * step < w1; i += 4 * step) {
			uint4 a0 = src[i], a1 = src[i + step], a2 = src[i + 2 * step],
			      a3 = src[i + 3 * step];
			dst[i] = a0;
			dst[i + step] = a1;
			dst[i + 2 * step] = a2;
			dst[i + 3 * step] = a3;
		}
		for (; i < w1; i += step)
			dst[i] = src[i];
		if (last && threadIdx.x == 0)
			for (unsigned long long k = words * 16; k < nbytes; k++)
				((unsigned char *)dst)[k] = ((const unsigned char *)src)[k];
		return;
	}
	int diff = 0;
	for (; i < w1; i += step) {
		uint4 a = src[i], d = dst[i];
		if (a.x != d.x || a.y != d.y || a.z != d.z || a.w != d.w) {
			dst[i] = a;
			diff = 1;
		}
	}
	if (last && threadIdx.x == 0) {
		const unsigned char *s8 = (const unsigned char *)src;
		unsigned char *d8 = (unsigned char *)dst;
		for (unsigned long long k = words * 16; k < nbytes; k++)
			if (s8[k] != d8[k]) {
				d8[k] = s8[k];
				diff = 1;
			}
	}
	if (__syncthreads_or(diff) && threadIdx.x == 0)
		((unsigned *)b.flags)[r->flag + blk / b.chunk_segs] = 1;
}
