/*
 * bench_hash.c — what hashing a chunk costs, in the two ways the shard format has
 * taken a chunk's hash (docs/format.md §5): format 4, the XXH3-128 of its bytes
 * beside the hash of each 256 KiB block (each byte hashed twice), and format 5, the
 * chunk's hash over its block hashes (each byte hashed once). Both as a save takes
 * them: hashed where the bytes lie (a state sent from the tensors, a load's verify)
 * and in the same pass as the copy into a pool buffer (the snapshot copy). The limit
 * measured in the same run is memcpy of the same bytes (and, for the in-place rows,
 * one read of them: memchr of a byte they do not hold).
 *
 * Usage: bench_hash [MiB (1024)] [reps (5)] [chunk MiB (16)]
 * Figures are GB/s of raw bytes, single thread, the best of reps, on a buffer larger
 * than the caches.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/io_internal.h"

#include "../bench_gen.h"

static double secs(uint64_t t0) { return (double)(ckpt_now_ns() - t0) / 1e9; }

enum op { OP_READ, OP_COPY, OP_FLAT, OP_TREE, OP_COPY_FLAT, OP_COPY_TREE };

/* One pass of op over the n bytes of src, chunk by chunk; its seconds. */
static double pass(enum op op, uint8_t *dst, const uint8_t *src, size_t n, size_t chunk,
                   uint8_t *blocks, volatile uint64_t *sink)
{
	uint8_t h[CKPT_HASH_BYTES];
	uint64_t t0 = ckpt_now_ns(), sum = 0;
	for (size_t off = 0; off < n; off += chunk) {
		size_t k = n - off < chunk ? n - off : chunk;
		switch (op) {
		case OP_READ:
			/* No byte is 0: memchr reads the whole chunk, at the library's
			 * vector width. */
			sum += memchr(src + off, 0, k) != NULL;
			break;
		case OP_COPY:
			memcpy(dst + off, src + off, k);
			break;
		case OP_FLAT:
		case OP_TREE:
			io_copy_hash128_blocks(NULL, src + off, k, IO_BLOCK_BYTES, op == OP_TREE, h,
			                       blocks);
			break;
		case OP_COPY_FLAT:
		case OP_COPY_TREE:
			io_copy_hash128_blocks(dst + off, src + off, k, IO_BLOCK_BYTES,
			                       op == OP_COPY_TREE, h, blocks);
			break;
		}
		sum += h[0];
	}
	*sink += sum;
	return secs(t0);
}

int main(int argc, char **argv)
{
	size_t mib = argc > 1 ? strtoul(argv[1], NULL, 10) : 1024;
	int reps = argc > 2 ? atoi(argv[2]) : 5;
	size_t chunk = (argc > 3 ? strtoul(argv[3], NULL, 10) : 16) << 20;
	if (!mib || reps < 1 || !chunk) {
		fprintf(stderr, "usage: bench_hash [MiB (1024)] [reps (5)] [chunk MiB (16)]\n");
		return 2;
	}
	size_t n = mib << 20;
	uint8_t *src = malloc(n), *dst = malloc(n);
	uint8_t *blocks = malloc((size_t)io_nblocks(chunk, IO_BLOCK_BYTES) * CKPT_HASH_BYTES + 16);
	if (!src || !dst || !blocks) {
		fprintf(stderr, "bench_hash: %zu MiB: out of memory\n", mib);
		return 1;
	}
	uint64_t seed = 1;
	for (size_t i = 0; i + 8 <= n; i += 8) {
		uint64_t w = rnd(&seed);
		memcpy(src + i, &w, 8);
	}
	for (size_t i = 0; i < n; i++)
		src[i] |= !src[i];        /* no zero byte: the read row's memchr sees them all */
	memset(dst, 0, n);
	volatile uint64_t sink = 0;
	static const struct { enum op op; const char *name; enum op limit; } rows[] = {
		{ OP_READ, "read (memchr): the in-place limit", OP_READ },
		{ OP_FLAT, "in place, format 4 (chunk + blocks)", OP_READ },
		{ OP_TREE, "in place, format 5 (tree)", OP_READ },
		{ OP_COPY, "memcpy: the copy limit", OP_COPY },
		{ OP_COPY_FLAT, "copy + format 4", OP_COPY },
		{ OP_COPY_TREE, "copy + format 5", OP_COPY },
	};
	double best[6] = { 0 };
	for (int r = 0; r < reps; r++)
		for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
			double s = pass(rows[i].op, dst, src, n, chunk, blocks, &sink);
			double gbs = (double)n / s / 1e9;
			if (gbs > best[rows[i].op])
				best[rows[i].op] = gbs;
		}
	printf("hashing %zu MiB in %zu MiB chunks, 256 KiB blocks, one thread, best of %d\n\n",
	       mib, chunk >> 20, reps);
	printf("| pass | GB/s | of the limit |\n| --- | --- | --- |\n");
	for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
		printf("| %s | %.2f | %.2f |\n", rows[i].name, best[rows[i].op],
		       best[rows[i].op] / best[rows[i].limit]);
	printf("\nformat 5 against format 4: %.2f x in place, %.2f x with the copy\n",
	       best[OP_TREE] / best[OP_FLAT], best[OP_COPY_TREE] / best[OP_COPY_FLAT]);
	free(src);
	free(dst);
	free(blocks);
	return sink == 42 ? 3 : 0;
}
