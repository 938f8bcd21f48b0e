/*
 * model.c — the synthetic model of ckpt-synth (see model.h): a transformer-like
 * layout (embeddings, per-layer weights and biases, norms, small tensors of every
 * dtype), fp32 optimizer moments for each floating-point model tensor, and
 * contents generated from (seed, name, global byte offset).
 *
 * Floating-point contents keep a narrow exponent range, as trained weights do, so
 * that compression figures are meaningful rather than those of random bytes.
 */
#include "model.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LAYERS 6

static uint64_t fnv1a(const char *s)
{
	uint64_t h = 0xcbf29ce484222325ull;
	for (; *s; s++)
		h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
	return h;
}

static uint64_t mix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}

uint64_t synth_tensor_bytes(const struct synth_tensor *t)
{
	uint64_t n = ckpt_dtype_size(t->dtype);
	for (unsigned d = 0; d < t->ndim; d++)
		n *= t->shape[d];
	return n;
}

static int add(struct synth_model *m, size_t *cap, const char *name, int kind, int dtype,
               unsigned ndim, uint64_t d0, uint64_t d1)
{
	if (m->n == *cap) {
		*cap = *cap ? *cap * 2 : 64;
		struct synth_tensor *n = realloc(m->t, *cap * sizeof *n);
		if (!n)
			return -ENOMEM;
		m->t = n;
	}
	struct synth_tensor *t = &m->t[m->n++];
	memset(t, 0, sizeof *t);
	snprintf(t->name, sizeof t->name, "%s", name);
	t->kind = kind;
	t->dtype = dtype;
	t->policy = ndim ? CKPT_SHARDED : CKPT_REPLICATED;
	t->ndim = ndim;
	t->shape[0] = d0;
	t->shape[1] = d1;
	t->name_hash = fnv1a(name);
	m->total_bytes += synth_tensor_bytes(t);
	return 0;
}

/* The layout for hidden size h. */
static int layout(struct synth_model *m, uint64_t h)
{
	size_t cap = 0;
	char name[128];
	free(m->t);
	m->t = NULL;
	m->n = 0;
	m->total_bytes = 0;
	uint64_t vocab = 5 * h + 13, up = 8 * h / 3 + 1;
	int rc = add(m, &cap, "model/embed.weight", CKPT_KIND_MODEL, CKPT_BF16, 2, vocab, h);
	for (int i = 0; i < LAYERS && !rc; i++) {
		snprintf(name, sizeof name, "model/layers.%d/attn.qkv.weight", i);
		rc = rc ? rc : add(m, &cap, name, CKPT_KIND_MODEL, CKPT_BF16, 2, 3 * h, h);
		snprintf(name, sizeof name, "model/layers.%d/attn.qkv.bias", i);
		rc = rc ? rc : add(m, &cap, name, CKPT_KIND_MODEL, CKPT_F32, 1, 3 * h, 0);
		snprintf(name, sizeof name, "model/layers.%d/mlp.up.weight", i);
		rc = rc ? rc : add(m, &cap, name, CKPT_KIND_MODEL, CKPT_F16, 2, up, h);
		snprintf(name, sizeof name, "model/layers.%d/mlp.down.weight", i);
		rc = rc ? rc : add(m, &cap, name, CKPT_KIND_MODEL, CKPT_BF16, 2, h, up);
		snprintf(name, sizeof name, "model/layers.%d/norm.weight", i);
		rc = rc ? rc : add(m, &cap, name, CKPT_KIND_MODEL, CKPT_F32, 1, h, 0);
	}
	/* One tensor of every other dtype, first dimensions that split unevenly. */
	rc = rc ? rc : add(m, &cap, "model/extra/rope_table", CKPT_KIND_MODEL, CKPT_F64, 2, h / 4 + 3, 7);
	rc = rc ? rc : add(m, &cap, "model/extra/fp8_e4m3.weight", CKPT_KIND_MODEL, CKPT_F8_E4M3, 2, h + 5, 33);
	rc = rc ? rc : add(m, &cap, "model/extra/fp8_e5m2.weight", CKPT_KIND_MODEL, CKPT_F8_E5M2, 2, h + 1, 17);
	rc = rc ? rc : add(m, &cap, "model/extra/position_ids", CKPT_KIND_MODEL, CKPT_I64, 1, 2 * h + 1, 0);
	rc = rc ? rc : add(m, &cap, "model/extra/token_types", CKPT_KIND_MODEL, CKPT_I32, 1, h + 9, 0);
	rc = rc ? rc : add(m, &cap, "model/extra/buckets", CKPT_KIND_MODEL, CKPT_I16, 2, h + 11, 3);
	rc = rc ? rc : add(m, &cap, "model/extra/quant.weight", CKPT_KIND_MODEL, CKPT_I8, 2, h + 3, 5);
	rc = rc ? rc : add(m, &cap, "model/extra/vocab_bytes", CKPT_KIND_MODEL, CKPT_U8, 1, 3 * h + 1, 0);
	rc = rc ? rc : add(m, &cap, "model/extra/mask", CKPT_KIND_MODEL, CKPT_BOOL, 2, h + 7, 2);
	/* fp32 Adam moments for every floating-point weight of the model. */
	size_t nmodel = m->n;
	for (size_t i = 0; i < nmodel && !rc; i++) {
		struct synth_tensor t = m->t[i];
		if (t.dtype != CKPT_BF16 && t.dtype != CKPT_F16 && t.dtype != CKPT_F32)
			continue;
		snprintf(name, sizeof name, "optim/exp_avg/%s", t.name);
		rc = add(m, &cap, name, CKPT_KIND_OPTIMIZER, CKPT_F32, t.ndim, t.shape[0], t.shape[1]);
		snprintf(name, sizeof name, "optim/exp_avg_sq/%s", t.name);
		rc = rc ? rc : add(m, &cap, name, CKPT_KIND_OPTIMIZER, CKPT_F32, t.ndim, t.shape[0], t.shape[1]);
	}
	rc = rc ? rc : add(m, &cap, "optim/step", CKPT_KIND_OPTIMIZER, CKPT_I64, 0, 0, 0);
	return rc;
}

int synth_model_build(struct synth_model *m, uint64_t bytes, uint64_t seed)
{
	memset(m, 0, sizeof *m);
	m->seed = seed;
	/* The largest h whose layout fits in the budget (sizes grow monotonically). */
	uint64_t lo = 1, hi = SYNTH_MAX_HIDDEN;
	while (lo < hi) {
		uint64_t mid = (lo + hi + 1) / 2;
		if (layout(m, mid))
			return -ENOMEM;
		if (m->total_bytes <= bytes)
			lo = mid;
		else
			hi = mid - 1;
	}
	return layout(m, lo);
}

uint64_t synth_model_max_bytes(void)
{
	struct synth_model m;
	memset(&m, 0, sizeof m);
	uint64_t n = layout(&m, SYNTH_MAX_HIDDEN) ? 0 : m.total_bytes;
	free(m.t);
	return n;
}

void synth_model_free(struct synth_model *m)
{
	free(m->t);
	memset(m, 0, sizeof *m);
}

void synth_split(uint64_t rows, unsigned rank, unsigned world, uint64_t *off, uint64_t *ext)
{
	uint64_t a = rows * rank / world, b = rows * (rank + 1) / world;
	*off = a;
	*ext = b - a;
}

/* Keep the sign and mantissa bits, pin the exponent near 1.0. */
static uint64_t shape_word(int dtype, uint64_t v)
{
	switch (dtype) {
	case CKPT_F64:  return (v & 0x800FFFFFFFFFFFFFull) | 0x3FE0000000000000ull;
	case CKPT_F32:  return (v & 0x807FFFFF807FFFFFull) | 0x3F0000003F000000ull;
	case CKPT_BF16: return (v & 0x807F807F807F807Full) | 0x3F003F003F003F00ull;
	case CKPT_F16:  return (v & 0x83FF83FF83FF83FFull) | 0x3800380038003800ull;
	case CKPT_BOOL: return v & 0x0101010101010101ull;
	default:        return v;
	}
}

/* Bytes [off, off+len) of tensor t's global row-major layout. */
static void gen_run(const struct synth_model *m, const struct synth_tensor *t, uint64_t off,
                    size_t len, uint8_t *out)
{
	uint64_t key = m->seed ^ t->name_hash;
	while (len) {
		uint64_t w = off >> 3;
		unsigned in = (unsigned)(off & 7);
		uint64_t v = shape_word(t->dtype, mix64(key + w * 0x9E3779B97F4A7C15ull));
		if (in == 0 && len >= 8) {
			memcpy(out, &v, 8);
			out += 8; off += 8; len -= 8;
			continue;
		}
		size_t take = 8 - in < len ? 8 - in : len;
		memcpy(out, (const uint8_t *)&v + in, take);
		out += take; off += take; len -= take;
	}
}

void synth_fill_box(const struct synth_model *m, const struct synth_tensor *t,
                    const uint64_t *offset, const uint64_t *extent, void *out)
{
	size_t es = ckpt_dtype_size(t->dtype);
	uint8_t *o = out;
	if (t->ndim == 0) {
		gen_run(m, t, 0, es, o);
	} else if (t->ndim == 1) {
		gen_run(m, t, offset[0] * es, (size_t)(extent[0] * es), o);
	} else {
		size_t row = (size_t)(extent[1] * es);
		for (uint64_t r = 0; r < extent[0]; r++, o += row)
			gen_run(m, t, ((offset[0] + r) * t->shape[1] + offset[1]) * es, row, o);
	}
}

static size_t blob(const struct synth_model *m, const char *name, size_t len, uint8_t *out,
                   size_t cap)
{
	struct synth_tensor t;
	memset(&t, 0, sizeof t);
	t.dtype = CKPT_U8;
	t.name_hash = fnv1a(name);
	if (len > cap)
		len = cap;
	gen_run(m, &t, 0, len, out);
	return len;
}

size_t synth_blob_scheduler(const struct synth_model *m, uint8_t *out, size_t cap)
{
	return blob(m, "scheduler", 217, out, cap);
}

size_t synth_blob_rng(const struct synth_model *m, unsigned rank, uint8_t *out, size_t cap)
{
	char name[64];
	snprintf(name, sizeof name, "rng/rank-%u", rank);
	return blob(m, name, 2500 + rank % 13, out, cap);
}
