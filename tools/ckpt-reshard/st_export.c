/*
 * st_export.c — ckpt-reshard --export-safetensors DIR: the consolidated model
 * tensors of a step as Hugging Face saves them — model.safetensors, or
 * model-00001-of-0000N.safetensors split by --max-shard-size, and
 * model.safetensors.index.json naming the file of every tensor — so that
 * from_pretrained loads the directory.
 *
 * Each file is safetensors: 8-byte little-endian header length, a JSON header of
 * {name: {dtype, shape, data_offsets}} (offsets contiguous, in header order) and a
 * __metadata__ of strings, padded with spaces to 8 bytes, then the data, row-major.
 *
 * Streamed with bounded memory: the headers are computed from the catalog alone,
 * then each tensor is read in slabs of whole rows along its first dimension, as
 * many as fit the buffer (--buffer, at least one row), cast when --dtype asks, and
 * appended. Every file is written under a temporary name and renamed into place
 * only when all are complete, the index last, so a failed export leaves no file
 * that parses but holds partial data.
 *
 * Names go through --name-map, else the built-in rule (st.h); a header is JSON,
 * which must be UTF-8, so a name that is not (possible only in a checkpoint saved
 * before the library required UTF-8 names) is refused by name, before anything is
 * written, as are two tensors that would get one name.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "reshard.h"
#include "st.h"
#include "toolutil.h"

#define ST_DEFAULT_SHARD 5000000000ull   /* transformers' save_pretrained: "5GB" */

struct st_item {
	struct ckpt_tensor_info ti;
	char    *out;                 /* the Hugging Face name */
	int      dtype;               /* written dtype (ti.dtype unless cast) */
	uint64_t elems, bytes, begin; /* bytes as written; begin within its file's data */
	unsigned file;
};

struct st_file {
	char     name[64], tmp[128];
	size_t   first, n;            /* items[first .. first + n) */
	uint64_t bytes;
	bool     created, renamed;
};

static int write_all(FILE *f, const void *p, size_t n, const char *path)
{
	if (n && fwrite(p, 1, n, f) != n) {
		int e = errno ? errno : EIO;
		return tool_fail(RX_FAIL, -e, "export: write %s: %s", path, strerror(e));
	}
	return 0;
}

struct stream {
	ckpt_load *l;
	uint8_t   *buf, *cbuf;
	size_t     cap, ccap;
	struct tool_progress p;
	uint64_t   done, total;
};

static int grow(uint8_t **b, size_t *cap, uint64_t want, const char *name)
{
	if (want <= *cap)
		return 0;
	uint8_t *n = want <= SIZE_MAX ? realloc(*b, (size_t)want) : NULL;
	if (!n)
		return tool_fail(RX_FAIL, -ENOMEM, "export: '%s': %" PRIu64 " bytes of rows do not "
		                 "fit in memory", name, want);
	*b = n;
	*cap = (size_t)want;
	return 0;
}

/* Stream item it into f through the buffer (grown to one row if needed). */
static int stream_item(struct stream *s, const struct st_item *it, FILE *f, const char *path)
{
	const struct ckpt_tensor_info *t = &it->ti;
	size_t esize = ckpt_dtype_size(t->dtype), osize = ckpt_dtype_size(it->dtype);
	uint64_t rows = t->ndim ? t->global_shape[0] : 1, row = 1;
	for (unsigned d = 1; d < t->ndim; d++)
		row *= t->global_shape[d];
	if (!it->bytes)
		return 0;
	if (grow(&s->buf, &s->cap, row * esize, t->name))
		return -1;
	uint64_t per = s->cap / (row * esize);
	if (it->dtype != t->dtype && grow(&s->cbuf, &s->ccap, per * row * osize, t->name))
		return -1;
	uint64_t off[CKPT_MAX_NDIM] = { 0 }, ext[CKPT_MAX_NDIM];
	for (unsigned d = 0; d < t->ndim; d++)
		ext[d] = t->global_shape[d];
	for (uint64_t r = 0; r < rows; r += per) {
		uint64_t k = rows - r < per ? rows - r : per;
		if (t->ndim) {
			off[0] = r;
			ext[0] = k;
		}
		int rc = ckpt_load_tensor(s->l, t->name, t->dtype, t->ndim, off, ext, s->buf,
		                          CKPT_MEM_HOST);
		if (rc)
			return tool_fail(reshard_exit_for(rc), rc, "export: %s", ckpt_last_error());
		const uint8_t *w = s->buf;
		if (it->dtype != t->dtype) {
			st_convert(t->dtype, it->dtype, s->buf, s->cbuf, (size_t)(k * row));
			w = s->cbuf;
		}
		if (write_all(f, w, (size_t)(k * row * osize), path))
			return -1;
		s->done += k * row * osize;
		tool_progress_update(&s->p, s->done, s->total);
	}
	return 0;
}

/* The header of file fi: its length in *hlen (a multiple of 8), or NULL. */
static char *make_header(const struct st_file *fi, const struct st_item *items, uint64_t step,
                         size_t *hlen)
{
	char *hdr = NULL;
	FILE *hf = open_memstream(&hdr, hlen);
	if (!hf)
		return NULL;
	fprintf(hf, "{\"__metadata__\":{\"format\":\"pt\",\"libckpt_step\":\"%" PRIu64 "\"}", step);
	for (size_t i = fi->first; i < fi->first + fi->n; i++) {
		const struct st_item *it = &items[i];
		fputc(',', hf);
		tool_json_str(hf, it->out);
		fprintf(hf, ":{\"dtype\":\"%s\",\"shape\":[", st_dtype_name(it->dtype));
		for (unsigned d = 0; d < it->ti.ndim; d++)
			fprintf(hf, "%s%" PRIu64, d ? "," : "", it->ti.global_shape[d]);
		fprintf(hf, "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}", it->begin,
		        it->begin + it->bytes);
	}
	fputc('}', hf);
	/* Spaces up to a multiple of 8, so that the data starts 8-byte aligned (the
	 * format allows the padding; readers that mmap the file expect it). */
	for (long pos = ftell(hf); pos > 0 && pos % 8; pos++)
		fputc(' ', hf);
	if (fclose(hf)) {
		free(hdr);
		return NULL;
	}
	return hdr;
}

/* Weights are often confidential: the files are private, as the checkpoint's own
 * files are (group-readable with CKPT_GROUP_ACCESS=1, as theirs). */
static mode_t file_mode(void)
{
	const char *ga = getenv("CKPT_GROUP_ACCESS");
	return ga && !strcmp(ga, "1") ? 0640 : 0600;
}

static FILE *create(int dfd, const char *name, const char *dir)
{
	int fd = openat(dfd, name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW,
	                file_mode());
	FILE *f = fd >= 0 ? fdopen(fd, "wb") : NULL;
	if (!f) {
		int e = errno;
		if (fd >= 0)
			close(fd);
		tool_fail(RX_FAIL, -e, "export: create %s/%s: %s", dir, name, strerror(e));
	}
	return f;
}

static int finish(FILE *f, const char *dir, const char *name)
{
	if (fflush(f) || fsync(fileno(f))) {
		int e = errno;
		fclose(f);
		return tool_fail(RX_FAIL, -e, "export: write %s/%s: %s", dir, name, strerror(e));
	}
	fclose(f);
	return 0;
}

static int item_cmp(const void *x, const void *y)
{
	return strcmp(((const struct st_item *)x)->out, ((const struct st_item *)y)->out);
}

/* DIR, created private when missing; an export already there is not overwritten
 * (a stale model.safetensors beside new shards would be loaded instead of them). */
static int open_dir(const char *dir, int *dfd)
{
	if (mkdir(dir, 0700) < 0 && errno != EEXIST)
		return tool_fail(RX_FAIL, -errno, "export: mkdir %s: %s", dir, strerror(errno));
	*dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (*dfd < 0)
		return tool_fail(RX_FAIL, -errno, "export: %s: %s", dir, strerror(errno));
	DIR *d = fdopendir(dup(*dfd));
	if (!d)
		return tool_fail(RX_FAIL, -errno, "export: %s: %s", dir, strerror(errno));
	struct dirent *de;
	int x = 0;
	while (!x && (de = readdir(d))) {
		if (!strcmp(de->d_name, "model.safetensors") ||
		    !strcmp(de->d_name, "model.safetensors.index.json") ||
		    !fnmatch("model-*-of-*.safetensors", de->d_name, 0))
			x = tool_fail(RX_EXISTS, -EEXIST, "export: %s already holds %s: export into "
			              "another directory, or remove the old export first", dir,
			              de->d_name);
	}
	closedir(d);
	return x;
}

int reshard_export_safetensors(const struct reshard_args *a)
{
	ckpt_ctx *c = NULL;
	struct st_item *items = NULL;
	struct st_file *files = NULL;
	struct st_namemap map = { 0 };
	struct stream s = { 0 };
	size_t ni = 0, nf = 0, nskip = 0;
	bool progress = false;
	int dfd = -1;
	char q[300], q2[300];
	const char *dir = a->export_dir;
	/* Every failure below reports itself (tool_fail) and sets x to its exit code. */
	int x = a->name_map ? st_namemap_load(a->name_map, false, &map) : 0;
	if (x || (x = reshard_open_source(a, &c)))
		goto out;
	int rc = ckpt_load_open(c, a->latest ? CKPT_LATEST : a->step, &s.l);
	if (rc) {
		x = tool_fail(reshard_exit_for(rc), rc, "%s", ckpt_last_error());
		goto out;
	}
	int n = ckpt_load_count(s.l);
	items = n >= 0 ? calloc((size_t)n + 1, sizeof *items) : NULL;
	if (!items) {
		x = tool_fail(RX_FAIL, n < 0 ? n : -ENOMEM, "export: the step's catalog: %s",
		              n < 0 ? ckpt_last_error() : "out of memory");
		goto out;
	}
	unsigned kinds = a->kinds ? a->kinds : 1u << CKPT_KIND_MODEL;
	for (int i = 0; i < n; i++) {
		struct st_item *it = &items[ni];
		if ((rc = ckpt_load_info(s.l, (unsigned)i, &it->ti, sizeof it->ti))) {
			x = tool_fail(RX_FAIL, rc, "export: %s", ckpt_last_error());
			goto out;
		}
		if (it->ti.kind < 1 || it->ti.kind > 31 || !(kinds & (1u << it->ti.kind)))
			continue;
		/* Blobs are opaque bytes and rank-bound items have no consolidated value:
		 * neither is a tensor of the exported model; both are reported as skipped. */
		bool blob = ckpt_load_is_blob(s.l, (unsigned)i) != 0;
		if (blob || it->ti.policy == CKPT_RANK_BOUND) {
			nskip++;
			if (!a->json && !a->quiet)
				fprintf(stderr, "ckpt-reshard: skipping '%s' (%s)\n",
				        tool_quote(it->ti.name, q, sizeof q), blob ? "a blob" : "rank-bound");
			continue;
		}
		if (!tool_utf8_ok(it->ti.name)) {
			x = tool_fail(RX_NAME, CKPT_ENAME, "export: tensor '%s': its name is not valid "
			              "UTF-8 (saved before names had to be), and a safetensors header is "
			              "JSON, which must be; nothing was written (--name-map can rename "
			              "it, --kind can leave it out)", tool_quote(it->ti.name, q, sizeof q));
			goto out;
		}
		const char *m = st_namemap_get(&map, false, it->ti.name);
		it->out = m ? strdup(m) : st_export_name(it->ti.name, it->ti.kind);
		ni++;
		if (!it->out) {
			x = tool_fail(RX_FAIL, -ENOMEM, "export: out of memory");
			goto out;
		}
		if (!strcmp(it->out, "__metadata__")) {
			x = tool_fail(RX_NAME, CKPT_ENAME, "export: tensor '%s' would be named "
			              "__metadata__, the key safetensors keeps for metadata (--name-map "
			              "can rename it)", tool_quote(it->ti.name, q, sizeof q));
			goto out;
		}
		it->dtype = a->cast && st_dtype_is_float(it->ti.dtype) ? a->cast : it->ti.dtype;
		it->elems = 1;
		for (unsigned d = 0; d < it->ti.ndim; d++)
			it->elems *= it->ti.global_shape[d];
		it->bytes = it->elems * ckpt_dtype_size(it->dtype);
		s.total += it->bytes;
	}
	qsort(items, ni, sizeof *items, item_cmp);
	for (size_t i = 1; i < ni; i++) {
		if (strcmp(items[i - 1].out, items[i].out))
			continue;
		x = tool_fail(RX_NAME, CKPT_ENAME, "export: tensors '%s' and '%s' would both be named "
		              "'%s'; nothing was written (--name-map can rename one)",
		              tool_quote(items[i - 1].ti.name, q, sizeof q),
		              tool_quote(items[i].ti.name, q2, sizeof q2), items[i].out);
		goto out;
	}
	/* Shards as huggingface_hub splits a state dict: in order, a new file when the
	 * next tensor would pass the limit, a tensor larger than the limit alone. */
	uint64_t limit = a->max_shard ? a->max_shard : ST_DEFAULT_SHARD;
	files = calloc(ni + 1, sizeof *files);
	if (!files) {
		x = tool_fail(RX_FAIL, -ENOMEM, "export: out of memory");
		goto out;
	}
	for (size_t i = 0; i < ni; i++) {
		struct st_file *cur = nf ? &files[nf - 1] : NULL;
		if (!cur || (cur->n && (items[i].bytes > limit || cur->bytes + items[i].bytes > limit)) ||
		    (cur->n && cur->bytes > limit)) {
			cur = &files[nf++];
			cur->first = i;
		}
		items[i].begin = cur->bytes;
		items[i].file = (unsigned)(cur - files);
		cur->bytes += items[i].bytes;
		cur->n++;
	}
	if (!nf)
		nf = 1;   /* no tensor: one empty file, which loads as an empty state dict */
	for (size_t k = 0; k < nf; k++) {
		if (nf == 1)
			snprintf(files[k].name, sizeof files[k].name, "model.safetensors");
		else
			snprintf(files[k].name, sizeof files[k].name, "model-%05zu-of-%05zu.safetensors",
			         k + 1, nf);
		snprintf(files[k].tmp, sizeof files[k].tmp, ".%s.tmp-%d", files[k].name, (int)getpid());
	}
	if ((x = open_dir(dir, &dfd)))
		goto out;
	s.cap = (size_t)(a->buffer ? a->buffer : 64u << 20);
	if (!(s.buf = malloc(s.cap))) {
		x = tool_fail(RX_FAIL, -ENOMEM, "export: --buffer of %zu bytes: out of memory", s.cap);
		goto out;
	}
	tool_progress_start(&s.p, "export", a->quiet || a->json);
	progress = true;
	double t0 = tool_now();
	uint64_t step = ckpt_load_step(s.l), header_bytes = 0;
	for (size_t k = 0; k < nf; k++) {
		struct st_file *fi = &files[k];
		size_t hlen = 0;
		char *hdr = make_header(fi, items, step, &hlen);
		if (!hdr) {
			x = tool_fail(RX_FAIL, -ENOMEM, "export: the header of %s: out of memory", fi->name);
			goto out;
		}
		header_bytes += hlen;
		FILE *f = create(dfd, fi->tmp, dir);
		if (!f) {
			free(hdr);
			x = RX_FAIL;
			goto out;
		}
		fi->created = true;
		uint8_t le[8];
		for (int b = 0; b < 8; b++)
			le[b] = (uint8_t)((uint64_t)hlen >> (8 * b));
		x = write_all(f, le, 8, fi->tmp);
		x = x ? x : write_all(f, hdr, hlen, fi->tmp);
		free(hdr);
		for (size_t i = fi->first; !x && i < fi->first + fi->n; i++) {
			/* stream_item reports its own failure; its code is an exit code or -1. */
			int r = stream_item(&s, &items[i], f, fi->tmp);
			x = r > 0 ? r : r ? RX_FAIL : 0;
		}
		if (x) {
			fclose(f);
			goto out;
		}
		if ((x = finish(f, dir, fi->tmp)))
			goto out;
	}
	tool_progress_end(&s.p);
	progress = false;
	/* The index, written last: {"metadata": {"total_size"}, "weight_map"}. */
	char itmp[128];
	snprintf(itmp, sizeof itmp, ".model.safetensors.index.json.tmp-%d", (int)getpid());
	FILE *f = create(dfd, itmp, dir);
	if (!f) {
		x = RX_FAIL;
		goto out;
	}
	fprintf(f, "{\n  \"metadata\": {\"total_size\": %" PRIu64 "},\n  \"weight_map\": {", s.total);
	for (size_t i = 0; i < ni; i++) {
		fputs(i ? ",\n    " : "\n    ", f);
		tool_json_str(f, items[i].out);
		fprintf(f, ": \"%s\"", files[items[i].file].name);
	}
	fputs("\n  }\n}\n", f);
	if ((x = finish(f, dir, itmp))) {
		unlinkat(dfd, itmp, 0);
		goto out;
	}
	for (size_t k = 0; k < nf; k++) {
		if (renameat(dfd, files[k].tmp, dfd, files[k].name)) {
			x = tool_fail(RX_FAIL, -errno, "export: rename %s/%s: %s", dir, files[k].name,
			              strerror(errno));
			unlinkat(dfd, itmp, 0);
			goto out;
		}
		files[k].renamed = true;
	}
	if (renameat(dfd, itmp, dfd, "model.safetensors.index.json") || fsync(dfd)) {
		x = tool_fail(RX_FAIL, -errno, "export: %s/model.safetensors.index.json: %s", dir,
		              strerror(errno));
		unlinkat(dfd, itmp, 0);
		goto out;
	}
	double dt = tool_now() - t0;
	char b1[32];
	if (a->json) {
		printf("{\"op\":\"export\",\"ok\":true,\"dir\":");
		tool_json_str(stdout, dir);
		printf(",\"step\":%" PRIu64 ",\"tensors\":%zu,\"skipped\":%zu,\"files\":%zu,\"bytes\":%"
		       PRIu64 ",\"header_bytes\":%" PRIu64 ",\"seconds\":%.6f}\n", step, ni, nskip, nf,
		       s.total, header_bytes, dt);
	} else {
		printf("exported step %" PRIu64 ": %zu tensors, %s in %zu file(s) to %s in %.3f s "
		       "(%zu skipped)\n", step, ni, tool_bytes(s.total, b1), nf, dir, dt, nskip);
	}
	x = RX_OK;
out:
	if (progress)
		tool_progress_end(&s.p);
	for (size_t k = 0; x != RX_OK && files && k < nf; k++) {
		if (files[k].renamed)
			unlinkat(dfd, files[k].name, 0);
		else if (files[k].created)
			unlinkat(dfd, files[k].tmp, 0);
	}
	if (dfd >= 0)
		close(dfd);
	for (size_t i = 0; items && i < ni; i++)
		free(items[i].out);
	free(s.buf);
	free(s.cbuf);
	free(files);
	free(items);
	st_namemap_free(&map);
	ckpt_load_close(s.l);
	ckpt_close(c);
	return x;
}
