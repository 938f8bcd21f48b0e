/*
 * verify.c — end-to-end verification of a committed step (ckpt-inspect verify, and
 * later ckptd's scrubber): every shard file's footer must be the committed one, and
 * every chunk of every rank is read, decompressed and checked against its hash, and
 * (format version 2) every block of it against the shard's block table.
 *
 * The chunks go through ONE io_read_batch over all shard files so that the disk is
 * kept busy (the target is the raw read bandwidth). Only when the batch fails is
 * each chunk not yet delivered re-read on its own, to name the first bad one
 * precisely (the batch's own error names whichever failed first in completion
 * order, which is good for the message but not a stable answer for --json).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "glue.h"

void ckpt_verify_opts_init(struct ckpt_verify_opts *o, size_t size)
{
	if (!o || size < sizeof(size_t))
		return;
	struct ckpt_verify_opts d;
	memset(&d, 0, sizeof d);
	d.size = size;
	memcpy(o, &d, size < sizeof d ? size : sizeof d);
}

struct verify_state {
	const struct io_read_req *base;
	uint8_t         *delivered;       /* per request */
	uint64_t         done, total;
	ckpt_progress_fn progress;
	void            *arg;
};

static int verify_chunk_cb(void *arg, const struct io_read_req *req, uint64_t off,
                           const void *raw, size_t len)
{
	CKPT_UNUSED(off);
	CKPT_UNUSED(raw);
	struct verify_state *v = arg;
	v->delivered[req - v->base] = 1;
	v->done += len;
	if (v->progress && v->progress(v->arg, v->done, v->total))
		return ckpt_err(-ECANCELED, "verify cancelled by the caller");
	return 0;
}

/* The footer in the file must be the index the manifest committed. A record that
 * names the footer (hash and place, what commits write) is checked by
 * load_footer_open; one that carries a copy of the index is compared byte for byte
 * (the reader has checked the trailer: magic, version, footer hash). */
static int verify_footer(ckpt_load *l, uint32_t r)
{
	if (!l->shards[r].index_len || glue_remote(l->ctx)) {
		struct io_shard_reader *named;
		int rc = load_footer_open(l, r, &named);
		if (!rc)
			io_shard_reader_close(named);
		return rc;
	}
	char path[4400];
	snprintf(path, sizeof path, "%s/%s", l->ctx->cfg.root, l->shards[r].path);
	struct io_shard_reader *rd;
	int rc = io_shard_reader_open(NULL, path, NULL, &rd);
	if (rc)
		return rc;
	uint64_t off = io_shard_reader_index(rd)->data_end;
	io_shard_reader_close(rd);
	size_t len = l->shards[r].index_len;
	uint8_t *buf = ckpt_malloc(len ? len : 1);
	if (!buf)
		return ckpt_err(-ENOMEM, "%s: footer", path);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	size_t got = 0;
	while (fd >= 0 && got < len) {
		ssize_t n = pread(fd, buf + got, len - got, (off_t)(off + got));
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		got += (size_t)n;
	}
	if (fd < 0)
		rc = ckpt_err(-errno, "open %s", path);
	else if (got != len || memcmp(buf, l->shards[r].index, len))
		rc = ckpt_err(CKPT_ECORRUPT, "%s: the footer at offset %llu is not the index committed "
		              "for rank %u (file replaced or damaged)", path, (unsigned long long)off, r);
	if (fd >= 0)
		close(fd);
	ckpt_free(buf);
	return rc;
}

/* Find the first chunk (in request order) of those not delivered that fails alone. */
static void verify_locate(struct io_engine *eng, ckpt_load *l, const struct io_read_req *reqs,
                          size_t n, struct verify_state *v, struct ckpt_verify_result *res)
{
	for (size_t i = 0; i < n; i++) {
		if (v->delivered[i])
			continue;
		if (!io_read_batch(eng, &reqs[i], 1, verify_chunk_cb))
			continue;
		const struct io_shard_index *ix = io_shard_reader_index(reqs[i].reader);
		const struct io_chunk_entry *ch = &ix->chunks[reqs[i].chunk];
		res->bad = 1;
		res->bad_rank = ix->rank;
		res->bad_chunk = reqs[i].chunk;
		res->bad_offset = ch->file_offset;
		snprintf(res->bad_tensor, sizeof res->bad_tensor, "%s", ix->tensors[ch->tensor].name);
		snprintf(res->bad_file, sizeof res->bad_file, "%s",
		         load_chunk_file(l, ix->rank, reqs[i].chunk));
		return;
	}
}

static int verify_step(ckpt_ctx *c, ckpt_load *l, const struct ckpt_verify_opts *o,
                       struct ckpt_verify_result *res)
{
	uint32_t world = l->rec.world;
	size_t n = 0;
	int rc;
	for (uint32_t r = 0; r < world; r++) {
		if ((rc = verify_footer(l, r)))
			return rc;
		n += l->ix[r]->nchunks;
	}
	struct io_read_req *reqs = ckpt_calloc(n ? n : 1, sizeof *reqs);
	struct verify_state v = { .progress = o->progress, .arg = o->arg };
	v.delivered = ckpt_calloc(n ? n : 1, 1);
	if (!reqs || !v.delivered) {
		ckpt_free(reqs);
		ckpt_free(v.delivered);
		return ckpt_err(-ENOMEM, "verify of %zu chunks", n);
	}
	v.base = reqs;
	struct io_engine *eng;
	if ((rc = load_engine_acquire(c, &eng))) {
		ckpt_free(reqs);
		ckpt_free(v.delivered);
		return rc;
	}
	size_t k = 0;
	for (uint32_t r = 0; r < world && !rc; r++) {
		struct io_shard_reader *rd;
		if ((rc = load_shard_reader(l, r, &rd)))
			break;
		const struct io_shard_index *ix = l->ix[r];
		for (uint32_t i = 0; i < ix->nchunks; i++) {
			/* Whole chunks, and their block hashes against the block table: a bad
			 * table is found here rather than by a later partial load. */
			reqs[k++] = (struct io_read_req){ .reader = rd, .chunk = i, .arg = &v,
			                                  .flags = IO_READ_CHECK_BLOCKS };
			v.total += ix->chunks[i].raw_len;
			res->stored_bytes += ix->chunks[i].stored_len;
		}
	}
	if (!rc)
		rc = io_read_batch(eng, reqs, n, verify_chunk_cb);
	if (rc && rc != -ECANCELED) {
		char msg[1024];
		snprintf(msg, sizeof msg, "%s", ckpt_err_msg());
		verify_locate(eng, l, reqs, k, &v, res);
		ckpt_err_restore(msg);
	}
	load_engine_release(c);
	res->chunks = 0;
	for (size_t i = 0; i < k; i++)
		res->chunks += v.delivered[i];
	res->raw_bytes = v.done;
	ckpt_free(reqs);
	ckpt_free(v.delivered);
	return rc;
}

int ckpt_catalog_verify(ckpt_ctx *c, uint64_t step, const struct ckpt_verify_opts *uo,
                        struct ckpt_verify_result *ures)
{
	if (!c)
		return ckpt_err(-EINVAL, "ckpt_catalog_verify: context is NULL");
	CKPT_LOG_SCOPE(&c->log, CKPT_LOG_NO_STEP);
	struct ckpt_verify_opts o;
	ckpt_verify_opts_init(&o, sizeof o);
	if (uo) {
		if (uo->size < sizeof(size_t) || uo->size > sizeof o)
			return ckpt_err(-EINVAL, "ckpt_catalog_verify: options size %zu", uo->size);
		memcpy(&o, uo, uo->size);
	}
	if (ures && ures->size < sizeof(size_t))
		return ckpt_err(-EINVAL, "ckpt_catalog_verify: result size %zu", ures->size);
	struct ckpt_verify_result *res = ckpt_calloc(1, sizeof *res);
	if (!res)
		return ckpt_err(-ENOMEM, "verify");
	uint64_t t0 = ckpt_now_ns();
	ckpt_load *l = NULL;
	int rc = ckpt_load_open(c, step, &l);
	if (!rc) {
		res->step = l->rec.step;
		rc = verify_step(c, l, &o, res);
		if (rc)
			ckpt_err_prefix(rc, "verify of step %llu", (unsigned long long)l->rec.step);
	}
	/* Trust is recorded only by the manifest's owner, and only for a clean pass. */
	if (!rc && !(o.flags & CKPT_VERIFY_NO_MARK) && glue_is_coordinator(c)) {
		rc = manifest_set_trust(c->manifest, res->step, CKPT_TRUST_VERIFIED);
		if (rc)
			ckpt_err_prefix(rc, "verify of step %llu: recording the trust level",
			                (unsigned long long)res->step);
		else
			res->marked = 1;
	}
	ckpt_load_close(l);
	res->seconds = (double)(ckpt_now_ns() - t0) / 1e9;
	if (ures) {
		size_t sz = ures->size < sizeof *res ? ures->size : sizeof *res;
		res->size = ures->size;
		memcpy(ures, res, sz);
	}
	ckpt_free(res);
	return rc;
}
