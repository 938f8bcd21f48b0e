/*
 * manifest_record.c — the manifest's keys and record codec (docs/format.md §8).
 *
 * Keys are big-endian so that LMDB's byte order is step order (and rank order
 * within a step). Values are little-endian, start with a u16 record version, and
 * have an exact length: a decoder checks every length against the bytes it was
 * given and refuses trailing bytes, so a torn, truncated or foreign value is
 * CKPT_EFORMAT — never an out-of-bounds read. This file knows nothing of LMDB.
 *
 * Records of the current versions end with their own checksum of the key and of
 * every value byte before it (rec_check). LMDB pages carry none, and a flipped bit in a
 * key or a value would otherwise read as a different truth (step 5's record under
 * key 7, or another footer hash); with it, a damaged record is CKPT_ECORRUPT naming
 * its key. Records written by older builds (no checksum) are still read.
 */
#include <errno.h>
#include <string.h>

#include <xxhash.h>

#include "manifest/manifest_internal.h"

void manifest_step_key(uint8_t out[MANIFEST_STEP_KEY_BYTES], uint64_t step)
{
	ckpt_put_be64(out, step);
}

void manifest_shard_key(uint8_t out[MANIFEST_SHARD_KEY_BYTES], uint64_t step, uint32_t rank)
{
	ckpt_put_be64(out, step);
	ckpt_put_be32(out + 8, rank);
}

/* A record's checksum: XXH3-64 of its value bytes, seeded with the XXH3-64 of its
 * key, so that one number covers both (and no state is allocated for it). */
static uint64_t rec_check(const uint8_t *key, size_t klen, const void *val, size_t vlen)
{
	return XXH3_64bits_withSeed(val, vlen, XXH3_64bits(key, klen));
}

_Static_assert(MANIFEST_MAX_META == CKPT_MAX_META, "a step's metadata: one limit");

bool manifest_path_ok(const char *path, size_t len)
{
	/* The rules of a tensor name are exactly those of a safe relative path
	 * (no leading '/', no "", "." or ".." component, no NUL or control byte):
	 * reuse the one checker rather than write a second. */
	return len > 0 && len <= MANIFEST_MAX_PATH && ckpt_name_check(path, len) == 0;
}

/* ------------------------------------------------------------------ step records
 *  off size  (version 2; version 1 is the same up to 48, without save id,
 *             incarnation and checksum: 48 + J + N bytes)
 *    0    2  record version (2)
 *    2    2  job_id length J (<= MANIFEST_MAX_JOB_ID)
 *    4    4  state (enum ckpt_step_state)
 *    8    4  trust (enum ckpt_trust; 0 for a record that is not COMMITTED)
 *   12    4  world
 *   16    4  ntensors
 *   20    2  note length N (<= MANIFEST_MAX_NOTE): abort reason
 *   22    2  reserved, 0
 *   24    8  logical_bytes
 *   32    8  stored_bytes
 *   40    8  commit_time_ns (CLOCK_REALTIME; for ABORTED: when it was recorded;
 *            for INFLIGHT: when the attempt began)
 *   48    8  save_id: the attempt (its files carry it)
 *   56    8  incarnation: the coordinator that began the attempt
 *   64    J  job_id bytes (no NUL)
 * 64+J    N  note bytes (no NUL)
 * 64+J+N  8  checksum of the 8-byte key and bytes [0, 64+J+N) (rec_check)
 *
 * Version 3 is version 2 with the step's user metadata before the checksum:
 * 64+J+N      4  metadata length M (1..MANIFEST_MAX_META)
 * 68+J+N      M  metadata bytes (a JSON object's text, no NUL)
 * 68+J+N+M    8  checksum of the 8-byte key and bytes [0, 68+J+N+M)
 * Only a record with metadata is written as version 3: a build that reads
 * version 2 at most still reads every other record, and refuses that one with
 * CKPT_EVERSION rather than misread it.
 *
 * Version 4 is version 3 whose metadata may be empty (M = 0), followed by the files
 * of other steps that the step's shards reference (an incremental save):
 * 68+J+N+M    4  R, referenced files (1..MANIFEST_MAX_REFS)
 * 72+J+N+M  24R  R x { step u64, save id u64, rank u32, reserved u32 = 0 }
 * then the checksum. Only a COMMITTED record with references is version 4; GC and
 * retention read them to keep those files (docs/format.md §8.6a).
 */

int manifest_step_check(const struct manifest_step *rec)
{
	size_t jl = strnlen(rec->job_id, sizeof rec->job_id);
	if (jl > MANIFEST_MAX_JOB_ID)
		return ckpt_err(-EINVAL, "step %llu: job id longer than %u bytes",
		                (unsigned long long)rec->step, MANIFEST_MAX_JOB_ID);
	if (rec->state < CKPT_STATE_COMMITTED || rec->state > CKPT_STATE_INFLIGHT)
		return ckpt_err(-EINVAL, "step %llu: bad state %u",
		                (unsigned long long)rec->step, rec->state);
	if (rec->trust > CKPT_TRUST_VERIFIED)
		return ckpt_err(-EINVAL, "step %llu: bad trust level %u",
		                (unsigned long long)rec->step, rec->trust);
	if (rec->meta_len > MANIFEST_MAX_META || (rec->meta_len && !rec->meta) ||
	    (rec->meta_len && memchr(rec->meta, '\0', rec->meta_len)))
		return ckpt_err(-EINVAL, "step %llu: metadata of %u bytes: longer than %u, or "
		                "holding a NUL", (unsigned long long)rec->step, rec->meta_len,
		                MANIFEST_MAX_META);
	if (rec->refs && (rec->nrefs == 0 || rec->nrefs > MANIFEST_MAX_REFS))
		return ckpt_err(-EINVAL, "step %llu: %u referenced files (at most %u)",
		                (unsigned long long)rec->step, rec->nrefs, MANIFEST_MAX_REFS);
	return 0;
}

void manifest_ref_at(const uint8_t *raw, uint32_t i, struct manifest_ref *out)
{
	const uint8_t *p = raw + (size_t)i * MANIFEST_REF_BYTES;
	out->step = ckpt_get_le64(p);
	out->save_id = ckpt_get_le64(p + 8);
	out->rank = ckpt_get_le32(p + 16);
}

size_t manifest_step_encode(const struct manifest_step *rec, const char *note, uint8_t *out)
{
	size_t jl = strnlen(rec->job_id, MANIFEST_MAX_JOB_ID);
	size_t nl = note ? strnlen(note, MANIFEST_MAX_NOTE) : 0;
	size_t ml = rec->meta ? rec->meta_len : 0;
	size_t rl = rec->refs ? rec->nrefs : 0;
	/* The lowest version that holds the record: 4 with references, 3 with metadata. */
	unsigned ver = rl ? 4 : ml ? 3 : 2;
	size_t n = MANIFEST_STEP_REC_FIXED + jl + nl + (ver >= 3 ? 4 + ml : 0) +
	           (rl ? 4 + rl * MANIFEST_REF_BYTES : 0) + MANIFEST_CHECK_BYTES;
	if (!out)
		return n;
	ckpt_put_le16(out + 0, (uint16_t)ver);
	ckpt_put_le16(out + 2, (uint16_t)jl);
	ckpt_put_le32(out + 4, rec->state);
	ckpt_put_le32(out + 8, rec->trust);
	ckpt_put_le32(out + 12, rec->world);
	ckpt_put_le32(out + 16, rec->ntensors);
	ckpt_put_le16(out + 20, (uint16_t)nl);
	ckpt_put_le16(out + 22, 0);
	ckpt_put_le64(out + 24, rec->logical_bytes);
	ckpt_put_le64(out + 32, rec->stored_bytes);
	ckpt_put_le64(out + 40, rec->commit_time_ns);
	ckpt_put_le64(out + 48, rec->save_id);
	ckpt_put_le64(out + 56, rec->incarnation);
	memcpy(out + MANIFEST_STEP_REC_FIXED, rec->job_id, jl);
	if (nl)
		memcpy(out + MANIFEST_STEP_REC_FIXED + jl, note, nl);
	if (ver >= 3) {
		ckpt_put_le32(out + MANIFEST_STEP_REC_FIXED + jl + nl, (uint32_t)ml);
		if (ml)
			memcpy(out + MANIFEST_STEP_REC_FIXED + jl + nl + 4, rec->meta, ml);
	}
	if (rl) {
		uint8_t *p = out + MANIFEST_STEP_REC_FIXED + jl + nl + 4 + ml;
		ckpt_put_le32(p, (uint32_t)rl);
		p += 4;
		for (size_t i = 0; i < rl; i++, p += MANIFEST_REF_BYTES) {
			ckpt_put_le64(p, rec->refs[i].step);
			ckpt_put_le64(p + 8, rec->refs[i].save_id);
			ckpt_put_le32(p + 16, rec->refs[i].rank);
			ckpt_put_le32(p + 20, 0);
		}
	}
	uint8_t k[MANIFEST_STEP_KEY_BYTES];
	manifest_step_key(k, rec->step);
	ckpt_put_le64(out + n - MANIFEST_CHECK_BYTES,
	              rec_check(k, sizeof k, out, n - MANIFEST_CHECK_BYTES));
	return n;
}

int manifest_step_decode(const void *p, size_t n, uint64_t step, struct manifest_step *out,
                         char *note, size_t note_cap)
{
	unsigned long long s = (unsigned long long)step;
	struct ckpt_cursor c;
	ckpt_cursor_init(&c, p, n);
	uint16_t ver = ckpt_cursor_u16(&c);
	if (!c.ok || ver == 0)
		return ckpt_err(CKPT_EFORMAT, "step %llu: step record of %zu bytes has no version", s, n);
	if (ver > MANIFEST_STEP_REC_VERSION)
		return ckpt_err(CKPT_EVERSION, "step %llu: step record version %u (this build reads <= %u)",
		                s, ver, MANIFEST_STEP_REC_VERSION);
	if (ver >= 2) {
		/* The checksum first: nothing of a damaged record is believed. */
		uint8_t k[MANIFEST_STEP_KEY_BYTES];
		manifest_step_key(k, step);
		if (n < MANIFEST_STEP_REC_FIXED + MANIFEST_CHECK_BYTES)
			return ckpt_err(CKPT_EFORMAT, "step %llu: step record truncated (%zu bytes)", s, n);
		if (ckpt_get_le64((const uint8_t *)p + n - MANIFEST_CHECK_BYTES) !=
		    rec_check(k, sizeof k, p, n - MANIFEST_CHECK_BYTES))
			return ckpt_err(CKPT_ECORRUPT, "step record under step %llu is damaged (checksum "
			                "mismatch: a changed byte in its key or value)", s);
		ckpt_cursor_init(&c, p, n - MANIFEST_CHECK_BYTES);
		(void)ckpt_cursor_u16(&c);
	}
	struct manifest_step r;
	memset(&r, 0, sizeof r);
	r.step = step;
	uint16_t jl = ckpt_cursor_u16(&c);
	r.state = ckpt_cursor_u32(&c);
	r.trust = ckpt_cursor_u32(&c);
	r.world = ckpt_cursor_u32(&c);
	r.ntensors = ckpt_cursor_u32(&c);
	uint16_t nl = ckpt_cursor_u16(&c);
	uint16_t reserved = ckpt_cursor_u16(&c);
	r.logical_bytes = ckpt_cursor_u64(&c);
	r.stored_bytes = ckpt_cursor_u64(&c);
	r.commit_time_ns = ckpt_cursor_u64(&c);
	if (ver >= 2) {
		r.save_id = ckpt_cursor_u64(&c);
		r.incarnation = ckpt_cursor_u64(&c);
	}
	if (!c.ok)
		return ckpt_err(CKPT_EFORMAT, "step %llu: step record truncated (%zu bytes)", s, n);
	if (jl > MANIFEST_MAX_JOB_ID || nl > MANIFEST_MAX_NOTE || reserved != 0)
		return ckpt_err(CKPT_EFORMAT, "step %llu: step record: job id length %u, note length %u, "
		                "reserved %u out of range", s, jl, nl, reserved);
	const uint8_t *job = ckpt_cursor_take(&c, jl);
	const uint8_t *why = ckpt_cursor_take(&c, nl);
	uint32_t ml = 0;
	const uint8_t *meta = NULL;
	if (ver >= 3) {
		/* Its length is checked before the bytes are taken: a hostile length is
		 * refused, never read past. */
		ml = ckpt_cursor_u32(&c);
		if (c.ok && ((ml == 0 && ver == 3) || ml > MANIFEST_MAX_META))
			return ckpt_err(CKPT_EFORMAT, "step %llu: step record: metadata length %u "
			                "(%u..%u)", s, ml, ver == 3 ? 1 : 0, MANIFEST_MAX_META);
		meta = ml ? ckpt_cursor_take(&c, ml) : NULL;
	}
	uint32_t rl = 0;
	const uint8_t *refs = NULL;
	if (ver >= 4) {
		rl = ckpt_cursor_u32(&c);
		/* The count against its limit, then against the bytes left. */
		if (c.ok && (rl == 0 || rl > MANIFEST_MAX_REFS))
			return ckpt_err(CKPT_EFORMAT, "step %llu: step record: %u referenced files "
			                "(1..%u)", s, rl, MANIFEST_MAX_REFS);
		refs = ckpt_cursor_take(&c, (size_t)rl * MANIFEST_REF_BYTES);
		for (uint32_t i = 0; refs && i < rl; i++) {
			struct manifest_ref e;
			manifest_ref_at(refs, i, &e);
			if (ckpt_get_le32(refs + (size_t)i * MANIFEST_REF_BYTES + 20) || e.step >= step)
				return ckpt_err(CKPT_EFORMAT, "step %llu: step record: referenced file %u "
				                "(step %llu): reserved bytes, or not an earlier step", s, i,
				                (unsigned long long)e.step);
		}
	}
	if (!c.ok || c.left != 0)
		return ckpt_err(CKPT_EFORMAT, "step %llu: step record is %zu bytes, its fields say "
		                "otherwise (job id %u, note %u, metadata %u bytes, %u references)", s,
		                n, jl, nl, ml, rl);
	if ((jl && memchr(job, '\0', jl)) || (nl && memchr(why, '\0', nl)) ||
	    (ml && memchr(meta, '\0', ml)))
		return ckpt_err(CKPT_EFORMAT, "step %llu: step record: NUL inside job id, note or "
		                "metadata", s);
	if (r.state < CKPT_STATE_COMMITTED || r.state > CKPT_STATE_INFLIGHT)
		return ckpt_err(CKPT_EFORMAT, "step %llu: step record: bad state %u", s, r.state);
	if (r.trust > CKPT_TRUST_VERIFIED || (r.state == CKPT_STATE_COMMITTED && r.trust == 0))
		return ckpt_err(CKPT_EFORMAT, "step %llu: step record: bad trust %u", s, r.trust);
	if (r.state == CKPT_STATE_COMMITTED && r.world == 0)
		return ckpt_err(CKPT_EFORMAT, "step %llu: committed step record with world 0", s);
	if (rl && r.state != CKPT_STATE_COMMITTED)
		return ckpt_err(CKPT_EFORMAT, "step %llu: step record: references in a record that "
		                "is not committed", s);
	if (jl)
		memcpy(r.job_id, job, jl);
	r.job_id[jl] = '\0';
	if (note && note_cap) {
		size_t k = nl < note_cap - 1 ? nl : note_cap - 1;
		if (k)
			memcpy(note, why, k);
		note[k] = '\0';
	}
	r.meta = (const char *)meta;
	r.meta_len = ml;
	r.nrefs = rl;
	r.refs_raw_ = refs;
	*out = r;
	return 0;
}

/* ------------------------------------------------------------------ shard records
 *  off size  (version 3; version 2 is the same without the checksum)
 *    0    2  record version (3)
 *    2    2  path length P (1..MANIFEST_MAX_PATH)
 *    4    4  rank (equal to the key's rank)
 *    8    8  file_size
 *   16   16  footer_hash (XXH3-128 of the footer, as in the trailer)
 *   32    8  footer_offset
 *   40    8  footer_len (1..MANIFEST_MAX_INDEX)
 *   48    8  index length X (0..MANIFEST_MAX_INDEX; 0: the index is only in the file)
 *   56    P  path, relative to the root (no NUL)
 * 56+P    X  encoded shard index, if kept here (lib/io's footer encoding, opaque here)
 * 56+P+X  8  checksum of the 12-byte key and bytes [0, 56+P+X)
 *
 * Why the footer and not the index: the index is already durable in the shard's own
 * footer before the rank votes, so the commit transaction need only name it (offset,
 * length, hash). At 256 ranks of 18 KB indexes that is 25 KB instead of 4.7 MB per
 * commit, and the manifest does not grow by a copy of every index.
 */

int manifest_shard_check(uint64_t step, const struct manifest_shard *s)
{
	unsigned long long st = (unsigned long long)step;
	if (!s->path)
		return ckpt_err(-EINVAL, "step %llu rank %u: no shard path", st, s->rank);
	size_t pl = strnlen(s->path, MANIFEST_MAX_PATH + 1);
	if (!manifest_path_ok(s->path, pl))
		return ckpt_err(-EINVAL, "step %llu rank %u: shard path '%.64s' is empty, longer than %u "
		                "bytes, absolute, or has an empty, '.' or '..' component",
		                st, s->rank, s->path, MANIFEST_MAX_PATH);
	if ((s->index_len && !s->index) || s->index_len > MANIFEST_MAX_INDEX ||
	    s->footer_len > MANIFEST_MAX_INDEX || (s->index_len == 0 && s->footer_len == 0))
		return ckpt_err(-EINVAL, "step %llu rank %u: shard index of %zu bytes, footer of %llu "
		                "bytes (at least one, each at most %llu)", st, s->rank, s->index_len,
		                (unsigned long long)s->footer_len, (unsigned long long)MANIFEST_MAX_INDEX);
	return 0;
}

size_t manifest_shard_rec_size(const struct manifest_shard *s)
{
	/* Both lengths are bounded by manifest_shard_check, so this cannot overflow. */
	return MANIFEST_SHARD_REC_FIXED + strnlen(s->path, MANIFEST_MAX_PATH) + s->index_len +
	       MANIFEST_CHECK_BYTES;
}

void manifest_shard_encode(uint64_t step, const struct manifest_shard *s, uint8_t *out)
{
	size_t pl = strnlen(s->path, MANIFEST_MAX_PATH);
	ckpt_put_le16(out + 0, MANIFEST_SHARD_REC_VERSION);
	ckpt_put_le16(out + 2, (uint16_t)pl);
	ckpt_put_le32(out + 4, s->rank);
	ckpt_put_le64(out + 8, s->file_size);
	memcpy(out + 16, s->footer_hash, CKPT_HASH_BYTES);
	ckpt_put_le64(out + 32, s->footer_offset);
	ckpt_put_le64(out + 40, s->footer_len);
	ckpt_put_le64(out + 48, (uint64_t)s->index_len);
	memcpy(out + MANIFEST_SHARD_REC_FIXED, s->path, pl);
	if (s->index_len)
		memcpy(out + MANIFEST_SHARD_REC_FIXED + pl, s->index, s->index_len);
	size_t body = MANIFEST_SHARD_REC_FIXED + pl + s->index_len;
	uint8_t k[MANIFEST_SHARD_KEY_BYTES];
	manifest_shard_key(k, step, s->rank);
	ckpt_put_le64(out + body, rec_check(k, sizeof k, out, body));
}

int manifest_shard_decode(const void *p, size_t n, uint64_t step, uint32_t rank,
                          struct manifest_shard *out, size_t *path_len)
{
	unsigned long long st = (unsigned long long)step;
	struct ckpt_cursor c;
	ckpt_cursor_init(&c, p, n);
	uint16_t ver = ckpt_cursor_u16(&c);
	if (!c.ok || ver == 0)
		return ckpt_err(CKPT_EFORMAT, "step %llu rank %u: shard record of %zu bytes has no version",
		                st, rank, n);
	if (ver < 2)
		return ckpt_err(CKPT_EFORMAT, "step %llu rank %u: shard record version %u is a "
		                "pre-release layout this build does not read", st, rank, ver);
	if (ver > MANIFEST_SHARD_REC_VERSION)
		return ckpt_err(CKPT_EVERSION, "step %llu rank %u: shard record version %u "
		                "(this build reads <= %u)", st, rank, ver, MANIFEST_SHARD_REC_VERSION);
	if (ver >= 3) {
		uint8_t k[MANIFEST_SHARD_KEY_BYTES];
		manifest_shard_key(k, step, rank);
		if (n < MANIFEST_SHARD_REC_FIXED + MANIFEST_CHECK_BYTES)
			return ckpt_err(CKPT_EFORMAT, "step %llu rank %u: shard record truncated (%zu "
			                "bytes)", st, rank, n);
		if (ckpt_get_le64((const uint8_t *)p + n - MANIFEST_CHECK_BYTES) !=
		    rec_check(k, sizeof k, p, n - MANIFEST_CHECK_BYTES))
			return ckpt_err(CKPT_ECORRUPT, "shard record of step %llu rank %u is damaged "
			                "(checksum mismatch: a changed byte in its key or value)", st, rank);
		ckpt_cursor_init(&c, p, n - MANIFEST_CHECK_BYTES);
		(void)ckpt_cursor_u16(&c);
	}
	uint16_t pl = ckpt_cursor_u16(&c);
	uint32_t rec_rank = ckpt_cursor_u32(&c);
	uint64_t file_size = ckpt_cursor_u64(&c);
	const uint8_t *hash = ckpt_cursor_take(&c, CKPT_HASH_BYTES);
	uint64_t foff = ckpt_cursor_u64(&c);
	uint64_t flen = ckpt_cursor_u64(&c);
	uint64_t xl = ckpt_cursor_u64(&c);
	if (!c.ok)
		return ckpt_err(CKPT_EFORMAT, "step %llu rank %u: shard record truncated (%zu bytes)",
		                st, rank, n);
	if (rec_rank != rank)
		return ckpt_err(CKPT_EFORMAT, "step %llu rank %u: shard record says rank %u",
		                st, rank, rec_rank);
	if (pl == 0 || pl > MANIFEST_MAX_PATH || xl > MANIFEST_MAX_INDEX ||
	    flen > MANIFEST_MAX_INDEX || (xl == 0 && flen == 0))
		return ckpt_err(CKPT_EFORMAT, "step %llu rank %u: shard record: path length %u, footer "
		                "length %llu or index length %llu out of range", st, rank, pl,
		                (unsigned long long)flen, (unsigned long long)xl);
	const char *path = (const char *)ckpt_cursor_take(&c, pl);
	/* xl <= MANIFEST_MAX_INDEX fits size_t; the cursor checks it against what is left. */
	const uint8_t *index = ckpt_cursor_take(&c, (size_t)xl);
	if (!c.ok || c.left != 0)
		return ckpt_err(CKPT_EFORMAT, "step %llu rank %u: shard record is %zu bytes, its fields "
		                "say otherwise (path %u, index %llu bytes)", st, rank, n, pl,
		                (unsigned long long)xl);
	if (!manifest_path_ok(path, pl))
		return ckpt_err(CKPT_EFORMAT, "step %llu rank %u: shard record: path is not a safe "
		                "relative path", st, rank);
	memset(out, 0, sizeof *out);
	out->rank = rank;
	out->path = path;              /* NOT NUL-terminated here: the caller copies it */
	out->file_size = file_size;
	memcpy(out->footer_hash, hash, CKPT_HASH_BYTES);
	out->footer_offset = foff;
	out->footer_len = flen;
	out->index = xl ? index : NULL;
	out->index_len = (size_t)xl;
	*path_len = pl;
	return 0;
}

/* ------------------------------------------------------------------ shard tables
 *  off size  (version 2)
 *    0    2  table version (2)
 *    2    2  reserved, 0
 *    4    4  count W (1 .. MANIFEST_MAX_TABLE_RANKS): the step's world
 *    8    8  save_id: the attempt; the path of rank r is ckpt_path_shard_rel(step, r,
 *            save_id)
 *   16    8  checksum of the 8-byte key and bytes [0, 16)
 *   24  56W  entries, entry r for rank r:
 *              0  4  rank (= r)      4  4  reserved, 0
 *              8  8  file_size      16 16  footer_hash (XXH3-128)
 *             32  8  footer_offset  40  8  footer_len (1 .. MANIFEST_MAX_INDEX)
 *             48  8  checksum of the key and the entry's bytes [0, 48)
 * Exact length 24 + 56 W. Version 1: an 8-byte header (no save id: the paths are
 * those without one) and 48-byte entries, no checksums; still read.
 * Each entry has its own checksum so that a reader of rank r checks the header and
 * entry r only: a load reads every rank, and checking all W each time would be W^2.
 */

void manifest_table_prefix(char out[MANIFEST_TABLE_PREFIX + 1], uint64_t step)
{
	/* The step directory of rank 0's canonical path: the layout is paths.c's alone. */
	char path[MANIFEST_TABLE_PREFIX + 48];
	ckpt_path_shard_rel(path, sizeof path, step, 0, 0);
	memcpy(out, path, MANIFEST_TABLE_PREFIX);
	out[MANIFEST_TABLE_PREFIX] = '\0';
}

bool manifest_shard_tabular(const char *prefix, uint64_t save_id, const struct manifest_shard *s)
{
	if (s->index_len || s->index || s->footer_len == 0 || s->footer_len > MANIFEST_MAX_INDEX ||
	    strncmp(s->path, prefix, MANIFEST_TABLE_PREFIX) != 0)
		return false;
	uint32_t rank;
	uint64_t id;
	/* The name is exactly what ckpt_path_shard_name writes for this rank and save id. */
	return ckpt_path_parse_shard(s->path + MANIFEST_TABLE_PREFIX, &rank, &id) &&
	       rank == s->rank && id == save_id && id != 0;
}

size_t manifest_table_size(uint32_t count)
{
	return MANIFEST_TABLE_HEADER + (size_t)count * MANIFEST_TABLE_ENTRY;
}

void manifest_table_header(uint8_t *out, uint64_t step, uint32_t count, uint64_t save_id)
{
	ckpt_put_le16(out + 0, MANIFEST_TABLE_VERSION);
	ckpt_put_le16(out + 2, 0);
	ckpt_put_le32(out + 4, count);
	ckpt_put_le64(out + 8, save_id);
	uint8_t k[MANIFEST_STEP_KEY_BYTES];
	manifest_step_key(k, step);
	ckpt_put_le64(out + 16, rec_check(k, sizeof k, out, 16));
}

void manifest_table_put(uint8_t *out, uint64_t step, const struct manifest_shard *s)
{
	uint8_t *e = out + MANIFEST_TABLE_HEADER + (size_t)s->rank * MANIFEST_TABLE_ENTRY;
	ckpt_put_le32(e + 0, s->rank);
	ckpt_put_le32(e + 4, 0);
	ckpt_put_le64(e + 8, s->file_size);
	memcpy(e + 16, s->footer_hash, CKPT_HASH_BYTES);
	ckpt_put_le64(e + 32, s->footer_offset);
	ckpt_put_le64(e + 40, s->footer_len);
	uint8_t k[MANIFEST_STEP_KEY_BYTES];
	manifest_step_key(k, step);
	ckpt_put_le64(e + 48, rec_check(k, sizeof k, e, 48));
}

int manifest_table_entry(const void *p, size_t n, uint64_t step, uint32_t rank,
                         struct manifest_shard *out, uint64_t *save_id)
{
	unsigned long long st = (unsigned long long)step;
	struct ckpt_cursor c;
	ckpt_cursor_init(&c, p, n);
	uint16_t ver = ckpt_cursor_u16(&c);
	uint16_t reserved = ckpt_cursor_u16(&c);
	uint32_t count = ckpt_cursor_u32(&c);
	if (!c.ok || ver == 0)
		return ckpt_err(CKPT_EFORMAT, "step %llu rank %u: shard table of %zu bytes has no "
		                "header", st, rank, n);
	if (ver > MANIFEST_TABLE_VERSION)
		return ckpt_err(CKPT_EVERSION, "step %llu rank %u: shard table version %u (this build "
		                "reads <= %u)", st, rank, ver, MANIFEST_TABLE_VERSION);
	uint8_t k[MANIFEST_STEP_KEY_BYTES];
	manifest_step_key(k, step);
	size_t hdr = ver >= 2 ? MANIFEST_TABLE_HEADER : MANIFEST_TABLE_HEADER_V1;
	size_t ent = ver >= 2 ? MANIFEST_TABLE_ENTRY : MANIFEST_TABLE_ENTRY_V1;
	*save_id = 0;
	if (ver >= 2) {
		*save_id = ckpt_cursor_u64(&c);
		uint64_t check = ckpt_cursor_u64(&c);
		if (!c.ok)
			return ckpt_err(CKPT_EFORMAT, "step %llu rank %u: shard table of %zu bytes is "
			                "shorter than its version %u header", st, rank, n, ver);
		if (check != rec_check(k, sizeof k, p, 16))
			return ckpt_err(CKPT_ECORRUPT, "shard table of step %llu is damaged (its header's "
			                "checksum does not match)", st);
		if (*save_id == 0)
			return ckpt_err(CKPT_EFORMAT, "step %llu rank %u: shard table with save id 0",
			                st, rank);
	}
	if (reserved != 0 || count == 0 || count > MANIFEST_MAX_TABLE_RANKS ||
	    n != hdr + (size_t)count * ent)
		return ckpt_err(CKPT_EFORMAT, "step %llu rank %u: shard table of %zu bytes says %u "
		                "ranks (reserved field %u)", st, rank, n, count, reserved);
	if (rank >= count)
		return ckpt_err(CKPT_ENOTFOUND, "step %llu rank %u: no shard record (the step has %u "
		                "ranks)", st, rank, count);
	const uint8_t *e = (const uint8_t *)p + hdr + (size_t)rank * ent;
	if (ver >= 2 && ckpt_get_le64(e + 48) != rec_check(k, sizeof k, e, 48))
		return ckpt_err(CKPT_ECORRUPT, "shard table of step %llu: the entry of rank %u is "
		                "damaged (checksum mismatch)", st, rank);
	uint32_t er = ckpt_get_le32(e), eres = ckpt_get_le32(e + 4);
	uint64_t flen = ckpt_get_le64(e + 40);
	if (er != rank || eres != 0 || flen == 0 || flen > MANIFEST_MAX_INDEX)
		return ckpt_err(CKPT_EFORMAT, "step %llu rank %u: shard table entry says rank %u, "
		                "reserved %u, footer of %llu bytes", st, rank, er, eres,
		                (unsigned long long)flen);
	memset(out, 0, sizeof *out);
	out->rank = rank;
	out->file_size = ckpt_get_le64(e + 8);
	memcpy(out->footer_hash, e + 16, CKPT_HASH_BYTES);
	out->footer_offset = ckpt_get_le64(e + 32);
	out->footer_len = flen;
	return 0;
}
