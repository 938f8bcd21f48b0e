/*
 * proto.c — encoders and bounds-checked decoders of the commit messages.
 * A message that fails to decode is a protocol error of its sender: the caller
 * closes that connection (it never trusts a partly decoded message).
 */
#include <errno.h>
#include <string.h>

#include "commit/commit_internal.h"

#define COMMIT_MSG_VERSION 1u

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
	if (!r || c.left)
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
	ckpt_buf_u64(b, v->index_len);
	ckpt_buf_put(b, v->index, v->index_len);
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
	uint64_t len = ckpt_cursor_u64(&c);
	if (!c.ok || !h || len != c.left || len == 0)
		return ckpt_err(CKPT_EPROTO, "PREPARE: index length %llu does not match the %zu "
		                "bytes that follow", (unsigned long long)len, c.left);
	memcpy(v->footer_hash, h, CKPT_HASH_BYTES);
	v->index = c.p;
	v->index_len = (size_t)len;
	return 0;
}
