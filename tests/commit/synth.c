/*
 * synth.c — synthetic shard indexes for the lib/commit tests (see synth.h).
 */
#include "synth.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

void synth_init(struct synth *s, uint64_t step, uint32_t rank, uint32_t world)
{
	memset(s, 0, sizeof *s);
	s->ix.step = step;
	s->ix.rank = rank;
	s->ix.world = world;
	s->ix.data_end = IO_HEADER_BYTES;
}

void synth_free(struct synth *s)
{
	for (uint32_t i = 0; i < s->ix.ntensors; i++)
		free((char *)s->ix.tensors[i].name);
	free(s->ix.tensors);
	free(s->ix.chunks);
	memset(s, 0, sizeof *s);
}

static uint64_t name_hash(const char *n)
{
	uint64_t h = 1469598103934665603ull;
	for (; *n; n++)
		h = (h ^ (uint8_t)*n) * 1099511628211ull;
	return h;
}

static void *grow(void *p, uint32_t *cap, uint32_t need, size_t elem)
{
	if (need <= *cap)
		return p;
	uint32_t c = *cap ? *cap * 2 : 8;
	while (c < need)
		c *= 2;
	p = realloc(p, (size_t)c * elem);
	if (!p)
		abort();
	*cap = c;
	return p;
}

void synth_attempt(struct synth *s, uint64_t save_id)
{
	s->ix.save_id = save_id;
	s->ix.block_bytes = save_id ? (uint32_t)IO_MAX_CHUNK_BYTES : 0;
}

void synth_add(struct synth *s, const struct synth_item *it)
{
	struct io_shard_index *ix = &s->ix;
	ix->tensors = grow(ix->tensors, &s->cap_t, ix->ntensors + 1, sizeof *ix->tensors);
	struct io_tensor_entry *t = &ix->tensors[ix->ntensors];
	memset(t, 0, sizeof *t);
	t->name = strdup(it->name);
	t->name_len = (uint16_t)strlen(it->name);
	t->kind = (uint8_t)(it->kind ? it->kind : CKPT_KIND_MODEL);
	t->dtype = (uint8_t)(it->blob ? CKPT_U8 : it->dtype ? it->dtype : CKPT_F32);
	t->policy = (uint8_t)it->policy;
	t->flags = it->blob ? IO_TENSOR_BLOB : 0;
	t->ndim = (uint8_t)it->ndim;
	uint64_t elems = 1;
	for (unsigned d = 0; d < it->ndim; d++) {
		t->global_shape[d] = it->shape[d];
		t->offset[d] = it->offset[d];
		t->extent[d] = it->extent[d];
		elems *= it->extent[d];
	}
	t->raw_bytes = elems * ckpt_dtype_size(t->dtype);
	t->first_chunk = ix->nchunks;
	uint64_t seed = (it->content ? it->content : 0x5EEDull) ^ name_hash(it->name);
	for (uint64_t pos = 0; pos < t->raw_bytes; pos += SYNTH_CHUNK) {
		ix->chunks = grow(ix->chunks, &s->cap_c, ix->nchunks + 1, sizeof *ix->chunks);
		struct io_chunk_entry *c = &ix->chunks[ix->nchunks];
		memset(c, 0, sizeof *c);
		c->tensor = ix->ntensors;
		c->codec = IO_CODEC_RAW;
		c->raw_offset = pos;
		c->raw_len = t->raw_bytes - pos < SYNTH_CHUNK ? t->raw_bytes - pos : SYNTH_CHUNK;
		c->stored_len = c->raw_len;
		c->file_offset = ix->data_end;
		tu_fill(c->hash, CKPT_HASH_BYTES, seed, pos);
		ix->data_end += ckpt_align_up(c->stored_len, CKPT_ALIGN);
		ix->nchunks++;
		t->nchunks++;
	}
	ix->ntensors++;
}

void synth_encode(const struct synth *s, void **buf, size_t *len, struct io_shard_index **dec)
{
	if (io_index_encode(&s->ix, buf, len)) {
		fprintf(stderr, "synth_encode: %s\n", ckpt_err_msg());
		abort();
	}
	struct io_shard_index *back = NULL;
	if (io_index_decode(*buf, *len, &back)) {
		fprintf(stderr, "synth_encode: the synthetic index does not decode: %s\n",
		        ckpt_err_msg());
		abort();
	}
	if (dec)
		*dec = back;
	else
		io_index_free(back);
}

struct commit_vote synth_vote(uint64_t step, uint32_t rank, const void *idx, size_t len)
{
	struct commit_vote v = { .rank = rank, .step = step, .index = idx, .index_len = len,
	                         .file_size = 1000000u + rank };
	tu_fill(v.footer_hash, CKPT_HASH_BYTES, step, rank);
	return v;
}

void synth_typical(struct synth *s, uint64_t step, uint32_t rank, uint32_t world)
{
	synth_init(s, step, rank, world);
	synth_add(s, &(struct synth_item){ .name = "w", .policy = CKPT_SHARDED, .ndim = 2,
	          .shape = { 4ull * world, 3 }, .offset = { 4ull * rank, 0 }, .extent = { 4, 3 } });
	synth_add(s, &(struct synth_item){ .name = "bias", .policy = CKPT_REPLICATED, .ndim = 1,
	          .shape = { 70 }, .extent = { 70 } });
	synth_add(s, &(struct synth_item){ .name = "rng", .policy = CKPT_RANK_BOUND, .ndim = 1,
	          .blob = true, .shape = { rank + 1 }, .extent = { rank + 1 },
	          .content = 77 + rank, .kind = CKPT_KIND_RNG });
	synth_add(s, &(struct synth_item){ .name = "sched", .policy = CKPT_REPLICATED, .ndim = 1,
	          .blob = true, .shape = { 40 }, .extent = { 40 }, .kind = CKPT_KIND_SCHEDULER });
}

int synth_rows_encode(uint64_t step, uint32_t r, uint32_t w, uint64_t save_id, unsigned n,
                      uint64_t rows, uint64_t cols, void **buf, size_t *len)
{
	struct io_tensor_entry *t = calloc(n ? n : 1, sizeof *t);
	struct io_chunk_entry *ch = calloc(n ? n : 1, sizeof *ch);
	char (*names)[32] = calloc(n ? n : 1, sizeof *names);
	int rc = t && ch && names ? 0 : -ENOMEM;
	uint64_t off = IO_HEADER_BYTES;
	uint32_t nch = 0;
	for (unsigned i = 0; i < n && !rc; i++) {
		snprintf(names[i], sizeof names[i], "model/layer.%u/w", i);
		t[i].name = names[i];
		t[i].name_len = (uint16_t)strlen(names[i]);
		t[i].kind = CKPT_KIND_MODEL;
		t[i].dtype = CKPT_F32;
		t[i].policy = CKPT_SHARDED;
		t[i].ndim = 2;
		t[i].global_shape[0] = rows;
		t[i].global_shape[1] = cols;
		t[i].offset[0] = rows * r / w;
		t[i].extent[0] = rows * (r + 1) / w - t[i].offset[0];
		t[i].extent[1] = cols;
		t[i].raw_bytes = t[i].extent[0] * cols * 4;
		t[i].first_chunk = nch;
		if (t[i].raw_bytes) {
			t[i].nchunks = 1;
			ch[nch] = (struct io_chunk_entry){ .tensor = i, .codec = IO_CODEC_RAW,
			                                   .raw_len = t[i].raw_bytes, .file_offset = off,
			                                   .stored_len = t[i].raw_bytes };
			ch[nch].hash[0] = (uint8_t)i;
			off += ckpt_align_up(t[i].raw_bytes, CKPT_ALIGN);
			nch++;
		}
	}
	if (!rc) {
		struct io_shard_index ix = { .step = step, .rank = r, .world = w, .data_end = off,
		                             .ntensors = n, .nchunks = nch, .tensors = t, .chunks = ch,
		                             .save_id = save_id,
		                             .block_bytes = save_id ? (uint32_t)IO_MAX_CHUNK_BYTES : 0 };
		rc = io_index_encode(&ix, buf, len);
	}
	free(t);
	free(ch);
	free(names);
	return rc;
}
