/*
 * hash_row.c — the streaming hash of a chunk's row of block hashes (docs/format.md
 * §5, version 5), in a state on the caller's stack.
 *
 * xxHash's own state must come from the heap where the library is linked shared
 * (its layout is not part of the shared library's interface), and a hash that can
 * fail for want of memory would put a chunk on disk whose hash is wrong. The row
 * is short (16 bytes a block) and hashed once a chunk, so this file compiles
 * XXH3 inline, with its state's layout known here, and never allocates.
 */
#define XXH_INLINE_ALL
#include <string.h>
#include <xxhash.h>

#include "io/io_internal.h"

_Static_assert(sizeof(XXH3_state_t) <= sizeof(((struct io_hash_row *)0)->state),
               "the row's state holds xxHash's");
_Static_assert(_Alignof(XXH3_state_t) <= _Alignof(struct io_hash_row),
               "the row's state is aligned as xxHash's");

static XXH3_state_t *row_state(struct io_hash_row *r)
{
	return (XXH3_state_t *)(void *)r->state;
}

void io_hash_row_reset(struct io_hash_row *r)
{
	memset(r, 0, sizeof *r);
	XXH3_INITSTATE(row_state(r));
	XXH3_128bits_reset(row_state(r));
}

void io_hash_row_add(struct io_hash_row *r, const uint8_t h[CKPT_HASH_BYTES])
{
	XXH3_128bits_update(row_state(r), h, CKPT_HASH_BYTES);
}

void io_hash_row_digest(struct io_hash_row *r, uint8_t out[CKPT_HASH_BYTES])
{
	XXH128_canonical_t c;
	XXH128_canonicalFromHash(&c, XXH3_128bits_digest(row_state(r)));
	memcpy(out, c.digest, CKPT_HASH_BYTES);
}
