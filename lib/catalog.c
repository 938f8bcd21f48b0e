/*
 * catalog.c — what a checkpoint root holds, for tools (ckpt-inspect list) and for
 * retention: the manifest's records merged with the step directories found on disk.
 *
 * The manifest alone decides visibility (docs/format.md §8.6); the directory scan is here
 * because operators must also see what is NOT visible — aborted saves, saves in
 * flight, and directories the manifest has no record of — and because retention
 * must never take a save in flight for garbage. An INFLIGHT record is a save in
 * flight only while the coordinator that began it holds the root (its incarnation
 * is the lock holder's, lib/lock.c); otherwise its coordinator is gone and the save
 * is presumed aborted, and shows so.
 */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "glue.h"

static int u64_cmp(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

/* Step numbers of the step directories in root, sorted (malloc'd). */
static int catalog_dirs(const char *root, uint64_t **out, size_t *n)
{
	*out = NULL;
	*n = 0;
	DIR *d = opendir(root);
	if (!d)
		return ckpt_err(-errno, "open checkpoint root %s", root);
	size_t cap = 0;
	struct dirent *e;
	int rc = 0;
	while ((e = readdir(d))) {
		uint64_t step;
		if (!ckpt_path_parse_step_dir(e->d_name, &step))
			continue;
		if (*n == cap) {
			cap = cap ? cap * 2 : 32;
			uint64_t *p = ckpt_realloc(*out, cap * sizeof *p);
			if (!p) {
				rc = ckpt_err(-ENOMEM, "listing %s", root);
				break;
			}
			*out = p;
		}
		(*out)[(*n)++] = step;
	}
	closedir(d);
	if (rc) {
		ckpt_free(*out);
		*out = NULL;
		*n = 0;
		return rc;
	}
	if (*n)
		qsort(*out, *n, sizeof **out, u64_cmp);
	return 0;
}

/* The incarnation whose INFLIGHT records are saves in flight now: this context's
 * when it is the coordinator, else the lock holder's (0: none holds the root). */
static uint64_t catalog_live_incarnation(const ckpt_ctx *c)
{
	if (glue_is_coordinator(c))
		return c->incarnation;
	if (glue_remote(c))
		return 0;
	uint64_t inc = 0;
	return lock_probe(c->cfg.root, &inc) ? inc : 0;
}

int catalog_list(ckpt_ctx *c, bool all, struct catalog_entry **out, size_t *count)
{
	*out = NULL;
	*count = 0;
	struct manifest *m;
	int rc = glue_manifest(c, &m);
	if (rc)
		return rc;
	int nrec = manifest_steps_list(m, all, NULL, 0);
	if (nrec < 0)
		return nrec;
	uint64_t *recs = ckpt_malloc((size_t)(nrec ? nrec : 1) * sizeof *recs);
	if (!recs)
		return ckpt_err(-ENOMEM, "listing %s", c->where);
	/* A commit between the two calls may add records: take what fits the first count. */
	int got = manifest_steps_list(m, all, recs, (size_t)nrec);
	if (got < 0) {
		ckpt_free(recs);
		return got;
	}
	size_t nr = (size_t)(got < nrec ? got : nrec);
	uint64_t *dirs;
	size_t nd;
	/* Through ckptd the directories are the storage node's: the records say it all. */
	if (glue_remote(c)) {
		dirs = NULL;
		nd = 0;
	} else if ((rc = catalog_dirs(c->cfg.root, &dirs, &nd))) {
		ckpt_free(recs);
		return rc;
	}
	uint64_t live = catalog_live_incarnation(c);
	struct catalog_entry *e = ckpt_calloc(nr + nd ? nr + nd : 1, sizeof *e);
	if (!e) {
		ckpt_free(recs);
		ckpt_free(dirs);
		return ckpt_err(-ENOMEM, "listing %s", c->where);
	}
	/* Merge the two sorted lists. */
	size_t i = 0, j = 0, n = 0;
	while (i < nr || j < nd) {
		uint64_t step;
		bool rec_here = false, dir_here = false;
		if (j >= nd || (i < nr && recs[i] <= dirs[j])) {
			step = recs[i];
			rec_here = true;
			if (j < nd && dirs[j] == step)
				dir_here = true;
		} else {
			step = dirs[j];
			dir_here = true;
		}
		i += rec_here;
		j += dir_here;
		struct catalog_entry *x = &e[n];
		memset(x, 0, sizeof *x);
		x->step = step;
		int g = manifest_step_get(m, step, &x->rec);
		if (g == 0)
			x->has_record = true;
		else if (g != CKPT_ENOTFOUND) {
			rc = g;
			break;
		}
		/* A directory of a step whose record was not listed: with "all" every record
		 * is listed, so this is a directory with no record (or a committed step's
		 * directory, listed above). Without "all", only committed steps show. */
		if (!all && !(x->has_record && x->rec.state == CKPT_STATE_COMMITTED))
			continue;
		x->live = x->has_record && x->rec.state == CKPT_STATE_INFLIGHT && live &&
		          x->rec.incarnation == live;
		if (dir_here) {
			x->has_dir = true;
			gc_step_dir_usage(c->cfg.root, step, &x->nfiles, &x->dir_bytes);
		}
		n++;
	}
	ckpt_free(recs);
	ckpt_free(dirs);
	if (rc) {
		ckpt_free(e);
		return rc;
	}
	*out = e;
	*count = n;
	return 0;
}

/* The public form of an entry. */
static void catalog_fill(struct ckpt_step_info *o, const struct catalog_entry *x)
{
	memset(o, 0, sizeof *o);
	o->step = x->step;
	o->has_record = x->has_record;
	o->has_dir = x->has_dir;
	o->nfiles = x->nfiles;
	o->dir_bytes = x->dir_bytes;
	if (x->has_record) {
		const struct manifest_step *rec = &x->rec;
		/* An in-flight record whose coordinator is gone is a presumed abort. */
		o->state = rec->state == CKPT_STATE_INFLIGHT && !x->live ? CKPT_STATE_ABORTED
		                                                         : (int)rec->state;
		o->trust = (int)rec->trust;
		o->world = rec->world;
		o->ntensors = rec->ntensors;
		o->logical_bytes = rec->logical_bytes;
		o->stored_bytes = rec->stored_bytes;
		o->commit_time_ns = rec->commit_time_ns;
	} else {
		o->state = CKPT_STATE_INFLIGHT;
	}
}

/* struct ckpt_step_info as first published: a caller's element is at least this. */
#define STEP_INFO_MIN sizeof(struct ckpt_step_info)

int ckpt_steps(ckpt_ctx *c, unsigned flags, struct ckpt_step_info *out, size_t cap,
               size_t elem_size)
{
	if (!c || (cap && !out))
		return ckpt_err(-EINVAL, "ckpt_steps: NULL argument");
	CKPT_LOG_SCOPE(&c->log, CKPT_LOG_NO_STEP);
	if (flags & ~(unsigned)CKPT_STEPS_ALL)
		return ckpt_err(-EINVAL, "ckpt_steps: unknown flags 0x%x", flags);
	int rc = glue_elem_size_check("ckpt_steps", elem_size, STEP_INFO_MIN);
	if (rc)
		return rc;
	ckpt_err_clear();
	struct catalog_entry *e;
	size_t n;
	if ((rc = catalog_list(c, flags & CKPT_STEPS_ALL, &e, &n)))
		return rc;
	for (size_t i = 0; i < n && i < cap; i++) {
		struct ckpt_step_info v;
		catalog_fill(&v, &e[i]);
		glue_elem_put(out, i, elem_size, &v, sizeof v);
	}
	ckpt_free(e);
	if (n > INT_MAX)
		return ckpt_err(-EOVERFLOW, "%s: %zu steps", c->where, n);
	return (int)n;
}

int ckpt_step_info(ckpt_ctx *c, uint64_t step, struct ckpt_step_info *out, size_t elem_size)
{
	if (!c || !out)
		return ckpt_err(-EINVAL, "ckpt_step_info: NULL argument");
	CKPT_LOG_SCOPE(&c->log, step == CKPT_LATEST ? CKPT_LOG_NO_STEP : step);
	int rc = glue_elem_size_check("ckpt_step_info", elem_size, STEP_INFO_MIN);
	if (rc)
		return rc;
	ckpt_err_clear();
	struct manifest *m;
	if ((rc = glue_manifest(c, &m)))
		return rc;
	if (step == CKPT_LATEST && (rc = manifest_step_latest(m, &step)))
		return ckpt_err(rc, "%s has no committed step", c->where);
	/* The one step's entry, as ckpt_steps would list it with CKPT_STEPS_ALL. */
	struct catalog_entry x;
	memset(&x, 0, sizeof x);
	x.step = step;
	rc = manifest_step_get(m, step, &x.rec);
	if (rc && rc != CKPT_ENOTFOUND)
		return rc;
	x.has_record = rc == 0;
	int d = gc_step_dir_usage(c->cfg.root, step, &x.nfiles, &x.dir_bytes);
	if (d && d != -ENOENT)
		return d;
	x.has_dir = d == 0;
	if (!x.has_record && !x.has_dir)
		return ckpt_err(CKPT_ENOTFOUND, "step %llu: no record and no directory in %s",
		                (unsigned long long)step, c->where);
	x.live = x.has_record && x.rec.state == CKPT_STATE_INFLIGHT &&
	         x.rec.incarnation && x.rec.incarnation == catalog_live_incarnation(c);
	ckpt_err_clear();
	struct ckpt_step_info v;
	catalog_fill(&v, &x);
	glue_elem_put(out, 0, elem_size, &v, sizeof v);
	return 0;
}

int ckpt_step_meta(ckpt_ctx *c, uint64_t step, char *dst, size_t cap, size_t *len)
{
	if (!c || !len || (cap && !dst))
		return ckpt_err(-EINVAL, "ckpt_step_meta: NULL argument");
	CKPT_LOG_SCOPE(&c->log, step == CKPT_LATEST ? CKPT_LOG_NO_STEP : step);
	*len = 0;
	ckpt_err_clear();
	struct manifest *m;
	int rc = glue_manifest(c, &m);
	if (rc)
		return rc;
	if (step == CKPT_LATEST && (rc = manifest_step_latest(m, &step)))
		return ckpt_err(rc, "%s has no committed step", c->where);
	/* Only the record is read: the step's shards are never opened. */
	if ((rc = manifest_step_meta(m, step, dst, cap, len)))
		return rc == -ENOSPC ? ckpt_err(rc, "step %llu: metadata of %zu bytes does not fit "
		                                "in %zu", (unsigned long long)step, *len, cap)
		                     : rc;
	if (*len < cap)
		dst[*len] = '\0';
	return 0;
}
