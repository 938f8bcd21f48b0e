/*
 * paths.c — the names of things inside a checkpoint root (docs/format.md §1).
 *
 *   <root>/manifest/                     LMDB environment (data.mdb, lock.mdb), unless
 *                                        the job keeps it apart (CKPT_MANIFEST_DIR)
 *   <root>/coordinator.lock              held by the root's one coordinator
 *   <root>/step-<20-digit step>/         one directory per step
 *   <root>/step-<step>/rank-<6+ digit rank>-<16 hex digit save id>.shard
 *   <root>/step-<step>/rank-<6+ digit rank>.shard   (format 1 and 2 files: no save id)
 *
 * Twenty digits hold any uint64_t, so names sort like steps. The save id names the
 * attempt that wrote a file: two attempts at one step (a stale copy of a job and
 * its restart, or a retry after an abort) never write, truncate or remove each
 * other's files, since their names differ.
 */
#include <dirent.h>
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

int ckpt_path_manifest_dir(char *out, size_t cap, const char *root)
{
	return path_fmt(cap, snprintf(out, cap, "%s/%s", root, CKPT_MANIFEST_NAME));
}

int ckpt_path_step_dir(char *out, size_t cap, const char *root, uint64_t step)
{
	return path_fmt(cap, snprintf(out, cap, "%s/step-%020llu", root,
	                                   (unsigned long long)step));
}

int ckpt_path_shard_name(char *out, size_t cap, uint32_t rank, uint64_t save_id)
{
	if (!save_id)
		return path_fmt(cap, snprintf(out, cap, "rank-%06u.shard", rank));
	return path_fmt(cap, snprintf(out, cap, "rank-%06u-%016llx.shard", rank,
	                              (unsigned long long)save_id));
}

int ckpt_path_shard_rel(char *out, size_t cap, uint64_t step, uint32_t rank, uint64_t save_id)
{
	int n = snprintf(out, cap, "step-%020llu/", (unsigned long long)step);
	if (path_fmt(cap, n))
		return -ENAMETOOLONG;
	return ckpt_path_shard_name(out + n, cap - (size_t)n, rank, save_id);
}

int ckpt_path_shard(char *out, size_t cap, const char *root, uint64_t step, uint32_t rank,
                    uint64_t save_id)
{
	int n = snprintf(out, cap, "%s/", root);
	if (path_fmt(cap, n))
		return -ENAMETOOLONG;
	return ckpt_path_shard_rel(out + n, cap - (size_t)n, step, rank, save_id);
}

bool ckpt_path_parse_shard(const char *name, uint32_t *rank, uint64_t *save_id)
{
	if (strncmp(name, "rank-", 5) != 0)
		return false;
	const char *p = name + 5;
	uint64_t r = 0;
	int digits = 0;
	for (; *p >= '0' && *p <= '9'; p++, digits++)
		if (!ckpt_mul_u64(r, 10, &r) || !ckpt_add_u64(r, (uint64_t)(*p - '0'), &r) ||
		    r > UINT32_MAX)
			return false;
	/* At least six digits, and no needless leading zero beyond the padding: the
	 * one spelling ckpt_path_shard_name gives. */
	if (digits < 6 || (digits > 6 && name[5] == '0'))
		return false;
	uint64_t id = 0;
	if (*p == '-') {
		p++;
		for (int i = 0; i < 16; i++, p++) {
			int v = *p >= '0' && *p <= '9' ? *p - '0' : *p >= 'a' && *p <= 'f' ? *p - 'a' + 10 : -1;
			if (v < 0)
				return false;
			id = id << 4 | (uint64_t)v;
		}
		if (!id)
			return false;
	}
	if (strcmp(p, ".shard") != 0)
		return false;
	*rank = (uint32_t)r;
	*save_id = id;
	return true;
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

int ckpt_step_remove_attempt(const char *root, uint64_t step, uint64_t save_id,
                             uint32_t *removed, bool *empty)
{
	return ckpt_step_remove_attempt_keep(root, step, save_id, NULL, NULL, removed, empty);
}

int ckpt_step_remove_attempt_keep(const char *root, uint64_t step, uint64_t save_id,
                                  ckpt_keep_fn keep, void *arg, uint32_t *removed,
                                  bool *empty)
{
	char dir[4200], path[4400];
	*removed = 0;
	*empty = false;
	int rc = ckpt_path_step_dir(dir, sizeof dir, root, step);
	if (rc)
		return ckpt_err(rc, "step directory of %s", root);
	DIR *d = opendir(dir);
	if (!d)
		return errno == ENOENT ? (*empty = true, 0) : ckpt_err(-errno, "open %s", dir);
	struct dirent *e;
	bool others = false;
	while ((e = readdir(d))) {
		uint32_t rank;
		uint64_t id;
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		/* Only the files this attempt named as its own: anything else (another
		 * attempt's, a file libckpt did not write) stays. A record without a save
		 * id (an older build's, or rebuild's verdict on the whole directory) names
		 * every shard file of the directory. */
		if (!ckpt_path_parse_shard(e->d_name, &rank, &id) || (save_id && id != save_id) ||
		    (keep && keep(arg, rank, id))) {
			others = true;
			continue;
		}
		snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
		if (unlink(path) < 0 && errno != ENOENT) {
			rc = ckpt_err(-errno, "remove %s", path);
			break;
		}
		(*removed)++;
	}
	closedir(d);
	if (rc)
		return rc;
	if (*removed && (rc = ckpt_fsync_dir(dir)))
		return rc;
	*empty = !others;
	return 0;
}
