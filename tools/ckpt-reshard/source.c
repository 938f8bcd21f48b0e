/*
 * source.c — what both jobs of ckpt-reshard (and the import) do to open a root: the
 * context options of a rank of the tool, the read-only source, and the exit code
 * that stands for a library error code.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "reshard.h"
#include "toolutil.h"

int reshard_exit_for(int rc)
{
	switch (rc) {
	case 0:              return RX_OK;
	case CKPT_ENOTFOUND: return RX_NOSTEP;
	case CKPT_ENOTROOT:
	case -ENOENT:
	case -ENOTDIR:       return RX_NOTROOT;
	case -EEXIST:        return RX_EXISTS;
	case CKPT_ENODEV:    return RX_NODEV;
	case CKPT_ERANKBOUND: return RX_RANKBOUND;
	default:             return RX_FAIL;
	}
}

int reshard_open_ctx(const char *root, const char *manifest_dir, int rank, int world,
                     unsigned flags, const struct reshard_args *a, ckpt_ctx **c)
{
	struct ckpt_opts o;
	ckpt_opts_init(&o, sizeof o);
	/* A source held by ckptd: "ckptd://HOST:PORT[,...]" in place of the root (the job
	 * id and secret from CKPT_JOB_ID and CKPT_JOB_SECRET). */
	if ((flags & CKPT_OPEN_READONLY) && !strncmp(root, "ckptd://", 8))
		o.target = root;
	else
		o.root = root;
	o.manifest_dir = manifest_dir;
	o.rank = rank;
	o.world = world;
	o.flags = flags;
	o.pool_bytes = a->pool;       /* the source's read buffers too: --pool bounds both */
	if (!(flags & CKPT_OPEN_READONLY)) {
		o.chunk_bytes = a->chunk;
		o.zstd_level = a->zstd_level;
		o.compress_codec = a->compress_codec;
		o.coord_addr = "127.0.0.1";
		o.coord_port = a->port;
		if (a->job[0])
			o.job_id = a->job;
	}
	return ckpt_open(&o, c);
}

int reshard_open_source(const struct reshard_args *a, ckpt_ctx **c)
{
	struct stat st;
	*c = NULL;
	if (strncmp(a->root, "ckptd://", 8) && stat(a->root, &st) < 0) {
		int rc = -errno;
		return tool_fail(reshard_exit_for(rc), rc, "%s: %s", a->root, strerror(-rc));
	}
	int rc = reshard_open_ctx(a->root, a->manifest_dir, 0, 1, CKPT_OPEN_READONLY, a, c);
	if (rc)
		return tool_fail(reshard_exit_for(rc), rc, "%s", ckpt_last_error());
	return 0;
}

