/*
 * proto.c — the messages of ckptd's protocol (remote.h): encoders into a ckpt_buf,
 * and decoders of untrusted bytes through a bounded cursor, every length checked
 * against what is left before it is used.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "remote/remote.h"

static int bad(const char *msg, const char *field)
{
	return ckpt_err(CKPT_EPROTO, "%s message: bad or truncated %s", msg, field);
}

/* A length-prefixed string into out (cap bytes with the NUL); the bytes must be
 * printable: no NUL, no control byte (a host, path or name goes into log lines and
 * error messages as it is). Bytes from 0x80 up are left to the field's own check
 * (names are UTF-8). */
static bool take_str(struct ckpt_cursor *c, char *out, size_t cap)
{
	uint16_t n = ckpt_cursor_u16(c);
	const uint8_t *p = ckpt_cursor_take(c, n);
	if (!p || n == 0 || n >= cap)
		return false;
	for (size_t i = 0; i < n; i++)
		if (p[i] < 0x20 || p[i] == 0x7f)
			return false;
	memcpy(out, p, n);
	out[n] = '\0';
	return true;
}

static void put_str(struct ckpt_buf *b, const char *s)
{
	size_t n = strlen(s);
	ckpt_buf_u16(b, (uint16_t)n);
	ckpt_buf_put(b, s, n);
}

int remote_coord_encode(struct ckpt_buf *b, uint32_t world, const struct remote_instance *in,
                        unsigned n, const struct remote_keep *keep, uint32_t timeout_ms)
{
	if (n == 0 || n > REMOTE_MAX_INSTANCES)
		return ckpt_err(-EINVAL, "COORD: %u instances", n);
	ckpt_buf_u32(b, world);
	ckpt_buf_u16(b, (uint16_t)n);
	for (unsigned i = 0; i < n; i++) {
		put_str(b, in[i].host);
		ckpt_buf_u16(b, (uint16_t)in[i].port);
	}
	if (keep) {
		ckpt_buf_u64(b, keep->last);
		ckpt_buf_u64(b, keep->every);
		ckpt_buf_u64(b, keep->seconds);
	}
	if (timeout_ms)
		ckpt_buf_u32(b, timeout_ms);
	return b->ok ? 0 : ckpt_err(-ENOMEM, "COORD message");
}

int remote_coord_decode(const void *p, size_t n, uint32_t *world,
                        struct remote_instance *in, unsigned cap, unsigned *count,
                        struct remote_keep *keep, uint32_t *timeout_ms)
{
	memset(keep, 0, sizeof *keep);
	*timeout_ms = 0;
	struct ckpt_cursor c;
	ckpt_cursor_init(&c, p, n);
	*world = ckpt_cursor_u32(&c);
	unsigned k = ckpt_cursor_u16(&c);
	if (!c.ok || *world == 0 || k == 0 || k > cap)
		return bad("COORD", "world or instance count");
	for (unsigned i = 0; i < k; i++) {
		if (!take_str(&c, in[i].host, sizeof in[i].host))
			return bad("COORD", "instance host");
		in[i].port = ckpt_cursor_u16(&c);
		if (!c.ok || in[i].port == 0)
			return bad("COORD", "instance port");
	}
	/* What follows the instances: nothing, the keep rules (24 bytes), the timeout
	 * (4), or both (28). */
	if (c.left == 24 || c.left == 28) {
		keep->last = ckpt_cursor_u64(&c);
		keep->every = ckpt_cursor_u64(&c);
		keep->seconds = ckpt_cursor_u64(&c);
	}
	if (c.left == 4) {
		*timeout_ms = ckpt_cursor_u32(&c);
		if (*timeout_ms == 0)
			return bad("COORD", "timeout");
	}
	if (c.left)
		return bad("COORD", "length");
	*count = k;
	return 0;
}

void remote_open_encode(struct ckpt_buf *b, const struct remote_open *o)
{
	ckpt_buf_u64(b, o->step);
	ckpt_buf_u64(b, o->save_id);
	ckpt_buf_u32(b, o->block_bytes);
	ckpt_buf_u64(b, o->size_hint);
	ckpt_buf_u64(b, o->chunk_bytes);
	if (o->flags)
		ckpt_buf_u32(b, o->flags);
}

int remote_open_decode(const void *p, size_t n, struct remote_open *o)
{
	struct ckpt_cursor c;
	ckpt_cursor_init(&c, p, n);
	o->step = ckpt_cursor_u64(&c);
	o->save_id = ckpt_cursor_u64(&c);
	o->block_bytes = ckpt_cursor_u32(&c);
	o->size_hint = ckpt_cursor_u64(&c);
	o->chunk_bytes = ckpt_cursor_u64(&c);
	/* The flags are newer than the message: absent, they are 0; present, never 0
	 * (the encoder leaves 0 out), and only those known. */
	bool has_flags = c.left == 4;
	o->flags = has_flags ? ckpt_cursor_u32(&c) : 0;
	if (!c.ok || c.left)
		return bad("OPEN", "fields");
	return (has_flags && !o->flags) || o->flags & ~REMOTE_OPEN_FLAGS ? bad("OPEN", "flags") : 0;
}

void remote_open_ok_encode(struct ckpt_buf *b, uint64_t max_chunk, uint32_t flags)
{
	ckpt_buf_u64(b, max_chunk);
	if (flags)
		ckpt_buf_u32(b, flags);
}

int remote_open_ok_decode(const void *p, size_t n, uint64_t *max_chunk, uint32_t *flags)
{
	struct ckpt_cursor c;
	ckpt_cursor_init(&c, p, n);
	*max_chunk = ckpt_cursor_u64(&c);
	bool has_flags = c.left == 4;
	*flags = has_flags ? ckpt_cursor_u32(&c) : 0;
	if (!c.ok || c.left)
		return bad("OPEN_OK", "fields");
	return (has_flags && !*flags) || *flags & ~REMOTE_OPEN_FLAGS ? bad("OPEN_OK", "flags") : 0;
}

void remote_grant_encode(struct ckpt_buf *b, const struct remote_grant *g, unsigned n)
{
	ckpt_buf_u16(b, (uint16_t)n);
	for (unsigned i = 0; i < n; i++) {
		ckpt_buf_u32(b, g[i].id);
		ckpt_buf_u64(b, g[i].addr);
		ckpt_buf_u32(b, g[i].rkey);
		ckpt_buf_u32(b, g[i].len);
	}
}

int remote_grant_decode(const void *p, size_t n, struct remote_grant *g, unsigned cap,
                        unsigned *count)
{
	struct ckpt_cursor c;
	ckpt_cursor_init(&c, p, n);
	unsigned k = ckpt_cursor_u16(&c);
	if (!c.ok || k == 0 || k > cap || k > REMOTE_MAX_GRANTS)
		return bad("GRANT", "count");
	for (unsigned i = 0; i < k; i++) {
		g[i].id = ckpt_cursor_u32(&c);
		g[i].addr = ckpt_cursor_u64(&c);
		g[i].rkey = ckpt_cursor_u32(&c);
		g[i].len = ckpt_cursor_u32(&c);
		if (!c.ok || g[i].id == 0 || g[i].len == 0 || g[i].addr > UINT64_MAX - g[i].len)
			return bad("GRANT", "grant");
	}
	if (c.left)
		return bad("GRANT", "length");
	*count = k;
	return 0;
}

void remote_tensor_encode(struct ckpt_buf *b, const struct io_tensor_desc *t)
{
	put_str(b, t->name);
	ckpt_buf_u8(b, t->kind);
	ckpt_buf_u8(b, t->dtype);
	ckpt_buf_u8(b, t->policy);
	ckpt_buf_u8(b, t->flags);
	ckpt_buf_u8(b, t->ndim);
	for (unsigned i = 0; i < t->ndim; i++)
		ckpt_buf_u64(b, t->global_shape[i]);
	for (unsigned i = 0; i < t->ndim; i++)
		ckpt_buf_u64(b, t->offset[i]);
	for (unsigned i = 0; i < t->ndim; i++)
		ckpt_buf_u64(b, t->extent[i]);
	ckpt_buf_u64(b, t->raw_bytes);
}

int remote_tensor_decode(const void *p, size_t n, struct remote_tensor *t)
{
	struct ckpt_cursor c;
	ckpt_cursor_init(&c, p, n);
	memset(t, 0, sizeof *t);
	if (!take_str(&c, t->name, sizeof t->name))
		return bad("TENSOR", "name");
	t->kind = ckpt_cursor_u8(&c);
	t->dtype = ckpt_cursor_u8(&c);
	t->policy = ckpt_cursor_u8(&c);
	t->flags = ckpt_cursor_u8(&c);
	t->ndim = ckpt_cursor_u8(&c);
	if (!c.ok || t->ndim > CKPT_MAX_NDIM)
		return bad("TENSOR", "rank (ndim)");
	for (unsigned i = 0; i < t->ndim; i++)
		t->global_shape[i] = ckpt_cursor_u64(&c);
	for (unsigned i = 0; i < t->ndim; i++)
		t->offset[i] = ckpt_cursor_u64(&c);
	for (unsigned i = 0; i < t->ndim; i++)
		t->extent[i] = ckpt_cursor_u64(&c);
	t->raw_bytes = ckpt_cursor_u64(&c);
	/* The writer checks the rest (names, shapes, boxes, sizes) as for any caller. */
	return c.ok && !c.left ? 0 : bad("TENSOR", "fields");
}

void remote_chunk_encode(struct ckpt_buf *b, const struct remote_chunk *c, bool after)
{
	ckpt_buf_u32(b, c->tensor);
	ckpt_buf_u8(b, c->codec);
	ckpt_buf_u64(b, c->raw_len);
	ckpt_buf_u64(b, c->stored_len);
	if (!after)
		ckpt_buf_put(b, c->hash, CKPT_HASH_BYTES);
	ckpt_buf_u32(b, c->block_bytes);
	ckpt_buf_u32(b, c->nblocks);
	if (after)
		return;
	ckpt_buf_put(b, c->blocks, (size_t)c->nblocks * CKPT_HASH_BYTES);
	if (c->grant)
		ckpt_buf_u32(b, c->grant);
}

int remote_chunk_decode(const void *p, size_t n, bool after, struct remote_chunk *c)
{
	struct ckpt_cursor k;
	ckpt_cursor_init(&k, p, n);
	memset(c, 0, sizeof *c);
	c->tensor = ckpt_cursor_u32(&k);
	c->codec = ckpt_cursor_u8(&k);
	c->raw_len = ckpt_cursor_u64(&k);
	c->stored_len = ckpt_cursor_u64(&k);
	const uint8_t *h = after ? NULL : ckpt_cursor_take(&k, CKPT_HASH_BYTES);
	c->block_bytes = ckpt_cursor_u32(&k);
	c->nblocks = ckpt_cursor_u32(&k);
	if (!k.ok || (!after && !h))
		return bad("CHUNK", "fields");
	if (h)
		memcpy(c->hash, h, CKPT_HASH_BYTES);
	if (c->codec != IO_CODEC_RAW && c->codec != IO_CODEC_ZSTD && c->codec != IO_CODEC_BYTEGROUP)
		return bad("CHUNK", "codec");
	if (c->raw_len == 0 || c->stored_len == 0 || c->raw_len > IO_MAX_CHUNK_BYTES ||
	    (c->codec == IO_CODEC_RAW && c->stored_len != c->raw_len))
		return bad("CHUNK", "lengths");
	/* The block hashes must be those a raw chunk of raw_len has at block_bytes. */
	uint64_t want = c->codec == IO_CODEC_RAW ? io_nblocks(c->raw_len, c->block_bytes) : 0;
	if (c->nblocks != want || (c->block_bytes && (c->block_bytes < IO_MIN_BLOCK_BYTES ||
	                                              (c->block_bytes & (c->block_bytes - 1)))))
		return bad("CHUNK", "block hashes");
	if (after)   /* the hashes come in HASHES, after the bytes; never a grant */
		return k.left ? bad("CHUNK", "length") : 0;
	c->blocks = ckpt_cursor_take(&k, (size_t)c->nblocks * CKPT_HASH_BYTES);
	if (!k.ok)
		return bad("CHUNK", "block hashes");
	/* The grant is newer than the message: absent, DATA follows; present, it is
	 * never 0 (the encoder leaves a 0 out). */
	bool has_grant = k.left == 4;
	c->grant = has_grant ? ckpt_cursor_u32(&k) : 0;
	if (k.left)
		return bad("CHUNK", "block hashes");
	return has_grant && !c->grant ? bad("CHUNK", "grant") : 0;
}

void remote_hashes_encode(struct ckpt_buf *b, const uint8_t hash[CKPT_HASH_BYTES],
                          const uint8_t *blocks, uint32_t nblocks)
{
	ckpt_buf_put(b, hash, CKPT_HASH_BYTES);
	ckpt_buf_put(b, blocks, (size_t)nblocks * CKPT_HASH_BYTES);
}

int remote_hashes_decode(const void *p, size_t n, uint32_t nblocks,
                         uint8_t hash[CKPT_HASH_BYTES], const uint8_t **blocks)
{
	/* Exactly the chunk's hash and the block hashes its CHUNK announced. */
	if (n != ((size_t)nblocks + 1) * CKPT_HASH_BYTES)
		return ckpt_err(CKPT_EPROTO, "malformed HASHES message: %zu bytes where the CHUNK "
		                "before it announced %u block hash%s (%zu bytes)", n, nblocks,
		                nblocks == 1 ? "" : "es", ((size_t)nblocks + 1) * CKPT_HASH_BYTES);
	memcpy(hash, p, CKPT_HASH_BYTES);
	*blocks = nblocks ? (const uint8_t *)p + CKPT_HASH_BYTES : NULL;
	return 0;
}

void remote_read_encode(struct ckpt_buf *b, const char *path, uint64_t off, uint64_t len)
{
	put_str(b, path);
	ckpt_buf_u64(b, off);
	ckpt_buf_u64(b, len);
}

int remote_read_decode(const void *p, size_t n, char *path, size_t cap, uint64_t *off,
                       uint64_t *len)
{
	struct ckpt_cursor c;
	ckpt_cursor_init(&c, p, n);
	if (!take_str(&c, path, cap))
		return bad("READ", "path");
	*off = ckpt_cursor_u64(&c);
	*len = ckpt_cursor_u64(&c);
	return c.ok && !c.left ? 0 : bad("READ", "range");
}

void remote_check_encode(struct ckpt_buf *b, const struct remote_check *k)
{
	put_str(b, k->path);
	ckpt_buf_u64(b, k->file_size);
	ckpt_buf_u64(b, k->footer_off);
	ckpt_buf_u64(b, k->footer_len);
	ckpt_buf_put(b, k->hash, CKPT_HASH_BYTES);
}

int remote_check_decode(const void *p, size_t n, struct remote_check *k)
{
	struct ckpt_cursor c;
	ckpt_cursor_init(&c, p, n);
	if (!take_str(&c, k->path, sizeof k->path))
		return bad("CHECK", "path");
	k->file_size = ckpt_cursor_u64(&c);
	k->footer_off = ckpt_cursor_u64(&c);
	k->footer_len = ckpt_cursor_u64(&c);
	const uint8_t *h = ckpt_cursor_take(&c, CKPT_HASH_BYTES);
	if (!c.ok || c.left || !h)
		return bad("CHECK", "fields");
	memcpy(k->hash, h, CKPT_HASH_BYTES);
	return 0;
}

const char *remote_msg_name(unsigned type)
{
	static const char *const names[] = {
		"COORD", "COORD_OK", "OPEN", "OPEN_OK", "TENSOR", "CHUNK", "DATA", "FINISH",
		"DURABLE", "ABORT", "ERROR", "MANIFEST", "MANIFEST_OK", "READ", "CHECK", "CHECK_OK",
		"REMOVE", "REMOVE_OK", "GRANT", "HASHES",
	};
	if (type < REMOTE_MSG_COORD || type - REMOTE_MSG_COORD >= sizeof names / sizeof names[0])
		return "unknown";
	return names[type - REMOTE_MSG_COORD];
}

void remote_error_encode(struct ckpt_buf *b, int code, const char *msg)
{
	size_t n = strlen(msg);
	if (n > 1000)
		n = 1000;
	ckpt_buf_u32(b, (uint32_t)code);
	ckpt_buf_u16(b, (uint16_t)n);
	ckpt_buf_put(b, msg, n);
}

int remote_error_take(const void *p, size_t n, const char *who)
{
	struct ckpt_cursor c;
	ckpt_cursor_init(&c, p, n);
	int code = (int)ckpt_cursor_u32(&c);
	uint16_t len = ckpt_cursor_u16(&c);
	const uint8_t *m = ckpt_cursor_take(&c, len);
	if (!c.ok || c.left || code >= 0 || code < -100000)
		return ckpt_err(CKPT_EPROTO, "%s: malformed ERROR message", who);
	char text[1024];
	size_t k = 0;
	for (size_t i = 0; i < len && k + 1 < sizeof text; i++)
		text[k++] = m[i] >= 0x20 && m[i] < 0x7f ? (char)m[i] : '?';
	text[k] = '\0';
	/* The peer's message ends with its words for the code, as ours will: once. */
	char tail[160];
	int t = snprintf(tail, sizeof tail, " (%s)", ckpt_strerror(code));
	if (t > 0 && (size_t)t < sizeof tail && k >= (size_t)t && !strcmp(text + k - (size_t)t, tail))
		text[k - (size_t)t] = '\0';
	return ckpt_err(code, "%s: %s", who, text);
}

void remote_send_error(struct net_conn *c, int code, const char *msg, int timeout_ms)
{
	struct ckpt_buf b;
	ckpt_buf_init(&b);
	remote_error_encode(&b, code, msg);
	if (b.ok)
		(void)net_send(c, REMOTE_MSG_ERROR, b.p, b.len, timeout_ms);
	ckpt_buf_free(&b);
}

int remote_path_split(const char *path, char *holder, size_t cap, const char **rel)
{
	if (path[0] != '@') {
		holder[0] = '\0';
		*rel = path;
		return 0;
	}
	const char *slash = strchr(path, '/');
	size_t n = slash ? (size_t)(slash - path - 1) : 0;
	if (!slash || n == 0 || n >= cap || !slash[1])
		return ckpt_err(CKPT_EFORMAT, "shard path '%.80s': expected @HOST:PORT/<file>", path);
	memcpy(holder, path + 1, n);
	holder[n] = '\0';
	*rel = slash + 1;
	return 0;
}

void remote_remove_encode(struct ckpt_buf *b, uint64_t step, uint64_t save_id)
{
	ckpt_buf_u64(b, step);
	ckpt_buf_u64(b, save_id);
}

int remote_remove_decode(const void *p, size_t n, uint64_t *step, uint64_t *save_id)
{
	struct ckpt_cursor c;
	ckpt_cursor_init(&c, p, n);
	*step = ckpt_cursor_u64(&c);
	*save_id = ckpt_cursor_u64(&c);
	/* An attempt is named by its save id: 0 would name every shard of the step. */
	return c.ok && !c.left && *save_id ? 0 : bad("REMOVE", "step or save id");
}
