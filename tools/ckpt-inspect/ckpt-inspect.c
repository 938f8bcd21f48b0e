/*
 * ckpt-inspect — an operator's view of a checkpoint root, on the public API only:
 *
 *   ckpt-inspect ROOT list [--all] [--json]
 *   ckpt-inspect ROOT show STEP|latest [--chunks] [--json]
 *   ckpt-inspect ROOT verify [STEP|latest|all] [--no-mark] [--quiet] [--json]
 *   ckpt-inspect ROOT diff STEP1 STEP2 [--json]
 *   ckpt-inspect ROOT gc [--keep-last N] [--keep-every K] [--keep-seconds S]
 *                        [--min-age S] [--dry-run] [--unrecorded] [--json]
 *   ckpt-inspect ROOT rebuild [--merge] [--json]
 *
 * Every command takes --manifest-dir DIR, the root's manifest directory when it is
 * kept apart from the root (the library's CKPT_MANIFEST_DIR otherwise).
 * Every option and exit code is documented in docs/ckpt-inspect.md; --help prints
 * the same summary. Under --json stdout holds exactly one JSON document whatever
 * happens (toolutil.h: the failure rule). Reading commands open the root read-only; verify (to record the
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

#include <jansson.h>

#include "ckpt/catalog.h"
#include "ckpt/ckpt.h"
#include "toolutil.h"

enum exit_code {
	EXIT_OK = 0, EXIT_FAIL = 1, EXIT_USAGE = 2, EXIT_NOSTEP = 3, EXIT_NOTROOT = 4,
	EXIT_READONLY = 5, EXIT_NOMANIFEST = 6, EXIT_BUSY = 7,
};

struct args {
	const char *root, *cmd;
	const char *manifest_dir;      /* --manifest-dir; NULL: the library's default */
	const char *pos[2];
	int         npos;
	bool        json, all, chunks, dry_run, no_mark, merge, quiet, unrecorded;
	uint64_t    keep_last, keep_every, keep_seconds, min_age;
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
	"  gc [--keep-last N] [--keep-every K] [--keep-seconds S] [--min-age S] [--dry-run]\n"
	"     [--unrecorded]               remove aborted attempts, and committed steps kept by\n"
	"                                  no rule (S: seconds, or 90m, 2h, 7d: committed within\n"
	"                                  that long); never the latest committed step nor a\n"
	"                                  save in flight; --unrecorded: also step directories\n"
	"                                  the manifest has no record of\n"
	"  rebuild [--merge]               recreate a lost or damaged manifest from the shard\n"
	"                                  files (--merge: add to a manifest that has records)\n"
	"\n"
	"options:\n"
	"  --manifest-dir DIR  the root's manifest directory, when it is kept apart from\n"
	"              the root (an absolute path; default: CKPT_MANIFEST_DIR, then\n"
	"              ROOT/manifest)\n"
	"  --json      machine-readable output on stdout: one JSON document, also on\n"
	"              failure ({\"ok\":false,\"error\",\"code\",\"exit\"})\n"
	"  --help      this text\n"
	"  --version   print the version and exit\n"
	"\n"
	"exit status: 0 ok; 1 failure (damage found by verify, or an operation failed);\n"
	"2 usage; 3 no such step; 4 not a checkpoint root; 5 root not writable (gc, rebuild);\n"
	"6 no usable manifest (run rebuild; or the manifest directory is on another host,\n"
	"or another root's); 7 root in use by a running job's coordinator.\n"
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
	return tool_fail(exit_for(rc), rc, "%s: %s", what, ckpt_last_error());
}

/* Where list, show and diff write their document: under --json a buffer, printed
 * only once the command has succeeded, so that a failure half-way leaves the error
 * object alone on stdout; otherwise stdout itself. */
struct doc {
	FILE  *f;
	char  *buf;
	size_t len;
};

static int doc_open(struct doc *d, bool json)
{
	memset(d, 0, sizeof d[0]);
	d->f = json ? open_memstream(&d->buf, &d->len) : stdout;
	return d->f ? 0 : -ENOMEM;
}

/* The command succeeded: the document goes out. */
static void doc_emit(struct doc *d)
{
	if (d->f == stdout)
		return;
	if (!fclose(d->f) && d->buf)
		fwrite(d->buf, 1, d->len, stdout);
	free(d->buf);
	d->f = NULL;
	d->buf = NULL;
}

/* The command failed: what it wrote is dropped (its error object says why). */
static void doc_drop(struct doc *d)
{
	if (!d->f || d->f == stdout)
		return;
	fclose(d->f);
	free(d->buf);
	d->f = NULL;
	d->buf = NULL;
}

static int open_root(const struct args *a, unsigned flags, ckpt_ctx **c)
{
	struct ckpt_opts o;
	ckpt_opts_init(&o, sizeof o);
	/* A job held by ckptd: "ckptd://HOST:PORT[,...]" in place of the root (the job
	 * id and secret from CKPT_JOB_ID and CKPT_JOB_SECRET, as for the job's ranks). */
	if (!strncmp(a->root, "ckptd://", 8))
		o.target = a->root;
	else
		o.root = a->root;
	o.manifest_dir = a->manifest_dir;
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
	if (!strncmp(root, "ckptd://", 8))
		return 0;
	struct stat st;
	if (stat(root, &st) < 0)
		return tool_fail(EXIT_NOTROOT, -errno, "%s: %s", root, strerror(errno));
	if (!S_ISDIR(st.st_mode))
		return tool_fail(EXIT_NOTROOT, CKPT_ENOTROOT, "%s is not a directory: not a "
		                 "checkpoint root", root);
	return 0;
}

/* Open for reading; then, if write is set, reopen as the manifest's owner. A root
 * that cannot be written still opens for reading when ro_ok: *unwritable says so
 * (and only that: a root opened read-only because nothing is to be written is not
 * said to be unwritable). */
static int open_for(const struct args *a, bool write, bool ro_ok, ckpt_ctx **c, bool *unwritable)
{
	*unwritable = false;
	int x = check_root_dir(a->root);
	if (x)
		return -x;
	int rc = open_root(a, CKPT_OPEN_READONLY, c);
	if (rc)
		return -fail(rc, a->root);
	if (!write)
		return 0;
	ckpt_close(*c);
	*c = NULL;
	rc = open_root(a, CKPT_OPEN_NO_GC, c);
	if (rc == 0)
		return 0;
	if (ro_ok && (rc == -EROFS || rc == -EACCES || rc == -EPERM || rc == -EBUSY)) {
		*unwritable = true;
		/* A job's coordinator holds the root (-EBUSY): reading is safe, marking is
		 * the job's manifest owner's business. */
		fprintf(stderr, "ckpt-inspect: %s %s: verifying without recording the result\n",
		        a->root, rc == -EBUSY ? "is in use by a running job" : "is not writable");
		rc = open_root(a, CKPT_OPEN_READONLY, c);
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
	/* CKPT_LATEST is no step number: the largest one is one less. */
	if (tool_parse_u64_range(s, 0, CKPT_LATEST - 1, step)) {
		tool_usage("'%s' is not a step (a number from 0 to %" PRIu64 ", or latest)", s,
		           (uint64_t)CKPT_LATEST - 1);
		return -1;
	}
	return 0;
}

static const char *state_name(const struct ckpt_step_info *s)
{
	if (!s->has_record)
		return "unrecorded";
	switch (s->state) {
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

/* ------------------------------------------------------------------ metadata */

/* The metadata of step (ckpt_save_set_meta), malloc'd and NUL-terminated in *out, or
 * NULL when it has none. 0 or the library's error. */
static int meta_get(ckpt_ctx *c, uint64_t step, char **out)
{
	*out = NULL;
	size_t len = 0;
	int rc = ckpt_step_meta(c, step, NULL, 0, &len);
	if (rc == 0 || rc != -ENOSPC)
		return rc;
	char *m = malloc(len + 1);
	if (!m)
		return -ENOMEM;
	if ((rc = ckpt_step_meta(c, step, m, len + 1, &len))) {
		free(m);
		return rc;
	}
	*out = m;
	return 0;
}

/* ,"meta":{...}: the stored text as it is when it is a JSON object (what the
 * library stores); otherwise, as a string, "meta_text", so that the document stays
 * JSON whatever the record holds. */
static void meta_json(FILE *f, const char *meta)
{
	json_error_t e;
	json_t *v = json_loads(meta, JSON_DECODE_ANY | JSON_DECODE_INT_AS_REAL, &e);
	if (v && json_is_object(v)) {
		fprintf(f, ",\"meta\":%s", meta);
	} else {
		fputs(",\"meta_text\":", f);
		tool_json_str(f, meta);
	}
	json_decref(v);
}

/* For people: indented, keys in stored order; the text as stored if it does not
 * parse here (an integer beyond 64 bits). */
static void meta_print(FILE *f, const char *meta)
{
	json_error_t e;
	json_t *v = json_loads(meta, 0, &e);
	char *pretty = v ? json_dumps(v, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
	fprintf(f, "metadata: %s\n", pretty ? pretty : meta);
	free(pretty);
	json_decref(v);
}

static int cmd_list(const struct args *a)
{
	ckpt_ctx *c;
	bool unwritable;
	int rc = open_for(a, false, false, &c, &unwritable);
	if (rc)
		return -rc;
	unsigned flags = a->all ? CKPT_STEPS_ALL : 0;
	struct ckpt_step_info *st = NULL;
	int n = ckpt_steps(c, flags, NULL, 0, sizeof(struct ckpt_step_info));
	if (n >= 0) {
		/* Both calls return the count: a job that commits in between makes the
		 * second larger than what was filled. */
		int cap = n;
		st = calloc((size_t)cap + 1, sizeof *st);
		n = st ? ckpt_steps(c, flags, st, (size_t)cap, sizeof *st) : -ENOMEM;
		if (n > cap)
			n = cap;
	}
	if (n < 0) {
		int x = fail(n, "list");
		ckpt_close(c);
		free(st);
		return x;
	}
	struct doc d;
	if (doc_open(&d, a->json)) {
		free(st);
		ckpt_close(c);
		return fail(-ENOMEM, "list");
	}
	FILE *f = d.f;
	char b1[32], b2[32], t[32];
	if (a->json) {
		fprintf(f, "{\"ok\":true,\"root\":");
		tool_json_str(f, a->root);
		fprintf(f, ",\"steps\":[");
		for (int i = 0; i < n; i++) {
			const struct ckpt_step_info *s = &st[i];
			double ratio = s->stored_bytes ?
				(double)s->logical_bytes / (double)s->stored_bytes : 0.0;
			fprintf(f, "%s{\"step\":%" PRIu64 ",\"state\":\"%s\",\"trust\":\"%s\",\"world\":%u,"
			        "\"tensors\":%u,\"logical_bytes\":%" PRIu64 ",\"stored_bytes\":%" PRIu64
			        ",\"compression_ratio\":%.4f,\"commit_time\":\"%s\",\"commit_time_ns\":%" PRIu64
			        ",\"has_record\":%s,\"has_dir\":%s,\"files\":%u,\"dir_bytes\":%" PRIu64,
			        i ? "," : "", s->step, state_name(s), trust_name(s->trust),
			        s->world, s->ntensors, s->logical_bytes,
			        s->stored_bytes, ratio, tool_time(s->commit_time_ns, t),
			        s->commit_time_ns, s->has_record ? "true" : "false",
			        s->has_dir ? "true" : "false", s->nfiles, s->dir_bytes);
			char *meta = NULL;
			if (s->has_record && s->state == CKPT_STATE_COMMITTED &&
			    (rc = meta_get(c, s->step, &meta)) != 0)
				break;
			if (meta)
				meta_json(f, meta);
			fputc('}', f);
			free(meta);
		}
		if (rc) {
			doc_drop(&d);
			free(st);
			int x = fail(rc, "list");
			ckpt_close(c);
			return x;
		}
		fprintf(f, "]}\n");
	} else {
		fprintf(f, "%-20s %-9s %-9s %5s %7s %11s %11s %6s  %s\n", "STEP", "STATE", "TRUST",
		        "WORLD", "TENSORS", "LOGICAL", "STORED", "RATIO", "COMMITTED (UTC)");
		for (int i = 0; i < n; i++) {
			const struct ckpt_step_info *s = &st[i];
			bool committed = s->has_record && s->state == CKPT_STATE_COMMITTED;
			if (committed)
				fprintf(f, "%-20" PRIu64 " %-9s %-9s %5u %7u %11s %11s %6.3f  %s\n",
				        s->step, state_name(s), trust_name(s->trust), s->world,
				        s->ntensors, tool_bytes(s->logical_bytes, b1),
				        tool_bytes(s->stored_bytes, b2),
				        s->stored_bytes ? (double)s->logical_bytes /
				        (double)s->stored_bytes : 0.0, tool_time(s->commit_time_ns, t));
			else {
				char world[16];
				snprintf(world, sizeof world, s->world ? "%u" : "-", s->world);
				fprintf(f, "%-20" PRIu64 " %-9s %-9s %5s %7s %11s %11s %6s  %s (%u file(s) on "
				        "disk)\n", s->step, state_name(s), "-", world, "-", "-",
				        tool_bytes(s->dir_bytes, b2), "-",
				        !s->has_record ? "no record in the manifest: kept (rebuild --merge "
				        "recovers it, gc --unrecorded removes it)" :
				        s->state == CKPT_STATE_INFLIGHT ? "being saved now" : "not visible",
				        s->nfiles);
			}
		}
		if (n == 0)
			fprintf(f, "(no %ssteps)\n", a->all ? "" : "committed ");
	}
	doc_emit(&d);
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
	*n = ckpt_load_chunks(l, i, NULL, 0, sizeof(struct ckpt_chunk_info));
	if (*n < 0)
		return *n;
	*out = calloc((size_t)*n + 1, sizeof **out);
	if (!*out)
		return -ENOMEM;
	int got = ckpt_load_chunks(l, i, *out, (size_t)*n, sizeof(struct ckpt_chunk_info));
	return got < 0 ? got : 0;
}

/* A name as JSON: "name" always (U+FFFD for bytes that are not UTF-8), and for a
 * name that is not UTF-8 (saved before the library required it) also "name_hex",
 * its stored bytes, so that a script can still ask for the item by them. */
static void json_name(FILE *f, const char *name)
{
	fputs("\"name\":", f);
	tool_json_str(f, name);
	if (!tool_utf8_ok(name)) {
		fputs(",\"name_hex\":\"", f);
		for (const unsigned char *p = (const unsigned char *)name; *p; p++)
			fprintf(f, "%02x", *p);
		fputc('"', f);
	}
}

/* The files of other steps that step's chunks reference (an incremental save):
 * every chunk whose file is not in the step's own directory, per file. */
struct ref_use { char file[256]; uint64_t chunks, raw_bytes; };

static int collect_refs(ckpt_load *l, uint64_t step, struct ref_use **out, int *n)
{
	*out = NULL;
	*n = 0;
	char own[64];
	snprintf(own, sizeof own, "step-%020" PRIu64 "/", step);
	int cnt = ckpt_load_count(l);
	for (int i = 0; i < cnt; i++) {
		struct ckpt_chunk_info *ch = NULL;
		int nch = 0;
		int rc = get_chunks(l, (unsigned)i, &ch, &nch);
		for (int k = 0; !rc && k < nch; k++) {
			if (!strncmp(ch[k].file, own, strlen(own)))
				continue;
			int j = 0;
			while (j < *n && strcmp((*out)[j].file, ch[k].file))
				j++;
			if (j == *n) {
				struct ref_use *r = realloc(*out, (size_t)(*n + 1) * sizeof *r);
				if (!r) {
					rc = -ENOMEM;
					break;
				}
				*out = r;
				memset(&r[j], 0, sizeof r[j]);
				snprintf(r[j].file, sizeof r[j].file, "%s", ch[k].file);
				(*n)++;
			}
			(*out)[j].chunks++;
			(*out)[j].raw_bytes += ch[k].raw_len;
		}
		free(ch);
		if (rc)
			return rc;
	}
	return 0;
}

static int cmd_show(const struct args *a)
{
	if (a->npos != 1)
		return tool_usage("show needs one STEP (a number, or latest)");
	uint64_t step;
	if (parse_step(a->pos[0], &step))
		return EXIT_USAGE;
	ckpt_ctx *c;
	bool unwritable;
	int rc = open_for(a, false, false, &c, &unwritable);
	if (rc)
		return -rc;
	ckpt_load *l;
	if ((rc = ckpt_load_open(c, step, &l))) {
		int x = fail(rc, "show");
		ckpt_close(c);
		return x;
	}
	struct doc d;
	if (doc_open(&d, a->json)) {
		ckpt_load_close(l);
		ckpt_close(c);
		return fail(-ENOMEM, "show");
	}
	FILE *f = d.f;
	struct ckpt_step_info si;
	ckpt_step_info(c, ckpt_load_step(l), &si, sizeof si);
	int n = ckpt_load_count(l);
	char b1[32], b2[32], t[32];
	char *meta = NULL;
	if ((rc = meta_get(c, ckpt_load_step(l), &meta))) {
		doc_drop(&d);
		ckpt_load_close(l);
		int x = fail(rc, "show");
		ckpt_close(c);
		return x;
	}
	struct ref_use *refs = NULL;
	int nrefs = 0;
	if ((rc = collect_refs(l, ckpt_load_step(l), &refs, &nrefs))) {
		doc_drop(&d);
		free(meta);
		ckpt_load_close(l);
		int x = fail(rc, "show");
		ckpt_close(c);
		return x;
	}
	if (a->json) {
		fprintf(f, "{\"ok\":true,\"step\":%" PRIu64 ",\"world\":%u,\"trust\":\"%s\","
		        "\"commit_time\":\"%s\",\"logical_bytes\":%" PRIu64 ",\"stored_bytes\":%" PRIu64,
		        si.step, si.world, trust_name(si.trust),
		        tool_time(si.commit_time_ns, t), si.logical_bytes, si.stored_bytes);
		if (meta)
			meta_json(f, meta);
		fprintf(f, ",\"references\":[");
		for (int j = 0; j < nrefs; j++) {
			fprintf(f, "%s{\"file\":", j ? "," : "");
			tool_json_str(f, refs[j].file);
			fprintf(f, ",\"chunks\":%" PRIu64 ",\"raw_bytes\":%" PRIu64 "}",
			        refs[j].chunks, refs[j].raw_bytes);
		}
		fprintf(f, "]");
		fprintf(f, ",\"tensors\":[");
	} else {
		fprintf(f, "step %" PRIu64 ": world %u, %d tensors and blobs, %s logical, %s stored, "
		        "trust %s, committed %s\n", si.step, si.world, n,
		        tool_bytes(si.logical_bytes, b1), tool_bytes(si.stored_bytes, b2),
		        trust_name(si.trust), tool_time(si.commit_time_ns, t));
		if (meta)
			meta_print(f, meta);
		for (int j = 0; j < nrefs; j++)
			fprintf(f, "references %s: %" PRIu64 " chunks, %s (not written again)\n",
			        refs[j].file, refs[j].chunks, tool_bytes(refs[j].raw_bytes, b1));
		fprintf(f, "%-40s %-9s %-7s %-20s %-10s %6s %6s %11s %11s\n", "NAME", "KIND", "DTYPE",
		        "SHAPE", "POLICY", "SHARDS", "CHUNKS", "BYTES", "STORED");
	}
	for (int i = 0; i < n && !rc; i++) {
		struct ckpt_tensor_info ti;
		if ((rc = ckpt_load_info(l, (unsigned)i, &ti, sizeof ti)))
			break;
		struct ckpt_chunk_info *ch = NULL;
		int nch = 0;
		if (a->chunks && (rc = get_chunks(l, (unsigned)i, &ch, &nch)))
			break;
		if (a->json) {
			fprintf(f, "%s{", i ? "," : "");
			json_name(f, ti.name);
			fprintf(f, ",\"kind\":\"%s\",\"dtype\":\"%s\",\"shape\":", ckpt_kind_name(ti.kind),
			        ckpt_dtype_name(ti.dtype));
			print_shape(f, ti.global_shape, ti.ndim, true);
			fprintf(f, ",\"policy\":\"%s\",\"shards\":%u,\"chunks\":%u,\"logical_bytes\":%" PRIu64
			        ",\"stored_bytes\":%" PRIu64, ckpt_policy_name(ti.policy), ti.nshards,
			        ti.nchunks, ti.logical_bytes, ti.stored_bytes);
			if (a->chunks) {
				fprintf(f, ",\"chunk_list\":[");
				for (int k = 0; k < nch; k++) {
					char h[33];
					hash_hex(ch[k].hash, h);
					fprintf(f, "%s{\"rank\":%u,\"chunk\":%u,\"file\":", k ? "," : "",
					        ch[k].rank, ch[k].chunk);
					tool_json_str(f, ch[k].file);
					fprintf(f, ",\"offset\":%" PRIu64 ",\"stored_len\":%" PRIu64 ",\"raw_offset\":%"
					        PRIu64 ",\"raw_len\":%" PRIu64 ",\"codec\":\"%s\",\"hash\":\"%s\","
					        "\"box_offset\":", ch[k].file_offset, ch[k].stored_len,
					        ch[k].raw_offset, ch[k].raw_len, ckpt_codec_name(ch[k].codec), h);
					print_shape(f, ch[k].box_offset, ti.ndim, true);
					fprintf(f, ",\"box_extent\":");
					print_shape(f, ch[k].box_extent, ti.ndim, true);
					fprintf(f, "}");
				}
				fprintf(f, "]");
			}
			fprintf(f, "}");
		} else {
			char shape[256];
			FILE *mf = fmemopen(shape, sizeof shape, "w");
			if (mf) {
				print_shape(mf, ti.global_shape, ti.ndim, false);
				fclose(mf);
			} else {
				snprintf(shape, sizeof shape, "?");
			}
			fprintf(f, "%-40s %-9s %-7s %-20s %-10s %6u %6u %11s %11s\n", ti.name,
			        ckpt_kind_name(ti.kind), ckpt_dtype_name(ti.dtype), shape,
			        ckpt_policy_name(ti.policy), ti.nshards, ti.nchunks,
			        tool_bytes(ti.logical_bytes, b1), tool_bytes(ti.stored_bytes, b2));
			for (int k = 0; k < nch; k++) {
				char h[33];
				hash_hex(ch[k].hash, h);
				fprintf(f, "    rank %u chunk %u  %s @ %" PRIu64 "  stored %" PRIu64 " raw %"
				        PRIu64 " (+%" PRIu64 ")  %s  %s  box ", ch[k].rank, ch[k].chunk,
				        ch[k].file, ch[k].file_offset, ch[k].stored_len, ch[k].raw_len,
				        ch[k].raw_offset, ckpt_codec_name(ch[k].codec), h);
				print_shape(f, ch[k].box_offset, ti.ndim, false);
				fprintf(f, "+");
				print_shape(f, ch[k].box_extent, ti.ndim, false);
				fprintf(f, "\n");
			}
		}
		free(ch);
	}
	int x;
	if (rc) {
		doc_drop(&d);
		x = fail(rc, "show");
	} else {
		if (a->json)
			fprintf(f, "]}\n");
		doc_emit(&d);
		x = EXIT_OK;
	}
	free(meta);
	free(refs);
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

/* What verify_one reports back to cmd_verify. */
struct verify_out {
	int  rc;
	char msg[1024];
};

/* Verify step (a number: the result names it whatever happens). */
static void verify_one(const struct args *a, ckpt_ctx *c, uint64_t step, bool known,
                       bool unwritable, bool first, struct verify_out *out)
{
	struct ckpt_verify_opts o;
	ckpt_verify_opts_init(&o, sizeof o);
	struct tool_progress p;
	char sname[24], lbl[64];
	if (known)
		snprintf(sname, sizeof sname, "%" PRIu64, step);
	else
		snprintf(sname, sizeof sname, "latest");
	snprintf(lbl, sizeof lbl, "verify step %s", sname);
	tool_progress_start(&p, lbl, a->quiet);
	o.progress = verify_progress;
	o.arg = &p;
	if (a->no_mark)
		o.flags |= CKPT_VERIFY_NO_MARK;
	struct ckpt_verify_result *r = calloc(1, sizeof *r);
	int rc = r ? 0 : -ENOMEM;
	if (r) {
		r->size = sizeof *r;
		rc = ckpt_catalog_verify(c, known ? step : CKPT_LATEST, &o, r);
	}
	tool_progress_end(&p);
	out->rc = rc;
	snprintf(out->msg, sizeof out->msg, "%s", rc ? (r ? ckpt_last_error() :
	         "out of memory") : "");
	const char *msg = out->msg;
	char b[32];
	if (!r) {
		if (a->json) {
			printf("%s{\"step\":", first ? "" : ",");
			printf(known ? "%" PRIu64 : "null", step);
			printf(",\"ok\":false");
			tool_json_fail_fields(stdout, msg, rc, EXIT_FAIL);
			printf("}");
		} else {
			printf("step %s: FAILED: %s\n", sname, msg);
		}
		fprintf(stderr, "ckpt-inspect: verify: %s\n", msg);
		return;
	}
	if (a->json) {
		/* The step asked for, even when it could not be opened (the result names a
		 * step only once the library opened one); null for latest of a root that
		 * has no committed step. */
		printf("%s{\"step\":", first ? "" : ",");
		printf(known ? "%" PRIu64 : "null", step);
		printf(",\"ok\":%s,\"chunks\":%" PRIu64 ",\"bytes\":%" PRIu64
		       ",\"stored_bytes\":%" PRIu64 ",\"seconds\":%.6f,\"marked\":%s",
		       rc ? "false" : "true", r->chunks, r->raw_bytes, r->stored_bytes, r->seconds,
		       r->marked ? "true" : "false");
		if (rc)
			tool_json_fail_fields(stdout, msg, rc, exit_for(rc));
		if (r->bad) {
			printf(",\"bad\":{\"tensor\":");
			tool_json_str(stdout, r->bad_tensor);
			printf(",\"rank\":%u,\"chunk\":%u,\"file\":", r->bad_rank, r->bad_chunk);
			tool_json_str(stdout, r->bad_file);
			printf(",\"offset\":%" PRIu64 "}", r->bad_offset);
		}
		printf("}");
	} else if (!rc) {
		/* Not marked: because it was asked, or because the root cannot be written
		 * (open_for fell back to reading); never "read-only" for a root that is not. */
		printf("step %" PRIu64 ": ok, %" PRIu64 " chunks, %s verified in %.3f s (%.0f MiB/s)%s\n",
		       r->step, r->chunks, tool_bytes(r->raw_bytes, b), r->seconds,
		       r->seconds > 0 ? (double)r->raw_bytes / 1048576.0 / r->seconds : 0.0,
		       r->marked ? "; marked verified" : a->no_mark ? "; not marked (--no-mark)" :
		       unwritable ? "; not marked (read-only root)" : "; not marked");
	} else if (r->bad) {
		printf("step %" PRIu64 ": FAILED: tensor '%s' chunk %u (rank %u, file %s, offset %" PRIu64
		       "): %s\n", r->step, r->bad_tensor, r->bad_chunk, r->bad_rank, r->bad_file,
		       r->bad_offset, msg);
	} else {
		printf("step %s: FAILED: %s\n", sname, msg);
	}
	free(r);
	if (rc)
		fprintf(stderr, "ckpt-inspect: verify: %s\n", msg);
}

static int cmd_verify(const struct args *a)
{
	if (a->npos > 1)
		return tool_usage("verify takes at most one STEP");
	const char *which = a->npos ? a->pos[0] : "latest";
	bool all = !strcmp(which, "all");
	uint64_t step = 0;
	if (!all && parse_step(which, &step))
		return EXIT_USAGE;
	ckpt_ctx *c;
	bool unwritable;
	int rc = open_for(a, !a->no_mark, true, &c, &unwritable);
	if (rc)
		return -rc;
	/* The steps to verify, by number: all committed ones, or the newest for latest,
	 * so that the report names the step it verified even when the verify fails. */
	struct ckpt_step_info *steps = NULL;
	int n = 1;
	bool known = step != CKPT_LATEST;
	if (all || !known) {
		n = ckpt_steps(c, 0, NULL, 0, sizeof *steps);
		int cap = n;
		steps = n >= 0 ? calloc((size_t)n + 1, sizeof *steps) : NULL;
		if (n < 0 || !steps || (n = ckpt_steps(c, 0, steps, (size_t)cap, sizeof *steps)) < 0) {
			int x = fail(n < 0 ? n : -ENOMEM, "verify");
			free(steps);
			ckpt_close(c);
			return x;
		}
		if (n > cap)        /* the job committed more since the count */
			n = cap;
		if (!all && n > 0) {
			step = steps[n - 1].step;
			known = true;
		}
		if (!all)
			n = 1;      /* latest of a root without steps: the library says why */
	}
	if (a->json) {
		tool_json_claim();
		printf("{\"steps\":[");
	}
	int worst = 0, nbad = 0;
	char first_msg[1024] = "";
	for (int i = 0; i < n; i++) {
		struct verify_out out;
		verify_one(a, c, all ? steps[i].step : step, all || known, unwritable, i == 0, &out);
		if (out.rc) {
			if (!nbad++)
				snprintf(first_msg, sizeof first_msg, "%s", out.msg);
			if (!worst || out.rc == CKPT_ENOTFOUND)
				worst = out.rc;
		}
	}
	int x = worst == CKPT_ENOTFOUND && !all ? EXIT_NOSTEP : (worst ? EXIT_FAIL : EXIT_OK);
	if (a->json) {
		printf("],\"ok\":%s,\"failed\":%d", nbad ? "false" : "true", nbad);
		if (nbad) {
			char msg[1100];
			if (nbad == 1)
				snprintf(msg, sizeof msg, "%s", first_msg);
			else
				snprintf(msg, sizeof msg, "%d steps failed; the first: %s", nbad, first_msg);
			tool_json_fail_fields(stdout, msg, worst, x);
		}
		printf("}\n");
	} else if (all && n == 0) {
		printf("(no committed steps)\n");
	}
	free(steps);
	ckpt_close(c);
	return x;
}

/* ------------------------------------------------------------------ diff */

struct diff_side {
	ckpt_load *l;
	int n;
};

/* Largest slab of a saved box that diff reads from each step at once. */
#define DIFF_SLAB_BYTES (64u << 20)

/* The saved box (offset, extent) that holds chunk ch of tensor ti, read from both
 * steps (from ranks ch->rank and rank2 where the copy is a rank's), rows of its
 * first dimension a slab at a time: the same bytes? A blob is read whole. */
static int diff_box_bytes(ckpt_load *l1, ckpt_load *l2, const struct ckpt_tensor_info *ti,
                          bool blob, const struct ckpt_chunk_info *ch, uint32_t rank2,
                          bool *same)
{
	bool own = ti->policy == CKPT_RANK_BOUND || blob;
	int ranks[2] = { own ? (int)ch->rank : -1, own ? (int)rank2 : -1 };
	size_t esz = ckpt_dtype_size(ti->dtype);
	uint64_t row = esz, rows = ti->ndim ? ch->box_extent[0] : 1;
	for (unsigned d = 1; d < ti->ndim; d++)
		row *= ch->box_extent[d];
	if (blob) {
		row = 0;
		for (int k = 0; k < 2; k++) {
			size_t len = 0;
			int rc = ckpt_load_blob_rank(k ? l2 : l1, ti->name, ranks[k], NULL, 0, &len);
			if (rc && rc != -ENOSPC)
				return rc;
			row = len > row ? len : row;
		}
		rows = 1;
	}
	uint64_t per = row && row < DIFF_SLAB_BYTES ? DIFF_SLAB_BYTES / row : 1;
	size_t cap = (size_t)((per < rows ? per : rows) * row);
	uint8_t *b1 = malloc(cap ? cap : 1), *b2 = malloc(cap ? cap : 1);
	int rc = b1 && b2 ? 0 : -ENOMEM;
	*same = true;
	for (uint64_t r = 0; !rc && *same && r < rows; r += per) {
		uint64_t n = rows - r < per ? rows - r : per;
		uint64_t off[CKPT_MAX_NDIM], ext[CKPT_MAX_NDIM];
		memcpy(off, ch->box_offset, sizeof off);
		memcpy(ext, ch->box_extent, sizeof ext);
		if (ti->ndim) {
			off[0] += r;
			ext[0] = n;
		}
		size_t len1 = 0, len2 = 0;
		if (blob) {
			rc = ckpt_load_blob_rank(l1, ti->name, ranks[0], b1, cap, &len1);
			if (!rc)
				rc = ckpt_load_blob_rank(l2, ti->name, ranks[1], b2, cap, &len2);
			*same = !rc && len1 == len2 && !memcmp(b1, b2, len1);
			continue;
		}
		struct ckpt_load_req q = { .name = ti->name, .dtype = ti->dtype, .ndim = ti->ndim,
		                           .offset = off, .extent = ext, .dst = b1,
		                           .mem = CKPT_MEM_HOST, .saved_rank = ranks[0] };
		rc = ckpt_load_tensors(l1, &q, 1, NULL);
		q.dst = b2;
		q.saved_rank = ranks[1];
		if (!rc)
			rc = ckpt_load_tensors(l2, &q, 1, NULL);
		*same = !rc && !memcmp(b1, b2, (size_t)(n * row));
	}
	free(b1);
	free(b2);
	return rc;
}

/*
 * Same metadata and the same chunks (placement within the box, lengths and hashes)?
 * Hashes taken in two ways (a step saved before format 5 beside one saved after,
 * docs/format.md §5) do not compare: the boxes that hold such chunks are then read
 * from both steps and their bytes compared.
 */
static int diff_same(ckpt_load *l1, unsigned i1, ckpt_load *l2, unsigned i2, bool *same)
{
	struct ckpt_tensor_info a, b;
	int rc = ckpt_load_info(l1, i1, &a, sizeof a);
	if (!rc)
		rc = ckpt_load_info(l2, i2, &b, sizeof b);
	if (rc)
		return rc;
	*same = a.kind == b.kind && a.dtype == b.dtype && a.policy == b.policy && a.ndim == b.ndim &&
	        !memcmp(a.global_shape, b.global_shape, sizeof a.global_shape) &&
	        a.nchunks == b.nchunks;
	if (!*same)
		return 0;
	struct ckpt_chunk_info *x = NULL, *y = NULL;
	int nx, ny;
	bool *read = NULL;      /* chunk k's box is read: its hashes do not compare */
	if (!(rc = get_chunks(l1, i1, &x, &nx)) && !(rc = get_chunks(l2, i2, &y, &ny))) {
		*same = nx == ny;
		if (*same && !(read = calloc((size_t)nx + 1, sizeof *read)))
			rc = -ENOMEM;
		for (int k = 0; !rc && *same && k < nx; k++) {
			*same = x[k].raw_len == y[k].raw_len && x[k].raw_offset == y[k].raw_offset &&
			        !memcmp(x[k].box_offset, y[k].box_offset, sizeof x[k].box_offset) &&
			        !memcmp(x[k].box_extent, y[k].box_extent, sizeof x[k].box_extent);
			read[k] = x[k].hash_blocks != y[k].hash_blocks;
			if (*same && !read[k])
				*same = !memcmp(x[k].hash, y[k].hash, 16);
		}
		/* Each box that holds such a chunk, once (a box's chunks are consecutive). */
		int blob = ckpt_load_is_blob(l1, i1);
		if (!rc && blob < 0)
			rc = blob;
		for (int k = 0; !rc && *same && k < nx; k++)
			if (read[k] && (k == 0 || !read[k - 1] || x[k].rank != x[k - 1].rank ||
			                memcmp(x[k].box_offset, x[k - 1].box_offset,
			                       sizeof x[k].box_offset)))
				rc = diff_box_bytes(l1, l2, &a, blob == 1, &x[k], y[k].rank, same);
	}
	free(read);
	free(x);
	free(y);
	return rc;
}

static int cmd_diff(const struct args *a)
{
	if (a->npos != 2)
		return tool_usage("diff needs two steps");
	uint64_t s1, s2;
	if (parse_step(a->pos[0], &s1) || parse_step(a->pos[1], &s2))
		return EXIT_USAGE;
	ckpt_ctx *c;
	bool unwritable;
	int rc = open_for(a, false, false, &c, &unwritable);
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
		if (!(lists[k] = calloc((size_t)(n1 + n2) + 1, sizeof *lists[k])))
			rc = -ENOMEM;
	struct doc d = { 0 };
	if (!rc && doc_open(&d, a->json))
		rc = -ENOMEM;
	int i = 0, j = 0;
	while (!rc && (i < n1 || j < n2)) {
		struct ckpt_tensor_info x, y;
		int cmp;
		if (i < n1 && (rc = ckpt_load_info(l1, (unsigned)i, &x, sizeof x)))
			break;
		if (j < n2 && (rc = ckpt_load_info(l2, (unsigned)j, &y, sizeof y)))
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
		FILE *f = d.f;
		if (a->json) {
			fprintf(f, "{\"ok\":true,\"from\":%" PRIu64 ",\"to\":%" PRIu64, ckpt_load_step(l1),
			        ckpt_load_step(l2));
			for (int k = 0; k < 4; k++) {
				fprintf(f, ",\"%s\":[", names[k]);
				for (int m = 0; m < cnt[k]; m++) {
					fputs(m ? "," : "", f);
					tool_json_str(f, lists[k][m]);
				}
				fprintf(f, "]");
			}
			fprintf(f, "}\n");
		} else {
			fprintf(f, "step %" PRIu64 " -> step %" PRIu64 "\n", ckpt_load_step(l1),
			        ckpt_load_step(l2));
			for (int k = 0; k < 3; k++)
				for (int m = 0; m < cnt[k]; m++)
					fprintf(f, "%c %s\n", marks[k], lists[k][m]);
			fprintf(f, "%d added, %d removed, %d changed, %d unchanged\n", cnt[ADDED],
			        cnt[REMOVED], cnt[CHANGED], cnt[UNCHANGED]);
		}
		doc_emit(&d);
	} else {
		doc_drop(&d);
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
	if (a->npos)
		return tool_usage("gc takes no positional argument");
	ckpt_ctx *c;
	bool unwritable;
	int rc = open_for(a, true, false, &c, &unwritable);
	if (rc)
		return -rc;
	struct ckpt_gc_opts o;
	ckpt_gc_opts_init(&o, sizeof o);
	o.keep_last = a->keep_last;
	o.keep_every = a->keep_every;
	o.keep_seconds = a->keep_seconds;
	o.min_age_s = a->min_age;
	o.flags = (a->dry_run ? CKPT_GC_DRY_RUN : 0) | (a->unrecorded ? CKPT_GC_UNRECORDED : 0);
	struct gc_out g = { a, 0 };
	o.report = gc_report;
	o.arg = &g;
	struct ckpt_gc_result r = { .size = sizeof r };
	/* Streamed: each removal is printed (and flushed) as it happens, so that the
	 * output of a gc that is killed half-way still says what went. */
	if (a->json) {
		tool_json_claim();
		printf("{\"dry_run\":%s,\"removed\":[", a->dry_run ? "true" : "false");
	}
	rc = ckpt_catalog_gc(c, &o, &r);
	char b[32];
	if (a->json) {
		printf("],\"ok\":%s,\"steps_removed\":%" PRIu64 ",\"bytes_freed\":%" PRIu64
		       ",\"steps_kept\":%" PRIu64 ",\"steps_unrecorded\":%" PRIu64, rc ? "false" : "true",
		       r.steps_removed, r.bytes_freed, r.steps_kept, r.steps_unrecorded);
		if (rc) {
			char msg[1024];
			snprintf(msg, sizeof msg, "gc: %s", ckpt_last_error());
			tool_json_fail_fields(stdout, msg, rc, exit_for(rc));
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
	if (a->npos)
		return tool_usage("rebuild takes no positional argument");
	int x = check_root_dir(a->root);
	if (x)
		return x;
	ckpt_ctx *c;
	/* RECOVER: a lost manifest is recreated, a damaged one set aside first. */
	int rc = open_root(a, CKPT_OPEN_RECOVER, &c);
	if (rc)
		return fail(rc, a->root);
	struct rb_out o = { a, 0 };
	struct ckpt_rebuild_result r = { .size = sizeof r };
	if (a->json) {
		tool_json_claim();
		printf("{\"steps\":[");
	}
	rc = ckpt_catalog_rebuild(c, a->merge ? CKPT_REBUILD_MERGE : 0, rebuild_report, &o, &r);
	if (a->json) {
		printf("],\"ok\":%s,\"committed\":%" PRIu64 ",\"present\":%" PRIu64
		       ",\"not_committed\":%" PRIu64, rc ? "false" : "true", r.steps_committed,
		       r.steps_present, r.steps_unproven);
		if (rc) {
			char msg[1024];
			snprintf(msg, sizeof msg, "rebuild: %s", ckpt_last_error());
			tool_json_fail_fields(stdout, msg, rc, exit_for(rc));
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
	bool zero_ok = !strcmp(opt, "--min-age");
	if (tool_parse_u64_range(v, zero_ok ? 0 : 1, UINT64_MAX, out)) {
		tool_usage("%s '%s': a %s integer (decimal digits only)", opt, v,
		           zero_ok ? "non-negative" : "positive");
		return -1;
	}
	return 0;
}

/* --keep-seconds: seconds, or a number with a unit s, m, h, d (90m, 2h, 7d). */
static int parse_duration(const char *opt, const char *v, uint64_t *out)
{
	static const struct { char unit; uint64_t s; } units[] = {
		{ 's', 1 }, { 'm', 60 }, { 'h', 3600 }, { 'd', 86400 },
	};
	size_t n = strlen(v);
	uint64_t mul = 1;
	char num[32];
	for (size_t k = 0; n > 1 && k < sizeof units / sizeof *units; k++)
		if (v[n - 1] == units[k].unit) {
			mul = units[k].s;
			n--;
		}
	if (n == 0 || n >= sizeof num) {
		tool_usage("%s '%s': a positive number of seconds, or with a unit s, m, h, d", opt, v);
		return -1;
	}
	memcpy(num, v, n);
	num[n] = '\0';
	uint64_t x;
	if (tool_parse_u64_range(num, 1, UINT64_MAX / mul, &x)) {
		tool_usage("%s '%s': a positive number of seconds, or with a unit s, m, h, d", opt, v);
		return -1;
	}
	*out = x * mul;
	return 0;
}

int main(int argc, char **argv)
{
	tool_init("ckpt-inspect", NULL);
	tool_version(argc, argv);
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
			usage(stdout);
			return EXIT_OK;
		}
	}
	static const struct option opts[] = {
		{ "json", no_argument, 0, 'j' }, { "all", no_argument, 0, 'a' },
		{ "chunks", no_argument, 0, 'c' }, { "dry-run", no_argument, 0, 'n' },
		{ "no-mark", no_argument, 0, 'N' }, { "merge", no_argument, 0, 'm' },
		{ "quiet", no_argument, 0, 'q' },
		{ "keep-last", required_argument, 0, 'L' }, { "keep-every", required_argument, 0, 'E' },
		{ "min-age", required_argument, 0, 'A' }, { "help", no_argument, 0, 'h' },
		{ "unrecorded", no_argument, 0, 'U' },
		{ "keep-seconds", required_argument, 0, 'S' },
		{ "manifest-dir", required_argument, 0, 'M' },
		{ 0, 0, 0, 0 },
	};
	/* --json anywhere: every error, usage errors included, is then a JSON object. */
	bool json = tool_scan_has(argc, argv, 3, opts, 'j');
	for (int i = 1; i < argc && i < 3; i++)
		json |= !strcmp(argv[i], "--json");
	tool_set_json(json);
	if (argc < 3) {
		usage(stderr);
		return tool_usage("usage: ckpt-inspect ROOT COMMAND [options]");
	}
	struct args a;
	memset(&a, 0, sizeof a);
	a.root = argv[1];
	a.cmd = argv[2];
	a.json = json;
	/* Which options each command accepts. */
	static const struct { const char *cmd, *opts; } allowed[] = {
		{ "list", "jaM" }, { "show", "jcM" }, { "verify", "jNqM" }, { "diff", "jM" },
		{ "gc", "jnLESAUM" }, { "rebuild", "jmM" },
	};
	const char *ok = NULL;
	for (size_t k = 0; k < sizeof allowed / sizeof *allowed; k++)
		if (!strcmp(a.cmd, allowed[k].cmd)) {
			ok = allowed[k].opts;
			tool_set_op(allowed[k].cmd);
		}
	if (!ok) {
		char q[256];
		usage(stderr);
		return tool_usage("unknown command '%s'", tool_quote(a.cmd, q, sizeof q));
	}
	/* Options after the command: getopt sees argv[2..] (argv[2] stands for the
	 * program name), as tool_scan_has did. */
	int sargc = argc - 2;
	char **sargv = argv + 2;
	optind = 0;
	opterr = 0;
	int ch, idx;
	while ((ch = getopt_long(sargc, sargv, ":", opts, &idx)) != -1) {
		if (ch == '?' || ch == ':')
			return tool_getopt_error(ch, sargv, opts);
		if (!strchr(ok, ch))
			return tool_usage("%s does not take --%s", a.cmd, opts[idx].name);
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
		case 'S': if (parse_duration("--keep-seconds", optarg, &a.keep_seconds)) return EXIT_USAGE; break;
		case 'M':
			/* The library refuses it too; said here as the usage error it is. */
			if (optarg[0] != '/') {
				char q[256];
				return tool_usage("--manifest-dir '%s': an absolute path",
				                  tool_quote(optarg, q, sizeof q));
			}
			a.manifest_dir = optarg;
			break;
		}
	}
	for (; optind < sargc; optind++) {
		if (a.npos == 2) {
			char q[256];
			return tool_usage("too many arguments ('%s')", tool_quote(sargv[optind], q, sizeof q));
		}
		a.pos[a.npos++] = sargv[optind];
	}
	if (!strcmp(a.cmd, "list")) {
		if (a.npos)
			return tool_usage("list takes no positional argument");
		return cmd_list(&a);
	}
	if (!strcmp(a.cmd, "show"))    return cmd_show(&a);
	if (!strcmp(a.cmd, "verify"))  return cmd_verify(&a);
	if (!strcmp(a.cmd, "diff"))    return cmd_diff(&a);
	if (!strcmp(a.cmd, "gc"))      return cmd_gc(&a);
	return cmd_rebuild(&a);
}
