/*
 * rebuild.c — recreating a lost manifest from the self-describing shard files
 * (ckpt-inspect rebuild, DESIGN §5).
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

/* Parse "rank-NNNNNN.shard". */
static bool rebuild_parse_rank(const char *name, uint32_t *rank)
{
	if (strncmp(name, "rank-", 5) || strlen(name) != 17 || strcmp(name + 11, ".shard"))
		return false;
	uint32_t v = 0;
	for (int i = 5; i < 11; i++) {
		if (name[i] < '0' || name[i] > '9')
			return false;
		v = v * 10 + (uint32_t)(name[i] - '0');
	}
	*rank = v;
	return true;
}

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

/* Rebuild one step directory. *outcome and why say what came of it; a negative
 * return is an error of the tool itself (memory, manifest), not of the step. */
static int rebuild_step(ckpt_ctx *c, uint64_t step, int *outcome, uint32_t *world_out,
                        char *why, size_t cap)
{
	char dir[4200], path[4500];
	struct rebuild_shard *sh = NULL;
	uint32_t nsh = 0, world = 0;
	int rc = ckpt_path_step_dir(dir, sizeof dir, c->cfg.root, step);
	if (rc)
		return ckpt_err(rc, "step directory");
	why[0] = '\0';
	DIR *d = opendir(dir);
	if (!d)
		return ckpt_err(-errno, "open %s", dir);
	/* First pass: open every shard file; the first one that decodes gives the world. */
	struct dirent *e;
	struct { uint32_t rank; char name[32]; } *files = NULL;
	size_t nfiles = 0, fcap = 0;
	while ((e = readdir(d))) {
		uint32_t r;
		if (!rebuild_parse_rank(e->d_name, &r))
			continue;
		if (nfiles == fcap) {
			fcap = fcap ? fcap * 2 : 16;
			void *p = ckpt_realloc(files, fcap * sizeof *files);
			if (!p) {
				closedir(d);
				ckpt_free(files);
				return ckpt_err(-ENOMEM, "rebuild of step %llu", (unsigned long long)step);
			}
			files = p;
		}
		files[nfiles].rank = r;
		snprintf(files[nfiles].name, sizeof files[nfiles].name, "%s", e->d_name);
		nfiles++;
	}
	closedir(d);
	for (size_t i = 0; i < nfiles && !why[0] && !rc; i++) {
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
		    ix->rank >= world || sh[ix->rank].rd) {
			snprintf(why, cap, "%s describes step %llu rank %u of %u (expected step %llu, "
			         "world %u)", path, (unsigned long long)ix->step, ix->rank, ix->world,
			         (unsigned long long)step, world);
			io_shard_reader_close(rd);
			break;
		}
		sh[ix->rank].rd = rd;
		nsh++;
		if ((rc = rebuild_footer(path, &sh[ix->rank], why, cap)))
			break;
	}
	ckpt_free(files);
	if (!rc && !why[0] && nsh == 0)
		snprintf(why, cap, "no shard file in %s", dir);
	for (uint32_t r = 0; !rc && !why[0] && r < world; r++)
		if (!sh[r].rd)
			snprintf(why, cap, "rank %u of %u has no shard file that decodes", r, world);
	*world_out = world;
	if (!rc && !why[0]) {
		struct commit_vote *votes = ckpt_calloc(world, sizeof *votes);
		if (!votes) {
			rc = ckpt_err(-ENOMEM, "rebuild of step %llu", (unsigned long long)step);
		} else {
			for (uint32_t r = 0; r < world; r++) {
				votes[r] = (struct commit_vote){
					.rank = r, .step = step, .index = sh[r].footer,
					.index_len = sh[r].footer_len, .file_size = sh[r].file_size,
				};
				io_hash128(sh[r].footer, sh[r].footer_len, votes[r].footer_hash);
			}
			/* The same decision a live commit takes; on failure it records the abort. */
			int drc = commit_decide(c->manifest, c->cfg.job_id, step, world, votes);
			ckpt_free(votes);
			if (drc == 0)
				*outcome = CKPT_REBUILD_COMMITTED;
			else if (drc == CKPT_EINVALID || drc == CKPT_EFORMAT)
				snprintf(why, cap, "%s", ckpt_err_msg());
			else
				rc = drc;
		}
	}
	if (!rc && why[0]) {
		*outcome = CKPT_REBUILD_UNPROVEN;
		struct manifest_step cur;
		if (!(manifest_step_get(c->manifest, step, &cur) == 0 &&
		      cur.state == CKPT_STATE_ABORTED)) {
			int arc = manifest_record_abort(c->manifest, step, world, why);
			if (arc)
				rc = arc;
		}
	}
	for (uint32_t r = 0; sh && r < world; r++) {
		io_shard_reader_close(sh[r].rd);
		ckpt_free(sh[r].footer);
	}
	ckpt_free(sh);
	return rc;
}

int ckpt_catalog_rebuild(ckpt_ctx *c, unsigned flags, ckpt_rebuild_report_fn report, void *arg,
                         struct ckpt_rebuild_result *ures)
{
	if (!c)
		return ckpt_err(-EINVAL, "ckpt_catalog_rebuild: context is NULL");
	if (flags & ~(unsigned)CKPT_REBUILD_MERGE)
		return ckpt_err(-EINVAL, "ckpt_catalog_rebuild: unknown flags 0x%x", flags);
	if (ures && ures->size < sizeof(size_t))
		return ckpt_err(-EINVAL, "ckpt_catalog_rebuild: result size %zu", ures->size);
	ckpt_err_clear();
	if (!glue_is_coordinator(c))
		return ckpt_err(CKPT_ESTATE, "rebuild of %s needs the context that owns the manifest "
		                "(rank 0, not read-only)", c->cfg.root);
	int nrec = manifest_steps_list(c->manifest, true, NULL, 0);
	if (nrec < 0)
		return nrec;
	if (nrec > 0 && !(flags & CKPT_REBUILD_MERGE))
		return ckpt_err(-EEXIST, "the manifest of %s holds %d record(s): rebuild recreates a "
		                "lost manifest (move it away first, or merge explicitly)", c->cfg.root,
		                nrec);
	int n = ckpt_catalog_steps(c, CKPT_CATALOG_ALL, NULL, 0);
	if (n < 0)
		return n;
	struct ckpt_catalog_step *st = ckpt_calloc((size_t)(n ? n : 1), sizeof *st);
	if (!st)
		return ckpt_err(-ENOMEM, "rebuild of %s", c->cfg.root);
	int got = ckpt_catalog_steps(c, CKPT_CATALOG_ALL, st, (size_t)n);
	struct ckpt_rebuild_result res;
	memset(&res, 0, sizeof res);
	int rc = got < 0 ? got : 0;
	char why[1024];
	for (int i = 0; !rc && i < got && i < n; i++) {
		if (!st[i].has_dir)
			continue;
		res.steps_seen++;
		uint64_t step = st[i].info.step;
		int outcome = 0;
		uint32_t world = st[i].info.world;
		why[0] = '\0';
		if (st[i].has_record) {
			/* The manifest decided this step already (merge): never overturned. */
			outcome = CKPT_REBUILD_PRESENT;
			snprintf(why, sizeof why, "already recorded as %s",
			         st[i].info.state == CKPT_STATE_COMMITTED ? "committed" : "not committed");
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
