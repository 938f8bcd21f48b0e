/*
 * fuzz_replay.c — runs a fuzz target without libFuzzer, so that every build (gcc
 * too) exercises the parser: each file of a corpus directory, then N seeded
 * mutations of them (bit flips, byte and integer overwrites, truncation,
 * duplication of a range). Usage: fuzz_replay CORPUS_DIR [N]. The seed comes
 * from CKPT_TEST_SEED or the clock and is printed.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

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
		fprintf(stderr, "usage: %s CORPUS_DIR [MUTATIONS]\n", argv[0]);
		return 2;
	}
	unsigned long iters = argc > 2 ? strtoul(argv[2], NULL, 10) : 5000;
	DIR *d = opendir(argv[1]);
	if (!d) {
		perror(argv[1]);
		return 2;
	}
	struct input in[256];
	size_t nin = 0;
	struct dirent *de;
	while ((de = readdir(d)) && nin < 256) {
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
	if (nin == 0) {
		fprintf(stderr, "%s: empty corpus\n", argv[1]);
		return 1;
	}
	uint64_t s = tu_seed();
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
