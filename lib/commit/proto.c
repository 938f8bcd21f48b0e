/*
 * proto.c — encoders and bounds-checked decoders of the commit messages.
 * A message that fails to decode is a protocol error of its sender: the caller
 * closes that connection (it never trusts a partly decoded message).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "commit/commit_internal.h"

/* 2: the save id in status messages and PREPARE. Every rank of a job runs one
 * build: a peer of another version is refused, never half understood. */
#define COMMIT_MSG_VERSION 2u

static int enc_done(struct ckpt_buf *b)
{
	return b->ok ? 0 : ckpt_err(-ENOMEM, "encode commit message");
}

int commit_step_encode(uint64_t step, struct ckpt_buf *b)
{
	ckpt_buf_u16(b, COMMIT_MSG_VERSION);
	ckpt_buf_u64(b, step);
	return enc_done(b);
}

static int dec_version(struct ckpt_cursor *c, const char *what)
{
	uint16_t v = ckpt_cursor_u16(c);
	if (!c->ok)
		return ckpt_err(CKPT_EPROTO, "%s: truncated", what);
	if (v != COMMIT_MSG_VERSION)
		return ckpt_err(CKPT_EPROTO, "%s: version %u, expected %u", what, v, COMMIT_MSG_VERSION);
	return 0;
}

int commit_step_decode(const void *p, size_t n, uint64_t *step)
{
	struct ckpt_cursor c;
	ckpt_cursor_init(&c, p, n);
	int rc = dec_version(&c, "BEGIN");
	if (rc)
		return rc;
	*step = ckpt_cursor_u64(&c);
	if (!c.ok || c.left)
		return ckpt_err(CKPT_EPROTO, "BEGIN: %zu bytes, expected 10", n);
	return 0;
}

int commit_status_encode(const struct commit_status_msg *m, struct ckpt_buf *b)
{
	size_t rl = strnlen(m->reason, COMMIT_MAX_REASON);
	ckpt_buf_u16(b, COMMIT_MSG_VERSION);
	ckpt_buf_u64(b, m->step);
	ckpt_buf_u32(b, (uint32_t)m->code);
	ckpt_buf_u16(b, (uint16_t)rl);
	ckpt_buf_put(b, m->reason, rl);
	ckpt_buf_u64(b, m->save_id);
	return enc_done(b);
}

int commit_status_decode(const void *p, size_t n, struct commit_status_msg *m)
{
	struct ckpt_cursor c;
	ckpt_cursor_init(&c, p, n);
	int rc = dec_version(&c, "status message");
	if (rc)
		return rc;
	m->step = ckpt_cursor_u64(&c);
	m->code = (int32_t)ckpt_cursor_u32(&c);
	uint16_t rl = ckpt_cursor_u16(&c);
	if (!c.ok || rl > COMMIT_MAX_REASON)
		return ckpt_err(CKPT_EPROTO, "status message: bad reason length %u", rl);
	const uint8_t *r = ckpt_cursor_take(&c, rl);
	m->save_id = ckpt_cursor_u64(&c);
	if (!r || !c.ok || c.left)
		return ckpt_err(CKPT_EPROTO, "status message: %zu bytes do not match its fields", n);
	/* A status is 0 or a negative code of ours; anything else is not from a peer
	 * that speaks this protocol. */
	if (m->code > 0 || m->code < -1999)
		return ckpt_err(CKPT_EPROTO, "status message: code %d out of range", m->code);
	memcpy(m->reason, r, rl);
	m->reason[rl] = '\0';
	for (size_t i = 0; i < rl; i++)
		if ((unsigned char)m->reason[i] < 0x20)
			m->reason[i] = '?';
	return 0;
}

int commit_prepare_encode(const struct commit_vote *v, struct ckpt_buf *b)
{
	ckpt_buf_u16(b, COMMIT_MSG_VERSION);
	ckpt_buf_u64(b, v->step);
	ckpt_buf_u32(b, v->rank);
	ckpt_buf_u64(b, v->file_size);
	ckpt_buf_put(b, v->footer_hash, CKPT_HASH_BYTES);
	ckpt_buf_u64(b, v->save_id);
	ckpt_buf_u64(b, v->index_len);
	ckpt_buf_put(b, v->index, v->index_len);
	/* The metadata, only when there is some: a vote without it is the same bytes
	 * as before metadata existed. */
	if (v->meta_len) {
		ckpt_buf_u32(b, (uint32_t)v->meta_len);
		ckpt_buf_put(b, v->meta, v->meta_len);
	}
	return enc_done(b);
}

int commit_prepare_decode(const void *p, size_t n, struct commit_vote *v)
{
	struct ckpt_cursor c;
	ckpt_cursor_init(&c, p, n);
	int rc = dec_version(&c, "PREPARE");
	if (rc)
		return rc;
	memset(v, 0, sizeof *v);
	v->step = ckpt_cursor_u64(&c);
	v->rank = ckpt_cursor_u32(&c);
	v->file_size = ckpt_cursor_u64(&c);
	const uint8_t *h = ckpt_cursor_take(&c, CKPT_HASH_BYTES);
	v->save_id = ckpt_cursor_u64(&c);
	uint64_t len = ckpt_cursor_u64(&c);
	if (!c.ok || !h || len > c.left || len == 0)
		return ckpt_err(CKPT_EPROTO, "PREPARE: index length %llu does not match the %zu "
		                "bytes that follow", (unsigned long long)len, c.left);
	memcpy(v->footer_hash, h, CKPT_HASH_BYTES);
	v->index = ckpt_cursor_take(&c, (size_t)len);
	v->index_len = (size_t)len;
	if (c.left) {
		/* The metadata: its length within bounds and exactly what is left. */
		uint32_t ml = ckpt_cursor_u32(&c);
		if (!c.ok || ml == 0 || ml > MANIFEST_MAX_META || ml != c.left)
			return ckpt_err(CKPT_EPROTO, "PREPARE of rank %u: metadata length %u (1..%u) "
			                "does not match the %zu bytes that follow", v->rank, ml,
			                MANIFEST_MAX_META, c.left);
		v->meta = ckpt_cursor_take(&c, ml);
		v->meta_len = ml;
	}
	return 0;
}

/* ------------------------------------------------------------------ the relay */

int commit_relay_encode(uint32_t rank, uint16_t type, const void *inner, size_t inner_len,
                        struct ckpt_buf *b)
{
	ckpt_buf_u16(b, COMMIT_MSG_VERSION);
	ckpt_buf_u32(b, rank);
	ckpt_buf_u16(b, type);
	ckpt_buf_put(b, inner, inner_len);
	return enc_done(b);
}

int commit_relay_decode(const void *p, size_t n, uint32_t *rank, uint16_t *type,
                        const uint8_t **inner, size_t *inner_len)
{
	struct ckpt_cursor c;
	ckpt_cursor_init(&c, p, n);
	int rc = dec_version(&c, "relayed message");
	if (rc)
		return rc;
	*rank = ckpt_cursor_u32(&c);
	*type = ckpt_cursor_u16(&c);
	if (!c.ok)
		return ckpt_err(CKPT_EPROTO, "relayed message: %zu bytes, shorter than its tag", n);
	*inner = c.p;
	*inner_len = c.left;
	return 0;
}

int commit_hello_encode(uint32_t node, const uint32_t *ranks, uint32_t n, struct ckpt_buf *b)
{
	ckpt_buf_u16(b, COMMIT_MSG_VERSION);
	ckpt_buf_u32(b, node);
	ckpt_buf_u32(b, n);
	for (uint32_t i = 0; i < n; i++)
		ckpt_buf_u32(b, ranks[i]);
	return enc_done(b);
}

int commit_hello_decode(const void *p, size_t n, uint32_t *node, uint32_t **ranks,
                        uint32_t *nranks)
{
	*ranks = NULL;
	*nranks = 0;
	struct ckpt_cursor c;
	ckpt_cursor_init(&c, p, n);
	int rc = dec_version(&c, "RELAY_HELLO");
	if (rc)
		return rc;
	*node = ckpt_cursor_u32(&c);
	uint32_t k = ckpt_cursor_u32(&c);
	/* The count is checked against the bytes that follow before anything is
	 * allocated for it. */
	if (!c.ok || k == 0 || k > COMMIT_MAX_NODE_RANKS || c.left != (size_t)k * 4)
		return ckpt_err(CKPT_EPROTO, "RELAY_HELLO: %u ranks in %zu bytes (1..%u ranks, 4 "
		                "bytes each)", k, c.left, COMMIT_MAX_NODE_RANKS);
	uint32_t *r = ckpt_malloc((size_t)k * sizeof *r);
	if (!r)
		return ckpt_err(-ENOMEM, "RELAY_HELLO");
	for (uint32_t i = 0; i < k; i++) {
		r[i] = ckpt_cursor_u32(&c);
		if (i && r[i] <= r[i - 1]) {
			uint32_t a = r[i - 1], b = r[i];
			ckpt_free(r);
			return ckpt_err(CKPT_EPROTO, "RELAY_HELLO: ranks not strictly ascending (%u "
			                "after %u)", b, a);
		}
	}
	*ranks = r;
	*nranks = k;
	return 0;
}

int commit_gone_encode(uint32_t rank, const char *reason, struct ckpt_buf *b)
{
	size_t rl = strnlen(reason ? reason : "", COMMIT_MAX_REASON);
	ckpt_buf_u16(b, COMMIT_MSG_VERSION);
	ckpt_buf_u32(b, rank);
	ckpt_buf_u16(b, (uint16_t)rl);
	ckpt_buf_put(b, reason, rl);
	return enc_done(b);
}

int commit_gone_decode(const void *p, size_t n, uint32_t *rank,
                       char reason[COMMIT_MAX_REASON + 1])
{
	struct ckpt_cursor c;
	ckpt_cursor_init(&c, p, n);
	int rc = dec_version(&c, "RANK_GONE");
	if (rc)
		return rc;
	*rank = ckpt_cursor_u32(&c);
	uint16_t rl = ckpt_cursor_u16(&c);
	const uint8_t *r = c.ok && rl <= COMMIT_MAX_REASON ? ckpt_cursor_take(&c, rl) : NULL;
	if (!r || c.left)
		return ckpt_err(CKPT_EPROTO, "RANK_GONE: %zu bytes do not match its fields", n);
	memcpy(reason, r, rl);
	reason[rl] = '\0';
	for (size_t i = 0; i < rl; i++)
		if ((unsigned char)reason[i] < 0x20)
			reason[i] = '?';
	return 0;
}
