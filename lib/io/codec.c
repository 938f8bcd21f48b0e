/*
 * codec.c — chunk identity and compression: XXH3-128 of the raw bytes (stored in
 * xxHash's canonical, big-endian form so the bytes mean the same on every host),
 * of a chunk and of each of its blocks in the same pass (docs/format.md §3a), and
 * one-shot zstd frames (docs/format.md §5).
 *
 * zstd's size_t results are converted here and never leave this file. Contexts
 * are expensive to create (hundreds of KiB), so each thread keeps one
 * compression and one decompression context in thread-specific data, freed by
 * the key's destructor when the thread exits.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>
#ifdef CKPT_HAVE_XXH_DISPATCH
/* XXH3_128bits and its update become the library's dispatching versions: the
 * widest vector unit the CPU has, chosen at run time (the same hashes). */
#include <xxh_x86dispatch.h>
#endif
#include <zstd.h>

#include "io/io_internal.h"

/* Pieces small enough to stay in L2 between the copy and the hashes. */
#define COPY_HASH_PIECE (128u << 10)

static void put_digest(uint8_t out[CKPT_HASH_BYTES], XXH128_hash_t h)
{
	XXH128_canonical_t c;
	XXH128_canonicalFromHash(&c, h);
	memcpy(out, c.digest, CKPT_HASH_BYTES);
}

void io_hash128(const void *p, size_t n, uint8_t out[CKPT_HASH_BYTES])
{
	put_digest(out, XXH3_128bits(p, n));
}

void io_copy_hash128(void *dst, const void *src, size_t n, uint8_t out[CKPT_HASH_BYTES])
{
	io_copy_hash128_blocks(dst, src, n, 0, out, NULL);
}

/* Without memory for the streaming states: the same hashes in separate passes. */
static void copy_hash_passes(void *dst, const void *src, size_t n, uint32_t block_bytes,
                             uint8_t out[CKPT_HASH_BYTES], uint8_t *blocks)
{
	if (dst)
		memcpy(dst, src, n);
	const uint8_t *p = dst ? dst : src;
	io_hash128(p, n, out);
	uint64_t nb = io_nblocks(n, block_bytes);
	for (uint64_t b = 0; b < nb; b++) {
		size_t off = (size_t)b * block_bytes;
		io_hash128(p + off, n - off < block_bytes ? n - off : block_bytes,
		           blocks + b * CKPT_HASH_BYTES);
	}
}

/*
 * One walk over the bytes in pieces that never cross a block boundary: each piece
 * is copied (when dst is given), then fed to the chunk's streaming hash and to its
 * block's while it is still in cache, so that the bytes cross the memory bus once
 * whatever the number of hashes taken of them.
 */
void io_copy_hash128_blocks(void *dst, const void *src, size_t n, uint32_t block_bytes,
                            uint8_t out[CKPT_HASH_BYTES], uint8_t *blocks)
{
	uint64_t nb = io_nblocks(n, block_bytes);
	if (!dst && !nb) {
		io_hash128(src, n, out);       /* one hash of bytes already in place */
		return;
	}
	XXH3_state_t *st = XXH3_createState(), *bst = nb ? XXH3_createState() : NULL;
	if (!st || (nb && !bst)) {
		XXH3_freeState(st);
		XXH3_freeState(bst);
		copy_hash_passes(dst, src, n, block_bytes, out, blocks);
		return;
	}
	XXH3_128bits_reset(st);
	if (nb)
		XXH3_128bits_reset(bst);
	uint8_t *d = dst;
	const uint8_t *s = src;
	size_t in_block = 0, b = 0;       /* bytes of the current block hashed; its index */
	for (size_t off = 0; off < n;) {
		size_t k = n - off < COPY_HASH_PIECE ? n - off : COPY_HASH_PIECE;
		if (nb && k > block_bytes - in_block)
			k = block_bytes - in_block;
		const uint8_t *p = s + off;
		if (d) {
			memcpy(d + off, s + off, k);
			p = d + off;           /* hash what was written: it is what goes to disk */
		}
		XXH3_128bits_update(st, p, k);
		off += k;
		if (nb) {
			XXH3_128bits_update(bst, p, k);
			in_block += k;
			if (in_block == block_bytes || off == n) {
				put_digest(blocks + b++ * CKPT_HASH_BYTES, XXH3_128bits_digest(bst));
				XXH3_128bits_reset(bst);
				in_block = 0;
			}
		}
	}
	put_digest(out, XXH3_128bits_digest(st));
	XXH3_freeState(st);
	XXH3_freeState(bst);
}

void io_hash_hex(const uint8_t h[CKPT_HASH_BYTES], char out[2 * CKPT_HASH_BYTES + 1])
{
	static const char hex[] = "0123456789abcdef";
	for (unsigned i = 0; i < CKPT_HASH_BYTES; i++) {
		out[2 * i] = hex[h[i] >> 4];
		out[2 * i + 1] = hex[h[i] & 15];
	}
	out[2 * CKPT_HASH_BYTES] = '\0';
}

/* ------------------------------------------------------------------ per-thread contexts */

struct zstd_ctxs {
	ZSTD_CCtx *c;
	ZSTD_DCtx *d;
};

static pthread_key_t ctx_key;
static pthread_once_t ctx_once = PTHREAD_ONCE_INIT;

static void ctx_destroy(void *p)
{
	struct zstd_ctxs *z = p;
	ZSTD_freeCCtx(z->c);
	ZSTD_freeDCtx(z->d);
	ckpt_free(z);
}

static void ctx_key_init(void)
{
	if (pthread_key_create(&ctx_key, ctx_destroy))
		abort();   /* only on PTHREAD_KEYS_MAX exhaustion: a build-level bug */
}

static struct zstd_ctxs *ctxs(void)
{
	pthread_once(&ctx_once, ctx_key_init);
	struct zstd_ctxs *z = pthread_getspecific(ctx_key);
	if (!z) {
		z = ckpt_calloc(1, sizeof *z);
		if (!z || pthread_setspecific(ctx_key, z)) {
			ckpt_free(z);
			return NULL;
		}
	}
	return z;
}

size_t io_codec_compress(void *dst, size_t cap, const void *src, size_t n, int level)
{
	struct zstd_ctxs *z = ctxs();
	if (!z)
		return 0;
	if (!z->c && !(z->c = ZSTD_createCCtx()))
		return 0;
	/* A one-shot call records the content size in the frame header, which
	 * decompress checks against the index's raw_len. */
	size_t r = ZSTD_compressCCtx(z->c, dst, cap, src, n, level);
	return ZSTD_isError(r) ? 0 : r;   /* dstSize_tooSmall and the rest: store raw */
}

int io_codec_decompress(void *dst, size_t raw_len, const void *src, size_t n)
{
	unsigned long long fcs = ZSTD_getFrameContentSize(src, n);
	if (fcs == ZSTD_CONTENTSIZE_ERROR || fcs == ZSTD_CONTENTSIZE_UNKNOWN)
		return ckpt_err(CKPT_ECORRUPT, "zstd: bad frame header");
	if (fcs != raw_len)
		return ckpt_err(CKPT_ECORRUPT, "zstd: frame holds %llu bytes, expected %zu", fcs,
		                raw_len);
	/* Exactly one frame: bytes after it would be unchecked data. */
	size_t fsz = ZSTD_findFrameCompressedSize(src, n);
	if (ZSTD_isError(fsz) || fsz != n)
		return ckpt_err(CKPT_ECORRUPT, "zstd: frame is not exactly %zu bytes", n);
	struct zstd_ctxs *z = ctxs();
	if (!z || (!z->d && !(z->d = ZSTD_createDCtx())))
		return ckpt_err(-ENOMEM, "zstd: decompression context");
	size_t r = ZSTD_decompressDCtx(z->d, dst, raw_len, src, n);
	if (ZSTD_isError(r))
		return ckpt_err(CKPT_ECORRUPT, "zstd: %s", ZSTD_getErrorName(r));
	if (r != raw_len)
		return ckpt_err(CKPT_ECORRUPT, "zstd: decompressed %zu bytes, expected %zu", r,
		                raw_len);
	return 0;
}
