/*
 * rebuild.c — recreating a lost manifest from the self-describing shard files
 * (ckpt-inspect rebuild, docs/format.md).
 *
 * A step is recorded COMMITTED only on proof: every rank 0..world-1 has a shard
 * file whose trailer, footer hash and index check out (io_shard_reader_open with
 * no index trusts nothing in the file), all agree on step and world, and the set
 * passes the same validation a live commit does (commit_decide: tiling, replicas
 * identical by hash, one durable transaction). The footer bytes a rank voted with
 * are the bytes at the end of its file, so they are read back exactly and become
 * the shard records unchanged. Anything less is recorded as aborted, with the
 * reason, so that list --all shows it and gc removes it.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "glue.h"

/* One rank's proof: its decoded index and the exact footer bytes. */
struct rebuild_shard {
	struct io_shard_reader *rd;
	void    *footer;
	size_t   footer_len;
	uint64_t file_size;
};

/* Read the footer of an opened shard exactly: it starts at data_end (checked by the
 * reader against the trailer) and its length is what the trailer says; re-encoding
 * the decoded index gives that length, and the bytes read must equal the encoding,
 * or the file holds something this build does not reproduce: not proven. */
static int rebuild_footer(const char *path, struct rebuild_shard *s, char *why, size_t cap)
{
	const struct io_shard_index *ix = io_shard_reader_index(s->rd);
	void *enc;
	size_t len;
	int rc = io_index_encode(ix, &enc, &len);
	if (rc)
		return ckpt_err(rc, "%s: encoding its index", path);
	uint8_t *buf = ckpt_malloc(len);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	struct stat st;
	size_t got = 0;
	while (buf && fd >= 0 && got < len) {
		ssize_t n = pread(fd, buf + got, len - got, (off_t)(ix->data_end + got));
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		got += (size_t)n;
	}
	if (!buf)
		rc = ckpt_err(-ENOMEM, "%s: footer", path);
	else if (fd < 0 || fstat(fd, &st) < 0)
		rc = ckpt_err(-errno, "read %s", path);
	else if (got != len || memcmp(buf, enc, len))
		snprintf(why, cap, "%s: footer bytes differ from their decoding", path);
	else {
		s->footer = enc;
		s->footer_len = len;
		s->file_size = (uint64_t)st.st_size;
		enc = NULL;
	}
	if (fd >= 0)
		close(fd);
	ckpt_free(buf);
	ckpt_free(enc);
	return rc;
}

/* One shard file of a step directory. */
struct rebuild_file { uint64_t save_id; uint32_t rank; char name[64]; };

static int file_cmp(const void *a, const void *b)
{
	const struct rebuild_file *x = a, *y = b;
	if (x->save_id != y->save_id)
		return x->save_id < y->save_id ? -1 : 1;
	return x->rank < y->rank ? -1 : x->rank > y->rank;
}

/* The shard files of a step directory, sorted by attempt then rank (malloc'd). */
static int rebuild_list(const char *dir, uint64_t step, struct rebuild_file **out, size_t *n)
{
	*out = NULL;
	*n = 0;
	DIR *d = opendir(dir);
	if (!d)
		return ckpt_err(-errno, "open %s", dir);
	struct dirent *e;
	size_t cap = 0;
	int rc = 0;
	while ((e = readdir(d))) {
		uint32_t r;
		uint64_t id;
		if (!ckpt_path_parse_shard(e->d_name, &r, &id))
			continue;
		if (*n == cap) {
			cap = cap ? cap * 2 : 16;
			void *p = ckpt_realloc(*out, cap * sizeof **out);
			if (!p) {
				rc = ckpt_err(-ENOMEM, "rebuild of step %llu", (unsigned long long)step);
				break;
			}
			*out = p;
		}
		(*out)[*n] = (struct rebuild_file){ .save_id = id, .rank = r };
		snprintf((*out)[*n].name, sizeof (*out)[*n].name, "%s", e->d_name);
		(*n)++;
	}
	closedir(d);
	if (rc) {
		ckpt_free(*out);
		*out = NULL;
		*n = 0;
		return rc;
	}
	if (*n)
		qsort(*out, *n, sizeof **out, file_cmp);
	return 0;
}

/* Open and check the files of one attempt (files[0..n), one save id): every rank of
 * the world the first decodable one names, each agreeing on step, world and save id.
 * Fills sh[0..*world) (caller frees) and *world; the reason in why when not proven;
 * a negative return is an error of the tool itself. */
static int rebuild_attempt(const char *dir, uint64_t step, const struct rebuild_file *files,
                           size_t n, struct rebuild_shard **shp, uint32_t *world_out,
                           char *why, size_t cap)
{
	char path[4500];
	struct rebuild_shard *sh = NULL;
	uint32_t world = 0;
	int rc = 0;
	for (size_t i = 0; i < n && !why[0] && !rc; i++) {
		snprintf(path, sizeof path, "%s/%s", dir, files[i].name);
		struct io_shard_reader *rd;
		int orc = io_shard_reader_open(NULL, path, NULL, &rd);
		if (orc) {
			snprintf(why, cap, "%s", ckpt_err_msg());
			break;
		}
		const struct io_shard_index *ix = io_shard_reader_index(rd);
		if (!sh) {
			world = ix->world;
			sh = ckpt_calloc(world ? world : 1, sizeof *sh);
			if (!sh) {
				io_shard_reader_close(rd);
				rc = ckpt_err(-ENOMEM, "rebuild of step %llu", (unsigned long long)step);
				break;
			}
		}
		if (ix->step != step || ix->world != world || ix->rank != files[i].rank ||
		    ix->rank >= world || ix->save_id != files[i].save_id || sh[ix->rank].rd) {
			snprintf(why, cap, "%s describes step %llu rank %u of %u, attempt %016llx "
			         "(expected step %llu, world %u, the attempt of its name)", path,
			         (unsigned long long)ix->step, ix->rank, ix->world,
			         (unsigned long long)ix->save_id, (unsigned long long)step, world);
			io_shard_reader_close(rd);
			break;
		}
		sh[ix->rank].rd = rd;
		if ((rc = rebuild_footer(path, &sh[ix->rank], why, cap)))
			break;
	}
	for (uint32_t r = 0; !rc && !why[0] && r < world; r++)
		if (!sh[r].rd)
			snprintf(why, cap, "rank %u of %u has no shard file that decodes", r, world);
	*shp = sh;
	*world_out = world;
	return rc;
}

static void rebuild_shards_free(struct rebuild_shard *sh, uint32_t world)
{
	for (uint32_t r = 0; sh && r < world; r++) {
		io_shard_reader_close(sh[r].rd);
		ckpt_free(sh[r].footer);
	}
	ckpt_free(sh);
}

/* Rebuild one step directory. Its files are grouped by attempt (the save id of their
 * names); the step is committed when exactly one attempt proves complete — two
 * complete attempts cannot be told apart, and neither is chosen. *outcome and why
 * say what came of it; a negative return is an error of the tool itself (memory,
 * manifest), not of the step. */
static int rebuild_step(ckpt_ctx *c, uint64_t step, int *outcome, uint32_t *world_out,
                        char *why, size_t cap)
{
	char dir[4200];
	int rc = ckpt_path_step_dir(dir, sizeof dir, c->cfg.root, step);
	if (rc)
		return ckpt_err(rc, "step directory");
	why[0] = '\0';
	struct rebuild_file *files;
	size_t nfiles;
	if ((rc = rebuild_list(dir, step, &files, &nfiles)))
		return rc;
	struct rebuild_shard *best = NULL;
	uint32_t best_world = 0, nproven = 0;
	uint64_t best_id = 0;
	char first_why[1024] = "";
	for (size_t i = 0, j; !rc && i < nfiles; i = j) {
		for (j = i; j < nfiles && files[j].save_id == files[i].save_id; j++)
			;
		struct rebuild_shard *sh;
		uint32_t world;
		char awhy[1024] = "";
		rc = rebuild_attempt(dir, step, files + i, j - i, &sh, &world, awhy, sizeof awhy);
		if (!rc && !awhy[0]) {
			nproven++;
			if (!best) {
				best = sh, best_world = world, best_id = files[i].save_id;
				continue;
			}
		} else if (!first_why[0]) {
			snprintf(first_why, sizeof first_why, "%s", awhy);
		}
		rebuild_shards_free(sh, world);
	}
	ckpt_free(files);
	if (!rc && nfiles == 0)
		snprintf(why, cap, "no shard file in %s", dir);
	else if (!rc && nproven > 1)
		snprintf(why, cap, "%u complete attempts at step %llu in %s: which one was committed "
		         "cannot be told from the files", nproven, (unsigned long long)step, dir);
	else if (!rc && nproven == 0)
		snprintf(why, cap, "%s", first_why);
	*world_out = best_world;
	if (!rc && !why[0]) {
		uint32_t world = best_world;
		struct commit_vote *votes = ckpt_calloc(world, sizeof *votes);
		if (!votes) {
			rc = ckpt_err(-ENOMEM, "rebuild of step %llu", (unsigned long long)step);
		} else {
			for (uint32_t r = 0; r < world; r++) {
				votes[r] = (struct commit_vote){
					.rank = r, .step = step, .save_id = best_id, .index = best[r].footer,
					.index_len = best[r].footer_len, .file_size = best[r].file_size,
				};
				io_hash128(best[r].footer, best[r].footer_len, votes[r].footer_hash);
			}
			/* The same decision a live commit takes; on failure it records the abort. */
			struct manifest_step id = { .step = step, .world = world, .save_id = best_id,
			                            .incarnation = c->incarnation };
			snprintf(id.job_id, sizeof id.job_id, "%s", c->cfg.job_id);
			int drc = commit_decide(c->manifest, &id,
			                        &(struct commit_decision){ .votes = votes });
			ckpt_free(votes);
			if (drc == 0)
				*outcome = CKPT_REBUILD_COMMITTED;
			else if (drc == CKPT_EINVALID || drc == CKPT_EFORMAT)
				snprintf(why, cap, "%s", ckpt_err_msg());
			else
				rc = drc;
		}
	}
	rebuild_shards_free(best, best_world);
	if (!rc && why[0]) {
		*outcome = CKPT_REBUILD_UNPROVEN;
		struct manifest_step cur;
		if (!(manifest_step_get(c->manifest, step, &cur) == 0 &&
		      cur.state == CKPT_STATE_ABORTED)) {
			/* No save id: the verdict is on the whole directory, whose shard files
			 * GC then removes, of whatever attempt (ckpt_step_remove_attempt). */
			struct manifest_step id = { .step = step, .world = *world_out };
			snprintf(id.job_id, sizeof id.job_id, "%s", c->cfg.job_id);
			int arc = manifest_record_abort(c->manifest, &id, why);
			if (arc)
				rc = arc;
		}
	}
	return rc;
}

int ckpt_catalog_rebuild(ckpt_ctx *c, unsigned flags, ckpt_rebuild_report_fn report, void *arg,
                         struct ckpt_rebuild_result *ures)
{
	if (!c)
		return ckpt_err(-EINVAL, "ckpt_catalog_rebuild: context is NULL");
	CKPT_LOG_SCOPE(&c->log, CKPT_LOG_NO_STEP);
	if (flags & ~(unsigned)CKPT_REBUILD_MERGE)
		return ckpt_err(-EINVAL, "ckpt_catalog_rebuild: unknown flags 0x%x", flags);
	if (ures && ures->size < sizeof(size_t))
		return ckpt_err(-EINVAL, "ckpt_catalog_rebuild: result size %zu", ures->size);
	ckpt_err_clear();
	if (glue_remote(c))
		return ckpt_err(CKPT_ESTATE, "rebuild of a job held by ckptd is its home instance's: it "
		                "applies the job's retention rules (CKPT_KEEP_*) after each commit and "
		                "collects what did not commit; on the storage node, ckpt-inspect "
		                "DATA/jobs/<job id> rebuild runs it by hand");
	if (!glue_is_coordinator(c))
		return ckpt_err(CKPT_ESTATE, "rebuild of %s needs the context that owns the manifest "
		                "(rank 0, not read-only)", c->cfg.root);
	int nrec = manifest_steps_count(c->manifest);
	if (nrec < 0)
		return nrec;
	if (nrec > 0 && !(flags & CKPT_REBUILD_MERGE))
		return ckpt_err(-EEXIST, "the manifest of %s (%s) holds %d record(s): rebuild "
		                "recreates a lost manifest (move it away first, or merge explicitly)",
		                c->cfg.root, c->manifest_path, nrec);
	struct ckpt_rebuild_result res;
	memset(&res, 0, sizeof res);
	/* Merge repairs: a damaged record says nothing true (not even its step: a flipped
	 * key bit moves a record to another step's key), so it goes, and the directories
	 * are then judged from their files like any other without a record. */
	for (;;) {
		uint64_t bad[64];
		int nb = manifest_steps_damaged(c->manifest, bad, CKPT_ARRAY_SIZE(bad));
		if (nb <= 0) {
			if (nb < 0)
				return nb;
			break;
		}
		for (int i = 0; i < nb && i < (int)CKPT_ARRAY_SIZE(bad); i++) {
			int drc = manifest_step_delete(c->manifest, bad[i]);
			if (drc && drc != CKPT_ENOTFOUND)
				return ckpt_err_prefix(drc, "remove the damaged record of step %llu",
				                       (unsigned long long)bad[i]);
			res.steps_damaged++;
			if (report)
				report(arg, bad[i], CKPT_REBUILD_DAMAGED, 0, "damaged record removed (its "
				       "checksum did not match)");
		}
	}
	int n = ckpt_steps(c, CKPT_STEPS_ALL, NULL, 0, sizeof(struct ckpt_step_info));
	if (n < 0)
		return n;
	struct ckpt_step_info *st = ckpt_calloc((size_t)(n ? n : 1), sizeof *st);
	if (!st)
		return ckpt_err(-ENOMEM, "rebuild of %s", c->cfg.root);
	int got = ckpt_steps(c, CKPT_STEPS_ALL, st, (size_t)n, sizeof *st);
	int rc = got < 0 ? got : 0;
	char why[1024];
	for (int i = 0; !rc && i < got && i < n; i++) {
		if (!st[i].has_dir)
			continue;
		res.steps_seen++;
		uint64_t step = st[i].step;
		int outcome = 0;
		uint32_t world = st[i].world;
		why[0] = '\0';
		if (st[i].has_record) {
			/* The manifest decided this step already (merge): never overturned. */
			outcome = CKPT_REBUILD_PRESENT;
			snprintf(why, sizeof why, "already recorded as %s",
			         st[i].state == CKPT_STATE_COMMITTED ? "committed" : "not committed");
		} else if ((rc = rebuild_step(c, step, &outcome, &world, why, sizeof why))) {
			ckpt_err_prefix(rc, "rebuild of step %llu", (unsigned long long)step);
			break;
		}
		res.steps_committed += outcome == CKPT_REBUILD_COMMITTED;
		res.steps_present += outcome == CKPT_REBUILD_PRESENT;
		res.steps_unproven += outcome == CKPT_REBUILD_UNPROVEN;
		if (report)
			report(arg, step, outcome, world, why);
	}
	ckpt_free(st);
	if (ures) {
		size_t sz = ures->size < sizeof res ? ures->size : sizeof res;
		res.size = ures->size;
		memcpy(ures, &res, sz);
	}
	return rc;
}
