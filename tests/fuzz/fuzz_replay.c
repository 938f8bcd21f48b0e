/*
 * fuzz_replay.c — runs a fuzz target without libFuzzer, so that every build (gcc
 * too) exercises the parser: each file of a corpus directory, then N seeded
 * mutations of them (bit flips, byte and integer overwrites, truncation,
 * duplication of a range). Usage: fuzz_replay CORPUS_DIR [N]. The seed comes
 * from CKPT_TEST_SEED or the clock and is printed.
 *
 * A target may also define fuzz_replay_seeds(): valid inputs generated from the
 * seed, added to the corpus (so each run starts from new valid messages too);
 * "fuzz_replay --emit DIR" writes a set of them as a seed corpus for libFuzzer.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
/* Optional (weak): up to max seeded valid inputs, malloc'd; returns the count. */
size_t fuzz_replay_seeds(uint64_t seed, uint8_t **bufs, size_t *lens, size_t max)
	__attribute__((weak));

#define MAX_INPUTS 256

struct input { uint8_t *p; size_t n; };

static void mutate(uint8_t **buf, size_t *n, uint64_t *s)
{
	uint8_t *p = *buf;
	size_t len = *n;
	unsigned steps = 1 + (unsigned)(tu_rand(s) % 4);
	for (unsigned k = 0; k < steps && len; k++) {
		size_t at = (size_t)(tu_rand(s) % len);
		switch (tu_rand(s) % 6) {
		case 0:                     /* flip a bit */
			p[at] ^= (uint8_t)(1u << (tu_rand(s) % 8));
			break;
		case 1:                     /* random byte */
			p[at] = (uint8_t)tu_rand(s);
			break;
		case 2: {                   /* interesting little-endian integer */
			static const uint64_t vals[] = { 0, 1, 2, 16, 17, 255, 4095, 4096, 65535,
			                                 0x7fffffff, 0xffffffff, 1ull << 32,
			                                 UINT64_MAX, UINT64_MAX - 4095 };
			uint64_t v = vals[tu_rand(s) % (sizeof vals / sizeof vals[0])];
			size_t w = (size_t)1 << (tu_rand(s) % 4);     /* 1, 2, 4, 8 bytes */
			for (size_t i = 0; i < w && at + i < len; i++)
				p[at + i] = (uint8_t)(v >> (8 * i));
			break;
		}
		case 3:                     /* truncate */
			len = at;
			break;
		case 4: {                   /* duplicate a range at the end */
			size_t m = (size_t)(tu_rand(s) % 64) + 1;
			if (m > len - at)
				m = len - at;
			uint8_t *q = realloc(p, len + m);
			if (!q)
				abort();
			p = q;
			memcpy(p + len, p + at, m);
			len += m;
			break;
		}
		default:                    /* small arithmetic */
			p[at] = (uint8_t)(p[at] + (tu_rand(s) % 2 ? 1 : -1));
			break;
		}
	}
	*buf = p;
	*n = len;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: %s CORPUS_DIR [MUTATIONS] | --emit DIR\n", argv[0]);
		return 2;
	}
	if (!strcmp(argv[1], "--emit")) {
		uint8_t *bufs[48];
		size_t lens[48];
		if (argc < 3 || !fuzz_replay_seeds) {
			fprintf(stderr, "--emit DIR: this target has no seed generator\n");
			return 2;
		}
		size_t n = fuzz_replay_seeds(1, bufs, lens, 48);
		for (size_t i = 0; i < n; i++) {
			char path[4096];
			snprintf(path, sizeof path, "%s/seed-%02zu", argv[2], i);
			if (tu_write_file(path, bufs[i], lens[i]))
				return 1;
			free(bufs[i]);
		}
		return 0;
	}
	unsigned long iters = argc > 2 ? strtoul(argv[2], NULL, 10) : 5000;
	DIR *d = opendir(argv[1]);
	if (!d) {
		perror(argv[1]);
		return 2;
	}
	struct input in[MAX_INPUTS];
	size_t nin = 0;
	struct dirent *de;
	while ((de = readdir(d)) && nin < MAX_INPUTS / 2) {
		if (de->d_name[0] == '.')
			continue;
		char path[4096];
		snprintf(path, sizeof path, "%s/%s", argv[1], de->d_name);
		void *p;
		size_t n;
		if (tu_read_file(path, &p, &n) == 0) {
			LLVMFuzzerTestOneInput(p, n);
			in[nin++] = (struct input){ p, n };
		}
	}
	closedir(d);
	uint64_t s = tu_seed();
	if (fuzz_replay_seeds) {
		uint8_t *bufs[MAX_INPUTS / 2];
		size_t lens[MAX_INPUTS / 2];
		size_t n = fuzz_replay_seeds(s, bufs, lens, MAX_INPUTS - nin < MAX_INPUTS / 2
		                             ? MAX_INPUTS - nin : MAX_INPUTS / 2);
		for (size_t i = 0; i < n; i++) {
			LLVMFuzzerTestOneInput(bufs[i], lens[i]);
			in[nin++] = (struct input){ bufs[i], lens[i] };
		}
	}
	if (nin == 0) {
		fprintf(stderr, "%s: empty corpus\n", argv[1]);
		return 1;
	}
	for (unsigned long i = 0; i < iters; i++) {
		const struct input *src = &in[tu_rand(&s) % nin];
		size_t n = src->n;
		uint8_t *p = malloc(n ? n : 1);
		memcpy(p, src->p, n);
		mutate(&p, &n, &s);
		/* An exact-size copy so that ASan sees any overread. */
		uint8_t *exact = malloc(n ? n : 1);
		memcpy(exact, p, n);
		LLVMFuzzerTestOneInput(exact, n);
		free(exact);
		free(p);
	}
	for (size_t i = 0; i < nin; i++)
		free(in[i].p);
	printf("fuzz_replay: %zu corpus files, %lu mutations: ok\n", nin, iters);
	return 0;
}
