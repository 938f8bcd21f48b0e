/*
 * synth.h — synthetic shard indexes for the lib/commit tests: a rank's index built
 * in memory (no shard file), from a list of items (name, policy, shape, box), with
 * one raw chunk per CHUNK bytes whose hashes are derived from a content seed, so
 * that replicated items agree across ranks unless a test says otherwise. The
 * coordinator never reads shard files, so these are all a vote needs.
 */
#ifndef CKPT_TEST_SYNTH_H
#define CKPT_TEST_SYNTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "commit/commit.h"

#define SYNTH_CHUNK 256u      /* raw bytes per synthetic chunk */

struct synth_item {
	const char *name;
	int         policy;        /* enum ckpt_policy */
	unsigned    ndim;
	uint64_t    shape[CKPT_MAX_NDIM];
	uint64_t    offset[CKPT_MAX_NDIM];
	uint64_t    extent[CKPT_MAX_NDIM];
	int         kind, dtype;   /* 0: CKPT_KIND_MODEL, CKPT_F32 */
	bool        blob;          /* u8, ndim 1, IO_TENSOR_BLOB */
	uint64_t    content;       /* seed of the chunk hashes (0: from the name only) */
};

/* One rank's index under construction (the arrays grow as items are added). */
struct synth {
	struct io_shard_index ix;
	uint32_t cap_t, cap_c;
};

void synth_init(struct synth *s, uint64_t step, uint32_t rank, uint32_t world);
/* The index names attempt save_id (a version-3 index; its chunks have no block
 * hashes: the block size is larger than any synthetic chunk). */
void synth_attempt(struct synth *s, uint64_t save_id);
void synth_free(struct synth *s);
/* Add an item; aborts on a malformed one (a bug in the test). */
void synth_add(struct synth *s, const struct synth_item *it);
/* Encode (malloc'd) and check that the encoding decodes; *dec (optional) gets the
 * decoded index (io_index_free). */
void synth_encode(const struct synth *s, void **buf, size_t *len, struct io_shard_index **dec);

/* A vote for an encoded index (the index bytes are borrowed). */
struct commit_vote synth_vote(uint64_t step, uint32_t rank, const void *idx, size_t len);

/* A typical rank's index for a W-rank job: 'w' sharded along dim 0 (4 rows per
 * rank, 3 columns), 'bias' replicated, 'rng' rank-bound (r+1 bytes), 'sched'
 * replicated blob. */
void synth_typical(struct synth *s, uint64_t step, uint32_t rank, uint32_t world);

/* The encoded index (malloc'd) of rank r of a w-rank job: n tensors
 * "model/layer.I/w", f32 [rows, cols], split by rows, one raw chunk each — what the
 * commit and rdma benchmarks and the rdma commit tests vote with, for attempt save_id
 * (0: none). 0 or -ENOMEM. */
int synth_rows_encode(uint64_t step, uint32_t r, uint32_t w, uint64_t save_id, unsigned n,
                      uint64_t rows, uint64_t cols, void **buf, size_t *len);

#endif
