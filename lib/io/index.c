/*
 * index.c — the shard index codec: the footer of a shard file, also carried in
 * PREPARE and stored in the manifest (docs/format.md §3).
 *
 * The decoder reads untrusted bytes (a file from disk, a message from a peer) and
 * is fuzzed: every count is checked against the bytes that remain before anything
 * is allocated, every field is range-checked before it is used, and the semantic
 * rules (chunk runs cover each tensor exactly, file ranges lie inside the data
 * area and do not overlap, names are valid and unique) are enforced here so that
 * readers of a decoded index may trust it.
 *
 * Version 4 adds references (docs/format.md §3b): a table of other shard files and,
 * for each chunk whose bytes lie in one of them, which. The section sits before the
 * tensor records so that the chunk decoder knows which chunks are references (their
 * file ranges are in the other file, not inside this one's data area). The chunk
 * records themselves keep their layout.
 *
 * Version 3 adds the save id: the attempt that wrote the shard (docs/format.md §3),
 * which the coordinator holds each vote to.
 *
 * Version 2 adds the place of the block table to the index header (its offset,
 * length and hash: 40 bytes whatever the shard's size, so the index that travels in
 * PREPARE does not grow with the data). The table itself, the per-block hashes, is
 * a region of the shard file of its own; its codec is here too (io_blocks_*), and
 * its decoder checks the table against the index it belongs to.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "io/io_internal.h"

/* ------------------------------------------------------------------ encode */

/* Version 4: the counts, the referenced files, then (chunk, file) in chunk order. */
static void refs_encode(struct ckpt_buf *b, const struct io_shard_index *ix)
{
	uint32_t nrefs = 0;
	for (uint32_t k = 0; ix->chunk_file && k < ix->nchunks; k++)
		nrefs += ix->chunk_file[k] != 0;
	ckpt_buf_u32(b, ix->nfiles);
	ckpt_buf_u32(b, nrefs);
	for (uint32_t f = 0; f < ix->nfiles; f++) {
		ckpt_buf_u64(b, ix->files[f].step);
		ckpt_buf_u64(b, ix->files[f].save_id);
		ckpt_buf_u32(b, ix->files[f].rank);
		ckpt_buf_u32(b, 0);                  /* reserved */
	}
	for (uint32_t k = 0; ix->chunk_file && k < ix->nchunks; k++) {
		if (!ix->chunk_file[k])
			continue;
		ckpt_buf_u32(b, k);
		ckpt_buf_u32(b, ix->chunk_file[k]);
	}
}

int io_index_encode(const struct io_shard_index *ix, void **out, size_t *len)
{
	*out = NULL;
	*len = 0;
	struct ckpt_buf b;
	ckpt_buf_init(&b);
	/* The lowest version that expresses the index: 1 has no block hashes, 2 no save
	 * id; 3 has both (a save id needs the version-2 fields before it); 4 is 3 with
	 * bytegroup chunks or references, or both; 5 is 4's layout with tree hashes,
	 * whatever its chunks (the hashes' kind is the whole file's). */
	bool v5 = ix->tree;
	bool v4 = v5 || io_index_has_bytegroup(ix) || ix->nfiles != 0;
	bool v3 = v4 || ix->save_id != 0, v2 = v3 || ix->block_bytes != 0;
	if (v3 && !ix->block_bytes)
		return ckpt_err(-EINVAL, "shard index: a save id needs block hashes (version 3)");
	if (v4 && !ix->save_id)
		return ckpt_err(-EINVAL, "shard index: bytegroup chunks, references and tree hashes "
		                "need a save id (version 4)");
	if (ix->nfiles && !ix->chunk_file)
		return ckpt_err(-EINVAL, "shard index: referenced files without references");
	ckpt_buf_put(&b, IO_INDEX_MAGIC, IO_MAGIC_BYTES);
	ckpt_buf_u32(&b, v5 ? IO_TREE_VERSION : v4 ? 4 : v3 ? 3 : v2 ? 2 : 1);
	ckpt_buf_u32(&b, 0);                         /* flags: none defined */
	ckpt_buf_u64(&b, ix->step);
	ckpt_buf_u32(&b, ix->rank);
	ckpt_buf_u32(&b, ix->world);
	ckpt_buf_u64(&b, ix->data_end);
	ckpt_buf_u32(&b, ix->ntensors);
	ckpt_buf_u32(&b, ix->nchunks);
	if (v2) {
		ckpt_buf_u32(&b, ix->block_bytes);
		ckpt_buf_u32(&b, 0);                 /* reserved */
		ckpt_buf_u64(&b, ix->blocks_offset);
		ckpt_buf_u64(&b, ix->blocks_len);
		ckpt_buf_put(&b, ix->blocks_hash, CKPT_HASH_BYTES);
	}
	if (v3)
		ckpt_buf_u64(&b, ix->save_id);
	if (v4)
		refs_encode(&b, ix);
	for (uint32_t i = 0; i < ix->ntensors; i++) {
		const struct io_tensor_entry *t = &ix->tensors[i];
		size_t n = strlen(t->name);
		if (n > UINT16_MAX || t->ndim > CKPT_MAX_NDIM) {
			ckpt_buf_free(&b);
			return ckpt_err(-EINVAL, "shard index: tensor %u: name or ndim too large", i);
		}
		ckpt_buf_u16(&b, (uint16_t)n);
		ckpt_buf_put(&b, t->name, n);
		ckpt_buf_u8(&b, t->kind);
		ckpt_buf_u8(&b, t->dtype);
		ckpt_buf_u8(&b, t->policy);
		ckpt_buf_u8(&b, t->flags);
		ckpt_buf_u8(&b, t->ndim);
		for (unsigned d = 0; d < t->ndim; d++)
			ckpt_buf_u64(&b, t->global_shape[d]);
		for (unsigned d = 0; d < t->ndim; d++)
			ckpt_buf_u64(&b, t->offset[d]);
		for (unsigned d = 0; d < t->ndim; d++)
			ckpt_buf_u64(&b, t->extent[d]);
		ckpt_buf_u64(&b, t->raw_bytes);
		ckpt_buf_u32(&b, t->first_chunk);
		ckpt_buf_u32(&b, t->nchunks);
	}
	for (uint32_t i = 0; i < ix->nchunks; i++) {
		const struct io_chunk_entry *c = &ix->chunks[i];
		static const uint8_t pad[3];
		ckpt_buf_u32(&b, c->tensor);
		ckpt_buf_u8(&b, c->codec);
		ckpt_buf_put(&b, pad, sizeof pad);
		ckpt_buf_u64(&b, c->raw_offset);
		ckpt_buf_u64(&b, c->raw_len);
		ckpt_buf_u64(&b, c->file_offset);
		ckpt_buf_u64(&b, c->stored_len);
		ckpt_buf_put(&b, c->hash, CKPT_HASH_BYTES);
	}
	if (!b.ok) {
		ckpt_buf_free(&b);
		return ckpt_err(-ENOMEM, "shard index: encoding %u tensors, %u chunks",
		                ix->ntensors, ix->nchunks);
	}
	*out = b.p;
	*len = b.len;
	return 0;
}

/* ------------------------------------------------------------------ free, find */

void io_index_free(struct io_shard_index *ix)
{
	if (!ix)
		return;
	if (ix->tensors)
		for (uint32_t i = 0; i < ix->ntensors; i++)
			ckpt_free((char *)ix->tensors[i].name);
	ckpt_free(ix->tensors);
	ckpt_free(ix->chunks);
	ckpt_free(ix->files);
	ckpt_free(ix->chunk_file);
	ckpt_free(ix);
}

int io_index_find(const struct io_shard_index *ix, const char *name)
{
	for (uint32_t i = 0; i < ix->ntensors && i <= (uint32_t)INT32_MAX; i++)
		if (!strcmp(ix->tensors[i].name, name))
			return (int)i;
	return -1;
}

bool io_index_has_bytegroup(const struct io_shard_index *ix)
{
	for (uint32_t k = 0; k < ix->nchunks; k++)
		if (ix->chunks[k].codec == IO_CODEC_BYTEGROUP)
			return true;
	return false;
}

uint64_t io_index_nblocks(const struct io_shard_index *ix)
{
	/* raw_len <= 2^30 and block_bytes >= 2^12 (both checked by the decoder): at
	 * most 2^18 blocks a chunk, 2^50 for 2^32 chunks. No overflow. */
	uint64_t n = 0;
	for (uint32_t k = 0; k < ix->nchunks; k++)
		n += io_chunk_nblocks(ix, &ix->chunks[k]);
	return n;
}

/* ------------------------------------------------------------------ decode */

#define BAD(...) ckpt_err(CKPT_EFORMAT, "shard index: " __VA_ARGS__)

static int tensor_check(const struct io_tensor_entry *t, uint32_t i)
{
	if (t->kind < 1 || t->kind > CKPT_KIND_MAX_)
		return BAD("tensor %u ('%s'): kind %u unknown", i, t->name, t->kind);
	if (t->dtype < 1 || t->dtype > CKPT_DTYPE_MAX_)
		return BAD("tensor %u ('%s'): dtype %u unknown", i, t->name, t->dtype);
	if (t->policy < 1 || t->policy > CKPT_POLICY_MAX_)
		return BAD("tensor %u ('%s'): policy %u unknown", i, t->name, t->policy);
	if (t->flags & ~(unsigned)IO_TENSOR_BLOB)
		return BAD("tensor %u ('%s'): flags 0x%x unknown", i, t->name, t->flags);
	for (unsigned d = 0; d < t->ndim; d++) {
		/* offset + extent <= global, written so that it cannot overflow. */
		if (!ckpt_range_ok(t->offset[d], t->extent[d], t->global_shape[d]))
			return BAD("tensor %u ('%s'): dim %u: offset %llu + extent %llu > shape %llu",
			           i, t->name, d, (unsigned long long)t->offset[d],
			           (unsigned long long)t->extent[d],
			           (unsigned long long)t->global_shape[d]);
	}
	uint64_t elems, bytes;
	if (!ckpt_shape_elems(t->ndim, t->global_shape, &elems))
		return BAD("tensor %u ('%s'): global shape overflows 64 bits", i, t->name);
	if (!ckpt_shape_elems(t->ndim, t->extent, &elems) ||
	    !ckpt_mul_u64(elems, ckpt_dtype_size(t->dtype), &bytes))
		return BAD("tensor %u ('%s'): extent size overflows 64 bits", i, t->name);
	if (t->flags & IO_TENSOR_BLOB) {
		if (t->dtype != CKPT_U8 || t->ndim != 1)
			return BAD("tensor %u ('%s'): blob must be u8 with ndim 1", i, t->name);
	}
	if (bytes != t->raw_bytes)
		return BAD("tensor %u ('%s'): raw_bytes %llu != %llu from extent and dtype", i,
		           t->name, (unsigned long long)t->raw_bytes, (unsigned long long)bytes);
	return 0;
}

static int tensor_decode(struct ckpt_cursor *c, struct io_tensor_entry *t, uint32_t i)
{
	uint16_t n = ckpt_cursor_u16(c);
	const uint8_t *name = ckpt_cursor_take(c, n);
	if (!c->ok)
		return BAD("tensor %u: truncated name", i);
	/* Every rule of ckpt_name_check but UTF-8: the save API has refused names that
	 * are not well-formed UTF-8 only since that rule was added, and a shard written
	 * before may hold one; refusing it here would make a committed checkpoint
	 * unreadable. The other rules keep what readers rely on (a NUL-terminated name,
	 * no control bytes, nothing that walks out of a path). */
	if (ckpt_name_problem((const char *)name, n, false))
		return BAD("tensor %u: invalid name (length %u)", i, n);
	char *s = ckpt_malloc((size_t)n + 1);
	if (!s)
		return ckpt_err(-ENOMEM, "shard index: tensor %u name", i);
	memcpy(s, name, n);
	s[n] = '\0';
	t->name = s;
	t->name_len = n;
	t->kind = ckpt_cursor_u8(c);
	t->dtype = ckpt_cursor_u8(c);
	t->policy = ckpt_cursor_u8(c);
	t->flags = ckpt_cursor_u8(c);
	t->ndim = ckpt_cursor_u8(c);
	if (!c->ok)
		return BAD("tensor %u ('%s'): truncated", i, s);
	if (t->ndim > CKPT_MAX_NDIM)
		return BAD("tensor %u ('%s'): ndim %u > %u", i, s, t->ndim, CKPT_MAX_NDIM);
	for (unsigned d = 0; d < t->ndim; d++)
		t->global_shape[d] = ckpt_cursor_u64(c);
	for (unsigned d = 0; d < t->ndim; d++)
		t->offset[d] = ckpt_cursor_u64(c);
	for (unsigned d = 0; d < t->ndim; d++)
		t->extent[d] = ckpt_cursor_u64(c);
	t->raw_bytes = ckpt_cursor_u64(c);
	t->first_chunk = ckpt_cursor_u32(c);
	t->nchunks = ckpt_cursor_u32(c);
	if (!c->ok)
		return BAD("tensor %u ('%s'): truncated", i, s);
	return tensor_check(t, i);
}

static int chunk_decode(struct ckpt_cursor *c, struct io_chunk_entry *k, uint32_t i,
                        uint64_t data_end, bool ref)
{
	k->tensor = ckpt_cursor_u32(c);
	k->codec = ckpt_cursor_u8(c);
	const uint8_t *pad = ckpt_cursor_take(c, 3);
	k->raw_offset = ckpt_cursor_u64(c);
	k->raw_len = ckpt_cursor_u64(c);
	k->file_offset = ckpt_cursor_u64(c);
	k->stored_len = ckpt_cursor_u64(c);
	const uint8_t *h = ckpt_cursor_take(c, CKPT_HASH_BYTES);
	if (!c->ok)
		return BAD("chunk %u: truncated", i);
	memcpy(k->hash, h, CKPT_HASH_BYTES);
	if (pad[0] | pad[1] | pad[2])
		return BAD("chunk %u: reserved bytes not zero", i);
	if (k->codec != IO_CODEC_RAW && k->codec != IO_CODEC_ZSTD && k->codec != IO_CODEC_BYTEGROUP)
		return BAD("chunk %u: codec %u unknown", i, k->codec);
	if (k->raw_len == 0 || k->raw_len > IO_MAX_CHUNK_BYTES)
		return BAD("chunk %u: raw_len %llu outside [1, %llu]", i,
		           (unsigned long long)k->raw_len, (unsigned long long)IO_MAX_CHUNK_BYTES);
	if (k->codec == IO_CODEC_RAW && k->stored_len != k->raw_len)
		return BAD("chunk %u: raw chunk with stored_len %llu != raw_len %llu", i,
		           (unsigned long long)k->stored_len, (unsigned long long)k->raw_len);
	/* A compressed chunk is stored only when it is smaller (docs/format.md §5). */
	if (k->codec != IO_CODEC_RAW && (k->stored_len == 0 || k->stored_len > k->raw_len))
		return BAD("chunk %u: %s stored_len %llu outside [1, raw_len %llu]", i,
		           k->codec == IO_CODEC_ZSTD ? "zstd" : "bytegroup",
		           (unsigned long long)k->stored_len, (unsigned long long)k->raw_len);
	if (k->file_offset % CKPT_ALIGN)
		return BAD("chunk %u: file_offset %llu not a multiple of %u", i,
		           (unsigned long long)k->file_offset, CKPT_ALIGN);
	/* A reference's bytes are in another file: its range is checked against that
	 * file when it is read (lib/io/reader.c). */
	if (k->file_offset < IO_HEADER_BYTES ||
	    (!ref && !ckpt_range_ok(k->file_offset, k->stored_len, data_end)))
		return BAD("chunk %u: file range [%llu, +%llu) outside [%u, data_end %llu)", i,
		           (unsigned long long)k->file_offset, (unsigned long long)k->stored_len,
		           IO_HEADER_BYTES, (unsigned long long)data_end);
	return 0;
}

/* Bytegroup chunks (version 4): only in an index of version 4 or later, and only
 * of tensors whose dtype has byte planes. An index of version 4 itself holds at
 * least one or a reference (the lowest version that expresses it: the encoding
 * stays canonical); version 5 is there for its hashes. Runs after runs_check, which
 * proved every chunk's tensor index valid. */
static int codecs_check(const struct io_shard_index *ix, uint32_t version)
{
	bool any = false;
	for (uint32_t k = 0; k < ix->nchunks; k++) {
		const struct io_chunk_entry *c = &ix->chunks[k];
		if (c->codec != IO_CODEC_BYTEGROUP)
			continue;
		const struct io_tensor_entry *te = &ix->tensors[c->tensor];
		if (version < IO_BYTEGROUP_VERSION)
			return BAD("chunk %u: bytegroup codec in a version-%u index", k, version);
		if (!io_bytegroup_width(te->dtype))
			return BAD("chunk %u: bytegroup codec for tensor '%s' of dtype %s", k,
			           te->name, ckpt_dtype_name(te->dtype));
		any = true;
	}
	if (version == IO_BYTEGROUP_VERSION && !any && !ix->nfiles)
		return BAD("version %u without a bytegroup chunk or a reference", version);
	return 0;
}

/* Each tensor's run [first_chunk, first_chunk + nchunks) holds exactly its chunks,
 * in raw order, covering [0, raw_bytes) without gap or overlap. */
static int runs_check(const struct io_shard_index *ix)
{
	for (uint32_t t = 0; t < ix->ntensors; t++) {
		const struct io_tensor_entry *te = &ix->tensors[t];
		if ((uint64_t)te->first_chunk + te->nchunks > ix->nchunks)
			return BAD("tensor %u ('%s'): chunks [%u, +%u) outside %u chunks", t,
			           te->name, te->first_chunk, te->nchunks, ix->nchunks);
		uint64_t pos = 0;
		for (uint32_t k = te->first_chunk; k < te->first_chunk + te->nchunks; k++) {
			const struct io_chunk_entry *c = &ix->chunks[k];
			if (c->tensor != t)
				return BAD("chunk %u: belongs to tensor %u, inside the run of "
				           "tensor %u ('%s')", k, c->tensor, t, te->name);
			if (c->raw_offset != pos)
				return BAD("chunk %u of tensor '%s': raw_offset %llu, expected %llu",
				           k, te->name, (unsigned long long)c->raw_offset,
				           (unsigned long long)pos);
			if (!ckpt_add_u64(pos, c->raw_len, &pos) || pos > te->raw_bytes)
				return BAD("chunk %u of tensor '%s': runs past raw_bytes %llu", k,
				           te->name, (unsigned long long)te->raw_bytes);
		}
		if (pos != te->raw_bytes)
			return BAD("tensor %u ('%s'): chunks cover %llu of %llu bytes", t, te->name,
			           (unsigned long long)pos, (unsigned long long)te->raw_bytes);
	}
	/* Every chunk must sit inside its own tensor's run (no orphans). */
	for (uint32_t k = 0; k < ix->nchunks; k++) {
		const struct io_chunk_entry *c = &ix->chunks[k];
		if (c->tensor >= ix->ntensors)
			return BAD("chunk %u: tensor %u >= %u tensors", k, c->tensor, ix->ntensors);
		const struct io_tensor_entry *te = &ix->tensors[c->tensor];
		if (k < te->first_chunk || k - te->first_chunk >= te->nchunks)
			return BAD("chunk %u: outside the run of its tensor %u ('%s')", k, c->tensor,
			           te->name);
	}
	return 0;
}

static int cmp_by_offset(const void *a, const void *b, void *arg)
{
	const struct io_chunk_entry *ch = arg;
	uint64_t x = ch[*(const uint32_t *)a].file_offset, y = ch[*(const uint32_t *)b].file_offset;
	return x < y ? -1 : x > y;
}

static int cmp_by_name(const void *a, const void *b, void *arg)
{
	const struct io_tensor_entry *te = arg;
	return strcmp(te[*(const uint32_t *)a].name, te[*(const uint32_t *)b].name);
}

/* Chunk file ranges disjoint, tensor names unique: both by sorting indices. */
static int overlap_and_names_check(const struct io_shard_index *ix)
{
	size_t n = ix->nchunks > ix->ntensors ? ix->nchunks : ix->ntensors;
	uint32_t *ord = ckpt_malloc((n ? n : 1) * sizeof *ord);
	if (!ord)
		return ckpt_err(-ENOMEM, "shard index: checking %zu entries", n);
	int rc = 0;
	uint32_t nown = 0;             /* chunks stored in this file (not references) */
	for (uint32_t i = 0; i < ix->nchunks; i++)
		if (!io_chunk_file(ix, i))
			ord[nown++] = i;
	qsort_r(ord, nown, sizeof *ord, cmp_by_offset, ix->chunks);
	for (uint32_t i = 1; i < nown && !rc; i++) {
		const struct io_chunk_entry *p = &ix->chunks[ord[i - 1]], *q = &ix->chunks[ord[i]];
		/* Both offsets are aligned and inside data_end, so no overflow here. */
		if (p->file_offset + p->stored_len > q->file_offset)
			rc = BAD("chunks %u and %u: file ranges overlap at %llu", ord[i - 1], ord[i],
			         (unsigned long long)q->file_offset);
	}
	for (uint32_t i = 0; i < ix->ntensors && !rc; i++)
		ord[i] = i;
	if (!rc)
		qsort_r(ord, ix->ntensors, sizeof *ord, cmp_by_name, ix->tensors);
	for (uint32_t i = 1; i < ix->ntensors && !rc; i++)
		if (!strcmp(ix->tensors[ord[i - 1]].name, ix->tensors[ord[i]].name))
			rc = BAD("tensors %u and %u: duplicate name '%s'", ord[i - 1], ord[i],
			         ix->tensors[ord[i]].name);
	ckpt_free(ord);
	return rc;
}

/* Version 2: the block table's place agrees with the chunk list (docs/format.md §3). */
static int blocks_place_check(const struct io_shard_index *ix)
{
	uint64_t n = io_index_nblocks(ix);
	if (n == 0) {
		static const uint8_t zero[CKPT_HASH_BYTES];
		if (ix->blocks_offset || ix->blocks_len || memcmp(ix->blocks_hash, zero, sizeof zero))
			return BAD("no chunk has blocks, but a block table is recorded (offset %llu, "
			           "%llu bytes)", (unsigned long long)ix->blocks_offset,
			           (unsigned long long)ix->blocks_len);
		return 0;
	}
	/* n <= 2^50: the length cannot overflow. */
	uint64_t want = IO_BLOCKS_HDR_BYTES + n * CKPT_HASH_BYTES;
	if (ix->blocks_len != want)
		return BAD("block table of %llu bytes, %llu blocks of %u bytes need %llu",
		           (unsigned long long)ix->blocks_len, (unsigned long long)n,
		           ix->block_bytes, (unsigned long long)want);
	if (ix->blocks_offset % CKPT_ALIGN || ix->blocks_offset < IO_HEADER_BYTES ||
	    !ckpt_range_ok(ix->blocks_offset, ix->blocks_len, ix->data_end))
		return BAD("block table [%llu, +%llu) misaligned or outside [%u, data_end %llu)",
		           (unsigned long long)ix->blocks_offset, (unsigned long long)ix->blocks_len,
		           IO_HEADER_BYTES, (unsigned long long)ix->data_end);
	for (uint32_t k = 0; k < ix->nchunks; k++) {
		const struct io_chunk_entry *ch = &ix->chunks[k];
		if (io_chunk_file(ix, k))
			continue;            /* its bytes are in another file */
		/* Both ranges lie inside data_end: no overflow. */
		if (ch->file_offset < ix->blocks_offset + ix->blocks_len &&
		    ix->blocks_offset < ch->file_offset + ch->stored_len)
			return BAD("block table [%llu, +%llu) overlaps chunk %u",
			           (unsigned long long)ix->blocks_offset,
			           (unsigned long long)ix->blocks_len, k);
	}
	return 0;
}

/* Version 4: the referenced files and which chunks lie in them (docs/format.md
 * §3b). None of either where the version is there for bytegroup chunks; else
 * canonical: at least one file and one reference; files distinct, earlier
 * steps than this one (a reference never points forward, so never in a cycle),
 * each referenced by some chunk; references in strictly ascending chunk order. */
static int refs_decode(struct ckpt_cursor *c, struct io_shard_index *ix, uint32_t nfiles,
                       uint32_t nrefs, uint32_t nchunks)
{
	if (nfiles == 0 && nrefs == 0)
		return 0;       /* version 4 for its bytegroup chunks, 5 for its hashes */
	if (nfiles == 0 || nrefs == 0 || nrefs > nchunks)
		return BAD("version 4 with %u referenced files and %u references (of %u chunks)",
		           nfiles, nrefs, nchunks);
	ix->files = ckpt_calloc(nfiles, sizeof *ix->files);
	ix->chunk_file = ckpt_calloc(nchunks, sizeof *ix->chunk_file);
	uint8_t *used = ckpt_calloc(nfiles, 1);
	int rc = 0;
	if (!ix->files || !ix->chunk_file || !used) {
		rc = ckpt_err(-ENOMEM, "shard index: %u referenced files", nfiles);
		goto out;
	}
	ix->nfiles = nfiles;
	for (uint32_t f = 0; f < nfiles && !rc; f++) {
		struct io_ref_file *e = &ix->files[f];
		e->step = ckpt_cursor_u64(c);
		e->save_id = ckpt_cursor_u64(c);
		e->rank = ckpt_cursor_u32(c);
		uint32_t reserved = ckpt_cursor_u32(c);
		if (!c->ok)
			rc = BAD("referenced file %u: truncated", f);
		else if (reserved)
			rc = BAD("referenced file %u: reserved bytes not zero", f);
		else if (e->step >= ix->step)
			rc = BAD("referenced file %u: step %llu is not earlier than the shard's %llu", f,
			         (unsigned long long)e->step, (unsigned long long)ix->step);
		for (uint32_t g = 0; g < f && !rc; g++)
			if (ix->files[g].step == e->step && ix->files[g].save_id == e->save_id &&
			    ix->files[g].rank == e->rank)
				rc = BAD("referenced files %u and %u are the same", g, f);
	}
	int64_t prev = -1;
	for (uint32_t i = 0; i < nrefs && !rc; i++) {
		uint32_t k = ckpt_cursor_u32(c), f = ckpt_cursor_u32(c);
		if (!c->ok)
			rc = BAD("reference %u: truncated", i);
		else if (k >= nchunks || (int64_t)k <= prev)
			rc = BAD("reference %u: chunk %u out of order or outside %u chunks", i, k,
			         nchunks);
		else if (f == 0 || f > nfiles)
			rc = BAD("reference %u (chunk %u): file %u outside [1, %u]", i, k, f, nfiles);
		else {
			ix->chunk_file[k] = f;
			used[f - 1] = 1;
			prev = k;
		}
	}
	for (uint32_t f = 0; f < nfiles && !rc; f++)
		if (!used[f])
			rc = BAD("referenced file %u: no chunk references it", f);
out:
	ckpt_free(used);
	return rc;
}

static int index_decode(struct ckpt_cursor *c, struct io_shard_index *ix)
{
	const uint8_t *magic = ckpt_cursor_take(c, IO_MAGIC_BYTES);
	if (!magic || memcmp(magic, IO_INDEX_MAGIC, IO_MAGIC_BYTES))
		return BAD("bad magic (not a shard index)");
	uint32_t version = ckpt_cursor_u32(c);
	uint32_t flags = ckpt_cursor_u32(c);
	ix->step = ckpt_cursor_u64(c);
	ix->rank = ckpt_cursor_u32(c);
	ix->world = ckpt_cursor_u32(c);
	ix->data_end = ckpt_cursor_u64(c);
	uint32_t ntensors = ckpt_cursor_u32(c);
	uint32_t nchunks = ckpt_cursor_u32(c);
	if (!c->ok)
		return BAD("truncated header (%zu bytes left)", c->left);
	/* A newer version may lay out what follows differently: stop before reading it. */
	if (version > IO_FORMAT_VERSION)
		return ckpt_err(CKPT_EVERSION, "shard index: version %u, this build reads <= %u",
		                version, IO_FORMAT_VERSION);
	if (version == 0)
		return BAD("version 0");
	if (version >= 2) {
		ix->block_bytes = ckpt_cursor_u32(c);
		uint32_t reserved = ckpt_cursor_u32(c);
		ix->blocks_offset = ckpt_cursor_u64(c);
		ix->blocks_len = ckpt_cursor_u64(c);
		const uint8_t *h = ckpt_cursor_take(c, CKPT_HASH_BYTES);
		if (!c->ok)
			return BAD("truncated version-2 header (%zu bytes left)", c->left);
		memcpy(ix->blocks_hash, h, CKPT_HASH_BYTES);
		if (reserved)
			return BAD("reserved header bytes not zero");
		/* A power of two that divides 4 KiB alignment and fits a chunk. */
		if (ix->block_bytes < IO_MIN_BLOCK_BYTES || ix->block_bytes > IO_MAX_CHUNK_BYTES ||
		    (ix->block_bytes & (ix->block_bytes - 1)))
			return BAD("block_bytes %u is not a power of two in [%u, %llu]",
			           ix->block_bytes, IO_MIN_BLOCK_BYTES,
			           (unsigned long long)IO_MAX_CHUNK_BYTES);
	}
	if (version >= 3) {
		ix->save_id = ckpt_cursor_u64(c);
		if (!c->ok)
			return BAD("truncated version-3 header (%zu bytes left)", c->left);
		if (ix->save_id == 0)
			return BAD("save id 0 in a version-3 index");
	}
	uint32_t nfiles = 0, nrefs = 0;
	if (version >= 4) {
		nfiles = ckpt_cursor_u32(c);
		nrefs = ckpt_cursor_u32(c);
		if (!c->ok)
			return BAD("truncated version-4 header (%zu bytes left)", c->left);
	}
	ix->tree = version >= IO_TREE_VERSION;
	if (flags)
		return BAD("flags 0x%x unknown", flags);
	if (ix->world == 0 || ix->rank >= ix->world)
		return BAD("rank %u outside world %u", ix->rank, ix->world);
	if (ix->data_end < IO_HEADER_BYTES || ix->data_end % CKPT_ALIGN)
		return BAD("data_end %llu not an aligned offset >= %u",
		           (unsigned long long)ix->data_end, IO_HEADER_BYTES);
	/* Counts against the bytes that remain, before allocating anything: a 4-billion
	 * count in a short buffer fails here. */
	uint64_t need = (uint64_t)ntensors * IO_INDEX_TENSOR_MIN +
	                (uint64_t)nchunks * IO_INDEX_CHUNK_BYTES +
	                (uint64_t)nfiles * IO_INDEX_FILE_BYTES + (uint64_t)nrefs * IO_INDEX_REF_BYTES;
	if (need > c->left)
		return BAD("%u tensors, %u chunks, %u files and %u references need >= %llu bytes, "
		           "%zu left", ntensors, nchunks, nfiles, nrefs, (unsigned long long)need,
		           c->left);
	ix->tensors = ckpt_calloc(ntensors ? ntensors : 1, sizeof *ix->tensors);
	ix->chunks = ckpt_calloc(nchunks ? nchunks : 1, sizeof *ix->chunks);
	if (!ix->tensors || !ix->chunks)
		return ckpt_err(-ENOMEM, "shard index: %u tensors, %u chunks", ntensors, nchunks);
	if (version >= 4) {
		int rc = refs_decode(c, ix, nfiles, nrefs, nchunks);
		if (rc)
			return rc;
	}
	for (uint32_t i = 0; i < ntensors; i++) {
		ix->ntensors = i + 1;         /* so that free sees the names decoded so far */
		int rc = tensor_decode(c, &ix->tensors[i], i);
		if (rc)
			return rc;
	}
	ix->nchunks = nchunks;
	for (uint32_t i = 0; i < nchunks; i++) {
		int rc = chunk_decode(c, &ix->chunks[i], i, ix->data_end,
		                      io_chunk_file(ix, i) != 0);
		if (rc)
			return rc;
	}
	if (c->left)
		return BAD("%zu bytes of trailing garbage", c->left);
	int rc = runs_check(ix);
	if (!rc)
		rc = codecs_check(ix, version);
	if (!rc && ix->block_bytes)
		rc = blocks_place_check(ix);
	return rc ? rc : overlap_and_names_check(ix);
}

int io_index_decode(const void *buf, size_t len, struct io_shard_index **out)
{
	*out = NULL;
	struct io_shard_index *ix = ckpt_calloc(1, sizeof *ix);
	if (!ix)
		return ckpt_err(-ENOMEM, "shard index: decode");
	struct ckpt_cursor c;
	ckpt_cursor_init(&c, buf, len);
	int rc = index_decode(&c, ix);
	if (rc) {
		io_index_free(ix);
		return rc;
	}
	*out = ix;
	return 0;
}

/* ------------------------------------------------------------------ block table */

int io_blocks_encode(uint32_t block_bytes, const uint8_t *hashes, uint64_t nblocks,
                     void **out, size_t *len)
{
	*out = NULL;
	*len = 0;
	uint64_t n;
	if (!ckpt_mul_u64(nblocks, CKPT_HASH_BYTES, &n) || !ckpt_add_u64(n, IO_BLOCKS_HDR_BYTES, &n) ||
	    n > SIZE_MAX)
		return ckpt_err(-EINVAL, "block table: %llu blocks", (unsigned long long)nblocks);
	uint8_t *p = ckpt_malloc((size_t)n);
	if (!p)
		return ckpt_err(-ENOMEM, "block table of %llu bytes", (unsigned long long)n);
	memcpy(p, IO_BLOCKS_MAGIC, IO_MAGIC_BYTES);
	ckpt_put_le32(p + IO_BLOCKS_OFF_VERSION, IO_BLOCKS_VERSION);
	ckpt_put_le32(p + IO_BLOCKS_OFF_BSIZE, block_bytes);
	ckpt_put_le64(p + IO_BLOCKS_OFF_COUNT, nblocks);
	ckpt_put_le64(p + IO_BLOCKS_OFF_RESERVED, 0);
	if (nblocks)
		memcpy(p + IO_BLOCKS_HDR_BYTES, hashes, (size_t)(n - IO_BLOCKS_HDR_BYTES));
	*out = p;
	*len = (size_t)n;
	return 0;
}

#define BADT(...) ckpt_err(CKPT_EFORMAT, "block table: " __VA_ARGS__)

int io_blocks_decode(const struct io_shard_index *ix, const void *buf, size_t len,
                     const uint8_t **hashes)
{
	const uint8_t *p = buf;
	*hashes = NULL;
	if (len < IO_BLOCKS_HDR_BYTES || memcmp(p, IO_BLOCKS_MAGIC, IO_MAGIC_BYTES))
		return BADT("bad magic or %zu bytes (not a block table)", len);
	/* The table's own layout version, not the file's: a file of version 3 still
	 * holds a table of version 2, the only one there is. */
	uint32_t version = ckpt_get_le32(p + IO_BLOCKS_OFF_VERSION);
	if (version > IO_BLOCKS_VERSION)
		return ckpt_err(CKPT_EVERSION, "block table: version %u, this build reads <= %u",
		                version, IO_BLOCKS_VERSION);
	if (version < IO_BLOCKS_VERSION)
		return BADT("version %u (block tables start at version %u)", version,
		            IO_BLOCKS_VERSION);
	uint32_t bsize = ckpt_get_le32(p + IO_BLOCKS_OFF_BSIZE);
	uint64_t count = ckpt_get_le64(p + IO_BLOCKS_OFF_COUNT);
	if (ckpt_get_le64(p + IO_BLOCKS_OFF_RESERVED))
		return BADT("reserved bytes not zero");
	if (!ix->block_bytes || bsize != ix->block_bytes)
		return BADT("block size %u, the index says %u", bsize, ix->block_bytes);
	uint64_t want = io_index_nblocks(ix);
	if (count != want)
		return BADT("%llu blocks, the index's chunks have %llu", (unsigned long long)count,
		            (unsigned long long)want);
	/* want <= 2^50 (io_index_nblocks): no overflow. */
	if ((uint64_t)len - IO_BLOCKS_HDR_BYTES != count * CKPT_HASH_BYTES)
		return BADT("%zu bytes for %llu blocks", len, (unsigned long long)count);
	*hashes = p + IO_BLOCKS_HDR_BYTES;
	return 0;
}
