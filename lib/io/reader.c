/*
 * reader.c — the shard reader: open and verify a shard file, and read chunks in
 * batches with many reads in flight over any number of files (docs/format.md §6).
 *
 * Opening without an index trusts nothing in the file: the trailer is checked
 * (magic, version, self-hash) before its footer offset and length are used, those
 * are bounds-checked against the file size before the footer is read, the footer
 * is checked against its hash before it is decoded, and the decoder checks every
 * field. Opening with an index (from the manifest, already decoded and checked)
 * only checks that the file holds the data the index describes.
 *
 * A batch read goes: O_DIRECT read of the chunk's 4 KiB-rounded stored bytes into
 * a pool buffer -> decompression (zstd, bytegroup) into a second buffer when compressed ->
 * XXH3-128 of the raw bytes against the index -> the caller's callback. Hashing
 * and decompression of one chunk overlap the reads of the others.
 *
 * A request for part of a chunk that has block hashes (format version 2) reads
 * only the run of blocks that covers the part, in one I/O, and checks each block
 * against the block table before the callback sees a byte. The table is read,
 * checked against the hash the index gives for it, and decoded once per reader,
 * when a request first needs it; a reader that only ever reads whole chunks never
 * reads it.
 *
 * A chunk of a format-4 shard may be a reference: its bytes lie in an earlier
 * step's shard file (docs/format.md §3b), which the reader opens on first need, from
 * the same root, and holds to the index's entry (its header's step, rank and save
 * id) before it reads from it. Everything else is the same as for a chunk of the
 * file itself: the same hash and block checks, against the referencing index; the
 * messages name both files.
 *
 * Threads: a reader belongs to the thread that owns its engine.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "io/io_internal.h"

struct io_shard_reader {
	struct io_engine *e;
	int               fd;
	char             *path;
	uint64_t          file_size;
	const struct io_shard_index *ix;
	struct io_shard_index *owned;     /* decoded from the file, or NULL (borrowed) */
	bool              have_footer;    /* footer read from the file and its hash checked */
	uint8_t           footer_hash[CKPT_HASH_BYTES];
	/* The block table, loaded on first need (io_shard_reader_load_blocks). */
	int               blocks_rc;      /* its answer once tried: 0 or the error */
	bool              blocks_tried;
	char             *blocks_msg;     /* the error's message, repeated to later callers */
	uint8_t          *blocks_buf;     /* the table as read */
	const uint8_t    *blocks;         /* its hashes (inside blocks_buf) */
	uint64_t         *first_block;    /* per chunk: index of its first block hash */
	struct io_read_stats stats;
	io_fetch_fn       fetch;          /* non-NULL: bytes come from it, not from fd */
	void             *fetch_arg;
	struct rd_ref    *refs;           /* [ix->nfiles]: referenced files, opened on need */
};

/* A file that references of this shard point into (format 4). */
struct rd_ref {
	bool     tried;
	int      rc;                      /* the open's answer, repeated to later callers */
	int      fd;
	uint64_t size;
	char    *name;                    /* "PATH (referenced by PATH)", for messages */
	char    *msg;
};

static int open_file(const char *path, int *fd)
{
	*fd = open(path, O_RDONLY | O_CLOEXEC | O_DIRECT);
	if (*fd < 0 && errno == EINVAL) {
		ckpt_log(CKPT_LOG_INFO, "%s: O_DIRECT refused, using buffered reads", path);
		*fd = open(path, O_RDONLY | O_CLOEXEC);
	}
	return *fd < 0 ? ckpt_err(-errno, "open shard file %s", path) : 0;
}

/* Synchronous aligned read of [off, off+len) (open-time metadata only). */
static int read_at(const struct io_shard_reader *r, void *buf, size_t len, uint64_t off)
{
	if (r->fetch)
		return r->fetch(r->fetch_arg, buf, len, off);
	size_t done = 0;
	while (done < len) {
		ssize_t n = pread(r->fd, (uint8_t *)buf + done, len - done, (off_t)(off + done));
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return ckpt_err(-errno, "read %s at offset %llu", r->path,
			                (unsigned long long)(off + done));
		if (n == 0)
			return ckpt_err(CKPT_EFORMAT, "%s: end of file at offset %llu (truncated?)",
			                r->path, (unsigned long long)(off + done));
		done += (size_t)n;
	}
	return 0;
}

static int check_header(const struct io_shard_reader *r, const uint8_t *h, uint64_t *step)
{
	if (memcmp(h, IO_HEADER_MAGIC, IO_MAGIC_BYTES))
		return ckpt_err(CKPT_EFORMAT, "%s: no shard header (bad magic)", r->path);
	uint32_t v = ckpt_get_le32(h + IO_HDR_OFF_VERSION);
	if (v > IO_FORMAT_VERSION)
		return ckpt_err(CKPT_EVERSION, "%s: header version %u, this build reads <= %u",
		                r->path, v, IO_FORMAT_VERSION);
	if (ckpt_get_le64(h + IO_HDR_OFF_HASH) != XXH3_64bits(h, IO_HDR_OFF_HASH))
		return ckpt_err(CKPT_ECORRUPT, "%s: header block hash mismatch", r->path);
	if (v == 0 || ckpt_get_le32(h + IO_HDR_OFF_LEN) != IO_HEADER_BYTES)
		return ckpt_err(CKPT_EFORMAT, "%s: header version %u or length %u invalid", r->path,
		                v, ckpt_get_le32(h + IO_HDR_OFF_LEN));
	*step = ckpt_get_le64(h + IO_HDR_OFF_STEP);
	return 0;
}

struct trailer {
	uint64_t footer_off, footer_len, step;
	uint8_t  footer_hash[CKPT_HASH_BYTES];
};

static int check_trailer(const char *path, uint64_t file_size, const uint8_t *t,
                         struct trailer *out)
{
	if (memcmp(t, IO_TRAILER_MAGIC, IO_MAGIC_BYTES))
		return ckpt_err(CKPT_EFORMAT, "%s: no shard trailer at end of file (%llu bytes): "
		                "truncated or unfinished", path,
		                (unsigned long long)file_size);
	/* Version before the self-hash: a newer trailer may put its hash elsewhere. */
	uint32_t v = ckpt_get_le32(t + IO_TRL_OFF_VERSION);
	if (v > IO_FORMAT_VERSION)
		return ckpt_err(CKPT_EVERSION, "%s: trailer version %u, this build reads <= %u",
		                path, v, IO_FORMAT_VERSION);
	if (ckpt_get_le64(t + IO_TRL_HASHED) != XXH3_64bits(t, IO_TRL_HASHED))
		return ckpt_err(CKPT_ECORRUPT, "%s: trailer hash mismatch", path);
	if (v == 0 || ckpt_get_le32(t + IO_TRL_OFF_FLAGS))
		return ckpt_err(CKPT_EFORMAT, "%s: trailer version %u or flags 0x%x invalid",
		                path, v, ckpt_get_le32(t + IO_TRL_OFF_FLAGS));
	out->footer_off = ckpt_get_le64(t + IO_TRL_OFF_FOOTER);
	out->footer_len = ckpt_get_le64(t + IO_TRL_OFF_FLEN);
	out->step = ckpt_get_le64(t + IO_TRL_OFF_STEP);
	memcpy(out->footer_hash, t + IO_TRL_OFF_FHASH, CKPT_HASH_BYTES);
	/* The footer lies between the header block and the trailer, aligned. */
	if (out->footer_off < IO_HEADER_BYTES || out->footer_off % CKPT_ALIGN ||
	    out->footer_len == 0 || out->footer_len > IO_MAX_FOOTER_BYTES ||
	    !ckpt_range_ok(out->footer_off, out->footer_len, file_size - IO_TRAILER_BYTES))
		return ckpt_err(CKPT_EFORMAT, "%s: footer [%llu, +%llu) outside the file "
		                "(%llu bytes) or misaligned", path,
		                (unsigned long long)out->footer_off,
		                (unsigned long long)out->footer_len,
		                (unsigned long long)file_size);
	return 0;
}

int io_shard_trailer_check(const char *path, uint64_t file_size, uint64_t footer_off,
                           uint64_t footer_len, const uint8_t footer_hash[CKPT_HASH_BYTES])
{
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0)
		return ckpt_err(errno == ENOENT ? CKPT_ECORRUPT : -errno, "%s: %s", path,
		                errno == ENOENT ? "no such shard file" : ckpt_strerror(-errno));
	struct stat st;
	uint8_t t[IO_TRAILER_BYTES];
	int rc = 0;
	if (fstat(fd, &st) < 0)
		rc = ckpt_err(-errno, "stat %s", path);
	else if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size != file_size ||
	         file_size < IO_HEADER_BYTES + CKPT_ALIGN)
		rc = ckpt_err(CKPT_ECORRUPT, "%s: %lld bytes, not the %llu of the shard voted for",
		              path, (long long)st.st_size, (unsigned long long)file_size);
	else {
		ssize_t n;
		do
			n = pread(fd, t, sizeof t, (off_t)(file_size - IO_TRAILER_BYTES));
		while (n < 0 && errno == EINTR);
		if (n != (ssize_t)sizeof t)
			rc = ckpt_err(n < 0 ? -errno : CKPT_ECORRUPT, "%s: read its trailer", path);
	}
	close(fd);
	struct trailer tr;
	if (!rc && !(rc = check_trailer(path, file_size, t, &tr)) &&
	    (tr.footer_off != footer_off || tr.footer_len != footer_len ||
	     memcmp(tr.footer_hash, footer_hash, CKPT_HASH_BYTES)))
		rc = ckpt_err(CKPT_ECORRUPT, "%s: its trailer names another footer (offset %llu, "
		              "%llu bytes) than the one voted for (offset %llu, %llu bytes, or another "
		              "hash)", path, (unsigned long long)tr.footer_off,
		              (unsigned long long)tr.footer_len, (unsigned long long)footer_off,
		              (unsigned long long)footer_len);
	return rc;
}

/* Read and verify header, trailer and footer; decode the index. */
static int load_index(struct io_shard_reader *r)
{
	if (r->file_size < IO_HEADER_BYTES + CKPT_ALIGN || r->file_size % CKPT_ALIGN)
		return ckpt_err(CKPT_EFORMAT, "%s: size %llu is not a shard file's (truncated?)",
		                r->path, (unsigned long long)r->file_size);
	uint8_t *blk = io_aligned_alloc(CKPT_ALIGN);
	if (!blk)
		return ckpt_err(-ENOMEM, "%s: reading trailer", r->path);
	struct trailer tr;
	uint64_t hstep = 0;
	int rc = read_at(r, blk, CKPT_ALIGN, r->file_size - CKPT_ALIGN);
	if (!rc)
		rc = check_trailer(r->path, r->file_size, blk + CKPT_ALIGN - IO_TRAILER_BYTES, &tr);
	if (!rc)
		rc = read_at(r, blk, IO_HEADER_BYTES, 0);
	if (!rc)
		rc = check_header(r, blk, &hstep);
	uint32_t hrank = rc ? 0 : ckpt_get_le32(blk + IO_HDR_OFF_RANK);
	uint32_t hworld = rc ? 0 : ckpt_get_le32(blk + IO_HDR_OFF_WORLD);
	uint32_t hversion = rc ? 0 : ckpt_get_le32(blk + IO_HDR_OFF_VERSION);
	uint64_t hsave = hversion >= 3 ? ckpt_get_le64(blk + IO_HDR_OFF_SAVE_ID) : 0;
	ckpt_free(blk);
	if (rc)
		return rc;
	/* footer_off + footer_len <= size - 64 and size is aligned: this stays inside. */
	size_t rlen = (size_t)ckpt_align_up(tr.footer_len, CKPT_ALIGN);
	uint8_t *f = io_aligned_alloc(rlen);
	if (!f)
		return ckpt_err(-ENOMEM, "%s: footer of %llu bytes", r->path,
		                (unsigned long long)tr.footer_len);
	rc = read_at(r, f, rlen, tr.footer_off);
	uint8_t h[CKPT_HASH_BYTES];
	if (!rc) {
		io_hash128(f, (size_t)tr.footer_len, h);
		memcpy(r->footer_hash, h, CKPT_HASH_BYTES);
		r->have_footer = true;
		if (memcmp(h, tr.footer_hash, CKPT_HASH_BYTES))
			rc = ckpt_err(CKPT_ECORRUPT, "%s: footer hash mismatch (offset %llu, %llu bytes)",
			              r->path, (unsigned long long)tr.footer_off,
			              (unsigned long long)tr.footer_len);
	}
	if (!rc && (rc = io_index_decode(f, (size_t)tr.footer_len, &r->owned)))
		ckpt_err_prefix(rc, "%s: footer", r->path);
	ckpt_free(f);
	if (rc)
		return rc;
	const struct io_shard_index *ix = r->owned;
	if (ix->step != tr.step || ix->step != hstep || ix->rank != hrank ||
	    ix->world != hworld || ix->data_end != tr.footer_off || ix->save_id != hsave)
		return ckpt_err(CKPT_EFORMAT, "%s: header, footer and trailer disagree (step %llu/"
		                "%llu/%llu, rank %u/%u, world %u/%u, data_end %llu/footer %llu, save "
		                "id %016llx/%016llx)",
		                r->path, (unsigned long long)hstep, (unsigned long long)ix->step,
		                (unsigned long long)tr.step, hrank, ix->rank, hworld, ix->world,
		                (unsigned long long)ix->data_end,
		                (unsigned long long)tr.footer_off, (unsigned long long)hsave,
		                (unsigned long long)ix->save_id);
	r->ix = ix;
	return 0;
}

void io_shard_reader_close(struct io_shard_reader *r)
{
	if (!r)
		return;
	if (r->fd >= 0)
		close(r->fd);
	if (r->refs) {
		for (uint32_t f = 0; f < r->ix->nfiles; f++) {
			if (r->refs[f].fd >= 0)
				close(r->refs[f].fd);
			ckpt_free(r->refs[f].name);
			ckpt_free(r->refs[f].msg);
		}
		ckpt_free(r->refs);
	}
	io_index_free(r->owned);
	ckpt_free(r->blocks_msg);
	ckpt_free(r->blocks_buf);
	ckpt_free(r->first_block);
	ckpt_free(r->path);
	ckpt_free(r);
}

/* A reader of name with no source yet (fd -1, no fetch): NULL on failure. */
static struct io_shard_reader *reader_new(struct io_engine *e, const char *name)
{
	struct io_shard_reader *r = ckpt_calloc(1, sizeof *r);
	if (!r || !(r->path = ckpt_strdup(name))) {
		ckpt_free(r);
		ckpt_err(-ENOMEM, "%s: reader", name);
		return NULL;
	}
	r->e = e;
	r->fd = -1;
	return r;
}

/* Once the source and its size are known: the index from the file's own footer, or
 * the given one (borrowed) held to the size. On failure r is closed. */
static int reader_finish(struct io_shard_reader *r, const struct io_shard_index *index,
                         struct io_shard_reader **out)
{
	int rc = 0;
	if (!index)
		rc = load_index(r);
	else if (r->file_size < index->data_end)
		rc = ckpt_err(CKPT_ECORRUPT, "%s: %llu bytes, the index needs %llu (truncated)",
		              r->path, (unsigned long long)r->file_size,
		              (unsigned long long)index->data_end);
	else
		r->ix = index;
	if (!rc && r->ix->nfiles) {
		if (!(r->refs = ckpt_calloc(r->ix->nfiles, sizeof *r->refs)))
			rc = ckpt_err(-ENOMEM, "%s: %u referenced files", r->path, r->ix->nfiles);
		for (uint32_t f = 0; !rc && f < r->ix->nfiles; f++)
			r->refs[f].fd = -1;
	}
	if (rc) {
		io_shard_reader_close(r);
		return rc;
	}
	*out = r;
	return 0;
}

int io_shard_reader_open(struct io_engine *e, const char *path,
                         const struct io_shard_index *index, struct io_shard_reader **out)
{
	*out = NULL;
	struct io_shard_reader *r = reader_new(e, path);
	if (!r)
		return -ENOMEM;
	int rc = open_file(path, &r->fd);
	struct stat st;
	if (!rc && fstat(r->fd, &st) < 0)
		rc = ckpt_err(-errno, "stat %s", path);
	if (!rc && !S_ISREG(st.st_mode))
		rc = ckpt_err(CKPT_EFORMAT, "%s: not a regular file", path);
	if (rc) {
		io_shard_reader_close(r);
		return rc;
	}
	r->file_size = (uint64_t)st.st_size;
	return reader_finish(r, index, out);
}

int io_shard_reader_open_fetch(struct io_engine *e, const char *name, uint64_t file_size,
                               const struct io_shard_index *index, io_fetch_fn fetch,
                               void *arg, struct io_shard_reader **out)
{
	*out = NULL;
	struct io_shard_reader *r = reader_new(e, name);
	if (!r)
		return -ENOMEM;
	r->fetch = fetch;
	r->fetch_arg = arg;
	r->file_size = file_size;
	return reader_finish(r, index, out);
}

const struct io_shard_index *io_shard_reader_index(const struct io_shard_reader *r)
{
	return r->ix;
}

int io_shard_reader_footer_hash(const struct io_shard_reader *r, uint8_t out[CKPT_HASH_BYTES])
{
	if (!r->have_footer)
		return -ENODATA;
	memcpy(out, r->footer_hash, CKPT_HASH_BYTES);
	return 0;
}

struct io_shard_index *io_shard_reader_take_index(struct io_shard_reader *r)
{
	struct io_shard_index *ix = r->owned;
	r->owned = NULL;                  /* still borrowed by the reader from here on */
	return ix;
}

const char *io_shard_reader_path(const struct io_shard_reader *r) { return r->path; }

void io_shard_reader_stats(const struct io_shard_reader *r, struct io_read_stats *out)
{
	*out = r->stats;
}

static int blocks_load(struct io_shard_reader *r)
{
	const struct io_shard_index *ix = r->ix;
	if (!ix->blocks_len)
		return 0;                 /* version 1, or no chunk long enough for blocks */
	unsigned long long off = (unsigned long long)ix->blocks_offset;
	/* The decoder put [offset, +len) inside [4096, data_end), and the open checked
	 * that the file holds data_end bytes; data_end is aligned, so is the read. */
	size_t rlen = (size_t)ckpt_align_up(ix->blocks_len, CKPT_ALIGN);
	if (!(r->blocks_buf = io_aligned_alloc(rlen)))
		return ckpt_err(-ENOMEM, "%s: block table of %llu bytes", r->path,
		                (unsigned long long)ix->blocks_len);
	int rc = read_at(r, r->blocks_buf, rlen, ix->blocks_offset);
	if (rc == CKPT_EFORMAT)       /* end of file inside it: the file is damaged */
		return ckpt_err(CKPT_ECORRUPT, "%s: block table at offset %llu: file ends early",
		                r->path, off);
	if (rc)
		return rc;
	r->stats.table_bytes += rlen;
	uint8_t h[CKPT_HASH_BYTES];
	io_hash128(r->blocks_buf, (size_t)ix->blocks_len, h);
	if (memcmp(h, ix->blocks_hash, CKPT_HASH_BYTES))
		return ckpt_err(CKPT_ECORRUPT, "%s: block table at offset %llu (%llu bytes): hash "
		                "mismatch", r->path, off, (unsigned long long)ix->blocks_len);
	if ((rc = io_blocks_decode(ix, r->blocks_buf, (size_t)ix->blocks_len, &r->blocks)))
		return ckpt_err_prefix(rc, "%s: block table at offset %llu", r->path, off);
	if (!(r->first_block = ckpt_malloc((ix->nchunks ? ix->nchunks : 1) * sizeof *r->first_block)))
		return ckpt_err(-ENOMEM, "%s: block table", r->path);
	uint64_t n = 0;
	for (uint32_t k = 0; k < ix->nchunks; k++) {
		r->first_block[k] = n;
		n += io_chunk_nblocks(ix, &ix->chunks[k]);
	}
	return 0;
}

int io_shard_reader_load_blocks(struct io_shard_reader *r)
{
	if (r->blocks_tried) {
		if (r->blocks_rc)
			ckpt_err_restore(r->blocks_msg ? r->blocks_msg : "block table");
		return r->blocks_rc;
	}
	r->blocks_tried = true;
	r->blocks_rc = blocks_load(r);
	if (r->blocks_rc) {
		r->blocks_msg = ckpt_strdup(ckpt_err_msg());
		ckpt_free(r->blocks_buf);
		r->blocks_buf = NULL;
		r->blocks = NULL;
	}
	return r->blocks_rc;
}

int io_shard_reader_chunk_blocks(struct io_shard_reader *r, uint32_t k, const uint8_t **out)
{
	*out = NULL;
	if (k >= r->ix->nchunks)
		return ckpt_err(-EINVAL, "%s: chunk %u of %u", r->path, k, r->ix->nchunks);
	if (!io_chunk_nblocks(r->ix, &r->ix->chunks[k]))
		return 0;
	int rc = io_shard_reader_load_blocks(r);
	if (rc)
		return rc;
	if (!r->blocks)               /* the decoder refuses such an index; checked anyway */
		return ckpt_err(CKPT_EFORMAT, "%s: chunk %u has blocks, the shard no block table",
		                r->path, k);
	*out = r->blocks + r->first_block[k] * CKPT_HASH_BYTES;
	return 0;
}

/* ------------------------------------------------------------------ references */

/* Open referenced file f: <root>/<its shard path>, root being the one this shard
 * lies in (<root>/step-…/rank-….shard), and check that its header is the file the
 * index names (a file replaced under that name is not read from). */
static int ref_open(struct io_shard_reader *r, struct rd_ref *ref, uint32_t f)
{
	const struct io_ref_file *e = &r->ix->files[f];
	if (r->fetch)
		return ckpt_err(CKPT_EFORMAT, "%s: references chunks of step %llu, which a shard "
		                "fetched through ckptd cannot follow", r->path,
		                (unsigned long long)e->step);
	char root[4096], path[4400];
	const char *end = strrchr(r->path, '/');
	while (end && end > r->path && end[-1] != '/')
		end--;                        /* back over the step directory's name */
	size_t n = end && end > r->path ? (size_t)(end - r->path - 1) : 0;
	if (!n || n >= sizeof root)
		return ckpt_err(CKPT_EFORMAT, "%s: not in a step directory of a root: its "
		                "references cannot be followed", r->path);
	memcpy(root, r->path, n);
	root[n] = '\0';
	int rc = ckpt_path_shard(path, sizeof path, root, e->step, e->rank, e->save_id);
	if (rc)
		return ckpt_err(rc, "%s: path of referenced file %u", r->path, f);
	size_t nl = strlen(path) + strlen(r->path) + 32;
	if (!(ref->name = ckpt_malloc(nl)))
		return ckpt_err(-ENOMEM, "%s: referenced file", r->path);
	snprintf(ref->name, nl, "%s, referenced by %s", path, r->path);
	if ((rc = open_file(path, &ref->fd)))
		return rc == -ENOENT
			? ckpt_err(CKPT_ECORRUPT, "%s: referenced file %s is missing", r->path, path)
			: ckpt_err_prefix(rc, "%s: referenced file", r->path);
	struct stat st;
	if (fstat(ref->fd, &st) < 0)
		return ckpt_err(-errno, "stat %s", path);
	ref->size = (uint64_t)st.st_size;
	uint8_t *h = io_aligned_alloc(IO_HEADER_BYTES);
	if (!h)
		return ckpt_err(-ENOMEM, "%s: header", path);
	ssize_t got;
	do
		got = pread(ref->fd, h, IO_HEADER_BYTES, 0);
	while (got < 0 && errno == EINTR);
	uint32_t v = got == (ssize_t)IO_HEADER_BYTES ? ckpt_get_le32(h + IO_HDR_OFF_VERSION) : 0;
	if (got != (ssize_t)IO_HEADER_BYTES || memcmp(h, IO_HEADER_MAGIC, IO_MAGIC_BYTES) ||
	    v == 0 || v > IO_FORMAT_VERSION ||
	    ckpt_get_le64(h + IO_HDR_OFF_HASH) != XXH3_64bits(h, IO_HDR_OFF_HASH) ||
	    ckpt_get_le64(h + IO_HDR_OFF_STEP) != e->step ||
	    ckpt_get_le32(h + IO_HDR_OFF_RANK) != e->rank ||
	    (v >= 3 ? ckpt_get_le64(h + IO_HDR_OFF_SAVE_ID) : 0) != e->save_id)
		rc = ckpt_err(CKPT_ECORRUPT, "%s: referenced file %s is not the shard of step %llu "
		              "rank %u attempt %016llx that it references (header missing, damaged "
		              "or another file's)", r->path, path, (unsigned long long)e->step,
		              e->rank, (unsigned long long)e->save_id);
	ckpt_free(h);
	return rc;
}

/* Where chunk k's bytes are read from: this file, or the referenced file that holds
 * them (opened once; its answer, success or error, holds for later requests). */
static int chunk_src(struct io_shard_reader *r, uint32_t k, int *fd, uint64_t *size,
                     const char **name)
{
	uint32_t f = io_chunk_file(r->ix, k);
	*fd = r->fd;
	*size = r->file_size;
	*name = r->path;
	if (!f)
		return 0;
	struct rd_ref *ref = &r->refs[f - 1];
	if (!ref->tried) {
		ref->tried = true;
		if ((ref->rc = ref_open(r, ref, f - 1)))
			ref->msg = ckpt_strdup(ckpt_err_msg());
	} else if (ref->rc) {
		ckpt_err_restore(ref->msg ? ref->msg : "referenced file");
	}
	if (ref->rc)
		return ref->rc;
	*fd = ref->fd;
	*size = ref->size;
	*name = ref->name;
	return 0;
}

/* The file chunk k's messages name (its source once opened). */
static const char *chunk_name(const struct io_shard_reader *r, uint32_t k)
{
	uint32_t f = io_chunk_file(r->ix, k);
	return f && r->refs[f - 1].name ? r->refs[f - 1].name : r->path;
}

/* ------------------------------------------------------------------ batch reads */

/* Memory for one read or one decompressed chunk: a pool buffer or an aligned
 * allocation (chunks larger than a pool buffer, or an exhausted pool). */
struct rd_mem {
	int   buf;        /* pool index, or -1 */
	void *p;
};

struct rd_slot {
	size_t          req;
	struct rd_mem   in;
	size_t          len;      /* bytes read: stored length (or blocks) rounded to 4 KiB */
	uint64_t        b0, nb;   /* partial read: blocks [b0, b0 + nb); nb 0: whole chunk */
	int64_t         res;
	struct rd_slot *next;     /* in the done queue */
	bool            busy;
};

struct rd_batch {
	struct io_engine *e;
	struct io_pool   *pool;
	const struct io_read_req *reqs;
	struct rd_slot   *slots;
	unsigned          nslots, inflight, nbusy;   /* busy: in flight or done, unprocessed */
	struct rd_slot   *done_head, **done_tail;
	uint8_t          *scratch;                   /* block hashes of a chunk (CHECK_BLOCKS) */
	size_t            scratch_cap;
};

static void mem_release(struct rd_batch *b, struct rd_mem *m)
{
	if (m->buf >= 0)
		io_pool_put(b->pool, (unsigned)m->buf);
	else
		ckpt_free(m->p);
	m->buf = -1;
	m->p = NULL;
}

/* 0 with memory, -EAGAIN when the pool is empty but our reads in flight will
 * refill it, -ENOMEM. Falling back to malloc only when nothing of ours can free a
 * buffer keeps progress certain even when the caller holds the whole pool. */
static int mem_get(struct rd_batch *b, size_t len, bool may_wait, struct rd_mem *m)
{
	m->buf = -1;
	m->p = NULL;
	if (b->pool && len <= io_pool_buf_bytes(b->pool)) {
		int idx = io_pool_get(b->pool, 0);
		if (idx >= 0) {
			m->buf = idx;
			m->p = io_pool_addr(b->pool, (unsigned)idx);
			return 0;
		}
		if (may_wait && b->inflight)
			return -EAGAIN;
	}
	m->p = io_aligned_alloc(len);
	return m->p ? 0 : -ENOMEM;
}

static void rd_done(void *owner, uint64_t cookie, int64_t res)
{
	struct rd_batch *b = owner;
	struct rd_slot *s = &b->slots[cookie];
	s->res = res;
	s->next = NULL;
	*b->done_tail = s;
	b->done_tail = &s->next;
	b->inflight--;
}

static int req_check(const struct io_read_req *q, size_t i)
{
	if (!q->reader)
		return ckpt_err(-EINVAL, "read batch: request %zu has no reader", i);
	const struct io_shard_index *ix = q->reader->ix;
	if (q->chunk >= ix->nchunks)
		return ckpt_err(-EINVAL, "%s: chunk %u of %u", q->reader->path, q->chunk,
		                ix->nchunks);
	const struct io_chunk_entry *c = &ix->chunks[q->chunk];
	if (q->hi && (q->lo >= q->hi || q->hi > c->raw_len))
		return ckpt_err(-EINVAL, "%s: chunk %u: range [%llu, %llu) outside its %llu bytes",
		                q->reader->path, q->chunk, (unsigned long long)q->lo,
		                (unsigned long long)q->hi, (unsigned long long)c->raw_len);
	if (q->flags & ~(unsigned)IO_READ_CHECK_BLOCKS)
		return ckpt_err(-EINVAL, "%s: chunk %u: read flags 0x%x unknown", q->reader->path,
		                q->chunk, q->flags);
	return 0;
}

/* The block table of q's file, loaded if need be; the error names the chunk. */
static int need_blocks(const struct io_read_req *q)
{
	int rc = io_shard_reader_load_blocks(q->reader);
	if (rc) {
		const struct io_shard_index *ix = q->reader->ix;
		ckpt_err_prefix(rc, "tensor '%s' chunk %u", ix->tensors[ix->chunks[q->chunk].tensor].name,
		                q->chunk);
	}
	return rc;
}

/* Which blocks request q reads: *nb 0 for the whole chunk. */
static int rd_blocks(const struct io_read_req *q, uint64_t *b0, uint64_t *nb)
{
	const struct io_shard_index *ix = q->reader->ix;
	const struct io_chunk_entry *c = &ix->chunks[q->chunk];
	uint64_t n = io_chunk_nblocks(ix, c);
	*b0 = *nb = 0;
	if (n && (q->flags & IO_READ_CHECK_BLOCKS))
		return need_blocks(q);
	if (!n || !q->hi)
		return 0;
	uint64_t first = q->lo / ix->block_bytes, last = (q->hi - 1) / ix->block_bytes;
	if (last - first + 1 == n)
		return 0;                 /* every block: the chunk's own hash is cheaper */
	int rc = need_blocks(q);
	if (rc)
		return rc;
	*b0 = first;
	*nb = last - first + 1;
	return 0;
}

/* Start request i. 0, -EAGAIN (wait for a buffer), or an error. */
static int rd_start(struct rd_batch *b, size_t i)
{
	const struct io_read_req *q = &b->reqs[i];
	int rc = req_check(q, i);
	uint64_t b0, nb;
	if (!rc)
		rc = rd_blocks(q, &b0, &nb);
	if (rc)
		return rc;
	struct io_shard_reader *r = q->reader;
	const struct io_chunk_entry *c = &r->ix->chunks[q->chunk];
	int fd;
	uint64_t fsize;
	const char *fname;
	if ((rc = chunk_src(r, q->chunk, &fd, &fsize, &fname)))
		return ckpt_err_prefix(rc, "tensor '%s' chunk %u", r->ix->tensors[c->tensor].name,
		                       q->chunk);
	if (!ckpt_range_ok(c->file_offset, ckpt_align_up(c->stored_len, CKPT_ALIGN), fsize))
		return ckpt_err(CKPT_ECORRUPT, "%s: chunk %u at offset %llu past end of file",
		                fname, q->chunk, (unsigned long long)c->file_offset);
	uint64_t off = c->file_offset;
	size_t len = (size_t)ckpt_align_up(c->stored_len, CKPT_ALIGN);
	if (nb) {
		/* Blocks are multiples of 4 KiB: the run starts aligned; its end is the
		 * block's, or the chunk's padded end for the last block. */
		uint64_t bsz = r->ix->block_bytes, from = b0 * bsz;
		uint64_t to = (b0 + nb) * bsz < c->raw_len ? (b0 + nb) * bsz : c->raw_len;
		off += from;
		len = (size_t)ckpt_align_up(to - from, CKPT_ALIGN);
	}
	unsigned si = 0;
	while (b->slots[si].busy)
		si++;
	struct rd_slot *s = &b->slots[si];
	if ((rc = mem_get(b, len, true, &s->in)))
		return rc == -ENOMEM ? ckpt_err(rc, "%s: buffer for chunk %u (%zu bytes)",
		                                r->path, q->chunk, len) : rc;
	s->req = i;
	s->len = len;
	s->b0 = b0;
	s->nb = nb;
	if (r->fetch) {
		/* Fetched bytes arrive whole or not at all, in this thread: the read is
		 * done when the fetch returns. */
		s->busy = true;
		b->nbusy++;
		b->inflight++;
		r->stats.reads++;
		r->stats.partial_reads += nb != 0;
		r->stats.bytes += len;
		rc = r->fetch(r->fetch_arg, s->in.p, len, off);
		rd_done(b, si, rc ? rc : (int64_t)len);
		return 0;
	}
	rc = io_engine_queue(b->e, IO_OP_READ, fd, s->in.p, len, off, rd_done, b, si);
	if (rc < 0) {
		mem_release(b, &s->in);
		return ckpt_err(rc, "read %s at offset %llu", fname, (unsigned long long)off);
	}
	r->stats.reads++;
	r->stats.partial_reads += nb != 0;
	r->stats.bytes += len;
	s->busy = true;
	b->nbusy++;
	b->inflight++;
	return 0;
}

/* Blocks [b0, b0 + nb) of chunk q->chunk are at raw (their hashes, when the caller
 * computed them, at given): check each against the table. */
static int check_blocks(struct io_shard_reader *r, const struct io_read_req *q, uint64_t b0,
                        uint64_t nb, const uint8_t *raw, const uint8_t *given)
{
	const struct io_shard_index *ix = r->ix;
	const struct io_chunk_entry *c = &ix->chunks[q->chunk];
	uint64_t bsz = ix->block_bytes;
	for (uint64_t j = 0; j < nb; j++) {
		uint64_t from = (b0 + j) * bsz, n = c->raw_len - from < bsz ? c->raw_len - from : bsz;
		uint8_t h[CKPT_HASH_BYTES];
		if (!given)
			io_hash128(raw + j * bsz, (size_t)n, h);
		const uint8_t *want = r->blocks + (r->first_block[q->chunk] + b0 + j) * CKPT_HASH_BYTES;
		r->stats.blocks_checked++;
		if (memcmp(given ? given + j * CKPT_HASH_BYTES : h, want, CKPT_HASH_BYTES))
			return ckpt_err(CKPT_ECORRUPT, "tensor '%s' chunk %u block %llu (file %s, offset "
			                "%llu): %s", ix->tensors[c->tensor].name, q->chunk,
			                (unsigned long long)(b0 + j), chunk_name(r, q->chunk),
			                (unsigned long long)(c->file_offset + from),
			                given ? "the block table's hash does not match the chunk's bytes"
			                      : "block hash mismatch");
	}
	return 0;
}

/* A completed partial read: check every block read, hand the run to the callback. */
static int rd_finish_blocks(struct rd_slot *s, const struct io_read_req *q, io_chunk_cb cb)
{
	struct io_shard_reader *r = q->reader;
	const struct io_chunk_entry *c = &r->ix->chunks[q->chunk];
	uint64_t bsz = r->ix->block_bytes, from = s->b0 * bsz;
	uint64_t to = (s->b0 + s->nb) * bsz < c->raw_len ? (s->b0 + s->nb) * bsz : c->raw_len;
	int rc = check_blocks(r, q, s->b0, s->nb, s->in.p, NULL);
	return rc ? rc : cb(q->arg, q, from, s->in.p, (size_t)(to - from));
}

/* A completed read: decompress, verify, hand to the callback. */
static int rd_finish(struct rd_batch *b, struct rd_slot *s, io_chunk_cb cb)
{
	const struct io_read_req *q = &b->reqs[s->req];
	struct io_shard_reader *r = q->reader;
	const struct io_chunk_entry *c = &r->ix->chunks[q->chunk];
	const char *tname = r->ix->tensors[c->tensor].name;
	const char *fname = chunk_name(r, q->chunk);
	unsigned long long off = (unsigned long long)c->file_offset;
	if (s->res < 0 && r->fetch)     /* the fetch's message says what failed */
		return ckpt_err_prefix((int)s->res, "tensor '%s' chunk %u (%s, offset %llu)", tname,
		                       q->chunk, fname, off);
	if (s->res < 0)
		return ckpt_err((int)s->res, "read %s at offset %llu (tensor '%s' chunk %u)",
		                fname, off, tname, q->chunk);
	if ((uint64_t)s->res != s->len)
		return ckpt_err(CKPT_ECORRUPT, "tensor '%s' chunk %u (file %s, offset %llu): short "
		                "read, %lld of %zu bytes (truncated?)", tname, q->chunk, fname, off,
		                (long long)s->res, s->len);
	if (s->nb)
		return rd_finish_blocks(s, q, cb);
	/* Verify with the block table too: both kinds of hash in one pass. */
	uint64_t nb = (q->flags & IO_READ_CHECK_BLOCKS) ? io_chunk_nblocks(r->ix, c) : 0;
	if (nb > b->scratch_cap) {
		uint8_t *p = nb <= SIZE_MAX / CKPT_HASH_BYTES
			? ckpt_realloc(b->scratch, (size_t)nb * CKPT_HASH_BYTES) : NULL;
		if (!p)
			return ckpt_err(-ENOMEM, "%s: block hashes of chunk %u", r->path, q->chunk);
		b->scratch = p;
		b->scratch_cap = (size_t)nb;
	}
	struct rd_mem out = { -1, NULL };
	const void *raw = s->in.p;
	int rc = 0;
	if (c->codec != IO_CODEC_RAW) {
		if ((rc = mem_get(b, (size_t)c->raw_len, false, &out)))
			return ckpt_err(rc, "%s: buffer for chunk %u", r->path, q->chunk);
		rc = io_chunk_decode(c->codec, r->ix->tensors[c->tensor].dtype, out.p,
		                     (size_t)c->raw_len, s->in.p, (size_t)c->stored_len);
		if (rc)
			ckpt_err_prefix(rc, "tensor '%s' chunk %u (file %s, offset %llu)", tname,
			                q->chunk, fname, off);
		/* The compressed bytes are done with: let the next read have them. */
		mem_release(b, &s->in);
		raw = out.p;
	}
	if (!rc) {
		/* A tree's chunk hash is made of the block hashes of any chunk, stored
		 * raw or not: they are computed whenever it is a tree, kept when asked for. */
		uint8_t h[CKPT_HASH_BYTES];
		io_copy_hash128_blocks(NULL, raw, (size_t)c->raw_len, r->ix->block_bytes, r->ix->tree,
		                       h, nb ? b->scratch : NULL);
		if (memcmp(h, c->hash, CKPT_HASH_BYTES))
			rc = ckpt_err(CKPT_ECORRUPT, "tensor '%s' chunk %u (file %s, offset %llu): "
			              "hash mismatch", tname, q->chunk, fname, off);
		/* The bytes are the chunk's: a block that differs is a bad table. */
		else if (nb)
			rc = check_blocks(r, q, 0, nb, raw, b->scratch);
	}
	if (!rc)
		rc = cb(q->arg, q, 0, raw, (size_t)c->raw_len);
	if (out.p)
		mem_release(b, &out);
	return rc;
}

int io_read_batch(struct io_engine *e, const struct io_read_req *reqs, size_t n,
                  io_chunk_cb cb)
{
	/* One slot more than the engine's depth: while a completed chunk is hashed and
	 * handed over, depth reads are still in flight (pool buffers permitting). */
	unsigned depth = io_engine_depth(e);
	struct rd_batch b = {
		.e = e, .pool = io_engine_pool(e), .reqs = reqs,
		.nslots = depth + 1,
	};
	b.done_tail = &b.done_head;
	if (n == 0)
		return 0;
	b.slots = ckpt_calloc(b.nslots, sizeof *b.slots);
	if (!b.slots)
		return ckpt_err(-ENOMEM, "read batch of %zu chunks", n);
	int err = 0;
	size_t next = 0;
	while ((next < n && !err) || b.inflight || b.done_head) {
		/* Keep the engine full. */
		while (next < n && !err && b.nbusy < b.nslots && b.inflight < depth) {
			int rc = rd_start(&b, next);
			if (rc == -EAGAIN)
				break;
			if (rc)
				err = rc;
			else
				next++;
		}
		if (!b.done_head && b.inflight) {
			int rc = io_engine_reap(e, true);
			if (rc < 0 && !err)
				err = rc;
			if (rc < 0)
				break;   /* the ring is broken; slots in flight cannot be recovered */
			continue;    /* refill the completed reads' places before hashing */
		}
		/* One completion at a time, then refill. */
		if (b.done_head) {
			struct rd_slot *s = b.done_head;
			b.done_head = s->next;
			if (!b.done_head)
				b.done_tail = &b.done_head;
			if (!err) {
				int rc = rd_finish(&b, s, cb);
				if (rc)
					err = rc;
			}
			if (s->in.p)
				mem_release(&b, &s->in);
			s->busy = false;
			b.nbusy--;
		}
	}
	ckpt_free(b.slots);
	ckpt_free(b.scratch);
	return err;
}
