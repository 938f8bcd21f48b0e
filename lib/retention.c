/*
 * retention.c — garbage collection for operators (ckpt-inspect gc): removes what
 * is invisible (step directories with no record, aborted and in-flight records)
 * and applies retention (keep the newest N committed steps, keep every K-th),
 * never the latest committed step.
 *
 * Order matters for DESIGN §3: a committed step's manifest record is deleted
 * BEFORE its files, so that a crash in between leaves orphan files (which the
 * next gc removes), never a visible step whose data is gone.
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
static int gc_reason(const struct ckpt_catalog_step *s, const struct ckpt_gc_opts *o,
                     uint64_t latest, uint64_t ncommitted_newer)
{
	if (s->has_record && s->info.state == CKPT_STATE_COMMITTED) {
		if (s->info.step == latest)
			return 0;
		if (!o->keep_last && !o->keep_every)
			return 0;
		if (o->keep_last && ncommitted_newer < o->keep_last)
			return 0;
		if (o->keep_every && s->info.step % o->keep_every == 0)
			return 0;
		return CKPT_GC_RETENTION;
	}
	return s->has_record ? CKPT_GC_ABORTED : CKPT_GC_ORPHAN;
}

int ckpt_catalog_gc(ckpt_ctx *c, const struct ckpt_gc_opts *uo, struct ckpt_gc_result *ures)
{
	if (!c)
		return ckpt_err(-EINVAL, "ckpt_catalog_gc: context is NULL");
	struct ckpt_gc_opts o;
	ckpt_gc_opts_init(&o, sizeof o);
	if (uo) {
		if (uo->size < sizeof(size_t) || uo->size > sizeof o)
			return ckpt_err(-EINVAL, "ckpt_catalog_gc: options size %zu", uo->size);
		memcpy(&o, uo, uo->size);
	}
	if (o.flags & ~(unsigned)CKPT_GC_DRY_RUN)
		return ckpt_err(-EINVAL, "ckpt_catalog_gc: unknown flags 0x%x", o.flags);
	ckpt_err_clear();
	bool dry = o.flags & CKPT_GC_DRY_RUN;
	if (!glue_is_coordinator(c))
		return ckpt_err(CKPT_ESTATE, "gc of %s needs the context that owns the manifest "
		                "(rank 0, not read-only)", c->cfg.root);
	/* Refuse up front on a root we cannot write: a gc that removes half is worse. */
	if (!dry && access(c->cfg.root, W_OK | X_OK) < 0)
		return ckpt_err(-errno, "gc: checkpoint root %s is not writable%s: nothing removed",
		                c->cfg.root, errno == EROFS ? " (read-only file system)" : "");
	int n = ckpt_catalog_steps(c, CKPT_CATALOG_ALL, NULL, 0);
	if (n < 0)
		return n;
	struct ckpt_catalog_step *st = ckpt_calloc((size_t)(n ? n : 1), sizeof *st);
	if (!st)
		return ckpt_err(-ENOMEM, "gc of %s", c->cfg.root);
	int got = ckpt_catalog_steps(c, CKPT_CATALOG_ALL, st, (size_t)n);
	if (got < 0) {
		ckpt_free(st);
		return got;
	}
	size_t cnt = (size_t)(got < n ? got : n);
	uint64_t latest = 0;
	bool have_latest = false;
	for (size_t i = 0; i < cnt; i++) {
		if (st[i].has_record && st[i].info.state == CKPT_STATE_COMMITTED) {
			latest = st[i].info.step;
			have_latest = true;
		}
	}
	struct ckpt_gc_result res;
	memset(&res, 0, sizeof res);
	int rc = 0;
	/* Newest first, so "committed steps newer than this one" is a running count. */
	uint64_t newer = 0;
	for (size_t k = cnt; k-- > 0 && !rc;) {
		const struct ckpt_catalog_step *s = &st[k];
		bool committed = s->has_record && s->info.state == CKPT_STATE_COMMITTED;
		int why = gc_reason(s, &o, have_latest ? latest : UINT64_MAX, newer);
		if (committed)
			newer++;
		if (!why) {
			res.steps_kept += committed;
			continue;
		}
		if (why != CKPT_GC_RETENTION && s->has_dir &&
		    gc_too_young(c->cfg.root, s->info.step, o.min_age_s)) {
			ckpt_log(CKPT_LOG_INFO, "gc: step %llu modified less than %llu s ago: spared",
			         (unsigned long long)s->info.step, (unsigned long long)o.min_age_s);
			continue;
		}
		struct ckpt_gc_item it = {
			.step = s->info.step, .reason = why, .bytes = s->dir_bytes, .nfiles = s->nfiles,
		};
		if (o.report)
			o.report(o.arg, &it);
		res.steps_removed++;
		res.bytes_freed += s->dir_bytes;
		if (dry)
			continue;
		/* Record first, files second (see the top of this file). */
		if (s->has_record && (rc = manifest_step_delete(c->manifest, s->info.step)) &&
		    rc != CKPT_ENOTFOUND)
			break;
		rc = 0;
		if (s->has_dir && (rc = gc_step_dir_remove(c->cfg.root, s->info.step)))
			ckpt_err_prefix(rc, "gc of step %llu", (unsigned long long)s->info.step);
	}
	ckpt_free(st);
	if (ures) {
		if (ures->size < sizeof(size_t))
			return rc ? rc : ckpt_err(-EINVAL, "ckpt_catalog_gc: result size %zu", ures->size);
		size_t sz = ures->size < sizeof res ? ures->size : sizeof res;
		res.size = ures->size;
		memcpy(ures, &res, sz);
	}
	return rc;
}
