/*
 * gc.c — garbage collection of uncommitted steps: a step directory with no
 * COMMITTED record in the manifest is invisible (DESIGN §3) and is removed when
 * no save of it can be in flight. A committed step is never touched here.
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "glue.h"

/* Remove the files of one step directory, then the directory. */
static int gc_remove_step(const char *root, const char *name)
{
	char dir[4200], path[4500];
	snprintf(dir, sizeof dir, "%s/%s", root, name);
	DIR *d = opendir(dir);
	if (!d)
		return errno == ENOENT ? 0 : ckpt_err(-errno, "gc: open %s", dir);
	struct dirent *e;
	int rc = 0;
	while ((e = readdir(d))) {
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
		if (unlink(path) < 0 && errno != ENOENT) {
			rc = ckpt_err(-errno, "gc: remove %s", path);
			break;
		}
	}
	closedir(d);
	if (!rc && rmdir(dir) < 0 && errno != ENOENT)
		rc = ckpt_err(-errno, "gc: remove %s", dir);
	return rc;
}

int gc_orphans(ckpt_ctx *c, uint64_t *removed)
{
	*removed = 0;
	DIR *d = opendir(c->cfg.root);
	if (!d)
		return ckpt_err(-errno, "gc: open %s", c->cfg.root);
	struct dirent *e;
	int rc = 0;
	while ((e = readdir(d)) && !rc) {
		uint64_t step;
		if (!ckpt_path_parse_step_dir(e->d_name, &step))
			continue;
		struct manifest_step rec;
		int g = manifest_step_get(c->manifest, step, &rec);
		if (g == 0 && rec.state == CKPT_STATE_COMMITTED)
			continue;
		if (g && g != CKPT_ENOTFOUND) {
			rc = g;
			break;
		}
		rc = gc_remove_step(c->cfg.root, e->d_name);
		if (!rc)
			(*removed)++;
	}
	closedir(d);
	if (!rc && *removed)
		rc = ckpt_fsync_dir(c->cfg.root);
	return rc;
}

int gc_step_dir_usage(const char *root, uint64_t step, uint32_t *nfiles, uint64_t *bytes)
{
	char dir[4200], path[4500];
	*nfiles = 0;
	*bytes = 0;
	int rc = ckpt_path_step_dir(dir, sizeof dir, root, step);
	if (rc)
		return ckpt_err(rc, "step directory of %s", root);
	DIR *d = opendir(dir);
	if (!d)
		return errno == ENOENT ? -ENOENT : ckpt_err(-errno, "open %s", dir);
	struct dirent *e;
	while ((e = readdir(d))) {
		struct stat st;
		snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
		if (lstat(path, &st) == 0 && S_ISREG(st.st_mode)) {
			(*nfiles)++;
			*bytes += (uint64_t)st.st_size;
		}
	}
	closedir(d);
	return 0;
}

int gc_step_dir_remove(const char *root, uint64_t step)
{
	char name[64];
	snprintf(name, sizeof name, "step-%020llu", (unsigned long long)step);
	int rc = gc_remove_step(root, name);
	return rc ? rc : ckpt_fsync_dir(root);
}
