/*
 * plan.c — the reshard plan (plan.h): the source step's catalog read once, by the
 * parent, before any rank process starts; the even split of a sharded tensor's
 * first dimension over the new ranks; and the refusals that can be made from the
 * plan alone (preflight), so that a reshard that cannot succeed starts no process.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <dirent.h>

#include "ckpt/catalog.h"
#include "plan.h"
#include "toolutil.h"

void plan_free(struct plan *p)
{
	for (size_t i = 0; i < p->n; i++) {
		free(p->items[i].name);
		free(p->items[i].rb_off);
		free(p->items[i].rb_ext);
		free(p->items[i].rb_have);
	}
	free(p->items);
}

/* Even split of rows over world: the first rows % world ranks get one more. */
static void split(uint64_t rows, unsigned rank, unsigned world, uint64_t *off, uint64_t *ext)
{
	uint64_t base = rows / world, rem = rows % world;
	*ext = base + (rank < rem);
	*off = rank * base + (rank < rem ? rank : rem);
}

int plan_build(ckpt_load *l, struct plan *p, uint32_t src_world)
{
	int n = ckpt_load_count(l);
	if (n < 0)
		return n;
	p->items = calloc((size_t)n + 1, sizeof *p->items);
	if (!p->items)
		return -ENOMEM;
	p->src_world = src_world;
	p->src_step = ckpt_load_step(l);
	for (int i = 0; i < n; i++) {
		struct item *it = &p->items[p->n];
		int rc = ckpt_load_info(l, (unsigned)i, &it->ti, sizeof it->ti);
		if (rc)
			return rc;
		if (!(it->name = strdup(it->ti.name)))
			return -ENOMEM;
		it->ti.name = it->name;
		p->n++;
		it->blob = ckpt_load_is_blob(l, (unsigned)i) == 1;
		int nch = ckpt_load_chunks(l, (unsigned)i, NULL, 0, sizeof(struct ckpt_chunk_info));
		if (nch < 0)
			return nch;
		struct ckpt_chunk_info *ch = calloc((size_t)nch + 1, sizeof *ch);
		if (!ch)
			return -ENOMEM;
		ckpt_load_chunks(l, (unsigned)i, ch, (size_t)nch, sizeof(struct ckpt_chunk_info));
		for (int k = 0; k < nch; k++)
			if (ch[k].raw_len > p->max_chunk)
				p->max_chunk = ch[k].raw_len;
		if (it->ti.policy == CKPT_RANK_BOUND && !it->blob) {
			it->rb_off = calloc(src_world, sizeof *it->rb_off);
			it->rb_ext = calloc(src_world, sizeof *it->rb_ext);
			it->rb_have = calloc(src_world, sizeof *it->rb_have);
			if (!it->rb_off || !it->rb_ext || !it->rb_have) {
				free(ch);
				return -ENOMEM;
			}
			for (int k = 0; k < nch; k++) {
				uint32_t r = ch[k].rank;
				if (r >= src_world)
					continue;
				it->rb_have[r] = true;
				memcpy(it->rb_off[r], ch[k].box_offset, sizeof it->rb_off[r]);
				memcpy(it->rb_ext[r], ch[k].box_extent, sizeof it->rb_ext[r]);
			}
		}
		free(ch);
	}
	return 0;
}


bool plan_new_box(const struct reshard_args *a, const struct plan *p, const struct item *it,
                    unsigned r, uint64_t *off, uint64_t *ext, int *saved_rank)
{
	*saved_rank = -1;
	unsigned ndim = it->ti.ndim;
	for (unsigned d = 0; d < ndim; d++) {
		off[d] = 0;
		ext[d] = it->ti.global_shape[d];
	}
	switch (it->ti.policy) {
	case CKPT_SHARDED:
		if (ndim == 0)
			return r == 0;
		split(it->ti.global_shape[0], r, a->world, &off[0], &ext[0]);
		return true;
	case CKPT_REPLICATED:
		return r == 0;         /* one copy is the whole value */
	default:
		if (!a->rank_map || a->rank_map[r] < 0)
			return false;
		*saved_rank = a->rank_map[r];
		if (!it->blob) {
			if (!it->rb_have || (uint32_t)*saved_rank >= p->src_world ||
			    !it->rb_have[*saved_rank])
				return false;
			memcpy(off, it->rb_off[*saved_rank], ndim * sizeof *off);
			memcpy(ext, it->rb_ext[*saved_rank], ndim * sizeof *ext);
		}
		return true;
	}
}

int plan_preflight(const struct reshard_args *a, const struct plan *p)
{
	for (size_t i = 0; i < p->n; i++) {
		const struct item *it = &p->items[i];
		if (it->ti.policy == CKPT_SHARDED && it->ti.ndim && it->ti.global_shape[0] < a->world) {
			char q[300];
			return tool_fail(RX_WORLD, -EINVAL, "--world %u: tensor '%s' has only %" PRIu64
			                 " rows in its first dimension; it cannot be split over %u ranks",
			                 a->world, tool_quote(it->name, q, sizeof q),
			                 it->ti.global_shape[0], a->world);
		}
	}
	/* The names go to stderr one a line, and into the JSON error as one list. */
	char list[1024] = "";
	size_t nrb = 0, used = 0;
	for (size_t i = 0; i < p->n; i++) {
		if (p->items[i].ti.policy != CKPT_RANK_BOUND || a->rank_map || a->drop_rank_bound)
			continue;
		if (!nrb++)
			fprintf(stderr, "ckpt-reshard: the step holds rank-bound state, which belongs to "
			        "one saved rank and is not resharded; map saved ranks to new ones with "
			        "--rank-map (when that is safe for your job) or leave it out with "
			        "--drop-rank-bound:\n");
		char q[300];
		tool_quote(p->items[i].name, q, sizeof q);
		fprintf(stderr, "  %s (%s)\n", q, ckpt_kind_name(p->items[i].ti.kind));
		if (used < sizeof list)
			used += (size_t)snprintf(list + used, sizeof list - used, "%s%s (%s)",
			                         nrb > 1 ? ", " : "", q, ckpt_kind_name(p->items[i].ti.kind));
	}
	if (nrb)
		return tool_fail_json(RX_RANKBOUND, CKPT_ERANKBOUND, "the step holds %zu rank-bound "
		                      "item(s), which need --rank-map or --drop-rank-bound: %s", nrb,
		                      list);
	for (unsigned r = 0; a->rank_map && r < a->world; r++) {
		if (a->rank_map[r] >= (int)p->src_world)
			return tool_usage("--rank-map: saved rank %d does not exist (the step was saved "
			                  "by %u ranks)", a->rank_map[r], p->src_world);
	}
	/* The output root: not the source, and not already holding the step. */
	char r1[PATH_MAX], r2[PATH_MAX];
	if (realpath(a->root, r1) && realpath(a->out, r2) && !strcmp(r1, r2))
		return tool_usage("--out is the source root; write to another root");
	struct stat st;
	if (stat(a->out, &st) == 0) {
		ckpt_ctx *c;
		int rc = reshard_open_ctx(a->out, a->out_manifest_dir, 0, 1, CKPT_OPEN_READONLY, a,
		                          &c);
		if (rc == CKPT_ENOTROOT) {
			/* No manifest yet: an empty directory becomes a root; anything else is
			 * somebody's data, and the rank processes would be refused anyway. */
			DIR *d = opendir(a->out);
			struct dirent *e;
			const char *found = NULL;
			while (d && (e = readdir(d)))
				if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
					found = e->d_name;
					break;
				}
			int x = 0;
			if (found) {
				char q[300];
				x = tool_fail(RX_NOTROOT, CKPT_ENOTROOT, "--out %s is not empty and not a "
				              "checkpoint root (found '%s')", a->out, tool_quote(found, q, sizeof q));
			}
			if (d)
				closedir(d);
			if (x)
				return x;
		} else if (rc) {
			return tool_fail(reshard_exit_for(rc), rc, "--out %s: %s", a->out,
			                 ckpt_last_error());
		} else {
			struct ckpt_step_info si;
			uint64_t s2 = a->have_out_step ? a->out_step : p->src_step;
			rc = ckpt_step_info(c, s2, &si, sizeof si);
			ckpt_close(c);
			if (rc == 0 && si.state == CKPT_STATE_COMMITTED)
				return tool_fail(RX_EXISTS, -EEXIST, "%s already holds step %" PRIu64 "; choose "
				                 "another --step or root", a->out, s2);
		}
	}
	return 0;
}
