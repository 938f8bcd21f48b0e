/*
 * reshard.h — what the parts of ckpt-reshard share: the parsed command line, the
 * exit codes, opening a root (source.c), and the entry point of each job, called by
 * main (ckpt-reshard.c) only: the reshard (ranks.c, with plan.c and readahead.c),
 * the safetensors export and import (st_export.c, st_import.c).
 *
 * The dependencies run one way: main -> the jobs -> source.c and toolutil; no job
 * calls into main or into another job.
 */
#ifndef CKPT_RESHARD_H
#define CKPT_RESHARD_H

#include <stdbool.h>
#include <stdint.h>

#include "ckpt/ckpt.h"

enum reshard_exit {
	RX_OK = 0, RX_FAIL = 1, RX_USAGE = 2, RX_NOSTEP = 3, RX_NOTROOT = 4, RX_EXISTS = 5,
	RX_WORLD = 6, RX_RANKBOUND = 7, RX_NODEV = 8,
	/* safetensors input (import) and names (both directions) */
	RX_HEADER = 9,      /* header length, JSON, UTF-8, duplicate keys, __metadata__ */
	RX_TENSOR = 10,     /* a tensor's entry: dtype, shape, size against its offsets */
	RX_OFFSETS = 11,    /* offsets outside the data, overlapping, or leaving a gap */
	RX_INDEX = 12,      /* the index json: malformed, a file outside the directory or
	                     * missing, a tensor not where it says */
	RX_NAME = 13,       /* a name that is not valid, or two sources for one name */
};

struct reshard_args {
	const char *root, *out, *export_dir, *import_path, *name_map;
	/* --manifest-dir and --out-manifest-dir: the manifest directories of root and out
	 * when they are kept apart (NULL: the library's default, CKPT_MANIFEST_DIR, then
	 * <root>/manifest) */
	const char *manifest_dir, *out_manifest_dir;
	uint64_t    step, out_step;
	bool        latest, have_out_step, json, quiet, drop_rank_bound;
	unsigned    world;
	unsigned    kinds;             /* export: bit (1 << kind) per kind; 0: model only */
	int         cast;              /* export --dtype: 0, CKPT_BF16, CKPT_F16, CKPT_F32 */
	uint64_t    max_shard;         /* export --max-shard-size (0: 5 GB) */
	int        *rank_map;          /* world entries, -1: none; NULL: no map */
	uint64_t    chunk, pool, buffer;
	int         zstd_level;
	int         compress_codec;   /* enum ckpt_codec, with zstd_level > 0 */
	unsigned    port;
	char        job[64];           /* the N rank processes' job id ("": CKPT_JOB_ID) */
};

/* Exit code for a library error code. */
int reshard_exit_for(int rc);
/* ckpt_open root (its manifest in manifest_dir; NULL: the library's default) as rank
 * of world with flags, with the output options of a (chunk, compression, coordinator,
 * job id; --pool for both): a library error code. */
int reshard_open_ctx(const char *root, const char *manifest_dir, int rank, int world,
                     unsigned flags, const struct reshard_args *a, ckpt_ctx **c);
/* Open a->root read-only as rank 0 of 1; reports its failure (tool_fail) and returns
 * the exit code, 0 on success. */
int reshard_open_source(const struct reshard_args *a, ckpt_ctx **c);

/* The jobs; each returns an exit code, having reported any failure. */
int reshard_run(struct reshard_args *a);                         /* --world N --out */
int reshard_export_safetensors(const struct reshard_args *a);   /* --export-safetensors */
int reshard_import_safetensors(const struct reshard_args *a);   /* --import-safetensors */

#endif
