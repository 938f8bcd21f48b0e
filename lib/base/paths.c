/*
 * paths.c — the names of things inside a checkpoint root (docs/format.md §1).
 *
 *   <root>/manifest/                     LMDB environment (data.mdb, lock.mdb)
 *   <root>/step-<20-digit step>/         one directory per step
 *   <root>/step-<step>/rank-<6-digit rank>.shard
 *
 * Twenty digits hold any uint64_t, so names sort like steps.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt_internal.h"

static int path_fmt(size_t cap, int n)
{
	return (n < 0 || (size_t)n >= cap) ? -ENAMETOOLONG : 0;
}

int ckpt_path_step_dir(char *out, size_t cap, const char *root, uint64_t step)
{
	return path_fmt(cap, snprintf(out, cap, "%s/step-%020llu", root,
	                                   (unsigned long long)step));
}

int ckpt_path_shard_rel(char *out, size_t cap, uint64_t step, uint32_t rank)
{
	return path_fmt(cap, snprintf(out, cap, "step-%020llu/rank-%06u.shard",
	                                   (unsigned long long)step, rank));
}

int ckpt_path_shard(char *out, size_t cap, const char *root, uint64_t step, uint32_t rank)
{
	return path_fmt(cap, snprintf(out, cap, "%s/step-%020llu/rank-%06u.shard", root,
	                                   (unsigned long long)step, rank));
}

bool ckpt_path_parse_step_dir(const char *name, uint64_t *step)
{
	if (strncmp(name, "step-", 5) != 0 || strlen(name) != 25)
		return false;
	uint64_t v = 0;
	for (int i = 5; i < 25; i++) {
		if (name[i] < '0' || name[i] > '9')
			return false;
		if (!ckpt_mul_u64(v, 10, &v) || !ckpt_add_u64(v, (uint64_t)(name[i] - '0'), &v))
			return false;
	}
	*step = v;
	return true;
}

int ckpt_fsync_dir(const char *path)
{
	int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return ckpt_err(-errno, "open directory %s for fsync", path);
	int rc = 0;
	if (fsync(fd) < 0)
		rc = ckpt_err(-errno, "fsync directory %s", path);
	close(fd);
	return rc;
}
