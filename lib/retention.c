/*
 * retention.c — garbage collection for operators (ckpt-inspect gc): removes what
 * is invisible (step directories with no record, aborted and in-flight records)
 * and applies retention (keep the newest N committed steps, keep every K-th, keep
 * those committed within the last S seconds), never the latest committed step;
 * and the same retention run by the job after each commit (ckpt_opts.keep_*).
 *
 * Order matters for the invariant (CONTRIBUTING.md, "Tests"). A committed step is
 * first retired — its record made ABORTED, still naming its attempt, in one
 * transaction — then its files go, then its record: a crash in between leaves an
 * aborted record that the next gc finishes, never a visible step whose data is gone,
 * nor files no record names. An aborted attempt's files go before its record, for
 * the same reason. What gc removes is what the manifest names (gc.c); a save in
 * flight is never a candidate, and a step directory without a record only when the
 * caller asks (CKPT_GC_UNRECORDED).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "glue.h"

void ckpt_gc_opts_init(struct ckpt_gc_opts *o, size_t size)
{
	if (!o || size < sizeof(size_t))
		return;
	struct ckpt_gc_opts d;
	memset(&d, 0, sizeof d);
	d.size = size;
	memcpy(o, &d, size < sizeof d ? size : sizeof d);
}

const char *ckpt_gc_reason_name(int reason)
{
	switch (reason) {
	case CKPT_GC_ORPHAN:    return "orphan";
	case CKPT_GC_ABORTED:   return "aborted";
	case CKPT_GC_RETENTION: return "retention";
	default:                return "?";
	}
}

/* Was the step directory modified less than min_age_s seconds ago? */
static bool gc_too_young(const char *root, uint64_t step, uint64_t min_age_s)
{
	if (!min_age_s)
		return false;
	char dir[4200];
	struct stat st;
	if (ckpt_path_step_dir(dir, sizeof dir, root, step) || stat(dir, &st) < 0)
		return false;
	time_t now = time(NULL);
	return st.st_mtime > now || (uint64_t)(now - st.st_mtime) < min_age_s;
}

/* Decide the fate of one step; 0: keep. */
static int gc_reason(const struct catalog_entry *x, const struct ckpt_gc_opts *o,
                     uint64_t latest, uint64_t ncommitted_newer, uint64_t now_ns)
{
	if (!x->has_record)
		/* No record: never collected unless the operator asks (gc.c says why). */
		return o->flags & CKPT_GC_UNRECORDED ? CKPT_GC_ORPHAN : 0;
	if (x->rec.state == CKPT_STATE_COMMITTED) {
		struct commit_keep k = { o->keep_last, o->keep_every, o->keep_seconds };
		return commit_keep_step(&k, x->step, latest, ncommitted_newer, x->rec.commit_time_ns,
		                        now_ns) ? 0 : CKPT_GC_RETENTION;
	}
	/* A save in flight is never a candidate, whoever asks. */
	if (x->live)
		return 0;
	return CKPT_GC_ABORTED;
}

#define GC_CHANGED 1   /* the step's record is not the one listed any more: spared */
#define GC_KEPT    2   /* files that committed steps reference were kept, and the
                          record that names them */

/* Remove one step for reason why (see the top of the file for the order), under
 * the manifest's attempts lock: only if its record is still the one that was listed.
 * The job may have begun (even committed) the step again since. */
static int gc_remove_locked(ckpt_ctx *c, const struct catalog_entry *x, int why)
{
	const char *root = c->cfg.root;
	struct manifest_step cur;
	int rc = manifest_step_get(c->manifest, x->step, &cur);
	if (rc && rc != CKPT_ENOTFOUND)
		return rc;
	bool has_record = rc == 0;
	if (has_record != x->has_record ||
	    (has_record && (cur.state != x->rec.state || cur.save_id != x->rec.save_id)))
		return GC_CHANGED;
	/* Read now, under the lock: what the committed steps reference at this moment
	 * (a commit since the listing may reference this step's files). */
	struct gc_refs refs;
	if ((rc = gc_refs_load(c->manifest, &refs)))
		return ckpt_err_prefix(rc, "the files committed steps reference");
	uint32_t kept = 0;
	switch (why) {
	case CKPT_GC_RETENTION:
		/* Invisible first, still naming its files; then the files; then the record. */
		if ((rc = manifest_step_retire(c->manifest, x->step, "removed by retention")))
			break;
		if ((rc = ckpt_fault(CKPT_FP_GC_AFTER_RETIRE)) < 0)
			break;
		/* fall through */
	case CKPT_GC_ABORTED:
		if (x->has_dir &&
		    (rc = gc_attempt_remove(root, x->step, x->rec.save_id, &refs, &kept)))
			break;
		/* Files that a committed step references stay, and so does the record that
		 * names them (aborted: the step is gone for readers), for a later gc to
		 * finish once nothing references them. */
		if ((rc = ckpt_fault(CKPT_FP_GC_AFTER_FILES_REMOVED)) < 0)
			break;
		if (kept) {
			rc = GC_KEPT;
			break;
		}
		rc = manifest_step_delete(c->manifest, x->step);
		rc = rc == CKPT_ENOTFOUND ? 0 : rc;
		break;
	case CKPT_GC_ORPHAN:
		rc = gc_unrecorded_remove(root, x->step, &refs, &kept);
		rc = !rc && kept ? GC_KEPT : rc;
		break;
	default:
		rc = ckpt_err(-EINVAL, "gc: step %llu: reason %d", (unsigned long long)x->step, why);
	}
	gc_refs_free(&refs);
	return rc;
}

static int gc_remove(ckpt_ctx *c, const struct catalog_entry *x, int why)
{
	manifest_attempts_lock(c->manifest);
	int rc = gc_remove_locked(c, x, why);
	manifest_attempts_unlock(c->manifest);
	return rc;
}

static int gc_run(ckpt_ctx *c, const struct ckpt_gc_opts *uo, struct ckpt_gc_result *ures);

int ckpt_catalog_gc(ckpt_ctx *c, const struct ckpt_gc_opts *uo, struct ckpt_gc_result *ures)
{
	if (!c)
		return ckpt_err(-EINVAL, "ckpt_catalog_gc: context is NULL");
	/* One gc at a time: the caller's and the one the save worker runs after a commit. */
	pthread_mutex_lock(&c->gc_lock);
	int rc = gc_run(c, uo, ures);
	pthread_mutex_unlock(&c->gc_lock);
	return rc;
}

void retention_after_commit(ckpt_ctx *c, uint64_t step)
{
	/* Through ckptd the manifest is the first instance's, and so is retention: the
	 * rules went there with the job's COORD. */
	if (glue_remote(c) || (!c->cfg.keep_last && !c->cfg.keep_every && !c->cfg.keep_seconds))
		return;
	if (!glue_is_coordinator(c))
		return;
	struct ckpt_gc_opts o;
	ckpt_gc_opts_init(&o, sizeof o);
	o.keep_last = c->cfg.keep_last;
	o.keep_every = c->cfg.keep_every;
	o.keep_seconds = c->cfg.keep_seconds;
	struct ckpt_gc_result res = { .size = sizeof res };
	uint64_t t0 = ckpt_now_ns();
	int rc = ckpt_catalog_gc(c, &o, &res);
	if (rc)
		ckpt_log(CKPT_LOG_WARN, "retention after step %llu: %s (the save stands; the next "
		         "commit tries again)", (unsigned long long)step, ckpt_err_msg());
	else
		ckpt_log(res.steps_removed ? CKPT_LOG_INFO : CKPT_LOG_DEBUG,
		         "retention after step %llu: %llu step(s) removed, %llu bytes freed, "
		         "%llu committed kept (%.1f ms)", (unsigned long long)step,
		         (unsigned long long)res.steps_removed, (unsigned long long)res.bytes_freed,
		         (unsigned long long)res.steps_kept, (double)(ckpt_now_ns() - t0) / 1e6);
	ckpt_err_clear();
}

static int gc_run(ckpt_ctx *c, const struct ckpt_gc_opts *uo, struct ckpt_gc_result *ures)
{
	if (!c)
		return ckpt_err(-EINVAL, "ckpt_catalog_gc: context is NULL");
	CKPT_LOG_SCOPE(&c->log, CKPT_LOG_NO_STEP);
	struct ckpt_gc_opts o;
	ckpt_gc_opts_init(&o, sizeof o);
	if (uo) {
		if (uo->size < sizeof(size_t) || uo->size > sizeof o)
			return ckpt_err(-EINVAL, "ckpt_catalog_gc: options size %zu", uo->size);
		memcpy(&o, uo, uo->size);
	}
	if (o.flags & ~(unsigned)(CKPT_GC_DRY_RUN | CKPT_GC_UNRECORDED))
		return ckpt_err(-EINVAL, "ckpt_catalog_gc: unknown flags 0x%x", o.flags);
	/* Before anything is removed: a refusal after the work would hide what was done. */
	if (ures && ures->size < sizeof(size_t))
		return ckpt_err(-EINVAL, "ckpt_catalog_gc: result size %zu", ures->size);
	ckpt_err_clear();
	bool dry = o.flags & CKPT_GC_DRY_RUN;
	if (glue_remote(c))
		return ckpt_err(CKPT_ESTATE, "gc of a job held by ckptd is its home instance's: it "
		                "applies the job's retention rules (CKPT_KEEP_*) after each commit and "
		                "collects what did not commit; on the storage node, ckpt-inspect "
		                "DATA/jobs/<job id> gc runs it by hand");
	if (!glue_is_coordinator(c))
		return ckpt_err(CKPT_ESTATE, "gc of %s needs the context that owns the manifest "
		                "(rank 0, not read-only)", c->cfg.root);
	/* Refuse up front on a root we cannot write: a gc that removes half is worse. */
	if (!dry && access(c->cfg.root, W_OK | X_OK) < 0)
		return ckpt_err(-errno, "gc: checkpoint root %s is not writable%s: nothing removed",
		                c->cfg.root, errno == EROFS ? " (read-only file system)" : "");
	struct catalog_entry *st;
	size_t cnt;
	int rc = catalog_list(c, true, &st, &cnt);
	if (rc)
		return rc;
	uint64_t latest = 0;
	bool have_latest = false;
	for (size_t i = 0; i < cnt; i++) {
		if (st[i].has_record && st[i].rec.state == CKPT_STATE_COMMITTED) {
			latest = st[i].step;
			have_latest = true;
		}
	}
	struct ckpt_gc_result res;
	memset(&res, 0, sizeof res);
	uint64_t now_ns = ckpt_wall_ns();
	/* Newest first, so "committed steps newer than this one" is a running count. */
	uint64_t newer = 0;
	for (size_t k = cnt; k-- > 0 && !rc;) {
		const struct catalog_entry *x = &st[k];
		bool committed = x->has_record && x->rec.state == CKPT_STATE_COMMITTED;
		int why = gc_reason(x, &o, have_latest ? latest : UINT64_MAX, newer, now_ns);
		if (committed)
			newer++;
		if (!why) {
			res.steps_kept += committed;
			res.steps_unrecorded += !x->has_record;
			continue;
		}
		if (why != CKPT_GC_RETENTION && x->has_dir &&
		    gc_too_young(c->cfg.root, x->step, o.min_age_s)) {
			ckpt_log(CKPT_LOG_INFO, "gc: step %llu modified less than %llu s ago: spared",
			         (unsigned long long)x->step, (unsigned long long)o.min_age_s);
			continue;
		}
		struct ckpt_gc_item it = {
			.step = x->step, .reason = why, .bytes = x->dir_bytes, .nfiles = x->nfiles,
		};
		if (o.report)
			o.report(o.arg, &it);
		if (!dry && (rc = gc_remove(c, x, why)) == GC_CHANGED) {
			ckpt_log(CKPT_LOG_INFO, "gc: step %llu was saved again while gc ran: spared",
			         (unsigned long long)x->step);
			rc = 0;
			continue;
		}
		if (rc == GC_KEPT) {
			/* Gone for readers (retired), its referenced files still on disk. */
			ckpt_log(CKPT_LOG_INFO, "gc: step %llu: files kept that committed steps "
			         "reference (their record stays, aborted, until nothing does)",
			         (unsigned long long)x->step);
			rc = 0;
			res.steps_removed += why == CKPT_GC_RETENTION;
			continue;
		}
		if (rc)
			ckpt_err_prefix(rc, "gc of step %llu", (unsigned long long)x->step);
		res.steps_removed++;
		res.bytes_freed += x->dir_bytes;
	}
	ckpt_free(st);
	if (ures) {
		size_t sz = ures->size < sizeof res ? ures->size : sizeof res;
		res.size = ures->size;
		memcpy(ures, &res, sz);
	}
	return rc;
}
