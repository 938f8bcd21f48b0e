/*
 * bench_gen.h — the benchmarks' pseudo-random data, shared so that "trained"
 * values mean the same in every table: splitmix64 and a Box-Muller gaussian.
 */
#ifndef CKPT_BENCH_GEN_H
#define CKPT_BENCH_GEN_H

#include <math.h>
#include <stdint.h>

static inline uint64_t rnd(uint64_t *s)
{
	/* splitmix64 */
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static inline double gauss(uint64_t *s)
{
	double u1 = ((double)(rnd(s) >> 11) + 1.0) / 9007199254740993.0;
	double u2 = (double)(rnd(s) >> 11) / 9007199254740992.0;
	return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

#endif
