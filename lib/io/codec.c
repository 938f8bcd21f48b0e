/*
 * codec.c — chunk identity and compression: XXH3-128 of the raw bytes (stored in
 * xxHash's canonical, big-endian form so the bytes mean the same on every host),
 * of a chunk and of each of its blocks in the same pass (docs/format.md §3a),
 * one-shot zstd frames, and byte-grouped planes of floating-point chunks
 * (docs/format.md §5).
 *
 * Byte grouping: the bytes of a floating-point element differ in what they hold.
 * The byte(s) with the sign and exponent take few values across a tensor of
 * trained weights or optimizer moments; the low mantissa bytes are close to
 * random. zstd over the interleaved bytes sees neither; split into planes (plane
 * p = byte p of every element), the exponent planes compress several-fold and the
 * mantissa planes are stored as they are, without spending time on them twice
 * (once compressing, once decompressing).
 *
 * zstd's size_t results are converted here and never leave this file. Contexts
 * are expensive to create (hundreds of KiB), so each thread keeps one
 * compression and one decompression context in thread-specific data, freed by
 * the key's destructor when the thread exits. Byte grouping keeps one plane there
 * too (up to half a chunk: what one plane is gathered into or decompressed into):
 * the writer's compression workers free theirs when the save ends, a thread that
 * loads keeps its own as it keeps its zstd context.
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
/* For ZSTD_c_literalCompressionMode (zstd >= 1.5.1; Debian 12 has 1.5.4). The
 * parameter is set through the stable ZSTD_CCtx_setParameter; a library that
 * refuses it leaves the plane to zstd's level 1. */
#define ZSTD_STATIC_LINKING_ONLY
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
	io_copy_hash128_blocks(dst, src, n, 0, false, out, NULL);
}

void io_chunk_hash(const void *p, size_t n, uint32_t block_bytes, bool tree,
                   uint8_t out[CKPT_HASH_BYTES])
{
	io_copy_hash128_blocks(NULL, p, n, block_bytes, tree, out, NULL);
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
 * A chunk hashed as a tree (version 5): each block hashed in one call, right after
 * its copy when there is one (a block of the library's size stays in L2 between
 * the two), its hash kept in blocks when given and fed to the row's. Every byte is
 * hashed once; nothing is allocated.
 */
static void copy_hash_tree(uint8_t *dst, const uint8_t *src, size_t n, uint32_t block_bytes,
                           uint64_t nb, uint8_t out[CKPT_HASH_BYTES], uint8_t *blocks)
{
	struct io_hash_row row;
	io_hash_row_reset(&row);
	for (uint64_t b = 0; b < nb; b++) {
		size_t off = (size_t)b * block_bytes;
		size_t k = n - off < block_bytes ? n - off : block_bytes;
		const uint8_t *p = src + off;
		if (dst) {
			memcpy(dst + off, p, k);
			p = dst + off;         /* hash what was written: it is what goes to disk */
		}
		uint8_t h[CKPT_HASH_BYTES];
		io_hash128(p, k, h);
		if (blocks)
			memcpy(blocks + b * CKPT_HASH_BYTES, h, CKPT_HASH_BYTES);
		io_hash_row_add(&row, h);
	}
	io_hash_row_digest(&row, out);
}

void io_tree_hash(const uint8_t *blocks, uint64_t nb, uint8_t out[CKPT_HASH_BYTES])
{
	struct io_hash_row row;
	io_hash_row_reset(&row);
	for (uint64_t b = 0; b < nb; b++)
		io_hash_row_add(&row, blocks + b * CKPT_HASH_BYTES);
	io_hash_row_digest(&row, out);
}

/*
 * One walk over the bytes in pieces that never cross a block boundary: each piece
 * is copied (when dst is given), then fed to the chunk's streaming hash and to its
 * block's while it is still in cache, so that the bytes cross the memory bus once
 * whatever the number of hashes taken of them.
 */
void io_copy_hash128_blocks(void *dst, const void *src, size_t n, uint32_t block_bytes,
                            bool tree, uint8_t out[CKPT_HASH_BYTES], uint8_t *blocks)
{
	uint64_t nb = io_nblocks(n, block_bytes);
	if (!tree && !blocks)
		nb = 0;                        /* no block hash wanted */
	if (nb && tree) {
		copy_hash_tree(dst, src, n, block_bytes, nb, out, blocks);
		return;
	}
	if (!dst && !nb) {
		io_hash128(src, n, out);       /* one hash of bytes already in place */
		return;
	}
	XXH3_state_t *st = XXH3_createState(), *bst = nb ? XXH3_createState() : NULL;
	if (!st || (nb && !bst)) {
		XXH3_freeState(st);
		XXH3_freeState(bst);
		copy_hash_passes(dst, src, n, nb ? block_bytes : 0, out, blocks);
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
	uint8_t   *plane;        /* byte grouping: one plane, gathered or decompressed */
	size_t     plane_cap;
};

static pthread_key_t ctx_key;
static pthread_once_t ctx_once = PTHREAD_ONCE_INIT;

static void ctx_destroy(void *p)
{
	struct zstd_ctxs *z = p;
	ZSTD_freeCCtx(z->c);
	ZSTD_freeDCtx(z->d);
	ckpt_free(z->plane);
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

/* ------------------------------------------------------------------ byte grouping */

unsigned io_bytegroup_width(int dtype)
{
	switch (dtype) {
	case CKPT_BF16: case CKPT_F16: return 2;
	case CKPT_F32:                 return 4;
	case CKPT_F64:                 return 8;
	default:                       return 0;   /* fp8 has one byte; integers: plain zstd */
	}
}

/* Bytes of plane p of n raw bytes of width-byte elements: one per element, and one
 * more for the planes the trailing partial element reaches. */
static size_t plane_bytes(size_t n, unsigned width, unsigned p)
{
	return n / width + (p < n % width);
}

/* This thread's plane buffer, of at least n bytes; NULL on -ENOMEM. */
static uint8_t *plane_buf(struct zstd_ctxs *z, size_t n)
{
	if (n <= z->plane_cap)
		return z->plane;
	uint8_t *p = ckpt_malloc(n ? n : 1);
	if (!p)
		return NULL;
	ckpt_free(z->plane);
	z->plane = p;
	z->plane_cap = n;
	return p;
}

/* The constant widths let the compiler unroll the strided loops. */
#define BG_GATHER(W)                                                     \
	for (size_t i = 0; i < m; i++)                                   \
		out[i] = src[i * (W) + p]
#define BG_SCATTER(W)                                                    \
	for (size_t i = 0; i < m; i++)                                   \
		dst[i * (W) + p] = in[i]

static void plane_gather(uint8_t *out, const uint8_t *src, size_t n, unsigned width, unsigned p)
{
	size_t m = n / width;
	switch (width) {
	case 2: BG_GATHER(2); break;
	case 4: BG_GATHER(4); break;
	default: BG_GATHER(8); break;
	}
	if (p < n % width)
		out[m] = src[m * width + p];
}

static void plane_scatter(uint8_t *dst, const uint8_t *in, size_t n, unsigned width, unsigned p)
{
	size_t m = n / width;
	switch (width) {
	case 2: BG_SCATTER(2); break;
	case 4: BG_SCATTER(4); break;
	default: BG_SCATTER(8); break;
	}
	if (p < n % width)
		dst[m * width + p] = in[m];
}

/* Elements sampled to tell random planes from the rest, and the collision entropy
 * (bits a byte) from which a plane counts as random: 2^7.9 = 239 (see below). */
#define BG_SAMPLE       4096u
#define BG_RANDOM_INV_P 239u

/*
 * Which planes look random, from a sample of the elements spread over the chunk:
 * those whose collision entropy (Rényi's of order 2, -log2 of the chance that two
 * bytes drawn at random are equal) is at least 7.9 bits a byte. It is a lower bound
 * of Shannon's entropy, so zstd's entropy coding cannot save even 1.3% of such a
 * plane, let alone the sixteenth that makes a plane worth compressing: the
 * mantissa planes are stored without a compression attempt, and a chunk whose
 * planes are all random is stored raw before any byte is moved. What the sample
 * cannot see is repetition (a plane of random bytes repeated): such a plane is
 * stored as it is. Sum c^2 - N estimates N(N-1) times the collision chance without
 * bias; no logarithm is needed. Returns how many planes are random.
 */
static unsigned planes_random(const uint8_t *src, size_t n, unsigned width, bool *random)
{
	size_t elems = n / width;
	if (elems < BG_SAMPLE)
		return 0;                  /* small chunks: just try every plane */
	size_t stride = elems / BG_SAMPLE;
	unsigned nrandom = 0;
	for (unsigned p = 0; p < width; p++) {
		uint32_t count[256] = { 0 };
		for (size_t i = 0; i < BG_SAMPLE; i++)
			count[src[i * stride * width + p]]++;
		uint64_t sq = 0, s = BG_SAMPLE;
		for (unsigned b = 0; b < 256; b++)
			sq += (uint64_t)count[b] * count[b];
		random[p] = (sq - s) * BG_RANDOM_INV_P <= s * (s - 1);
		nrandom += random[p];
	}
	return nrandom;
}

/* zstd's fastest match search with Huffman-coded literals (plane_compress). */
static bool entropy_params(ZSTD_CCtx *c)
{
	return !ZSTD_isError(ZSTD_CCtx_reset(c, ZSTD_reset_session_and_parameters)) &&
	       !ZSTD_isError(ZSTD_CCtx_setParameter(c, ZSTD_c_compressionLevel, ZSTD_minCLevel())) &&
	       !ZSTD_isError(ZSTD_CCtx_setParameter(c, ZSTD_c_literalCompressionMode,
	                                            ZSTD_ps_enable));
}

/* The first bytes of a plane that choose how level 1 compresses it. */
#define BG_PROBE (64u << 10)

/*
 * One plane into at most want bytes; its length, or 0 when it does not fit.
 *
 * Level 1, bytegroup's default, entropy-codes a plane unless it repeats: zstd's
 * fastest match search (its lowest level) with the literals Huffman-coded, which
 * zstd leaves raw at negative levels unless told. A plane of exponent bytes of
 * trained weights or moments has a skewed distribution of values and few matches
 * worth the name: what pays is the entropy coding, and level 1's search costs time
 * and, on such planes, some of the ratio (short matches that cost more than the
 * literals they replace). Measured on the exponent plane of gaussian weights:
 * ratio 2.95 at about 1 GB/s a thread, against 2.71 at 0.2-0.35 GB/s with level 1
 * (docs/perf.md §7). A plane that does repeat (the zeros of fp16 moments that
 * underflowed) needs the search: the first BG_PROBE bytes are compressed both ways
 * and level 1 serves the whole plane when it wins there by more than 1/32. The
 * frames are ordinary zstd frames: nothing changes for the reader. Other levels are
 * zstd's levels.
 */
static size_t plane_compress(ZSTD_CCtx *c, void *dst, size_t want, const void *plane, size_t m,
                             int level)
{
	size_t r;
	bool entropy = level == 1 && entropy_params(c);
	if (entropy && m >= 4 * BG_PROBE && want >= ZSTD_compressBound(BG_PROBE)) {
		/* Both probes land in dst, which the plane's frame then overwrites. */
		size_t e = ZSTD_compress2(c, dst, want, plane, BG_PROBE);
		size_t l = ZSTD_compressCCtx(c, dst, want, plane, BG_PROBE, 1);
		if (!ZSTD_isError(e) && !ZSTD_isError(l) && l + l / 32 < e)
			entropy = false;
		else
			/* Set again: zstd documents that compressCCtx ignores the advanced
			 * parameters, not that it leaves them as they were. */
			entropy = entropy_params(c);
	}
	if (entropy)
		r = ZSTD_compress2(c, dst, want, plane, m);
	else
		r = ZSTD_compressCCtx(c, dst, want, plane, m, level);
	return ZSTD_isError(r) ? 0 : r;
}

size_t io_bytegroup_compress(void *dst, size_t cap, const void *src, size_t n, unsigned width,
                             int level)
{
	if ((width != 2 && width != 4 && width != 8) || n == 0)
		return 0;
	size_t hdr = IO_BG_HDR_BYTES + (size_t)width * IO_BG_PLANE_BYTES;
	struct zstd_ctxs *z = ctxs();
	if (cap <= hdr || !z || (!z->c && !(z->c = ZSTD_createCCtx())))
		return 0;
	bool random[8] = { false };
	if (planes_random(src, n, width, random) == width)
		return 0;
	uint8_t *plane = plane_buf(z, plane_bytes(n, width, 0));
	if (!plane)
		return 0;
	uint8_t *d = dst;
	d[0] = IO_BG_LAYOUT;
	d[1] = (uint8_t)width;
	d[2] = d[3] = 0;
	size_t pos = hdr;
	for (unsigned p = 0; p < width; p++) {
		size_t m = plane_bytes(n, width, p), room = cap - pos, len = 0;
		uint8_t method = IO_BG_STORED;
		/* Worth its decompression only when it saves a sixteenth: a mantissa
		 * plane that zstd shrinks by a percent is stored as it is. */
		size_t want = random[p] ? 0 : m - m / 16;
		if (want > room)
			want = room;
		if (want > 0) {
			plane_gather(plane, src, n, width, p);
			size_t r = plane_compress(z->c, d + pos, want, plane, m, level);
			if (r && r < want) {
				method = IO_BG_ZSTD;
				len = r;
			}
		}
		if (method == IO_BG_STORED) {
			if (m > room)
				return 0;           /* the chunk does not pay: stored raw */
			if (want > 0)
				memcpy(d + pos, plane, m);
			else
				plane_gather(d + pos, src, n, width, p);
			len = m;
		}
		uint8_t *e = d + IO_BG_HDR_BYTES + (size_t)p * IO_BG_PLANE_BYTES;
		e[0] = method;
		e[1] = e[2] = e[3] = 0;
		ckpt_put_le32(e + 4, (uint32_t)len);   /* <= m <= 2^30 */
		pos += len;
	}
	return pos;
}

int io_bytegroup_decompress(void *dst, size_t raw_len, const void *src, size_t n,
                            unsigned width)
{
	const uint8_t *s = src;
	if (n < IO_BG_HDR_BYTES)
		return ckpt_err(CKPT_ECORRUPT, "bytegroup: %zu bytes, shorter than its header", n);
	if (s[0] != IO_BG_LAYOUT)
		return ckpt_err(CKPT_ECORRUPT, "bytegroup: layout %u unknown", s[0]);
	if (s[1] != width || s[2] || s[3])
		return ckpt_err(CKPT_ECORRUPT, "bytegroup: element width %u (reserved 0x%02x%02x), "
		                "expected %u from the tensor's dtype", s[1], s[2], s[3], width);
	if (width != 2 && width != 4 && width != 8)
		return ckpt_err(CKPT_ECORRUPT, "bytegroup: element width %u", width);
	size_t hdr = IO_BG_HDR_BYTES + (size_t)width * IO_BG_PLANE_BYTES;
	if (n < hdr)
		return ckpt_err(CKPT_ECORRUPT, "bytegroup: %zu bytes, shorter than the header of "
		                "%u planes (%zu)", n, width, hdr);
	/* Every plane's place first, before any byte is written: the lengths must
	 * tile the stored bytes exactly. */
	uint64_t total = hdr;
	for (unsigned p = 0; p < width; p++) {
		const uint8_t *e = s + IO_BG_HDR_BYTES + (size_t)p * IO_BG_PLANE_BYTES;
		uint32_t len = ckpt_get_le32(e + 4);
		size_t m = plane_bytes(raw_len, width, p);
		if (e[1] | e[2] | e[3])
			return ckpt_err(CKPT_ECORRUPT, "bytegroup: plane %u: reserved bytes not zero", p);
		if (e[0] == IO_BG_STORED ? len != m : e[0] != IO_BG_ZSTD || len == 0)
			return ckpt_err(CKPT_ECORRUPT, "bytegroup: plane %u: method %u with %u bytes "
			                "(the plane holds %zu)", p, e[0], len, m);
		total += len;              /* width <= 8 lengths of 32 bits: no overflow */
	}
	if (total != n)
		return ckpt_err(CKPT_ECORRUPT, "bytegroup: planes and header take %llu bytes, %zu "
		                "are stored", (unsigned long long)total, n);
	struct zstd_ctxs *z = NULL;
	uint8_t *plane = NULL;
	size_t pos = hdr;
	for (unsigned p = 0; p < width; p++) {
		const uint8_t *e = s + IO_BG_HDR_BYTES + (size_t)p * IO_BG_PLANE_BYTES;
		size_t len = ckpt_get_le32(e + 4), m = plane_bytes(raw_len, width, p);
		const uint8_t *in = s + pos;
		pos += len;
		if (e[0] == IO_BG_STORED) {
			plane_scatter(dst, in, raw_len, width, p);
			continue;
		}
		if (!plane) {
			z = ctxs();
			if (!z || (!z->d && !(z->d = ZSTD_createDCtx())) ||
			    !(plane = plane_buf(z, plane_bytes(raw_len, width, 0))))
				return ckpt_err(-ENOMEM, "bytegroup: decompression context and plane");
		}
		int rc = io_codec_decompress(plane, m, in, len);
		if (rc)
			return ckpt_err_prefix(rc, "bytegroup: plane %u", p);
		plane_scatter(dst, plane, raw_len, width, p);
	}
	return 0;
}

/* ------------------------------------------------------------------ one chunk */

size_t io_chunk_encode(uint8_t codec, int level, int dtype, void *dst, size_t cap,
                       const void *src, size_t n, uint8_t *used)
{
	unsigned width = codec == IO_CODEC_BYTEGROUP ? io_bytegroup_width(dtype) : 0;
	size_t r;
	if (width) {
		*used = IO_CODEC_BYTEGROUP;
		r = io_bytegroup_compress(dst, cap, src, n, width, level);
	} else {
		*used = IO_CODEC_ZSTD;
		r = io_codec_compress(dst, cap, src, n, level);
	}
	return r;
}

int io_chunk_decode(uint8_t codec, int dtype, void *dst, size_t raw_len, const void *src,
                    size_t n)
{
	if (codec == IO_CODEC_ZSTD)
		return io_codec_decompress(dst, raw_len, src, n);
	if (codec == IO_CODEC_BYTEGROUP && io_bytegroup_width(dtype))
		return io_bytegroup_decompress(dst, raw_len, src, n, io_bytegroup_width(dtype));
	return ckpt_err(CKPT_ECORRUPT, "codec %u for a chunk of dtype %s", codec,
	                ckpt_dtype_name(dtype));
}
