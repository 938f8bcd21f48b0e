/*
 * ckpt-inspect — an operator's view of a checkpoint root, on the public API only:
 *
 *   ckpt-inspect ROOT list [--all] [--json]
 *   ckpt-inspect ROOT show STEP|latest [--chunks] [--json]
 *   ckpt-inspect ROOT verify [STEP|latest|all] [--no-mark] [--quiet] [--json]
 *   ckpt-inspect ROOT diff STEP1 STEP2 [--json]
 *   ckpt-inspect ROOT gc [--keep-last N] [--keep-every K] [--min-age S] [--dry-run]
 *                        [--unrecorded] [--json]
 *   ckpt-inspect ROOT rebuild [--merge] [--json]
 *
 * Every option and exit code is documented in docs/ckpt-inspect.md; --help prints
 * the same summary. Reading commands open the root read-only; verify (to record the
 * trust level), gc and rebuild open it as the manifest's owner (rank 0, world 1)
 * without the garbage collection a job's coordinator runs at open, so that nothing
 * is removed except what gc was asked to remove.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ckpt/ckpt.h"
#include "toolutil.h"

enum exit_code {
	EXIT_OK = 0, EXIT_FAIL = 1, EXIT_USAGE = 2, EXIT_NOSTEP = 3, EXIT_NOTROOT = 4,
	EXIT_READONLY = 5, EXIT_NOMANIFEST = 6, EXIT_BUSY = 7,
};

struct args {
	const char *root, *cmd;
	const char *pos[2];
	int         npos;
	bool        json, all, chunks, dry_run, no_mark, merge, quiet, unrecorded;
	uint64_t    keep_last, keep_every, min_age;
};

static void usage(FILE *f)
{
	fprintf(f,
	"usage: ckpt-inspect ROOT COMMAND [options]\n"
	"\n"
	"commands:\n"
	"  list [--all]                    every committed step: state, world size, logical and\n"
	"                                  stored bytes, compression ratio, commit time, trust;\n"
	"                                  --all adds aborted and in-flight steps, and step\n"
	"                                  directories the manifest has no record of\n"
	"  show STEP|latest [--chunks]     every tensor of a step; --chunks adds the placement of\n"
	"                                  every chunk (rank, file, offset, lengths, codec, hash)\n"
	"  verify [STEP|latest|all]        read every chunk and check its hash (default: latest);\n"
	"         [--no-mark] [--quiet]    a verified step is marked so in the manifest unless\n"
	"                                  --no-mark; --quiet: no progress display\n"
	"  diff STEP1 STEP2                tensors added, removed, changed (by chunk hash), unchanged\n"
	"  gc [--keep-last N] [--keep-every K] [--min-age S] [--dry-run] [--unrecorded]\n"
	"                                  remove aborted attempts, and committed steps kept by\n"
	"                                  neither rule; never the latest committed step nor a\n"
	"                                  save in flight; --unrecorded: also step directories\n"
	"                                  the manifest has no record of\n"
	"  rebuild [--merge]               recreate a lost or damaged manifest from the shard\n"
	"                                  files (--merge: add to a manifest that has records)\n"
	"\n"
	"options:\n"
	"  --json      machine-readable output on stdout (one JSON document)\n"
	"  --help      this text\n"
	"\n"
	"exit status: 0 ok; 1 failure (damage found by verify, or an operation failed);\n"
	"2 usage; 3 no such step; 4 not a checkpoint root; 5 root not writable (gc, rebuild);\n"
	"6 no usable manifest (run rebuild); 7 root in use by a running job's coordinator.\n"
	"See docs/ckpt-inspect.md.\n");
}

static int exit_for(int rc)
{
	switch (rc) {
	case 0:              return EXIT_OK;
	case CKPT_ENOTFOUND: return EXIT_NOSTEP;
	case CKPT_ENOTROOT:
	case -ENOENT:
	case -ENOTDIR:       return EXIT_NOTROOT;
	case -EROFS:
	case -EACCES:
	case -EPERM:         return EXIT_READONLY;
	case CKPT_ENOMANIFEST: return EXIT_NOMANIFEST;
	case -EBUSY:         return EXIT_BUSY;
	default:             return EXIT_FAIL;
	}
}

static int fail(int rc, const char *what)
{
	/* The library's message already ends with the code's description. */
	fprintf(stderr, "ckpt-inspect: %s: %s\n", what, ckpt_last_error(NULL));
	return exit_for(rc);
}

static int open_root(const char *root, unsigned flags, ckpt_ctx **c)
{
	struct ckpt_opts o;
	ckpt_opts_init(&o, sizeof o);
	o.root = root;
	o.rank = 0;
	o.world = 1;
	o.flags = flags;
	/* Tools only read: a few buffers keep the disk busy without pre-faulting the
	 * default pool — the reads in flight (8), the chunk being hashed and one to
	 * decompress into (0: the library's chunk size; CKPT_POOL_BYTES still wins). */
	if (!getenv("CKPT_POOL_BYTES"))
		o.pool_bytes = 160u << 20;
	return ckpt_open(&o, c);
}

/* The root must be an existing directory before anything may create files in it. */
static int check_root_dir(const char *root)
{
	struct stat st;
	if (stat(root, &st) < 0) {
		fprintf(stderr, "ckpt-inspect: %s: %s\n", root, strerror(errno));
		return EXIT_NOTROOT;
	}
	if (!S_ISDIR(st.st_mode)) {
		fprintf(stderr, "ckpt-inspect: %s is not a directory: not a checkpoint root\n", root);
		return EXIT_NOTROOT;
	}
	return 0;
}

/* Open for reading; then, if write is set, reopen as the manifest's owner. A root
 * that cannot be written still opens for reading when ro_ok (*readonly says so). */
static int open_for(const struct args *a, bool write, bool ro_ok, ckpt_ctx **c, bool *readonly)
{
	int x = check_root_dir(a->root);
	if (x)
		return -x;
	int rc = open_root(a->root, CKPT_OPEN_READONLY, c);
	if (rc)
		return -fail(rc, a->root);
	*readonly = true;
	if (!write)
		return 0;
	ckpt_close(*c);
	*c = NULL;
	rc = open_root(a->root, CKPT_OPEN_NO_GC, c);
	if (rc == 0) {
		*readonly = false;
		return 0;
	}
	if (ro_ok && (rc == -EROFS || rc == -EACCES || rc == -EPERM)) {
		fprintf(stderr, "ckpt-inspect: %s is not writable: verifying without recording the "
		        "result\n", a->root);
		rc = open_root(a->root, CKPT_OPEN_READONLY, c);
		if (!rc)
			return 0;
	}
	return -fail(rc, a->root);
}

static int parse_step(const char *s, uint64_t *step)
{
	if (!strcmp(s, "latest")) {
		*step = CKPT_LATEST;
		return 0;
	}
	if (tool_parse_u64(s, step) || *step == CKPT_LATEST) {
		fprintf(stderr, "ckpt-inspect: '%s' is not a step (a number, or latest)\n", s);
		return -1;
	}
	return 0;
}

static const char *state_name(const struct ckpt_catalog_step *s)
{
	if (!s->has_record)
		return "unrecorded";
	switch (s->info.state) {
	case CKPT_STATE_COMMITTED: return "committed";
	case CKPT_STATE_ABORTED:   return "aborted";
	case CKPT_STATE_INFLIGHT:  return "in-flight";
	default:                   return "?";
	}
}

static const char *trust_name(int trust)
{
	switch (trust) {
	case CKPT_TRUST_COMMITTED: return "committed";
	case CKPT_TRUST_VERIFIED:  return "verified";
	default:                   return "-";
	}
}

/* ------------------------------------------------------------------ list */

static int cmd_list(const struct args *a)
{
	ckpt_ctx *c;
	bool ro;
	int rc = open_for(a, false, false, &c, &ro);
	if (rc)
		return -rc;
	unsigned flags = a->all ? CKPT_CATALOG_ALL : 0;
	struct ckpt_catalog_step *st = NULL;
	int n = ckpt_catalog_steps(c, flags, NULL, 0);
	if (n >= 0) {
		st = calloc((size_t)n + 1, sizeof *st);
		n = st ? ckpt_catalog_steps(c, flags, st, (size_t)n) : -ENOMEM;
	}
	if (n < 0) {
		int x = fail(n, "list");
		ckpt_close(c);
		free(st);
		return x;
	}
	char b1[32], b2[32], t[32];
	if (a->json) {
		printf("{\"root\":");
		tool_json_str(stdout, a->root);
		printf(",\"steps\":[");
		for (int i = 0; i < n; i++) {
			const struct ckpt_catalog_step *s = &st[i];
			double ratio = s->info.stored_bytes ?
				(double)s->info.logical_bytes / (double)s->info.stored_bytes : 0.0;
			printf("%s{\"step\":%" PRIu64 ",\"state\":\"%s\",\"trust\":\"%s\",\"world\":%u,"
			       "\"tensors\":%u,\"logical_bytes\":%" PRIu64 ",\"stored_bytes\":%" PRIu64
			       ",\"compression_ratio\":%.4f,\"commit_time\":\"%s\",\"commit_time_ns\":%" PRIu64
			       ",\"has_record\":%s,\"has_dir\":%s,\"files\":%u,\"dir_bytes\":%" PRIu64 "}",
			       i ? "," : "", s->info.step, state_name(s), trust_name(s->info.trust),
			       s->info.world, s->info.ntensors, s->info.logical_bytes,
			       s->info.stored_bytes, ratio, tool_time(s->info.commit_time_ns, t),
			       s->info.commit_time_ns, s->has_record ? "true" : "false",
			       s->has_dir ? "true" : "false", s->nfiles, s->dir_bytes);
		}
		printf("]}\n");
	} else {
		printf("%-20s %-9s %-9s %5s %7s %11s %11s %6s  %s\n", "STEP", "STATE", "TRUST", "WORLD",
		       "TENSORS", "LOGICAL", "STORED", "RATIO", "COMMITTED (UTC)");
		for (int i = 0; i < n; i++) {
			const struct ckpt_catalog_step *s = &st[i];
			bool committed = s->has_record && s->info.state == CKPT_STATE_COMMITTED;
			if (committed)
				printf("%-20" PRIu64 " %-9s %-9s %5u %7u %11s %11s %6.3f  %s\n", s->info.step,
				       state_name(s), trust_name(s->info.trust), s->info.world,
				       s->info.ntensors, tool_bytes(s->info.logical_bytes, b1),
				       tool_bytes(s->info.stored_bytes, b2),
				       s->info.stored_bytes ? (double)s->info.logical_bytes /
				       (double)s->info.stored_bytes : 0.0, tool_time(s->info.commit_time_ns, t));
			else {
				char world[16];
				snprintf(world, sizeof world, s->info.world ? "%u" : "-", s->info.world);
				printf("%-20" PRIu64 " %-9s %-9s %5s %7s %11s %11s %6s  %s (%u file(s) on disk)\n",
				       s->info.step, state_name(s), "-", world, "-", "-",
				       tool_bytes(s->dir_bytes, b2), "-",
				       !s->has_record ? "no record in the manifest: kept (rebuild --merge "
				       "recovers it, gc --unrecorded removes it)" :
				       s->info.state == CKPT_STATE_INFLIGHT ? "being saved now" : "not visible",
				       s->nfiles);
			}
		}
		if (n == 0)
			printf("(no %ssteps)\n", a->all ? "" : "committed ");
	}
	free(st);
	ckpt_close(c);
	return EXIT_OK;
}

/* ------------------------------------------------------------------ show */

static void print_shape(FILE *f, const uint64_t *v, unsigned ndim, bool json)
{
	fputc('[', f);
	for (unsigned d = 0; d < ndim; d++)
		fprintf(f, "%s%" PRIu64, d ? (json ? "," : ", ") : "", v[d]);
	fputc(']', f);
}

static void hash_hex(const uint8_t h[16], char out[33])
{
	for (int i = 0; i < 16; i++)
		snprintf(out + 2 * i, 3, "%02x", h[i]);
}

/* Chunks of entry i, malloc'd; count in *n. */
static int get_chunks(ckpt_load *l, unsigned i, struct ckpt_chunk_info **out, int *n)
{
	*out = NULL;
	*n = ckpt_load_chunks(l, i, NULL, 0);
	if (*n < 0)
		return *n;
	*out = calloc((size_t)*n + 1, sizeof **out);
	if (!*out)
		return -ENOMEM;
	int got = ckpt_load_chunks(l, i, *out, (size_t)*n);
	return got < 0 ? got : 0;
}

static int cmd_show(const struct args *a)
{
	if (a->npos != 1) {
		fprintf(stderr, "ckpt-inspect: show needs one STEP (a number, or latest)\n");
		return EXIT_USAGE;
	}
	uint64_t step;
	if (parse_step(a->pos[0], &step))
		return EXIT_USAGE;
	ckpt_ctx *c;
	bool ro;
	int rc = open_for(a, false, false, &c, &ro);
	if (rc)
		return -rc;
	ckpt_load *l;
	if ((rc = ckpt_load_open(c, step, &l))) {
		int x = fail(rc, "show");
		ckpt_close(c);
		return x;
	}
	struct ckpt_step_info si;
	ckpt_step_info(c, ckpt_load_step(l), &si);
	int n = ckpt_load_count(l);
	char b1[32], b2[32], t[32];
	if (a->json) {
		printf("{\"step\":%" PRIu64 ",\"world\":%u,\"trust\":\"%s\",\"commit_time\":\"%s\","
		       "\"logical_bytes\":%" PRIu64 ",\"stored_bytes\":%" PRIu64 ",\"tensors\":[",
		       si.step, si.world, trust_name(si.trust), tool_time(si.commit_time_ns, t),
		       si.logical_bytes, si.stored_bytes);
	} else {
		printf("step %" PRIu64 ": world %u, %d tensors and blobs, %s logical, %s stored, "
		       "trust %s, committed %s\n", si.step, si.world, n,
		       tool_bytes(si.logical_bytes, b1), tool_bytes(si.stored_bytes, b2),
		       trust_name(si.trust), tool_time(si.commit_time_ns, t));
		printf("%-40s %-9s %-7s %-20s %-10s %6s %6s %11s %11s\n", "NAME", "KIND", "DTYPE", "SHAPE",
		       "POLICY", "SHARDS", "CHUNKS", "BYTES", "STORED");
	}
	for (int i = 0; i < n && !rc; i++) {
		struct ckpt_tensor_info ti;
		if ((rc = ckpt_load_info(l, (unsigned)i, &ti)))
			break;
		struct ckpt_chunk_info *ch = NULL;
		int nch = 0;
		if (a->chunks && (rc = get_chunks(l, (unsigned)i, &ch, &nch)))
			break;
		if (a->json) {
			printf("%s{\"name\":", i ? "," : "");
			tool_json_str(stdout, ti.name);
			printf(",\"kind\":\"%s\",\"dtype\":\"%s\",\"shape\":", ckpt_kind_name(ti.kind),
			       ckpt_dtype_name(ti.dtype));
			print_shape(stdout, ti.global_shape, ti.ndim, true);
			printf(",\"policy\":\"%s\",\"shards\":%u,\"chunks\":%u,\"logical_bytes\":%" PRIu64
			       ",\"stored_bytes\":%" PRIu64, ckpt_policy_name(ti.policy), ti.nshards,
			       ti.nchunks, ti.logical_bytes, ti.stored_bytes);
			if (a->chunks) {
				printf(",\"chunk_list\":[");
				for (int k = 0; k < nch; k++) {
					char h[33];
					hash_hex(ch[k].hash, h);
					printf("%s{\"rank\":%u,\"chunk\":%u,\"file\":", k ? "," : "", ch[k].rank,
					       ch[k].chunk);
					tool_json_str(stdout, ch[k].file);
					printf(",\"offset\":%" PRIu64 ",\"stored_len\":%" PRIu64 ",\"raw_offset\":%"
					       PRIu64 ",\"raw_len\":%" PRIu64 ",\"codec\":\"%s\",\"hash\":\"%s\","
					       "\"box_offset\":", ch[k].file_offset, ch[k].stored_len,
					       ch[k].raw_offset, ch[k].raw_len, ckpt_codec_name(ch[k].codec), h);
					print_shape(stdout, ch[k].box_offset, ti.ndim, true);
					printf(",\"box_extent\":");
					print_shape(stdout, ch[k].box_extent, ti.ndim, true);
					printf("}");
				}
				printf("]");
			}
			printf("}");
		} else {
			char shape[256];
			FILE *mf = fmemopen(shape, sizeof shape, "w");
			if (mf) {
				print_shape(mf, ti.global_shape, ti.ndim, false);
				fclose(mf);
			} else {
				snprintf(shape, sizeof shape, "?");
			}
			printf("%-40s %-9s %-7s %-20s %-10s %6u %6u %11s %11s\n", ti.name,
			       ckpt_kind_name(ti.kind), ckpt_dtype_name(ti.dtype), shape,
			       ckpt_policy_name(ti.policy), ti.nshards, ti.nchunks,
			       tool_bytes(ti.logical_bytes, b1), tool_bytes(ti.stored_bytes, b2));
			for (int k = 0; k < nch; k++) {
				char h[33];
				hash_hex(ch[k].hash, h);
				printf("    rank %u chunk %u  %s @ %" PRIu64 "  stored %" PRIu64 " raw %" PRIu64
				       " (+%" PRIu64 ")  %s  %s  box ", ch[k].rank, ch[k].chunk, ch[k].file,
				       ch[k].file_offset, ch[k].stored_len, ch[k].raw_len, ch[k].raw_offset,
				       ckpt_codec_name(ch[k].codec), h);
				print_shape(stdout, ch[k].box_offset, ti.ndim, false);
				printf("+");
				print_shape(stdout, ch[k].box_extent, ti.ndim, false);
				printf("\n");
			}
		}
		free(ch);
	}
	if (a->json)
		printf("]}\n");
	int x = rc ? fail(rc, "show") : EXIT_OK;
	ckpt_load_close(l);
	ckpt_close(c);
	return x;
}

/* ------------------------------------------------------------------ verify */

static int verify_progress(void *arg, uint64_t done, uint64_t total)
{
	tool_progress_update(arg, done, total);
	return 0;
}

static int verify_one(const struct args *a, ckpt_ctx *c, uint64_t step, bool ro, bool first)
{
	struct ckpt_verify_opts o;
	ckpt_verify_opts_init(&o, sizeof o);
	struct tool_progress p;
	char sname[24], lbl[64];
	if (step == CKPT_LATEST)
		snprintf(sname, sizeof sname, "latest");
	else
		snprintf(sname, sizeof sname, "%" PRIu64, step);
	snprintf(lbl, sizeof lbl, "verify step %s", sname);
	tool_progress_start(&p, lbl, a->quiet);
	o.progress = verify_progress;
	o.arg = &p;
	if (a->no_mark)
		o.flags |= CKPT_VERIFY_NO_MARK;
	struct ckpt_verify_result *r = calloc(1, sizeof *r);
	if (!r)
		return fail(-ENOMEM, "verify");
	r->size = sizeof *r;
	int rc = ckpt_catalog_verify(c, step, &o, r);
	tool_progress_end(&p);
	char b[32];
	const char *msg = rc ? ckpt_last_error(NULL) : "";
	if (a->json) {
		printf("%s{\"step\":%" PRIu64 ",\"ok\":%s,\"chunks\":%" PRIu64 ",\"bytes\":%" PRIu64
		       ",\"stored_bytes\":%" PRIu64 ",\"seconds\":%.6f,\"marked\":%s",
		       first ? "" : ",", r->step, rc ? "false" : "true", r->chunks, r->raw_bytes,
		       r->stored_bytes, r->seconds, r->marked ? "true" : "false");
		if (rc) {
			printf(",\"error\":");
			tool_json_str(stdout, msg);
			printf(",\"code\":%d", rc);
		}
		if (r->bad) {
			printf(",\"bad\":{\"tensor\":");
			tool_json_str(stdout, r->bad_tensor);
			printf(",\"rank\":%u,\"chunk\":%u,\"file\":", r->bad_rank, r->bad_chunk);
			tool_json_str(stdout, r->bad_file);
			printf(",\"offset\":%" PRIu64 "}", r->bad_offset);
		}
		printf("}");
	} else if (!rc) {
		printf("step %" PRIu64 ": ok, %" PRIu64 " chunks, %s verified in %.3f s (%.0f MiB/s)%s\n",
		       r->step, r->chunks, tool_bytes(r->raw_bytes, b), r->seconds,
		       r->seconds > 0 ? (double)r->raw_bytes / 1048576.0 / r->seconds : 0.0,
		       r->marked ? "; marked verified" : ro ? "; not marked (read-only root)" :
		       "; not marked (--no-mark)");
	} else if (r->bad) {
		printf("step %" PRIu64 ": FAILED: tensor '%s' chunk %u (rank %u, file %s, offset %" PRIu64
		       "): %s\n", r->step, r->bad_tensor, r->bad_chunk, r->bad_rank, r->bad_file,
		       r->bad_offset, msg);
	} else {
		printf("step %s: FAILED: %s\n", sname, msg);
	}
	free(r);
	if (!a->json && rc)
		fprintf(stderr, "ckpt-inspect: verify: %s\n", msg);
	return rc;
}

static int cmd_verify(const struct args *a)
{
	if (a->npos > 1) {
		fprintf(stderr, "ckpt-inspect: verify takes at most one STEP\n");
		return EXIT_USAGE;
	}
	const char *which = a->npos ? a->pos[0] : "latest";
	bool all = !strcmp(which, "all");
	uint64_t step = 0;
	if (!all && parse_step(which, &step))
		return EXIT_USAGE;
	ckpt_ctx *c;
	bool ro;
	int rc = open_for(a, !a->no_mark, true, &c, &ro);
	if (rc)
		return -rc;
	uint64_t *steps = NULL;
	int n = 1;
	if (all) {
		n = ckpt_steps(c, NULL, 0);
		steps = n >= 0 ? calloc((size_t)n + 1, sizeof *steps) : NULL;
		if (n < 0 || !steps || (n = ckpt_steps(c, steps, (size_t)n)) < 0) {
			int x = fail(n < 0 ? n : -ENOMEM, "verify");
			free(steps);
			ckpt_close(c);
			return x;
		}
	}
	if (a->json)
		printf("{\"steps\":[");
	int worst = 0, nbad = 0;
	for (int i = 0; i < n; i++) {
		rc = verify_one(a, c, all ? steps[i] : step, ro, i == 0);
		if (rc) {
			nbad++;
			if (!worst || rc == CKPT_ENOTFOUND)
				worst = rc;
		}
	}
	if (a->json)
		printf("],\"ok\":%s,\"failed\":%d}\n", nbad ? "false" : "true", nbad);
	else if (all && n == 0)
		printf("(no committed steps)\n");
	free(steps);
	ckpt_close(c);
	return worst == CKPT_ENOTFOUND && !all ? EXIT_NOSTEP : (worst ? EXIT_FAIL : EXIT_OK);
}

/* ------------------------------------------------------------------ diff */

struct diff_side {
	ckpt_load *l;
	int n;
};

/* Same metadata and the same chunks (placement within the box, lengths and hashes)? */
static int diff_same(ckpt_load *l1, unsigned i1, ckpt_load *l2, unsigned i2, bool *same)
{
	struct ckpt_tensor_info a, b;
	int rc = ckpt_load_info(l1, i1, &a);
	if (!rc)
		rc = ckpt_load_info(l2, i2, &b);
	if (rc)
		return rc;
	*same = a.kind == b.kind && a.dtype == b.dtype && a.policy == b.policy && a.ndim == b.ndim &&
	        !memcmp(a.global_shape, b.global_shape, sizeof a.global_shape) &&
	        a.nchunks == b.nchunks;
	if (!*same)
		return 0;
	struct ckpt_chunk_info *x = NULL, *y = NULL;
	int nx, ny;
	if (!(rc = get_chunks(l1, i1, &x, &nx)) && !(rc = get_chunks(l2, i2, &y, &ny))) {
		*same = nx == ny;
		for (int k = 0; *same && k < nx; k++)
			*same = x[k].raw_len == y[k].raw_len && x[k].raw_offset == y[k].raw_offset &&
			        !memcmp(x[k].hash, y[k].hash, 16) &&
			        !memcmp(x[k].box_offset, y[k].box_offset, sizeof x[k].box_offset) &&
			        !memcmp(x[k].box_extent, y[k].box_extent, sizeof x[k].box_extent);
	}
	free(x);
	free(y);
	return rc;
}

static int cmd_diff(const struct args *a)
{
	if (a->npos != 2) {
		fprintf(stderr, "ckpt-inspect: diff needs two steps\n");
		return EXIT_USAGE;
	}
	uint64_t s1, s2;
	if (parse_step(a->pos[0], &s1) || parse_step(a->pos[1], &s2))
		return EXIT_USAGE;
	ckpt_ctx *c;
	bool ro;
	int rc = open_for(a, false, false, &c, &ro);
	if (rc)
		return -rc;
	ckpt_load *l1 = NULL, *l2 = NULL;
	if ((rc = ckpt_load_open(c, s1, &l1)) || (rc = ckpt_load_open(c, s2, &l2))) {
		int x = fail(rc, "diff");
		ckpt_load_close(l1);
		ckpt_close(c);
		return x;
	}
	int n1 = ckpt_load_count(l1), n2 = ckpt_load_count(l2);
	/* Both catalogs are sorted by name: one merge walk. */
	enum { ADDED, REMOVED, CHANGED, UNCHANGED };
	static const char *names[] = { "added", "removed", "changed", "unchanged" };
	static const char marks[] = { '+', '-', '~', '=' };
	const char **lists[4];
	int cnt[4] = { 0, 0, 0, 0 };
	for (int k = 0; k < 4; k++)
		lists[k] = calloc((size_t)(n1 + n2) + 1, sizeof *lists[k]);
	int i = 0, j = 0;
	while (!rc && (i < n1 || j < n2)) {
		struct ckpt_tensor_info x, y;
		int cmp;
		if (i < n1 && (rc = ckpt_load_info(l1, (unsigned)i, &x)))
			break;
		if (j < n2 && (rc = ckpt_load_info(l2, (unsigned)j, &y)))
			break;
		cmp = i >= n1 ? 1 : j >= n2 ? -1 : strcmp(x.name, y.name);
		if (cmp < 0) {
			lists[REMOVED][cnt[REMOVED]++] = x.name;
			i++;
		} else if (cmp > 0) {
			lists[ADDED][cnt[ADDED]++] = y.name;
			j++;
		} else {
			bool same;
			if ((rc = diff_same(l1, (unsigned)i, l2, (unsigned)j, &same)))
				break;
			int k = same ? UNCHANGED : CHANGED;
			lists[k][cnt[k]++] = x.name;
			i++;
			j++;
		}
	}
	if (!rc) {
		if (a->json) {
			printf("{\"from\":%" PRIu64 ",\"to\":%" PRIu64, ckpt_load_step(l1), ckpt_load_step(l2));
			for (int k = 0; k < 4; k++) {
				printf(",\"%s\":[", names[k]);
				for (int m = 0; m < cnt[k]; m++) {
					printf(m ? "," : "");
					tool_json_str(stdout, lists[k][m]);
				}
				printf("]");
			}
			printf("}\n");
		} else {
			printf("step %" PRIu64 " -> step %" PRIu64 "\n", ckpt_load_step(l1), ckpt_load_step(l2));
			for (int k = 0; k < 3; k++)
				for (int m = 0; m < cnt[k]; m++)
					printf("%c %s\n", marks[k], lists[k][m]);
			printf("%d added, %d removed, %d changed, %d unchanged\n", cnt[ADDED], cnt[REMOVED],
			       cnt[CHANGED], cnt[UNCHANGED]);
		}
	}
	int x = rc ? fail(rc, "diff") : EXIT_OK;
	for (int k = 0; k < 4; k++)
		free(lists[k]);
	ckpt_load_close(l1);
	ckpt_load_close(l2);
	ckpt_close(c);
	return x;
}

/* ------------------------------------------------------------------ gc */

struct gc_out {
	const struct args *a;
	int n;
};

static void gc_report(void *arg, const struct ckpt_gc_item *it)
{
	struct gc_out *g = arg;
	char b[32];
	if (g->a->json) {
		printf("%s{\"step\":%" PRIu64 ",\"reason\":\"%s\",\"bytes\":%" PRIu64 ",\"files\":%u}",
		       g->n ? "," : "", it->step, ckpt_gc_reason_name(it->reason), it->bytes, it->nfiles);
	} else {
		printf("%s step %" PRIu64 " (%s): %u file(s), %s\n",
		       g->a->dry_run ? "would remove" : "remove", it->step,
		       ckpt_gc_reason_name(it->reason), it->nfiles, tool_bytes(it->bytes, b));
	}
	fflush(stdout);
	g->n++;
}

static int cmd_gc(const struct args *a)
{
	if (a->npos) {
		fprintf(stderr, "ckpt-inspect: gc takes no positional argument\n");
		return EXIT_USAGE;
	}
	ckpt_ctx *c;
	bool ro;
	int rc = open_for(a, true, false, &c, &ro);
	if (rc)
		return -rc;
	struct ckpt_gc_opts o;
	ckpt_gc_opts_init(&o, sizeof o);
	o.keep_last = a->keep_last;
	o.keep_every = a->keep_every;
	o.min_age_s = a->min_age;
	o.flags = (a->dry_run ? CKPT_GC_DRY_RUN : 0) | (a->unrecorded ? CKPT_GC_UNRECORDED : 0);
	struct gc_out g = { a, 0 };
	o.report = gc_report;
	o.arg = &g;
	struct ckpt_gc_result r = { .size = sizeof r };
	if (a->json)
		printf("{\"dry_run\":%s,\"removed\":[", a->dry_run ? "true" : "false");
	rc = ckpt_catalog_gc(c, &o, &r);
	char b[32];
	if (a->json) {
		printf("],\"ok\":%s,\"steps_removed\":%" PRIu64 ",\"bytes_freed\":%" PRIu64
		       ",\"steps_kept\":%" PRIu64 ",\"steps_unrecorded\":%" PRIu64, rc ? "false" : "true",
		       r.steps_removed, r.bytes_freed, r.steps_kept, r.steps_unrecorded);
		if (rc) {
			printf(",\"error\":");
			tool_json_str(stdout, ckpt_last_error(NULL));
		}
		printf("}\n");
	} else if (!rc) {
		printf("%s %" PRIu64 " step(s), %s %s; %" PRIu64 " committed step(s) kept\n",
		       a->dry_run ? "would remove" : "removed", r.steps_removed,
		       tool_bytes(r.bytes_freed, b), a->dry_run ? "to free" : "freed", r.steps_kept);
		if (r.steps_unrecorded)
			printf("%" PRIu64 " step director%s without a record left alone (`rebuild --merge` "
			       "recovers them, --unrecorded removes them)\n", r.steps_unrecorded,
			       r.steps_unrecorded == 1 ? "y" : "ies");
	}
	int x = rc ? fail(rc, "gc") : EXIT_OK;
	ckpt_close(c);
	return x;
}

/* ------------------------------------------------------------------ rebuild */

struct rb_out {
	const struct args *a;
	int n;
};

static void rebuild_report(void *arg, uint64_t step, int outcome, uint32_t world, const char *why)
{
	struct rb_out *o = arg;
	const char *what = outcome == CKPT_REBUILD_COMMITTED ? "committed" :
	                   outcome == CKPT_REBUILD_PRESENT ? "present" :
	                   outcome == CKPT_REBUILD_DAMAGED ? "damaged-record-removed" : "not-committed";
	if (o->a->json) {
		printf("%s{\"step\":%" PRIu64 ",\"outcome\":\"%s\",\"world\":%u,\"why\":",
		       o->n ? "," : "", step, what, world);
		tool_json_str(stdout, why ? why : "");
		printf("}");
	} else if (outcome == CKPT_REBUILD_COMMITTED) {
		printf("step %" PRIu64 ": committed (world %u, every shard proven)\n", step, world);
	} else if (outcome == CKPT_REBUILD_PRESENT) {
		printf("step %" PRIu64 ": left as it was (%s)\n", step, why);
	} else if (outcome == CKPT_REBUILD_DAMAGED) {
		printf("step %" PRIu64 ": %s\n", step, why);
	} else {
		printf("step %" PRIu64 ": NOT committed: %s\n", step, why);
	}
	o->n++;
}

static int cmd_rebuild(const struct args *a)
{
	if (a->npos) {
		fprintf(stderr, "ckpt-inspect: rebuild takes no positional argument\n");
		return EXIT_USAGE;
	}
	int x = check_root_dir(a->root);
	if (x)
		return x;
	ckpt_ctx *c;
	/* RECOVER: a lost manifest is recreated, a damaged one set aside first. */
	int rc = open_root(a->root, CKPT_OPEN_RECOVER, &c);
	if (rc)
		return fail(rc, a->root);
	struct rb_out o = { a, 0 };
	struct ckpt_rebuild_result r = { .size = sizeof r };
	if (a->json)
		printf("{\"steps\":[");
	rc = ckpt_catalog_rebuild(c, a->merge ? CKPT_REBUILD_MERGE : 0, rebuild_report, &o, &r);
	if (a->json) {
		printf("],\"ok\":%s,\"committed\":%" PRIu64 ",\"present\":%" PRIu64
		       ",\"not_committed\":%" PRIu64, rc ? "false" : "true", r.steps_committed,
		       r.steps_present, r.steps_unproven);
		if (rc) {
			printf(",\"error\":");
			tool_json_str(stdout, ckpt_last_error(NULL));
		}
		printf("}\n");
	} else if (!rc) {
		printf("rebuilt: %" PRIu64 " step(s) committed, %" PRIu64 " not committed (gc removes "
		       "them), %" PRIu64 " already recorded\n", r.steps_committed, r.steps_unproven,
		       r.steps_present);
	}
	x = rc ? fail(rc, "rebuild") : EXIT_OK;
	ckpt_close(c);
	return x;
}

/* ------------------------------------------------------------------ main */

static int parse_count(const char *opt, const char *v, uint64_t *out)
{
	if (tool_parse_u64(v, out) || (*out == 0 && strcmp(opt, "--min-age"))) {
		fprintf(stderr, "ckpt-inspect: %s '%s': a positive integer%s\n", opt, v,
		        strcmp(opt, "--min-age") ? "" : " or 0");
		return -1;
	}
	return 0;
}

int main(int argc, char **argv)
{
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
			usage(stdout);
			return EXIT_OK;
		}
	}
	if (argc < 3) {
		usage(stderr);
		return EXIT_USAGE;
	}
	struct args a;
	memset(&a, 0, sizeof a);
	a.root = argv[1];
	a.cmd = argv[2];
	static const struct option opts[] = {
		{ "json", no_argument, 0, 'j' }, { "all", no_argument, 0, 'a' },
		{ "chunks", no_argument, 0, 'c' }, { "dry-run", no_argument, 0, 'n' },
		{ "no-mark", no_argument, 0, 'N' }, { "merge", no_argument, 0, 'm' },
		{ "quiet", no_argument, 0, 'q' },
		{ "keep-last", required_argument, 0, 'L' }, { "keep-every", required_argument, 0, 'E' },
		{ "min-age", required_argument, 0, 'A' }, { "help", no_argument, 0, 'h' },
		{ "unrecorded", no_argument, 0, 'U' },
		{ 0, 0, 0, 0 },
	};
	/* Which options each command accepts. */
	static const struct { const char *cmd, *opts; } allowed[] = {
		{ "list", "ja" }, { "show", "jc" }, { "verify", "jNq" }, { "diff", "j" },
		{ "gc", "jnLEAU" }, { "rebuild", "jm" },
	};
	const char *ok = NULL;
	for (size_t k = 0; k < sizeof allowed / sizeof *allowed; k++)
		if (!strcmp(a.cmd, allowed[k].cmd))
			ok = allowed[k].opts;
	if (!ok) {
		fprintf(stderr, "ckpt-inspect: unknown command '%s'\n", a.cmd);
		usage(stderr);
		return EXIT_USAGE;
	}
	optind = 3;
	int ch, idx;
	while ((ch = getopt_long(argc, argv, "", opts, &idx)) != -1) {
		if (ch == '?') {
			usage(stderr);
			return EXIT_USAGE;
		}
		if (!strchr(ok, ch)) {
			fprintf(stderr, "ckpt-inspect: %s does not take --%s\n", a.cmd, opts[idx].name);
			return EXIT_USAGE;
		}
		switch (ch) {
		case 'j': a.json = true; break;
		case 'a': a.all = true; break;
		case 'c': a.chunks = true; break;
		case 'n': a.dry_run = true; break;
		case 'N': a.no_mark = true; break;
		case 'm': a.merge = true; break;
		case 'q': a.quiet = true; break;
		case 'U': a.unrecorded = true; break;
		case 'L': if (parse_count("--keep-last", optarg, &a.keep_last)) return EXIT_USAGE; break;
		case 'E': if (parse_count("--keep-every", optarg, &a.keep_every)) return EXIT_USAGE; break;
		case 'A': if (parse_count("--min-age", optarg, &a.min_age)) return EXIT_USAGE; break;
		}
	}
	for (; optind < argc; optind++) {
		if (a.npos == 2) {
			fprintf(stderr, "ckpt-inspect: too many arguments ('%s')\n", argv[optind]);
			return EXIT_USAGE;
		}
		a.pos[a.npos++] = argv[optind];
	}
	if (!strcmp(a.cmd, "list")) {
		if (a.npos) {
			fprintf(stderr, "ckpt-inspect: list takes no positional argument\n");
			return EXIT_USAGE;
		}
		return cmd_list(&a);
	}
	if (!strcmp(a.cmd, "show"))    return cmd_show(&a);
	if (!strcmp(a.cmd, "verify"))  return cmd_verify(&a);
	if (!strcmp(a.cmd, "diff"))    return cmd_diff(&a);
	if (!strcmp(a.cmd, "gc"))      return cmd_gc(&a);
	return cmd_rebuild(&a);
}
