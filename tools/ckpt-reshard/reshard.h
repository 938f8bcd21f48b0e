/*
 * reshard.h — the parts of ckpt-reshard shared between its two jobs: the parsed
 * command line and the safetensors export (safetensors.c).
 */
#ifndef CKPT_RESHARD_H
#define CKPT_RESHARD_H

#include <stdbool.h>
#include <stdint.h>

#include "ckpt/ckpt.h"

enum reshard_exit {
	RX_OK = 0, RX_FAIL = 1, RX_USAGE = 2, RX_NOSTEP = 3, RX_NOTROOT = 4, RX_EXISTS = 5,
	RX_WORLD = 6, RX_RANKBOUND = 7, RX_NODEV = 8,
};

struct reshard_args {
	const char *root, *out, *export_file;
	uint64_t    step, out_step;
	bool        latest, have_out_step, json, quiet, drop_rank_bound;
	unsigned    world;
	int         kind;              /* 0: all kinds */
	int        *rank_map;          /* world entries, -1: none; NULL: no map */
	uint64_t    chunk, pool, buffer;
	int         zstd_level;
	unsigned    port;
	char        job[64];           /* the N rank processes' job id ("": CKPT_JOB_ID) */
};

/* Exit code for a library error code. */
int reshard_exit_for(int rc);
/* Open root read-only as rank 0 of 1 (tools' context). */
int reshard_open_source(const struct reshard_args *a, ckpt_ctx **c);
/* --export-safetensors: returns an exit code. */
int reshard_export_safetensors(const struct reshard_args *a);

#endif
