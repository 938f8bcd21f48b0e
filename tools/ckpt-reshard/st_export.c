/*
 * safetensors.c — ckpt-reshard --export-safetensors: the consolidated tensors of a
 * step in one safetensors file (8-byte little-endian header length, a JSON header
 * of {name: {dtype, shape, data_offsets}}, then the data, row-major, in header
 * order), loadable by the safetensors library.
 *
 * Streamed with bounded memory: the header is computed from the catalog alone, then
 * each tensor is read in slabs of whole rows along its first dimension, as many as
 * fit the buffer (--buffer, at least one row), and appended. The file is written
 * under a temporary name and renamed into place only when complete, so a failed
 * export never leaves a file that parses but holds partial data.
 *
 * The header is JSON, which must be UTF-8: a tensor whose name is not (possible only
 * in a checkpoint saved before the library required UTF-8 names) is refused by
 * name, before anything is written, rather than mapped to another name that would
 * no longer say which tensor it is.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "reshard.h"
#include "toolutil.h"

static const char *st_dtype(int dtype)
{
	switch (dtype) {
	case CKPT_F64:     return "F64";
	case CKPT_F32:     return "F32";
	case CKPT_F16:     return "F16";
	case CKPT_BF16:    return "BF16";
	case CKPT_F8_E4M3: return "F8_E4M3";
	case CKPT_F8_E5M2: return "F8_E5M2";
	case CKPT_I64:     return "I64";
	case CKPT_I32:     return "I32";
	case CKPT_I16:     return "I16";
	case CKPT_I8:      return "I8";
	case CKPT_U8:      return "U8";
	case CKPT_BOOL:    return "BOOL";
	default:           return NULL;
	}
}

struct st_item {
	unsigned idx;                 /* entry in the load catalog */
	struct ckpt_tensor_info ti;
	uint64_t bytes, begin;
};

static int st_write_all(FILE *f, const void *p, size_t n, const char *path)
{
	if (n && fwrite(p, 1, n, f) != n) {
		int e = errno ? errno : EIO;
		return tool_fail(RX_FAIL, -e, "export: write %s: %s", path, strerror(e));
	}
	return 0;
}

/* Stream tensor it into f through buf (cap bytes, grown to one row if needed). */
static int st_stream(ckpt_load *l, const struct st_item *it, FILE *f, const char *path,
                     uint8_t **buf, size_t *cap, struct tool_progress *p, uint64_t *done,
                     uint64_t total)
{
	const struct ckpt_tensor_info *t = &it->ti;
	size_t esize = ckpt_dtype_size(t->dtype);
	uint64_t rows = t->ndim ? t->global_shape[0] : 1, row = esize;
	for (unsigned d = 1; d < t->ndim; d++)
		row *= t->global_shape[d];
	if (!it->bytes)
		return 0;
	if (row > *cap) {
		uint8_t *n = row <= SIZE_MAX ? realloc(*buf, (size_t)row) : NULL;
		if (!n)
			return tool_fail(RX_FAIL, -ENOMEM, "export: '%s': one row of %" PRIu64 " bytes "
			                 "does not fit in memory", t->name, row);
		*buf = n;
		*cap = (size_t)row;
	}
	uint64_t per = *cap / row;
	uint64_t off[CKPT_MAX_NDIM] = { 0 }, ext[CKPT_MAX_NDIM];
	for (unsigned d = 0; d < t->ndim; d++)
		ext[d] = t->global_shape[d];
	for (uint64_t r = 0; r < rows; r += per) {
		uint64_t k = rows - r < per ? rows - r : per;
		if (t->ndim) {
			off[0] = r;
			ext[0] = k;
		}
		int rc = ckpt_load_tensor(l, t->name, t->dtype, t->ndim, off, ext, *buf, CKPT_MEM_HOST);
		if (rc)
			return tool_fail(reshard_exit_for(rc), rc, "export: %s", ckpt_last_error(NULL));
		if (st_write_all(f, *buf, (size_t)(k * row), path))
			return -1;
		*done += k * row;
		tool_progress_update(p, *done, total);
	}
	return 0;
}

int reshard_export_safetensors(const struct reshard_args *a)
{
	ckpt_ctx *c = NULL;
	ckpt_load *l = NULL;
	struct st_item *items = NULL;
	char *hdr = NULL;
	size_t hlen = 0;
	FILE *f = NULL;
	uint8_t *buf = NULL;
	char tmp[4200], q[300];
	bool progress = false;
	struct tool_progress p;
	snprintf(tmp, sizeof tmp, "%s.tmp-%d", a->export_file, (int)getpid());
	/* Every failure below reports itself (tool_fail) and sets x to its exit code. */
	int x = reshard_open_source(a, &c);
	if (x)
		goto out;
	int rc = ckpt_load_open(c, a->latest ? CKPT_LATEST : a->step, &l);
	if (rc) {
		x = tool_fail(reshard_exit_for(rc), rc, "%s", ckpt_last_error(NULL));
		goto out;
	}
	int n = ckpt_load_count(l);
	items = n >= 0 ? calloc((size_t)n + 1, sizeof *items) : NULL;
	if (!items) {
		x = tool_fail(RX_FAIL, n < 0 ? n : -ENOMEM, "export: the step's catalog: %s",
		              n < 0 ? ckpt_last_error(NULL) : "out of memory");
		goto out;
	}
	size_t ni = 0, nskip = 0;
	uint64_t total = 0;
	/* Blobs are opaque bytes and rank-bound items have no consolidated value: neither
	 * is a tensor of the exported model; both are reported as skipped. */
	for (int i = 0; i < n; i++) {
		struct st_item *it = &items[ni];
		if ((rc = ckpt_load_info(l, (unsigned)i, &it->ti))) {
			x = tool_fail(RX_FAIL, rc, "export: %s", ckpt_last_error(NULL));
			goto out;
		}
		bool skip = ckpt_load_is_blob(l, (unsigned)i) != 0 || it->ti.policy == CKPT_RANK_BOUND ||
		            (a->kind && it->ti.kind != a->kind);
		if (skip) {
			if (!(a->kind && it->ti.kind != a->kind)) {
				nskip++;
				if (!a->json && !a->quiet)
					fprintf(stderr, "ckpt-reshard: skipping '%s' (%s)\n",
					        tool_quote(it->ti.name, q, sizeof q),
					        ckpt_load_is_blob(l, (unsigned)i) ? "a blob" : "rank-bound");
			}
			continue;
		}
		if (!tool_utf8_ok(it->ti.name)) {
			x = tool_fail(RX_FAIL, CKPT_ENAME, "export: tensor '%s': its name is not valid "
			              "UTF-8 (saved before names had to be), and a safetensors header is "
			              "JSON, which must be; nothing was written (--kind can leave it out)",
			              tool_quote(it->ti.name, q, sizeof q));
			goto out;
		}
		it->idx = (unsigned)i;
		uint64_t e = 1;
		for (unsigned d = 0; d < it->ti.ndim; d++)
			e *= it->ti.global_shape[d];
		it->bytes = e * ckpt_dtype_size(it->ti.dtype);
		it->begin = total;
		total += it->bytes;
		ni++;
	}
	FILE *hf = open_memstream(&hdr, &hlen);
	if (!hf) {
		x = tool_fail(RX_FAIL, -ENOMEM, "export: the header: out of memory");
		goto out;
	}
	fprintf(hf, "{\"__metadata__\":{\"format\":\"pt\",\"libckpt_step\":\"%" PRIu64 "\"}",
	        ckpt_load_step(l));
	for (size_t i = 0; i < ni; i++) {
		const struct st_item *it = &items[i];
		fputc(',', hf);
		tool_json_str(hf, it->ti.name);
		fprintf(hf, ":{\"dtype\":\"%s\",\"shape\":[", st_dtype(it->ti.dtype));
		for (unsigned d = 0; d < it->ti.ndim; d++)
			fprintf(hf, "%s%" PRIu64, d ? "," : "", it->ti.global_shape[d]);
		fprintf(hf, "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}", it->begin,
		        it->begin + it->bytes);
	}
	fputc('}', hf);
	/* Pad with spaces so that the data starts 8-byte aligned (the format allows it,
	 * and readers that mmap the file expect it). */
	long pos = ftell(hf);
	while (pos > 0 && (pos + 8) % 8) {
		fputc(' ', hf);
		pos++;
	}
	if (fclose(hf) || !hdr) {
		x = tool_fail(RX_FAIL, -ENOMEM, "export: the header: out of memory");
		goto out;
	}
	/* Weights are often confidential: the file is private, as the checkpoint's own
	 * files are (group-readable with CKPT_GROUP_ACCESS=1, as theirs). */
	const char *ga = getenv("CKPT_GROUP_ACCESS");
	int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC,
	              ga && !strcmp(ga, "1") ? 0640 : 0600);
	f = fd >= 0 ? fdopen(fd, "wb") : NULL;
	if (!f) {
		int e = errno;
		if (fd >= 0)
			close(fd);
		x = tool_fail(RX_FAIL, -e, "export: create %s: %s", tmp, strerror(e));
		goto out;
	}
	uint8_t le[8];
	for (int b = 0; b < 8; b++)
		le[b] = (uint8_t)((uint64_t)hlen >> (8 * b));
	if ((x = st_write_all(f, le, 8, tmp)) || (x = st_write_all(f, hdr, hlen, tmp)))
		goto out;
	uint64_t want = a->buffer ? a->buffer : 64u << 20;
	size_t cap = (size_t)want;
	buf = malloc(cap);
	if (!buf) {
		x = tool_fail(RX_FAIL, -ENOMEM, "export: --buffer of %" PRIu64 " bytes: out of memory",
		              want);
		goto out;
	}
	tool_progress_start(&p, "export", a->quiet || a->json);
	progress = true;
	uint64_t done = 0;
	double t0 = tool_now();
	for (size_t i = 0; i < ni; i++) {
		/* st_stream reports its own failure; its code is an exit code or rc. */
		int r = st_stream(l, &items[i], f, tmp, &buf, &cap, &p, &done, total);
		if (r) {
			x = r > 0 ? r : RX_FAIL;
			goto out;
		}
	}
	tool_progress_end(&p);
	progress = false;
	if (fflush(f) || fsync(fileno(f))) {
		int e = errno;
		x = tool_fail(RX_FAIL, -e, "export: write %s: %s", tmp, strerror(e));
		goto out;
	}
	fclose(f);
	f = NULL;
	if (rename(tmp, a->export_file)) {
		int e = errno;
		x = tool_fail(RX_FAIL, -e, "export: rename to %s: %s", a->export_file, strerror(e));
		goto out;
	}
	double dt = tool_now() - t0;
	char b1[32];
	if (a->json) {
		printf("{\"op\":\"export\",\"ok\":true,\"file\":");
		tool_json_str(stdout, a->export_file);
		printf(",\"step\":%" PRIu64 ",\"tensors\":%zu,\"skipped\":%zu,\"bytes\":%" PRIu64
		       ",\"header_bytes\":%zu,\"seconds\":%.6f}\n", ckpt_load_step(l), ni, nskip, total,
		       hlen, dt);
	} else {
		printf("exported step %" PRIu64 ": %zu tensors, %s to %s in %.3f s (%zu skipped)\n",
		       ckpt_load_step(l), ni, tool_bytes(total, b1), a->export_file, dt, nskip);
	}
	x = RX_OK;
out:
	if (progress)
		tool_progress_end(&p);
	if (f)
		fclose(f);
	if (x != RX_OK)
		unlink(tmp);
	free(buf);
	free(hdr);
	free(items);
	ckpt_load_close(l);
	ckpt_close(c);
	return x;
}
