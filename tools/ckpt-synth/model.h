/*
 * model.h — the synthetic "model" of ckpt-synth: a deterministic list of tensors
 * (names, dtypes, global shapes) sized to a byte budget, and their contents as a
 * pure function of (seed, tensor name, global byte offset) — never of the world
 * size, so a checkpoint saved by W ranks can be checked as any W' ranks would
 * read it.
 */
#ifndef CKPT_SYNTH_MODEL_H
#define CKPT_SYNTH_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "ckpt/ckpt.h"

struct synth_tensor {
	char     name[128];
	int      kind, dtype, policy;
	unsigned ndim;
	uint64_t shape[2];
	uint64_t name_hash;
};

struct synth_model {
	struct synth_tensor *t;
	size_t n;
	uint64_t seed;
	uint64_t total_bytes;     /* sum of global tensor sizes (blobs excluded) */
};

/* Build the tensor list whose global sizes add up to about bytes. -ENOMEM. */
int  synth_model_build(struct synth_model *m, uint64_t bytes, uint64_t seed);
/* The layout grows with a hidden size of at most this; its model is the largest one
 * (synth_model_max_bytes bytes; 0 when out of memory), and a larger budget cannot be
 * met. */
#define SYNTH_MAX_HIDDEN (1ull << 20)
uint64_t synth_model_max_bytes(void);
void synth_model_free(struct synth_model *m);

/* Bytes of tensor t. */
uint64_t synth_tensor_bytes(const struct synth_tensor *t);
/* This rank's rows [off, off+ext) of dimension 0 under an even split over world. */
void synth_split(uint64_t rows, unsigned rank, unsigned world, uint64_t *off, uint64_t *ext);
/* Fill out with the box (offset, extent) of tensor t, row-major. */
void synth_fill_box(const struct synth_model *m, const struct synth_tensor *t,
                    const uint64_t *offset, const uint64_t *extent, void *out);

/* Blobs: the scheduler state (replicated) and a rank's RNG state (rank-bound). */
size_t synth_blob_scheduler(const struct synth_model *m, uint8_t *out, size_t cap);
size_t synth_blob_rng(const struct synth_model *m, unsigned rank, uint8_t *out, size_t cap);
#define SYNTH_BLOB_MAX 4096

#endif
