/*
 * codec.c — chunk identity and compression: XXH3-128 of the raw bytes (stored in
 * xxHash's canonical, big-endian form so the bytes mean the same on every host)
 * and one-shot zstd frames (docs/format.md §5).
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
#include <zstd.h>

#include "io/io_internal.h"

void io_hash128(const void *p, size_t n, uint8_t out[CKPT_HASH_BYTES])
{
	XXH128_canonical_t c;
	XXH128_canonicalFromHash(&c, XXH3_128bits(p, n));
	memcpy(out, c.digest, CKPT_HASH_BYTES);
}

/* Blocks small enough to stay in L2 between the copy and the hash. */
#define COPY_HASH_BLOCK (128u << 10)

void io_copy_hash128(void *dst, const void *src, size_t n, uint8_t out[CKPT_HASH_BYTES])
{
	XXH3_state_t *st = XXH3_createState();
	if (!st) {
		/* No memory for the streaming state: two passes still give the same hash. */
		memcpy(dst, src, n);
		io_hash128(dst, n, out);
		return;
	}
	XXH3_128bits_reset(st);
	uint8_t *d = dst;
	const uint8_t *s = src;
	for (size_t off = 0; off < n; off += COPY_HASH_BLOCK) {
		size_t k = n - off < COPY_HASH_BLOCK ? n - off : COPY_HASH_BLOCK;
		memcpy(d + off, s + off, k);
		XXH3_128bits_update(st, d + off, k);
	}
	XXH128_canonical_t c;
	XXH128_canonicalFromHash(&c, XXH3_128bits_digest(st));
	memcpy(out, c.digest, CKPT_HASH_BYTES);
	XXH3_freeState(st);
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
	free(z);
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
		z = calloc(1, sizeof *z);
		if (!z || pthread_setspecific(ctx_key, z)) {
			free(z);
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
