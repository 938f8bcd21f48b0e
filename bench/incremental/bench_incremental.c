/*
 * bench_incremental.c — what an incremental save costs against a full one
 * (docs/format.md §3b): a state of host tensors is saved whole, then again with
 * 10% of its bytes changed, with references on and off. Prints, per save, the bytes
 * written and the time from submit to durable (every byte and the footer synced,
 * ckpt_save_stats' durable_seconds) and to committed, as a table.
 *
 * Usage: bench_incremental ROOT [MiB of state, default 512] [repeats, default 3]
 * ROOT must not exist or be empty; it is left as it is (remove it after).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt.h"

#define NT 40                       /* tensors: 10% changed = 4 of them */

static float *t[NT];
static size_t tbytes;

static int save(ckpt_ctx *c, uint64_t step, int incremental, struct ckpt_save_stats *st)
{
	ckpt_save *s;
	int rc = ckpt_save_begin(c, step, &s);
	if (rc)
		return rc;
	uint64_t n = tbytes / 4;
	for (int i = 0; i < NT && !rc; i++) {
		char name[32];
		snprintf(name, sizeof name, "layer%02d/w", i);
		struct ckpt_tensor x = { .name = name, .kind = CKPT_KIND_MODEL, .dtype = CKPT_F32,
			.policy = CKPT_REPLICATED, .ndim = 1, .global_shape = &n, .data = t[i] };
		rc = ckpt_save_add_tensor(s, &x);
	}
	if (!rc)
		rc = ckpt_save_set_incremental(s, incremental);
	if (!rc)
		rc = ckpt_save_submit(s);
	if (!rc)
		rc = ckpt_save_wait(s, -1);
	st->size = sizeof *st;
	if (!rc)
		ckpt_save_stats(s, st);
	ckpt_save_free(s);
	return rc;
}

/* Change fraction 1/10 of the state: the first NT/10 tensors, every element. */
static void change(uint64_t step)
{
	for (int i = 0; i < NT / 10; i++)
		for (size_t k = 0; k < tbytes / 4; k++)
			t[i][k] += (float)step;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: %s ROOT [MiB] [repeats]\n", argv[0]);
		return 2;
	}
	size_t mib = argc > 2 ? (size_t)atol(argv[2]) : 512;
	int reps = argc > 3 ? atoi(argv[3]) : 3;
	tbytes = (mib << 20) / NT / 4096 * 4096;
	for (int i = 0; i < NT; i++) {
		if (!(t[i] = malloc(tbytes)))
			return 1;
		for (size_t k = 0; k < tbytes / 4; k++)
			t[i][k] = (float)(i * 7919 + k);
	}
	struct ckpt_opts o;
	ckpt_opts_init(&o, sizeof o);
	o.root = argv[1];
	o.rank = 0;
	o.world = 1;
	ckpt_ctx *c;
	if (ckpt_open(&o, &c)) {
		fprintf(stderr, "open: %s\n", ckpt_last_error());
		return 1;
	}
	printf("state %zu MiB in %d tensors of %zu MiB; %d tensors (10%%) change between "
	       "the measured steps; %d repeats\n\n", (size_t)NT * tbytes >> 20, NT, tbytes >> 20,
	       NT / 10, reps);
	printf("| save | logical MiB | written MiB | written/logical | durable s | committed s "
	       "| durable / full |\n|---|---:|---:|---:|---:|---:|---:|\n");
	uint64_t step = 1;
	struct ckpt_save_stats st;
	if (save(c, step++, 0, &st)) {              /* warm-up: files, pool, page cache */
		fprintf(stderr, "save: %s\n", ckpt_last_error());
		return 1;
	}
	for (int r = 0; r < reps; r++) {
		struct ckpt_save_stats full, inc;
		change(step);
		if (save(c, step++, 0, &full))
			break;
		change(step);
		if (save(c, step++, 1, &inc)) {
			fprintf(stderr, "save: %s\n", ckpt_last_error());
			return 1;
		}
		struct { const char *what; struct ckpt_save_stats *s; } row[2] = {
			{ "full (10% changed, incremental off)", &full },
			{ "incremental (10% changed)", &inc },
		};
		for (int k = 0; k < 2; k++)
			printf("| %s | %.0f | %.1f | %.3f | %.3f | %.3f | %.3f |\n", row[k].what,
			       (double)row[k].s->logical_bytes / 1048576.0,
			       (double)row[k].s->stored_bytes / 1048576.0,
			       (double)row[k].s->stored_bytes / (double)row[k].s->logical_bytes,
			       row[k].s->durable_seconds, row[k].s->commit_seconds,
			       row[k].s->durable_seconds / full.durable_seconds);
	}
	ckpt_close(c);
	for (int i = 0; i < NT; i++)
		free(t[i]);
	return 0;
}
