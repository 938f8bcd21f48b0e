/*
 * st.h — the safetensors side of ckpt-reshard, shared by the export (st_export.c)
 * and the import (st_import.c), implemented in st_format.c: the dtypes by their
 * safetensors names, the --dtype cast, the --max-shard-size value, and how names
 * go between a checkpoint ('/'-separated, under a kind folder such as "model/") and
 * a Hugging Face state dict ('.'-separated): the built-in rule and --name-map.
 */
#ifndef CKPT_RESHARD_ST_H
#define CKPT_RESHARD_ST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The safetensors reference reader's cap on the header (100 MB): a larger length
 * in the first 8 bytes is refused before anything is read. */
#define ST_MAX_HEADER 100000000u

/* "F32", "BF16", ... for a dtype, NULL for none; and back (0: not a known name). */
const char *st_dtype_name(int dtype);
int         st_dtype_parse(const char *s);
/* Whether dtype is a floating-point type (--dtype casts these only). */
bool        st_dtype_is_float(int dtype);
/* Convert n elements of floating dtype from at src to floating dtype to at dst,
 * rounding to nearest, ties to even, once (from the exact value); NaN stays NaN
 * (quiet, sign kept), a value beyond the target's range becomes infinity. */
void        st_convert(int from, int to, const void *src, void *dst, size_t n);

/* --max-shard-size as Hugging Face reads it: digits, then nothing or B (bytes), KB,
 * MB, GB, TB (powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024), any case.
 * 0 or -1 (zero, overflow or anything else). */
int st_parse_shard_size(const char *s, uint64_t *out);

/* --name-map FILE: a JSON object of checkpoint name -> Hugging Face name. */
struct st_pair { char *a, *b; };
struct st_namemap {
	struct st_pair *fwd;      /* sorted by checkpoint name (a) */
	struct st_pair *rev;      /* the same pairs sorted by Hugging Face name (a) */
	size_t          n;
};
/* Load path; reports its failure (tool_fail) and returns the exit code, 0 on
 * success. reverse: the map will be read backwards (import), so two checkpoint
 * names for one Hugging Face name are refused. */
int  st_namemap_load(const char *path, bool reverse, struct st_namemap *m);
void st_namemap_free(struct st_namemap *m);
/* The mapped name of key in the direction asked, or NULL when the map lacks it. */
const char *st_namemap_get(const struct st_namemap *m, bool reverse, const char *key);

/* The built-in rule, export: a model tensor drops a leading "model/"; every other
 * name keeps its folders; then '/' becomes '.'. A new string (malloc), or NULL. */
char *st_export_name(const char *name, int kind);
/* Import: "model/" + the name, kept as it is. A new string, or NULL. */
char *st_import_name(const char *name);

#endif
