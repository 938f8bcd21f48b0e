/*
 * st_format.c — the pieces of the safetensors format and of Hugging Face's
 * conventions that both directions need (st.h): dtype names, the --dtype cast,
 * --max-shard-size, and names (the built-in rule and --name-map).
 *
 * The cast goes through double, which holds every value of every floating dtype
 * exactly, and rounds once from there: rounding f64 -> f32 -> bf16 twice would get
 * some ties wrong. --name-map is parsed by jansson, strictly (duplicate keys and
 * text that is not UTF-8 refused), as the safetensors headers are.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "reshard.h"
#include "st.h"
#include "toolutil.h"

static const struct { int dtype; const char *name; } st_dtypes[] = {
	{ CKPT_F64, "F64" }, { CKPT_F32, "F32" }, { CKPT_F16, "F16" }, { CKPT_BF16, "BF16" },
	{ CKPT_F8_E4M3, "F8_E4M3" }, { CKPT_F8_E5M2, "F8_E5M2" }, { CKPT_I64, "I64" },
	{ CKPT_I32, "I32" }, { CKPT_I16, "I16" }, { CKPT_I8, "I8" }, { CKPT_U8, "U8" },
	{ CKPT_BOOL, "BOOL" },
};

const char *st_dtype_name(int dtype)
{
	for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++)
		if (st_dtypes[i].dtype == dtype)
			return st_dtypes[i].name;
	return NULL;
}

int st_dtype_parse(const char *s)
{
	for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++)
		if (!strcmp(st_dtypes[i].name, s))
			return st_dtypes[i].dtype;
	return 0;
}

bool st_dtype_is_float(int dtype)
{
	return dtype >= CKPT_F64 && dtype <= CKPT_F8_E5M2;
}

/* A binary float of ebits exponent bits and mbits fraction bits; fn: no infinity,
 * the all-ones pattern alone is NaN (F8_E4M3, the "fn" variant torch and
 * safetensors use). */
struct fmt { int ebits, mbits; bool fn; };

static struct fmt fmt_of(int dtype)
{
	switch (dtype) {
	case CKPT_F64:     return (struct fmt){ 11, 52, false };
	case CKPT_F32:     return (struct fmt){ 8, 23, false };
	case CKPT_F16:     return (struct fmt){ 5, 10, false };
	case CKPT_BF16:    return (struct fmt){ 8, 7, false };
	case CKPT_F8_E4M3: return (struct fmt){ 4, 3, true };
	default:           return (struct fmt){ 5, 2, false };   /* CKPT_F8_E5M2 */
	}
}

static double decode(uint64_t bits, struct fmt f)
{
	int bias = (1 << (f.ebits - 1)) - 1;
	uint64_t emax = (1u << f.ebits) - 1, mmask = ((uint64_t)1 << f.mbits) - 1;
	uint64_t e = (bits >> f.mbits) & emax, m = bits & mmask;
	double sign = (bits >> (f.ebits + f.mbits)) & 1 ? -1.0 : 1.0;
	if (f.fn ? (e == emax && m == mmask) : e == emax)
		return f.fn || m ? copysign(NAN, sign) : sign * INFINITY;
	if (e == 0)
		return sign * ldexp((double)m, 1 - bias - f.mbits);
	return sign * ldexp((double)(m | ((uint64_t)1 << f.mbits)), (int)e - bias - f.mbits);
}

/* Round x to the format (IEEE, with infinity), nearest, ties to even: from the bits
 * of the double, so that there is one rounding. */
static uint64_t encode(double x, struct fmt f)
{
	uint64_t u;
	memcpy(&u, &x, sizeof u);
	uint64_t sign = (u >> 63) << (f.ebits + f.mbits);
	uint64_t inf = (((uint64_t)1 << f.ebits) - 1) << f.mbits;
	int de = (int)((u >> 52) & 0x7ff);
	uint64_t dm = u & (((uint64_t)1 << 52) - 1);
	if (de == 0x7ff)
		return sign | inf | (dm ? (uint64_t)1 << (f.mbits - 1) : 0);
	if (de == 0 && dm == 0)
		return sign;
	/* x = sig * 2^(e - 52) with sig of 53 bits (fewer for a subnormal double). */
	uint64_t sig = de ? dm | ((uint64_t)1 << 52) : dm;
	int e = de ? de - 1023 : -1022;
	int bias = (1 << (f.ebits - 1)) - 1, te = e + bias;
	int shift = 52 - f.mbits + (te < 1 ? 1 - te : 0);
	uint64_t q;
	if (shift >= 64) {
		q = 0;
	} else if (shift == 0) {
		q = sig;
	} else {
		q = sig >> shift;
		uint64_t rem = sig & (((uint64_t)1 << shift) - 1), half = (uint64_t)1 << (shift - 1);
		if (rem > half || (rem == half && (q & 1)))
			q++;
	}
	/* q holds the implicit bit of a normal number, which adds one to the exponent
	 * field: a carry out of the fraction moves into the exponent by itself. */
	uint64_t bits = te >= 1 ? ((uint64_t)(te - 1) << f.mbits) + q : q;
	return sign | (bits >= inf ? inf : bits);
}

static uint64_t get(const uint8_t *p, size_t w)
{
	uint64_t v = 0;
	for (size_t b = 0; b < w; b++)
		v |= (uint64_t)p[b] << (8 * b);
	return v;
}

void st_convert(int from, int to, const void *src, void *dst, size_t n)
{
	struct fmt ff = fmt_of(from), tf = fmt_of(to);
	size_t fw = ckpt_dtype_size(from), tw = ckpt_dtype_size(to);
	const uint8_t *s = src;
	uint8_t *d = dst;
	for (size_t i = 0; i < n; i++) {
		uint64_t v = encode(decode(get(s + i * fw, fw), ff), tf);
		for (size_t b = 0; b < tw; b++)
			d[i * tw + b] = (uint8_t)(v >> (8 * b));
	}
}

int st_parse_shard_size(const char *s, uint64_t *out)
{
	static const struct { const char *unit; uint64_t mul; } units[] = {
		{ "", 1 }, { "B", 1 }, { "KB", 1000 }, { "MB", 1000000 }, { "GB", 1000000000 },
		{ "TB", 1000000000000ull }, { "KIB", 1ull << 10 }, { "MIB", 1ull << 20 },
		{ "GIB", 1ull << 30 }, { "TIB", 1ull << 40 },
	};
	size_t nd = strspn(s, "0123456789");
	if (!nd || nd > 20)
		return -1;
	char num[21];
	memcpy(num, s, nd);
	num[nd] = '\0';
	uint64_t v;
	if (tool_parse_u64(num, &v))
		return -1;
	for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
		if (strcasecmp(s + nd, units[i].unit))
			continue;
		if (!v || v > UINT64_MAX / units[i].mul)
			return -1;
		*out = v * units[i].mul;
		return 0;
	}
	return -1;
}

char *st_export_name(const char *name, int kind)
{
	if (kind == CKPT_KIND_MODEL && !strncmp(name, "model/", 6) && name[6])
		name += 6;
	char *s = strdup(name);
	for (char *p = s; p && *p; p++)
		if (*p == '/')
			*p = '.';
	return s;
}

char *st_import_name(const char *name)
{
	char *s = NULL;
	return asprintf(&s, "model/%s", name) < 0 ? NULL : s;
}

static int pair_cmp(const void *x, const void *y)
{
	return strcmp(((const struct st_pair *)x)->a, ((const struct st_pair *)y)->a);
}

void st_namemap_free(struct st_namemap *m)
{
	for (size_t i = 0; i < m->n && m->fwd; i++) {
		free(m->fwd[i].a);
		free(m->fwd[i].b);
	}
	free(m->fwd);
	free(m->rev);
	memset(m, 0, sizeof *m);
}

int st_namemap_load(const char *path, bool reverse, struct st_namemap *m)
{
	memset(m, 0, sizeof *m);
	json_error_t je;
	json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
	if (!root)
		return tool_fail(RX_USAGE, -EINVAL, "--name-map %s: line %d: %s", path, je.line,
		                 je.text);
	if (!json_is_object(root)) {
		json_decref(root);
		return tool_fail(RX_USAGE, -EINVAL, "--name-map %s: not a JSON object of checkpoint "
		                 "name to Hugging Face name", path);
	}
	size_t n = json_object_size(root);
	m->fwd = calloc(n + 1, sizeof *m->fwd);
	m->rev = calloc(n + 1, sizeof *m->rev);
	if (!m->fwd || !m->rev) {
		json_decref(root);
		st_namemap_free(m);
		return tool_fail(RX_FAIL, -ENOMEM, "--name-map %s: out of memory", path);
	}
	const char *k;
	json_t *v;
	json_object_foreach(root, k, v) {
		char q[300];
		if (!json_is_string(v) || !json_string_length(v) || !k[0]) {
			json_decref(root);
			st_namemap_free(m);
			return tool_fail(RX_USAGE, -EINVAL, "--name-map %s: '%s': names are non-empty "
			                 "strings", path, tool_quote(k, q, sizeof q));
		}
		m->fwd[m->n].a = strdup(k);
		m->fwd[m->n].b = strdup(json_string_value(v));
		m->n++;
		if (!m->fwd[m->n - 1].a || !m->fwd[m->n - 1].b) {
			json_decref(root);
			st_namemap_free(m);
			return tool_fail(RX_FAIL, -ENOMEM, "--name-map %s: out of memory", path);
		}
	}
	json_decref(root);
	for (size_t i = 0; i < m->n; i++)
		m->rev[i] = (struct st_pair){ m->fwd[i].b, m->fwd[i].a };
	qsort(m->fwd, m->n, sizeof *m->fwd, pair_cmp);
	qsort(m->rev, m->n, sizeof *m->rev, pair_cmp);
	for (size_t i = 1; reverse && i < m->n; i++) {
		if (strcmp(m->rev[i - 1].a, m->rev[i].a))
			continue;
		char q1[300], q2[300], q3[300];
		int x = tool_fail(RX_NAME, CKPT_ENAME, "--name-map %s: '%s' and '%s' both map to '%s': "
		                  "the import cannot tell which to create", path,
		                  tool_quote(m->rev[i - 1].b, q1, sizeof q1),
		                  tool_quote(m->rev[i].b, q2, sizeof q2),
		                  tool_quote(m->rev[i].a, q3, sizeof q3));
		st_namemap_free(m);
		return x;
	}
	return 0;
}

const char *st_namemap_get(const struct st_namemap *m, bool reverse, const char *key)
{
	if (!m->n)
		return NULL;
	struct st_pair k = { (char *)key, NULL };
	const struct st_pair *p = bsearch(&k, reverse ? m->rev : m->fwd, m->n, sizeof k, pair_cmp);
	return p ? p->b : NULL;
}
