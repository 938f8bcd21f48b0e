/*
 * test_codec_pool.c — chunk codec (XXH3-128, zstd frames) and the buffer pool
 * (ownership, timeouts, cross-thread wake-up, double put, custom allocator).
 */
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "io/io_internal.h"
#include "testutil.h"

/* ------------------------------------------------------------------ codec */

START_TEST(copy_hash_matches_hash)
{
	/* The fused copy+hash must give the bytes and the hash of the two-pass path. */
	size_t sizes[] = { 0, 1, 63, 4096, (128u << 10) - 1, 128u << 10, (128u << 10) + 1, 5u << 20 };
	for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
		size_t n = sizes[i];
		uint8_t *src = malloc(n + 1), *dst = malloc(n + 1);
		tu_fill(src, n, tu_seed(), 900 + i);
		uint8_t h1[CKPT_HASH_BYTES], h2[CKPT_HASH_BYTES];
		io_copy_hash128(dst, src, n, h1);
		io_hash128(src, n, h2);
		ck_assert_msg(!memcmp(h1, h2, sizeof h1), "hash differs at size %zu", n);
		ck_assert_msg(!memcmp(src, dst, n), "copy differs at size %zu", n);
		free(src);
		free(dst);
	}
}
END_TEST

START_TEST(copy_hash_blocks_match_hashes)
{
	/* One pass, copying or not, gives the chunk's hash and each block's hash as
	 * separate io_hash128 calls would; at and around block and piece edges. A tree
	 * (format 5) is the hash of the block hashes one after another, whether they
	 * are kept or not; a chunk of one block is its bytes' hash either way. */
	const uint32_t blocks[] = { 4096, 16384, 256u << 10 };
	const size_t sizes[] = { 1, 4096, 4097, 16384, 16385, (256u << 10) - 1, 256u << 10,
	                         (256u << 10) + 1, (3u << 20) + 12345 };
	for (unsigned b = 0; b < CKPT_ARRAY_SIZE(blocks); b++)
		for (unsigned i = 0; i < CKPT_ARRAY_SIZE(sizes); i++)
			for (int mode = 0; mode < 8; mode++) {
				bool copy = mode & 1, tree = mode & 2, keep = !(mode & 4);
				size_t n = sizes[i];
				uint32_t bs = blocks[b];
				uint64_t nb = io_nblocks(n, bs);
				ck_assert_uint_eq(nb, n > bs ? (n + bs - 1) / bs : 0);
				uint8_t *src = malloc(n), *dst = malloc(n);
				uint8_t *got = malloc((nb + 1) * CKPT_HASH_BYTES);
				uint8_t *row = malloc((nb + 1) * CKPT_HASH_BYTES);
				tu_fill(src, n, tu_seed(), 950 + i);
				memset(got, 0xEE, (nb + 1) * CKPT_HASH_BYTES);
				memset(dst, 0, n);
				uint8_t h[CKPT_HASH_BYTES], want[CKPT_HASH_BYTES];
				io_copy_hash128_blocks(copy ? dst : NULL, src, n, bs, tree, h,
				                       keep ? got : NULL);
				for (uint64_t j = 0; j < nb; j++) {
					size_t from = (size_t)j * bs, k = n - from < bs ? n - from : bs;
					io_hash128(src + from, k, row + j * CKPT_HASH_BYTES);
					if (keep)
						ck_assert_msg(!memcmp(got + j * CKPT_HASH_BYTES,
						                      row + j * CKPT_HASH_BYTES, CKPT_HASH_BYTES),
						              "block %llu, n %zu block %u tree %d",
						              (unsigned long long)j, n, bs, tree);
				}
				if (tree && nb)
					io_hash128(row, (size_t)nb * CKPT_HASH_BYTES, want);
				else
					io_hash128(src, n, want);
				ck_assert_msg(!memcmp(h, want, sizeof h), "chunk hash, n %zu block %u "
				              "tree %d copy %d keep %d", n, bs, tree, copy, keep);
				uint8_t alone[CKPT_HASH_BYTES];
				io_chunk_hash(src, n, bs, tree, alone);
				ck_assert(!memcmp(alone, want, sizeof want));
				if (copy)
					ck_assert(!memcmp(dst, src, n));
				/* Nothing written past the last block hash, nor at all unasked. */
				for (unsigned k = 0; k < (keep ? 1 : nb + 1) * CKPT_HASH_BYTES; k++)
					ck_assert_uint_eq(got[(keep ? nb * CKPT_HASH_BYTES : 0) + k], 0xEE);
				free(src);
				free(dst);
				free(got);
				free(row);
			}
}
END_TEST

START_TEST(hash_known_values)
{
	uint8_t h[CKPT_HASH_BYTES], h2[CKPT_HASH_BYTES];
	char hex[2 * CKPT_HASH_BYTES + 1];
	io_hash128("", 0, h);
	io_hash_hex(h, hex);
	/* XXH3-128 of the empty input, canonical (big-endian) form. */
	ck_assert_str_eq(hex, "99aa06d3014798d86001c324468d497f");
	io_hash128("abc", 3, h);
	io_hash128("abd", 3, h2);
	ck_assert_mem_ne(h, h2, CKPT_HASH_BYTES);
	io_hash_hex(h, hex);
	ck_assert_uint_eq(strlen(hex), 32);
}
END_TEST

START_TEST(zstd_round_trip)
{
	uint64_t seed = tu_seed();
	size_t n = 300000;
	uint8_t *src = malloc(n), *z = malloc(n), *back = malloc(n);
	/* Compressible: runs of a few random symbols. */
	uint64_t s = seed;
	for (size_t i = 0; i < n; i++)
		src[i] = (uint8_t)("abcd"[(i / 64 + tu_rand(&s) % 2) % 4]);
	size_t zn = io_codec_compress(z, n - 1, src, n, 3);
	ck_assert_uint_gt(zn, 0);
	ck_assert_uint_lt(zn, n / 4);
	ck_assert_int_eq(io_codec_decompress(back, n, z, zn), 0);
	ck_assert_mem_eq(back, src, n);
	/* Incompressible: random bytes do not fit in n - 1. */
	tu_fill(src, n, seed, 1);
	ck_assert_uint_eq(io_codec_compress(z, n - 1, src, n, 3), 0);
	/* Too small a destination is "store raw", not an error. */
	ck_assert_uint_eq(io_codec_compress(z, 10, src, n, 1), 0);
	free(src);
	free(z);
	free(back);
}
END_TEST

START_TEST(zstd_corrupt_frames)
{
	size_t n = 100000;
	uint8_t *src = calloc(1, n), *z = malloc(n + 16), *back = malloc(n + 1);
	for (size_t i = 0; i < n; i++)
		src[i] = (uint8_t)(i % 251);
	size_t zn = io_codec_compress(z, n - 1, src, n, 1);
	ck_assert_uint_gt(zn, 16);
	/* Wrong expected size. */
	ck_assert_int_eq(io_codec_decompress(back, n - 1, z, zn), CKPT_ECORRUPT);
	ck_assert_ptr_nonnull(strstr(ckpt_err_msg(), "expected"));
	ck_assert_int_eq(io_codec_decompress(back, n + 1, z, zn), CKPT_ECORRUPT);
	/* Truncated frame. */
	ck_assert_int_eq(io_codec_decompress(back, n, z, zn - 1), CKPT_ECORRUPT);
	/* Trailing bytes after the frame. */
	z[zn] = 0;
	ck_assert_int_eq(io_codec_decompress(back, n, z, zn + 1), CKPT_ECORRUPT);
	/* Bad magic. */
	z[0] ^= 0xff;
	ck_assert_int_eq(io_codec_decompress(back, n, z, zn), CKPT_ECORRUPT);
	z[0] ^= 0xff;
	/* Garbage in the middle of the block data: an error or wrong bytes, never a
	 * crash; wrong bytes are the hash's job (checked by the reader). */
	z[zn / 2] ^= 0x5a;
	int rc = io_codec_decompress(back, n, z, zn);
	ck_assert(rc == CKPT_ECORRUPT || rc == 0);
	ck_assert_int_eq(io_codec_decompress(back, n, "", 0), CKPT_ECORRUPT);
	free(src);
	free(z);
	free(back);
}
END_TEST

/* ------------------------------------------------------------------ pool */

START_TEST(pool_ownership)
{
	struct io_pool *p;
	ck_assert_int_eq(io_pool_create(4096, 0, NULL, &p), -EINVAL);
	ck_assert_ptr_null(p);
	ck_assert_int_eq(io_pool_create(4095, 2, NULL, &p), -EINVAL);
	ck_assert_int_eq(io_pool_create(SIZE_MAX / 2 + 1 - (SIZE_MAX / 2 + 1) % 4096, 4, NULL, &p),
	                 -EINVAL);
	ck_assert_int_eq(io_pool_create(8192, 3, NULL, &p), 0);
	ck_assert_uint_eq(io_pool_nbufs(p), 3);
	ck_assert_uint_eq(io_pool_buf_bytes(p), 8192);
	int got[3];
	for (int i = 0; i < 3; i++) {
		got[i] = io_pool_get(p, 0);
		ck_assert_int_ge(got[i], 0);
		uint8_t *a = io_pool_addr(p, (unsigned)got[i]);
		ck_assert_uint_eq((uintptr_t)a % CKPT_ALIGN, 0);
		memset(a, i, 8192);           /* every byte writable, no overlap below */
		ck_assert_int_eq(io_pool_index_of(p, a + 100, 8000), got[i]);
		ck_assert_int_eq(io_pool_index_of(p, a + 100, 8100), -1);   /* crosses into the next */
	}
	ck_assert_int_ne(got[0], got[1]);
	ck_assert_int_ne(got[1], got[2]);
	ck_assert_int_ne(got[0], got[2]);
	for (int i = 0; i < 3; i++)
		ck_assert_uint_eq(((uint8_t *)io_pool_addr(p, (unsigned)got[i]))[8191], i);
	ck_assert_uint_eq(io_pool_nfree(p), 0);
	ck_assert_int_eq(io_pool_get(p, 0), -ETIMEDOUT);
	uint64_t t0 = ckpt_now_ns();
	ck_assert_int_eq(io_pool_get(p, 50), -ETIMEDOUT);
	ck_assert_uint_ge(ckpt_now_ns() - t0, 45000000ull);
	ck_assert_ptr_null(io_pool_addr(p, 3));
	uint8_t local;
	ck_assert_int_eq(io_pool_index_of(p, &local, 1), -1);
	io_pool_put(p, (unsigned)got[1]);
	ck_assert_uint_eq(io_pool_nfree(p), 1);
	ck_assert_int_eq(io_pool_get(p, 0), got[1]);
	for (int i = 0; i < 3; i++)
		io_pool_put(p, (unsigned)got[i]);
	ck_assert_uint_eq(io_pool_nfree(p), 3);
	io_pool_destroy(p);
	io_pool_destroy(NULL);
}
END_TEST

/* Two classes: small takers get small buffers while they last, then large ones;
 * large takers never get a small one; every index serves addr, len, index_of and
 * put; the byte counts follow. */
START_TEST(pool_classes)
{
	struct io_pool *p;
	ck_assert_int_eq(io_pool_create_classes(16384, 2, 16384, 3, NULL, &p), -EINVAL);
	ck_assert_int_eq(io_pool_create_classes(16384, 2, 1000, 3, NULL, &p), -EINVAL);
	ck_assert_int_eq(io_pool_create_classes(16384, 2, 4096, 3, NULL, &p), 0);
	ck_assert_uint_eq(io_pool_nbufs(p), 2);
	ck_assert_uint_eq(io_pool_nslots(p), 5);
	ck_assert_uint_eq(io_pool_bytes(p), 2 * 16384 + 3 * 4096);
	ck_assert_uint_eq(io_pool_bytes_out(p), 0);
	int s[3];
	for (int i = 0; i < 3; i++) {
		s[i] = io_pool_get_fit(p, 4096, 0);
		ck_assert_int_ge(s[i], 2);                  /* a small one */
		ck_assert_uint_eq(io_pool_len(p, (unsigned)s[i]), 4096);
		uint8_t *a = io_pool_addr(p, (unsigned)s[i]);
		ck_assert_uint_eq((uintptr_t)a % CKPT_ALIGN, 0);
		memset(a, 0x40 + i, 4096);
		ck_assert_int_eq(io_pool_index_of(p, a + 10, 4000), s[i]);
		ck_assert_int_eq(io_pool_index_of(p, a + 10, 4090), -1);
	}
	ck_assert_uint_eq(io_pool_nfree(p), 2);         /* the large class untouched */
	ck_assert_uint_eq(io_pool_bytes_out(p), 3 * 4096);
	/* Small ones gone: a small taker gets a large buffer. A large taker never
	 * gets a small one. */
	int l0 = io_pool_get_fit(p, 100, 0);
	ck_assert_int_ge(l0, 0);
	ck_assert_int_lt(l0, 2);
	ck_assert_uint_eq(io_pool_len(p, (unsigned)l0), 16384);
	int l1 = io_pool_get_fit(p, 8192, 0);
	ck_assert_int_ge(l1, 0);
	ck_assert_int_lt(l1, 2);
	memset(io_pool_addr(p, (unsigned)l0), 0x11, 16384);
	memset(io_pool_addr(p, (unsigned)l1), 0x22, 16384);
	ck_assert_int_eq(io_pool_get_fit(p, 10, 0), -ETIMEDOUT);
	io_pool_put(p, (unsigned)s[1]);
	ck_assert_int_eq(io_pool_get(p, 0), -ETIMEDOUT);    /* no large one free */
	ck_assert_int_eq(io_pool_get_fit(p, 16384, 0), -ETIMEDOUT);
	ck_assert_int_eq(io_pool_get_fit(p, 4096, 0), s[1]);
	for (int i = 0; i < 3; i++)
		ck_assert_uint_eq(((uint8_t *)io_pool_addr(p, (unsigned)s[i]))[4095], 0x40 + i);
	ck_assert_ptr_null(io_pool_addr(p, 5));
	ck_assert_uint_eq(io_pool_len(p, 5), 0);
	for (int i = 0; i < 3; i++)
		io_pool_put(p, (unsigned)s[i]);
	io_pool_put(p, (unsigned)l0);
	io_pool_put(p, (unsigned)l1);
	ck_assert_uint_eq(io_pool_bytes_out(p), 0);
	ck_assert_uint_eq(io_pool_nfree(p), 2);
	io_pool_destroy(p);
}
END_TEST

struct putter { struct io_pool *p; unsigned idx; };

static void *put_later(void *arg)
{
	struct putter *q = arg;
	usleep(100 * 1000);
	io_pool_put(q->p, q->idx);
	return NULL;
}

/* Several classes: a taker gets the smallest class that holds its bytes, then the
 * next larger one with a buffer free, never a smaller one; a taker whose classes
 * are all out waits even while smaller classes have buffers, and a put of a
 * buffer it may take wakes it; indices, addresses and byte counts follow the
 * classes; bad class tables are refused. */
START_TEST(pool_sized_classes)
{
	struct io_pool *p;
	struct io_pool_class bad_order[2] = { { 16384, 1 }, { 16384, 1 } };
	struct io_pool_class bad_size[2] = { { 16384, 1 }, { 6000, 1 } };
	struct io_pool_class bad_empty[2] = { { 16384, 1 }, { 4096, 0 } };
	ck_assert_int_eq(io_pool_create_sized(bad_order, 2, NULL, &p), -EINVAL);
	ck_assert_ptr_null(p);
	ck_assert_int_eq(io_pool_create_sized(bad_size, 2, NULL, &p), -EINVAL);
	ck_assert_int_eq(io_pool_create_sized(bad_empty, 2, NULL, &p), -EINVAL);
	ck_assert_int_eq(io_pool_create_sized(bad_order, 0, NULL, &p), -EINVAL);
	ck_assert_int_eq(io_pool_create_sized(bad_order, IO_POOL_MAX_CLASSES + 1, NULL, &p),
	                 -EINVAL);
	/* 32 KiB x 2, 16 KiB x 2, 8 KiB x 1, 4 KiB x 3: indices 0-1, 2-3, 4, 5-7. */
	struct io_pool_class cls[4] = { { 32768, 2 }, { 16384, 2 }, { 8192, 1 }, { 4096, 3 } };
	ck_assert_int_eq(io_pool_create_sized(cls, 4, NULL, &p), 0);
	ck_assert_uint_eq(io_pool_nclasses(p), 4);
	ck_assert_uint_eq(io_pool_nslots(p), 8);
	ck_assert_uint_eq(io_pool_nbufs(p), 2);
	ck_assert_uint_eq(io_pool_buf_bytes(p), 32768);
	ck_assert_uint_eq(io_pool_bytes(p), 2 * 32768 + 2 * 16384 + 8192 + 3 * 4096);
	struct io_pool_class info;
	unsigned nfree;
	ck_assert_int_eq(io_pool_class_info(p, 2, &info, &nfree), 0);
	ck_assert_uint_eq(info.bytes, 8192);
	ck_assert_uint_eq(info.count, 1);
	ck_assert_uint_eq(nfree, 1);
	ck_assert_int_eq(io_pool_class_info(p, 4, &info, NULL), -EINVAL);
	/* Each buffer in its place: contiguous, aligned, the class's size. */
	uint8_t *base = io_pool_addr(p, 0);
	size_t off = 0;
	for (unsigned i = 0; i < 8; i++) {
		ck_assert_ptr_eq(io_pool_addr(p, i), base + off);
		ck_assert_int_eq(io_pool_index_of(p, base + off, io_pool_len(p, i)), (int)i);
		ck_assert_int_eq(io_pool_index_of(p, base + off + 1, io_pool_len(p, i)), -1);
		off += io_pool_len(p, i);
	}
	ck_assert_uint_eq(io_pool_len(p, 4), 8192);
	ck_assert_uint_eq(io_pool_len(p, 8), 0);
	ck_assert_ptr_null(io_pool_addr(p, 8));
	/* 5000 bytes fit the 8 KiB class; its one buffer gone, the 16 KiB class. */
	int a = io_pool_get_fit(p, 5000, 0);
	ck_assert_int_eq(a, 4);
	int b = io_pool_get_fit(p, 5000, 0);
	ck_assert_int_ge(b, 2);
	ck_assert_int_le(b, 3);
	/* Tiny takers: the 4 KiB class, never anything larger while it has some. */
	int t[3];
	for (int i = 0; i < 3; i++) {
		t[i] = io_pool_get_fit(p, i == 0 ? 0 : 1 + (size_t)i * 1000, 0);
		ck_assert_int_ge(t[i], 5);
		ck_assert_uint_eq(io_pool_len(p, (unsigned)t[i]), 4096);
	}
	ck_assert_uint_eq(io_pool_bytes_out(p), 8192 + 16384 + 3 * 4096);
	/* 4 KiB and 8 KiB classes out: a tiny taker goes up to the 16 KiB one. */
	int c = io_pool_get_fit(p, 1, 0);
	ck_assert_uint_eq(io_pool_len(p, (unsigned)c), 16384);
	ck_assert_uint_eq(io_pool_nfree(p), 2);     /* the largest class untouched */
	/* Then the 32 KiB class, and then nothing: -ETIMEDOUT. */
	int d = io_pool_get_fit(p, 1, 0), e = io_pool_get_fit(p, 20000, 0);
	ck_assert_uint_eq(io_pool_len(p, (unsigned)d), 32768);
	ck_assert_uint_eq(io_pool_len(p, (unsigned)e), 32768);
	ck_assert_int_eq(io_pool_get_fit(p, 1, 0), -ETIMEDOUT);
	ck_assert_uint_eq(io_pool_bytes_out(p), io_pool_bytes(p));
	/* A small buffer back: a large taker still has none, a small one gets it. */
	io_pool_put(p, (unsigned)t[1]);
	ck_assert_int_eq(io_pool_get_fit(p, 8193, 0), -ETIMEDOUT);
	ck_assert_int_eq(io_pool_get(p, 0), -ETIMEDOUT);
	ck_assert_int_eq(io_pool_get_fit(p, 4096, 0), t[1]);
	/* A taker of 20000 bytes waits while only smaller classes come back, and a
	 * put of a 32 KiB buffer wakes it. */
	io_pool_put(p, (unsigned)a);
	ck_assert_int_eq(io_pool_get_fit(p, 20000, 50), -ETIMEDOUT);
	ck_assert_int_eq(io_pool_get_fit(p, 8192, 0), a);
	pthread_t th;
	struct putter pt = { p, (unsigned)d };
	ck_assert_int_eq(pthread_create(&th, NULL, put_later, &pt), 0);
	int w = io_pool_get_fit(p, 20000, 10000);
	ck_assert_int_eq(w, d);
	pthread_join(th, NULL);
	int back[] = { a, b, t[0], t[1], t[2], c, w, e };
	for (unsigned i = 0; i < sizeof back / sizeof back[0]; i++)
		io_pool_put(p, (unsigned)back[i]);
	ck_assert_uint_eq(io_pool_bytes_out(p), 0);
	for (unsigned k = 0; k < 4; k++) {
		ck_assert_int_eq(io_pool_class_info(p, k, &info, &nfree), 0);
		ck_assert_uint_eq(nfree, cls[k].count);
	}
	io_pool_destroy(p);
}
END_TEST


/* The halving layout (ckptd's pool, a rank's when saving through ckptd): the chunk
 * size and classes of a half, a quarter, ... down to 64 KiB sharing a quarter of
 * the bytes, the same number each; never more bytes than asked; one class where the
 * pool has few large buffers or the chunk size has no smaller class; bad sizes
 * refused. */
START_TEST(pool_halving_layout)
{
	struct io_pool *p;
	struct io_pool_class info;
	/* 16 MiB of 1 MiB chunks: 12 of 1 MiB, then 512, 256, 128, 64 KiB x 4. */
	ck_assert_int_eq(io_pool_create_halving(1u << 20, 16u << 20, NULL, &p), 0);
	ck_assert_uint_eq(io_pool_nclasses(p), 5);
	ck_assert_uint_eq(io_pool_nbufs(p), 12);
	ck_assert_uint_eq(io_pool_buf_bytes(p), 1u << 20);
	for (unsigned c = 1; c < 5; c++) {
		ck_assert_int_eq(io_pool_class_info(p, c, &info, NULL), 0);
		ck_assert_uint_eq(info.bytes, (1u << 20) >> c);
		ck_assert_uint_eq(info.count, 4);
	}
	ck_assert_uint_eq(io_pool_bytes(p), (12u << 20) + 4 * (960u << 10));
	ck_assert_uint_le(io_pool_bytes(p), 16u << 20);
	io_pool_destroy(p);
	/* A chunk size that is not a power of two: halves rounded up to 4 KiB. */
	ck_assert_int_eq(io_pool_create_halving(300u << 10, 4000u << 10, NULL, &p), 0);
	ck_assert_uint_eq(io_pool_nbufs(p), 10);
	ck_assert_uint_eq(io_pool_nclasses(p), 3);
	ck_assert_int_eq(io_pool_class_info(p, 1, &info, NULL), 0);
	ck_assert_uint_eq(info.bytes, 152u << 10);
	ck_assert_int_eq(io_pool_class_info(p, 2, &info, NULL), 0);
	ck_assert_uint_eq(info.bytes, 76u << 10);
	ck_assert_uint_eq(io_pool_bytes(p), (3000u << 10) + 4 * (228u << 10));
	io_pool_destroy(p);
	/* Fewer than 8 large buffers would be left: all of one size, as many as fit. */
	ck_assert_int_eq(io_pool_create_halving(1u << 20, (10u << 20) + 5, NULL, &p), 0);
	ck_assert_uint_eq(io_pool_nclasses(p), 1);
	ck_assert_uint_eq(io_pool_nbufs(p), 10);
	io_pool_destroy(p);
	/* 64 KiB chunks have no smaller class. */
	ck_assert_int_eq(io_pool_create_halving(64u << 10, 64u << 20, NULL, &p), 0);
	ck_assert_uint_eq(io_pool_nclasses(p), 1);
	ck_assert_uint_eq(io_pool_nslots(p), 1024);
	io_pool_destroy(p);
	ck_assert_int_eq(io_pool_create_halving(0, 1u << 20, NULL, &p), -EINVAL);
	ck_assert_ptr_null(p);
	ck_assert_int_eq(io_pool_create_halving(1u << 20, (1u << 20) - 1, NULL, &p), -EINVAL);
	ck_assert_int_eq(io_pool_create_halving(4095, 1u << 20, NULL, &p), -EINVAL);
}
END_TEST

/* The whole pool at once (a direct save's tail, lib/save.c): only where every
 * buffer is free, nothing taken otherwise; the mapping whole; given back, every
 * buffer of every class is free again and handed out as before. */
START_TEST(pool_take_all)
{
	struct io_pool *p;
	ck_assert_int_eq(io_pool_create_halving(1u << 20, 16u << 20, NULL, &p), 0);
	uint8_t *base = NULL;
	int b = io_pool_get_fit(p, 100u << 10, 0);        /* one small buffer out */
	ck_assert_int_ge(b, 0);
	ck_assert_int_eq(io_pool_take_all(p, &base), -EBUSY);
	ck_assert_ptr_null(base);
	ck_assert_uint_eq(io_pool_bytes_out(p), io_pool_len(p, (unsigned)b));
	io_pool_put(p, (unsigned)b);
	ck_assert_int_eq(io_pool_take_all(p, &base), 0);
	ck_assert_ptr_eq(base, io_pool_addr(p, 0));
	ck_assert_uint_eq(io_pool_bytes_out(p), io_pool_bytes(p));
	ck_assert_int_eq(io_pool_get_fit(p, 4096, 0), -ETIMEDOUT);
	uint8_t *again = NULL;
	ck_assert_int_eq(io_pool_take_all(p, &again), -EBUSY);
	memset(base, 0x5a, io_pool_bytes(p));             /* the mapping, end to end */
	io_pool_put_all(p);
	ck_assert_uint_eq(io_pool_bytes_out(p), 0);
	ck_assert_int_eq(io_pool_get(p, 0), 0);           /* low indices first again */
	ck_assert_int_eq(io_pool_get_fit(p, 4096, 0), (int)io_pool_nslots(p) - 4);
	io_pool_put(p, 0);
	io_pool_put(p, io_pool_nslots(p) - 4);
	io_pool_destroy(p);
}
END_TEST

START_TEST(pool_blocking_get_woken_by_put)
{
	struct io_pool *p;
	ck_assert_int_eq(io_pool_create(4096, 1, NULL, &p), 0);
	int b = io_pool_get(p, -1);
	ck_assert_int_eq(b, 0);
	struct putter q = { p, (unsigned)b };
	pthread_t th;
	ck_assert_int_eq(pthread_create(&th, NULL, put_later, &q), 0);
	uint64_t t0 = ckpt_now_ns();
	ck_assert_int_eq(io_pool_get(p, -1), 0);      /* blocks until the other thread puts */
	ck_assert_uint_ge(ckpt_now_ns() - t0, 50000000ull);
	pthread_join(th, NULL);
	/* And with a finite timeout that is long enough. */
	ck_assert_int_eq(pthread_create(&th, NULL, put_later, &q), 0);
	ck_assert_int_eq(io_pool_get(p, 10000), 0);
	pthread_join(th, NULL);
	io_pool_put(p, 0);
	io_pool_destroy(p);
}
END_TEST

START_TEST(pool_double_put_caught)
{
	/* In a child: a debug build aborts; a release build logs and ignores. */
	pid_t pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		struct io_pool *p;
		if (io_pool_create(4096, 2, NULL, &p))
			_exit(2);
		int b = io_pool_get(p, 0);
		io_pool_put(p, (unsigned)b);
		io_pool_put(p, (unsigned)b);          /* the bug under test */
		io_pool_put(p, 7);                    /* not an index of this pool */
		/* Ignored: the free count did not grow past nbufs, and the buffer is
		 * handed out only once. */
		int x = io_pool_get(p, 0), y = io_pool_get(p, 0), z = io_pool_get(p, 0);
		_exit(x >= 0 && y >= 0 && x != y && z == -ETIMEDOUT ? 0 : 3);
	}
	int st;
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	ck_assert_msg((WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT) ||
	              (WIFEXITED(st) && WEXITSTATUS(st) == 0), "status 0x%x", st);
}
END_TEST

struct counting_alloc { int allocs, frees; size_t bytes; };

static void *ca_alloc(size_t bytes, void *arg)
{
	struct counting_alloc *c = arg;
	c->allocs++;
	c->bytes = bytes;
	void *m = NULL;
	return posix_memalign(&m, CKPT_ALIGN, bytes) ? NULL : m;
}

static void ca_free(void *p, size_t bytes, void *arg)
{
	struct counting_alloc *c = arg;
	ck_assert_uint_eq(bytes, c->bytes);
	c->frees++;
	free(p);
}

START_TEST(pool_custom_allocator)
{
	struct counting_alloc c = { 0, 0, 0 };
	struct io_pool_alloc a = { ca_alloc, ca_free, &c };
	struct io_pool *p;
	ck_assert_int_eq(io_pool_create(16384, 5, &a, &p), 0);
	ck_assert_int_eq(c.allocs, 1);                  /* one mapping for all buffers */
	ck_assert_uint_eq(c.bytes, 5 * 16384);
	uint8_t *b0 = io_pool_addr(p, 0), *b4 = io_pool_addr(p, 4);
	ck_assert_uint_eq((size_t)(b4 - b0), 4 * 16384);
	io_pool_destroy(p);
	ck_assert_int_eq(c.frees, 1);
}
END_TEST

/* The pool's own memory: aligned to a huge page when it is one or more (so that the
 * kernel can back it with huge pages, THP permitting), faulted in, writable end to
 * end; sizes that are not whole pages are refused. */
START_TEST(map_buffers)
{
	ck_assert_ptr_null(io_map_buffers(0));
	ck_assert_ptr_null(io_map_buffers(4096 + 1));
	size_t sizes[] = { 4096, 8192, 2u << 20, (6u << 20) + 4096 * 3 };
	long pg = sysconf(_SC_PAGESIZE);
	for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
		size_t n = sizes[i];
		uint8_t *m = io_map_buffers(n);
		ck_assert_ptr_nonnull(m);
		ck_assert_uint_eq((uintptr_t)m % (n >= (2u << 20) ? (2u << 20) : 4096u), 0);
		size_t npages = (n + (size_t)pg - 1) / (size_t)pg;
		unsigned char *vec = malloc(npages);
		ck_assert_int_eq(mincore(m, n, vec), 0);
		for (size_t k = 0; k < npages; k++)
			ck_assert_msg(vec[k] & 1, "size %zu: page %zu not faulted in", n, k);
		free(vec);
		m[0] = 1;
		m[n - 1] = 2;
		ck_assert_uint_eq(m[0] + m[n - 1], 3);
		io_unmap_buffers(m, n);
	}
	io_unmap_buffers(NULL, 4096);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("io_codec_pool");
	TCase *tc = tcase_create("codec_pool");
	tcase_add_test(tc, copy_hash_matches_hash);
	tcase_add_test(tc, copy_hash_blocks_match_hashes);
	tcase_add_test(tc, hash_known_values);
	tcase_add_test(tc, zstd_round_trip);
	tcase_add_test(tc, zstd_corrupt_frames);
	tcase_add_test(tc, pool_ownership);
	tcase_add_test(tc, pool_classes);
	tcase_add_test(tc, pool_sized_classes);
	tcase_add_test(tc, pool_halving_layout);
	tcase_add_test(tc, pool_take_all);
	tcase_add_test(tc, pool_blocking_get_woken_by_put);
	tcase_add_test(tc, pool_double_put_caught);
	tcase_add_test(tc, pool_custom_allocator);
	tcase_add_test(tc, map_buffers);
	suite_add_tcase(s, tc);
	SRunner *sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
