/*
 * buf.c — a growable byte buffer for encoders (index, manifest records, messages).
 */
#include <stdlib.h>
#include <string.h>

#include "ckpt_internal.h"

void ckpt_buf_init(struct ckpt_buf *b)
{
	b->p = NULL;
	b->len = b->cap = 0;
	b->ok = true;
}

void ckpt_buf_free(struct ckpt_buf *b)
{
	ckpt_free(b->p);
	ckpt_buf_init(b);
}

void ckpt_buf_put(struct ckpt_buf *b, const void *p, size_t n)
{
	if (!b->ok)
		return;
	if (n > b->cap - b->len) {
		size_t cap = b->cap ? b->cap : 256;
		while (cap - b->len < n) {
			if (cap > SIZE_MAX / 2) { b->ok = false; return; }
			cap *= 2;
		}
		uint8_t *q = ckpt_realloc(b->p, cap);
		if (!q) { b->ok = false; return; }
		b->p = q;
		b->cap = cap;
	}
	if (n)
		memcpy(b->p + b->len, p, n);
	b->len += n;
}

void ckpt_buf_u8(struct ckpt_buf *b, uint8_t v) { ckpt_buf_put(b, &v, 1); }
void ckpt_buf_u16(struct ckpt_buf *b, uint16_t v) { uint8_t t[2]; ckpt_put_le16(t, v); ckpt_buf_put(b, t, 2); }
void ckpt_buf_u32(struct ckpt_buf *b, uint32_t v) { uint8_t t[4]; ckpt_put_le32(t, v); ckpt_buf_put(b, t, 4); }
void ckpt_buf_u64(struct ckpt_buf *b, uint64_t v) { uint8_t t[8]; ckpt_put_le64(t, v); ckpt_buf_put(b, t, 8); }
