/*
 * plan.h — the reshard plan: every item of the source step, with the boxes the
 * saved ranks held of rank-bound tensors, and what each new rank saves of it.
 */
#ifndef CKPT_RESHARD_PLAN_H
#define CKPT_RESHARD_PLAN_H

#include "reshard.h"

/* One item of the source step and what the new ranks do with it. */
struct item {
	struct ckpt_tensor_info ti;
	char    *name;
	bool     blob;
	/* rank-bound: box of each saved rank's piece (from the chunk list) */
	uint64_t (*rb_off)[CKPT_MAX_NDIM], (*rb_ext)[CKPT_MAX_NDIM];
	bool    *rb_have;
};

struct plan {
	struct item *items;
	size_t       n;
	uint32_t     src_world;
	uint64_t     src_step;
	uint64_t     max_chunk;
	uint64_t     bytes;
};

/* Read the catalog of l (saved with src_world ranks) into p (zeroed by the caller);
 * 0 or a negative error code (p then holds what was read: plan_free it). */
int  plan_build(ckpt_load *l, struct plan *p, uint32_t src_world);
void plan_free(struct plan *p);
/* The new box of item it for rank r of a->world; false: that rank saves nothing of
 * it. saved_rank: the saved rank whose piece it takes (rank-bound), else -1. */
bool plan_new_box(const struct reshard_args *a, const struct plan *p, const struct item *it,
                  unsigned r, uint64_t *off, uint64_t *ext, int *saved_rank);
/* Refuse what would fail later, before any rank process starts: exit code or 0. */
int  plan_preflight(const struct reshard_args *a, const struct plan *p);

#endif
