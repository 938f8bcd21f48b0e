/*
 * gc.c — garbage collection of attempts that cannot commit, by the coordinator at
 * open and by ckpt_catalog_gc (retention.c).
 *
 * What may be deleted is decided by the manifest alone, positively: the files of an
 * attempt whose record says it is ABORTED, or INFLIGHT under a coordinator that is
 * gone (presumed abort: one coordinator per root, and a new one holds the root
 * now). A step directory the manifest has no record of is never collected: it is
 * the sign of a lost or damaged manifest (or of a root restored from a backup older
 * than its files), and its files may be the only copy of committed steps that
 * `ckpt-inspect rebuild --merge` can recover; the operator decides (`ckpt-inspect gc
 * --unrecorded`). A damaged record protects its step the same way. A committed step
 * is never touched here.
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "glue.h"

/* Remove every regular file of one step directory, then the directory. */
static int gc_remove_dir(const char *root, uint64_t step)
{
	char dir[4200], path[4500];
	int rc = ckpt_path_step_dir(dir, sizeof dir, root, step);
	if (rc)
		return ckpt_err(rc, "step directory of %s", root);
	DIR *d = opendir(dir);
	if (!d)
		return errno == ENOENT ? 0 : ckpt_err(-errno, "gc: open %s", dir);
	struct dirent *e;
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
	return rc ? rc : ckpt_fsync_dir(root);
}

int gc_attempt_remove(const char *root, uint64_t step, uint64_t save_id)
{
	uint32_t removed;
	bool empty;
	int rc = ckpt_step_remove_attempt(root, step, save_id, &removed, &empty);
	if (rc)
		return rc;
	if (!empty)
		return 0;                  /* something the record does not name stays */
	char dir[4200];
	if ((rc = ckpt_path_step_dir(dir, sizeof dir, root, step)))
		return ckpt_err(rc, "step directory of %s", root);
	if (rmdir(dir) < 0 && errno != ENOENT && errno != ENOTEMPTY)
		return ckpt_err(-errno, "gc: remove %s", dir);
	return ckpt_fsync_dir(root);
}

int gc_unrecorded_remove(const char *root, uint64_t step)
{
	return gc_remove_dir(root, step);
}

int gc_open(ckpt_ctx *c, uint64_t *removed)
{
	*removed = 0;
	const char *root = c->cfg.root;
	manifest_creation_leftovers_remove(c->manifest_path);
	uint64_t bad[8];
	int nbad = manifest_steps_damaged(c->manifest, bad, CKPT_ARRAY_SIZE(bad));
	if (nbad > 0)
		ckpt_log(CKPT_LOG_WARN, "%s: %d damaged record(s) in the manifest (the first under "
		         "step %llu): their steps are left alone; `ckpt-inspect %s rebuild --merge%s%s` "
		         "removes the damaged records and recovers the steps from their files",
		         root, nbad, (unsigned long long)bad[0], root, GLUE_MANIFEST_OPT(c));
	DIR *d = opendir(root);
	if (!d)
		return ckpt_err(-errno, "gc: open %s", root);
	struct dirent *e;
	int rc = 0;
	uint64_t unrecorded = 0, first_unrecorded = 0;
	while ((e = readdir(d)) && !rc) {
		uint64_t step;
		if (!ckpt_path_parse_step_dir(e->d_name, &step))
			continue;
		struct manifest_step rec;
		int g = manifest_step_get(c->manifest, step, &rec);
		if (g == CKPT_ENOTFOUND) {
			if (!unrecorded++)
				first_unrecorded = step;
			continue;
		}
		if (g) {
			ckpt_log(CKPT_LOG_WARN, "gc: step %llu left alone: %s", (unsigned long long)step,
			         ckpt_err_msg());
			continue;
		}
		if (rec.state == CKPT_STATE_COMMITTED)
			continue;
		/* ABORTED, or INFLIGHT of a coordinator that is gone (this one has begun
		 * nothing yet): presumed abort. */
		if ((rc = gc_attempt_remove(root, step, rec.save_id)))
			break;
		if (rec.state == CKPT_STATE_INFLIGHT)
			commit_decide(c->manifest, &rec, &(struct commit_decision){ .abort = true,
			              .why = "presumed aborted: the coordinator that began it is gone" });
		(*removed)++;
	}
	closedir(d);
	if (unrecorded)
		ckpt_log(CKPT_LOG_WARN, "%s: %llu step director%s without a record in the manifest "
		         "(the first: step %llu) kept: `ckpt-inspect %s rebuild --merge%s%s` recovers "
		         "what they hold, `ckpt-inspect %s gc --unrecorded%s%s` removes them", root,
		         (unsigned long long)unrecorded, unrecorded == 1 ? "y" : "ies",
		         (unsigned long long)first_unrecorded, root, GLUE_MANIFEST_OPT(c), root,
		         GLUE_MANIFEST_OPT(c));
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
