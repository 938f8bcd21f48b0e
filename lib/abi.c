/*
 * abi.c — what a binary built against one release of libckpt relies on in another:
 * the version the library reports, and the layout of every public struct, fixed
 * here at compile time so that a change to a field's type, order or size breaks the
 * build instead of callers' memory. Option and result structs carry their size
 * first and only grow at the end (ckpt.h): a field appended there changes the size
 * asserted below, and that is the one layout change allowed within a major version
 * (CONTRIBUTING.md, "ABI and versions"); update the number with the field.
 *
 * The exported names are kept by cmake/libckpt.map and the ctest abi_symbols.
 */
#include <stddef.h>

#include "ckpt/catalog.h"
#include "ckpt/ckpt.h"

#define ABI_STR_(x) #x
#define ABI_STR(x)  ABI_STR_(x)

const char *ckpt_version(void)
{
	return ABI_STR(CKPT_VERSION_MAJOR) "." ABI_STR(CKPT_VERSION_MINOR) "."
	       ABI_STR(CKPT_VERSION_PATCH);
}

_Static_assert(CKPT_VERSION_NUMBER ==
               CKPT_VERSION_MAJOR * 10000 + CKPT_VERSION_MINOR * 100 + CKPT_VERSION_PATCH,
               "CKPT_VERSION_NUMBER");
_Static_assert(CKPT_VERSION_MINOR < 100 && CKPT_VERSION_PATCH < 100,
               "CKPT_VERSION_NUMBER holds minor and patch below 100");

/* Constants that size public arrays. */
_Static_assert(CKPT_MAX_NDIM == 16, "CKPT_MAX_NDIM is part of the ABI");
_Static_assert(CKPT_MAX_NAME == 4096, "CKPT_MAX_NAME is part of the ABI");
_Static_assert(CKPT_MAX_META == 65536, "CKPT_MAX_META is part of the ABI");

/* The sizes and the offset of the last field, on LP64 targets (x86-64, aarch64: what
 * libckpt builds for). The options and result structs that start with their size
 * must keep it first. */
#if defined(__LP64__)
#define ABI_LAYOUT(type, size_, last, off)                                          \
	_Static_assert(sizeof(struct type) == (size_), "size of struct " #type);     \
	_Static_assert(offsetof(struct type, last) == (off), "offset of " #type "." #last)
#define ABI_SIZE_FIRST(type) \
	_Static_assert(offsetof(struct type, size) == 0, "struct " #type ": size first")

ABI_LAYOUT(ckpt_opts,            200, device_pool_bytes, 192);
ABI_LAYOUT(ckpt_log_ctx,          24, step,              16);
ABI_LAYOUT(ckpt_gds_stats,        56, files_refused,     48);
ABI_LAYOUT(ckpt_tensor,           64, mem,               56);
ABI_LAYOUT(ckpt_save_stats,       72, device_unchanged_bytes, 64);
ABI_LAYOUT(ckpt_step_info,        72, dir_bytes,         64);
ABI_LAYOUT(ckpt_tensor_info,     176, stored_bytes,     168);
ABI_LAYOUT(ckpt_load_req,         56, flags,             48);
ABI_LAYOUT(ckpt_chunk_info,      336, hash_blocks,      328);
ABI_LAYOUT(ckpt_verify_opts,      32, arg,               24);
ABI_LAYOUT(ckpt_verify_result,  8272, bad_file,        4169);
ABI_LAYOUT(ckpt_gc_item,          32, nfiles,            24);
ABI_LAYOUT(ckpt_gc_opts,          64, keep_seconds,      56);
ABI_LAYOUT(ckpt_gc_result,        40, steps_unrecorded,  32);
ABI_LAYOUT(ckpt_rebuild_result,   48, steps_damaged,     40);

ABI_SIZE_FIRST(ckpt_opts);
ABI_SIZE_FIRST(ckpt_gds_stats);
ABI_SIZE_FIRST(ckpt_save_stats);
ABI_SIZE_FIRST(ckpt_verify_opts);
ABI_SIZE_FIRST(ckpt_verify_result);
ABI_SIZE_FIRST(ckpt_gc_opts);
ABI_SIZE_FIRST(ckpt_gc_result);
ABI_SIZE_FIRST(ckpt_rebuild_result);
#endif
