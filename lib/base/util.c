/*
 * util.c — clocks, shapes, names and dtypes: small facts every module shares.
 */
#include <errno.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "ckpt_internal.h"

uint64_t ckpt_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t ckpt_wall_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

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

int ckpt_name_check(const char *name, size_t len)
{
	if (!name || len == 0)
		return CKPT_ENAME;
	if (len > CKPT_MAX_NAME)
		return CKPT_ENAME;
	if (memchr(name, '\0', len))
		return CKPT_ENAME;
	if (name[0] == '/')
		return CKPT_ENAME;
	/* Every '/'-separated component must be non-empty and not "." or "..". */
	size_t start = 0;
	for (size_t i = 0; i <= len; i++) {
		if (i == len || name[i] == '/') {
			size_t n = i - start;
			if (n == 0)
				return CKPT_ENAME;
			if ((n == 1 && name[start] == '.') ||
			    (n == 2 && name[start] == '.' && name[start + 1] == '.'))
				return CKPT_ENAME;
			start = i + 1;
		}
	}
	for (size_t i = 0; i < len; i++)
		if ((unsigned char)name[i] < 0x20)
			return CKPT_ENAME;
	return 0;
}
