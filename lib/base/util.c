/*
 * util.c — random ids, shapes, names and dtypes: small facts every module shares.
 */
#include <errno.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "ckpt_internal.h"

uint64_t ckpt_random_id(void)
{
	uint64_t v = 0;
	while (v == 0)
		if (getrandom(&v, sizeof v, 0) != (ssize_t)sizeof v)
			v = ckpt_now_ns() ^ ((uint64_t)getpid() << 40) ^ ckpt_wall_ns();
	return v;
}

bool ckpt_shape_elems(unsigned ndim, const uint64_t *shape, uint64_t *out)
{
	uint64_t n = 1;
	for (unsigned i = 0; i < ndim; i++)
		if (!ckpt_mul_u64(n, shape[i], &n))
			return false;
	*out = n;
	return true;
}

static const struct { const char *name; size_t size; } dtypes[] = {
	[CKPT_F64] = { "f64", 8 },  [CKPT_F32] = { "f32", 4 },   [CKPT_F16] = { "f16", 2 },
	[CKPT_BF16] = { "bf16", 2 }, [CKPT_F8_E4M3] = { "f8_e4m3", 1 },
	[CKPT_F8_E5M2] = { "f8_e5m2", 1 }, [CKPT_I64] = { "i64", 8 }, [CKPT_I32] = { "i32", 4 },
	[CKPT_I16] = { "i16", 2 },  [CKPT_I8] = { "i8", 1 },     [CKPT_U8] = { "u8", 1 },
	[CKPT_BOOL] = { "bool", 1 },
};

size_t ckpt_dtype_size(int dtype)
{
	return (dtype >= 1 && dtype <= CKPT_DTYPE_MAX_) ? dtypes[dtype].size : 0;
}

const char *ckpt_dtype_name(int dtype)
{
	return (dtype >= 1 && dtype <= CKPT_DTYPE_MAX_) ? dtypes[dtype].name : "?";
}

const char *ckpt_kind_name(int kind)
{
	static const char *const names[] = { "?", "model", "optimizer", "rng", "scheduler", "extra" };
	return (kind >= 1 && kind <= CKPT_KIND_MAX_) ? names[kind] : "?";
}

const char *ckpt_policy_name(int policy)
{
	static const char *const names[] = { "?", "sharded", "replicated", "rank-bound" };
	return (policy >= 1 && policy <= CKPT_POLICY_MAX_) ? names[policy] : "?";
}

/* Length of the well-formed UTF-8 sequence at p (1 to 4 bytes), or 0 when the bytes
 * there are not one: RFC 3629's grammar (Unicode Table 3-7), which leaves out overlong
 * forms (C0, C1, E0 80..9F, F0 80..8F), the surrogates U+D800..U+DFFF (ED A0..BF),
 * everything above U+10FFFF (F4 90.., F5..FF), lone continuation bytes and sequences
 * cut short. */
static size_t utf8_seq(const unsigned char *p, size_t left)
{
	unsigned char b = p[0];
	if (b < 0x80)
		return 1;
	size_t n;
	unsigned char lo = 0x80, hi = 0xBF;       /* range of the second byte */
	if (b >= 0xC2 && b <= 0xDF)      n = 2;
	else if (b == 0xE0)              { n = 3; lo = 0xA0; }
	else if (b == 0xED)              { n = 3; hi = 0x9F; }
	else if (b >= 0xE1 && b <= 0xEF) n = 3;
	else if (b == 0xF0)              { n = 4; lo = 0x90; }
	else if (b == 0xF4)              { n = 4; hi = 0x8F; }
	else if (b >= 0xF1 && b <= 0xF3) n = 4;
	else
		return 0;
	if (left < n || p[1] < lo || p[1] > hi)
		return 0;
	for (size_t i = 2; i < n; i++)
		if (p[i] < 0x80 || p[i] > 0xBF)
			return 0;
	return n;
}

const char *ckpt_name_problem(const char *name, size_t len, bool utf8)
{
	if (!name || len == 0)
		return "empty";
	if (len > CKPT_MAX_NAME)
		return "longer than CKPT_MAX_NAME bytes";
	if (memchr(name, '\0', len))
		return "a NUL byte";
	if (name[0] == '/')
		return "a leading '/'";
	/* Every '/'-separated component must be non-empty and not "." or "..". */
	size_t start = 0;
	for (size_t i = 0; i <= len; i++) {
		if (i == len || name[i] == '/') {
			size_t n = i - start;
			if (n == 0)
				return "an empty component";
			if ((n == 1 && name[start] == '.') ||
			    (n == 2 && name[start] == '.' && name[start + 1] == '.'))
				return "a '.' or '..' component";
			start = i + 1;
		}
	}
	for (size_t i = 0; i < len; i++)
		if ((unsigned char)name[i] < 0x20)
			return "a control byte";
	const unsigned char *p = (const unsigned char *)name;
	for (size_t i = 0; utf8 && i < len;) {
		size_t n = utf8_seq(p + i, len - i);
		if (!n)
			return "not well-formed UTF-8";
		i += n;
	}
	return NULL;
}

int ckpt_name_check(const char *name, size_t len)
{
	return ckpt_name_problem(name, len, true) ? CKPT_ENAME : 0;
}

const char *ckpt_name_quote(const char *name, size_t len, char *out, size_t cap)
{
	static const char hex[] = "0123456789abcdef";
	const unsigned char *p = (const unsigned char *)name;
	size_t o = 0;
	if (cap < 8) {
		if (cap)
			out[0] = '\0';
		return out;
	}
	if (!name)
		len = 0;
	/* Room kept for one escape or sequence (4), "..." and the NUL. */
	for (size_t i = 0; i < len;) {
		size_t n = utf8_seq(p + i, len - i);
		if (i >= CKPT_NAME_QUOTE_BYTES || o + 8 > cap) {
			memcpy(out + o, "...", 3);
			o += 3;
			break;
		}
		if (n && p[i] >= 0x20 && p[i] != 0x7f) {
			memcpy(out + o, p + i, n);
			o += n;
			i += n;
		} else {
			out[o++] = '\\';
			out[o++] = 'x';
			out[o++] = hex[p[i] >> 4];
			out[o++] = hex[p[i] & 15];
			i++;
		}
	}
	out[o < cap ? o : cap - 1] = '\0';
	return out;
}
