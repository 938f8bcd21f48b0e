/*
 * stage_kernel.cu — the one kernel of libckpt: a compare-and-copy into the device
 * staging pool (lib/snapshot/stage.c). The library is C and never needs nvcc: this
 * file is compiled to PTX once (scripts/gen-stage-ptx.sh, with a CUDA toolkit) and
 * the PTX text is kept in stage_ptx.h, which the CUDA runtime compiles for the
 * device at the first use (cudaLibraryLoadData).
 *
 * ckpt_stage_diff: dst gets src's bytes, nbytes of them; only the 16-byte words
 * that differ are written. Block b covers words [b * seg_words, (b + 1) * seg_words)
 * of the range; the last block also the bytes after the last whole word. A block
 * that found any difference raises flags[b / chunk_segs] (a chunk is chunk_segs
 * segments; flags were cleared before). src and dst are 16-byte aligned.
 */
extern "C" __global__ void ckpt_stage_diff(const uint4 *__restrict__ src,
                                           uint4 *__restrict__ dst,
                                           unsigned long long nbytes, unsigned seg_words,
                                           unsigned chunk_segs, unsigned *__restrict__ flags)
{
	unsigned long long words = nbytes / 16;
	unsigned long long lo = (unsigned long long)blockIdx.x * seg_words;
	unsigned long long hi = lo + seg_words < words ? lo + seg_words : words;
	int diff = 0;
	for (unsigned long long i = lo + threadIdx.x; i < hi; i += blockDim.x) {
		uint4 a = src[i], b = dst[i];
		if (a.x != b.x || a.y != b.y || a.z != b.z || a.w != b.w) {
			dst[i] = a;
			diff = 1;
		}
	}
	if (blockIdx.x == gridDim.x - 1 && threadIdx.x == 0) {
		const unsigned char *s8 = (const unsigned char *)src;
		unsigned char *d8 = (unsigned char *)dst;
		for (unsigned long long i = words * 16; i < nbytes; i++)
			if (s8[i] != d8[i]) {
				d8[i] = s8[i];
				diff = 1;
			}
	}
	if (__syncthreads_or(diff) && threadIdx.x == 0)
		flags[blockIdx.x / chunk_segs] = 1;
}
