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
 *
 * Nor is a file that a committed step references (an incremental save's chunks that
 * lie in an earlier step's file, docs/format.md §3b): the committed records list
 * the files they reference, and every removal here spares those, logging which step
 * keeps each. The record that names such a file (ABORTED: the step retired, its
 * files not all gone) stays, so that the file is never left without a record; a
 * later GC removes it once no committed step references it.
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "glue.h"

int gc_refs_load(struct manifest *m, struct gc_refs *out)
{
	memset(out, 0, sizeof *out);
	return manifest_refs_all(m, &out->refs, &out->by, &out->n, &out->damaged,
	                         &out->damaged_max);
}

void gc_refs_free(struct gc_refs *r)
{
	ckpt_free(r->refs);
	ckpt_free(r->by);
	memset(r, 0, sizeof *r);
}

/* The committed step that references file (step, rank, save_id), if any. */
static bool gc_refs_find(const struct gc_refs *r, uint64_t step, uint32_t rank,
                         uint64_t save_id, uint64_t *by)
{
	if (!r)
		return false;
	if (r->damaged && step < r->damaged_max) {
		*by = r->damaged_max;         /* an unreadable record may reference it */
		return true;
	}
	for (size_t i = 0; i < r->n; i++) {
		if (r->refs[i].step == step && r->refs[i].rank == rank &&
		    r->refs[i].save_id == save_id) {
			*by = r->by[i];
			return true;
		}
	}
	return false;
}

struct gc_keep { const struct gc_refs *refs; uint64_t step; uint32_t kept; };

static bool gc_keep_ref(void *arg, uint32_t rank, uint64_t save_id)
{
	struct gc_keep *k = arg;
	uint64_t by;
	if (!gc_refs_find(k->refs, k->step, rank, save_id, &by))
		return false;
	k->kept++;
	ckpt_log(CKPT_LOG_INFO, "gc: step %llu: the shard of rank %u (attempt %016llx) kept: "
	         "step %llu%s references it", (unsigned long long)k->step, rank,
	         (unsigned long long)save_id, (unsigned long long)by,
	         k->refs->damaged && k->step < k->refs->damaged_max
	         ? " (a damaged record, which may)" : "");
	return true;
}

/* Remove every regular file of one step directory, then the directory. */
static int gc_remove_dir(const char *root, uint64_t step, const struct gc_refs *refs,
                         uint32_t *kept)
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
		uint32_t rank;
		uint64_t id;
		struct gc_keep k = { refs, step, 0 };
		if (refs && ckpt_path_parse_shard(e->d_name, &rank, &id) && gc_keep_ref(&k, rank, id)) {
			(*kept)++;
			continue;
		}
		snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
		if (unlink(path) < 0 && errno != ENOENT) {
			rc = ckpt_err(-errno, "gc: remove %s", path);
			break;
		}
	}
	closedir(d);
	if (!rc && *kept)
		return ckpt_fsync_dir(dir);
	if (!rc && rmdir(dir) < 0 && errno != ENOENT)
		rc = ckpt_err(-errno, "gc: remove %s", dir);
	return rc ? rc : ckpt_fsync_dir(root);
}

int gc_attempt_remove(const char *root, uint64_t step, uint64_t save_id,
                      const struct gc_refs *refs, uint32_t *kept)
{
	uint32_t removed;
	bool empty;
	struct gc_keep k = { refs, step, 0 };
	int rc = ckpt_step_remove_attempt_keep(root, step, save_id, refs ? gc_keep_ref : NULL,
	                                       &k, &removed, &empty);
	if (kept)
		*kept = k.kept;
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

int gc_unrecorded_remove(const char *root, uint64_t step, const struct gc_refs *refs,
                         uint32_t *kept)
{
	*kept = 0;
	return gc_remove_dir(root, step, refs, kept);
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
	/* The files committed steps reference stay, whatever names them. */
	struct gc_refs refs;
	int rc = gc_refs_load(c->manifest, &refs);
	if (rc)
		return ckpt_err_prefix(rc, "gc: the files committed steps reference");
	DIR *d = opendir(root);
	if (!d) {
		gc_refs_free(&refs);
		return ckpt_err(-errno, "gc: open %s", root);
	}
	struct dirent *e;
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
		if ((rc = gc_attempt_remove(root, step, rec.save_id, &refs, NULL)))
			break;
		if (rec.state == CKPT_STATE_INFLIGHT)
			commit_decide(c->manifest, &rec, &(struct commit_decision){ .abort = true,
			              .why = "presumed aborted: the coordinator that began it is gone" });
		(*removed)++;
	}
	closedir(d);
	gc_refs_free(&refs);
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
