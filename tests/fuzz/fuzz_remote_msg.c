/*
 * fuzz_remote_msg.c — libFuzzer target for the decoders of ckptd's messages
 * (lib/remote/proto.c): COORD, OPEN, TENSOR, CHUNK, READ, CHECK, REMOVE —
 * untrusted bytes that ckptd takes from any peer that passed the handshake — and
 * ERROR, OPEN_OK and GRANT, which a rank takes from whatever answers as ckptd (a
 * GRANT's address and key go to the rank's RDMA WRITE); and remote_path_split,
 * which reads the holder out of a shard record's path.
 *
 * Every input goes to every decoder (a payload carries no type of its own; the
 * frame header does), and, as a string, to remote_path_split. Besides "no crash,
 * no leak, no overread" (ASan): what decodes keeps the decoder's promises (counts
 * and lengths within bounds, strings printable and terminated, block hashes inside
 * the input) and re-encodes to the same bytes; ERROR yields a code in the band it
 * allows and a printable message; a split path puts back together to the input.
 *
 * fuzz_replay_seeds() gives the replay driver seeded valid messages of every kind
 * to start from (the committed corpus, tests/fuzz/corpus/remote_msg, was written
 * with it: fuzz_remote_msg_replay --emit DIR).
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "remote/remote.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#ifdef FUZZ_STUB_NET
/* The libFuzzer binary compiles proto.c without lib/net: remote_send_error's
 * net_send is never called here. */
int net_send(struct net_conn *c, uint16_t type, const void *payload, size_t len,
             int timeout_ms)
{
	(void)c, (void)type, (void)payload, (void)len, (void)timeout_ms;
	abort();
}
#endif

static void same(const struct ckpt_buf *b, const uint8_t *data, size_t size)
{
	if (!b->ok || b->len != size || memcmp(b->p, data, size))
		abort();
}

static bool printable(const char *s, size_t cap)
{
	size_t n = strnlen(s, cap);
	if (n == 0 || n == cap)
		return false;
	for (size_t i = 0; i < n; i++)
		if ((uint8_t)s[i] < 0x20 || s[i] == 0x7f)
			return false;
	return true;
}

static void check_coord(const uint8_t *data, size_t size)
{
	static struct remote_instance in[REMOTE_MAX_INSTANCES];
	uint32_t world;
	unsigned count = 0;
	/* A smaller cap than the protocol's too: the decoder must hold to the caller's. */
	unsigned cap = size % 2 ? REMOTE_MAX_INSTANCES : 3;
	struct remote_keep keep;
	uint32_t timeout;
	if (remote_coord_decode(data, size, &world, in, cap, &count, &keep, &timeout))
		return;
	if (world == 0 || count == 0 || count > cap)
		abort();
	for (unsigned i = 0; i < count; i++)
		if (!printable(in[i].host, sizeof in[i].host) || in[i].port == 0 || in[i].port > 65535)
			abort();
	/* The retention rules and the timeout are there or not: the message says which
	 * by its length (a timeout of 0 is not sent). */
	struct ckpt_buf b;
	ckpt_buf_init(&b);
	if (remote_coord_encode(&b, world, in, count, NULL, timeout))
		abort();
	if (b.len != size) {
		ckpt_buf_free(&b);
		ckpt_buf_init(&b);
		if (remote_coord_encode(&b, world, in, count, &keep, timeout))
			abort();
	} else if (keep.last || keep.every || keep.seconds) {
		abort();
	}
	same(&b, data, size);
	ckpt_buf_free(&b);
}

static void check_remove(const uint8_t *data, size_t size)
{
	uint64_t step, save_id;
	if (remote_remove_decode(data, size, &step, &save_id))
		return;
	if (save_id == 0)
		abort();
	struct ckpt_buf b;
	ckpt_buf_init(&b);
	remote_remove_encode(&b, step, save_id);
	same(&b, data, size);
	ckpt_buf_free(&b);
}

static void check_open(const uint8_t *data, size_t size)
{
	struct remote_open o;
	if (remote_open_decode(data, size, &o))
		return;
	struct ckpt_buf b;
	ckpt_buf_init(&b);
	remote_open_encode(&b, &o);
	same(&b, data, size);
	ckpt_buf_free(&b);
}

static void check_open_ok(const uint8_t *data, size_t size)
{
	uint64_t max;
	uint32_t flags;
	if (remote_open_ok_decode(data, size, &max, &flags))
		return;
	if (flags & ~REMOTE_OPEN_FLAGS)
		abort();
	struct ckpt_buf b;
	ckpt_buf_init(&b);
	remote_open_ok_encode(&b, max, flags);
	same(&b, data, size);
	ckpt_buf_free(&b);
}

/* GRANT: a count within the caller's cap and the protocol's, ids never 0, ranges
 * that do not wrap. */
static void check_grant(const uint8_t *data, size_t size)
{
	struct remote_grant g[REMOTE_MAX_GRANTS];
	unsigned cap = size % 2 ? REMOTE_MAX_GRANTS : 2, count = 0;
	if (remote_grant_decode(data, size, g, cap, &count))
		return;
	if (count == 0 || count > cap)
		abort();
	for (unsigned i = 0; i < count; i++)
		if (!g[i].id || !g[i].len || g[i].addr + g[i].len < g[i].addr)
			abort();
	struct ckpt_buf b;
	ckpt_buf_init(&b);
	remote_grant_encode(&b, g, count);
	same(&b, data, size);
	ckpt_buf_free(&b);
}

static void check_tensor(const uint8_t *data, size_t size)
{
	struct remote_tensor t;
	if (remote_tensor_decode(data, size, &t))
		return;
	if (t.ndim > CKPT_MAX_NDIM || !printable(t.name, sizeof t.name))
		abort();
	struct io_tensor_desc d = { .name = t.name, .kind = t.kind, .dtype = t.dtype,
	                            .policy = t.policy, .flags = t.flags, .ndim = t.ndim,
	                            .global_shape = t.global_shape, .offset = t.offset,
	                            .extent = t.extent, .raw_bytes = t.raw_bytes };
	struct ckpt_buf b;
	ckpt_buf_init(&b);
	remote_tensor_encode(&b, &d);
	same(&b, data, size);
	ckpt_buf_free(&b);
}

/* after: the form of a stream with hashes after the bytes (REMOTE_OPEN_AFTER). */
static void check_chunk_as(const uint8_t *data, size_t size, bool after)
{
	struct remote_chunk c;
	if (remote_chunk_decode(data, size, after, &c))
		return;
	if ((c.codec != IO_CODEC_RAW && c.codec != IO_CODEC_ZSTD && c.codec != IO_CODEC_BYTEGROUP) ||
	    c.raw_len == 0 ||
	    c.raw_len > IO_MAX_CHUNK_BYTES || c.stored_len == 0 ||
	    (c.codec == IO_CODEC_RAW && c.stored_len != c.raw_len))
		abort();
	uint64_t want = c.codec == IO_CODEC_RAW ? io_nblocks(c.raw_len, c.block_bytes) : 0;
	if (c.nblocks != want)
		abort();
	/* The block hashes end the message, or come before its grant; after: neither
	 * is there. */
	size_t hb = (size_t)c.nblocks * CKPT_HASH_BYTES, tail = c.grant ? 4 : 0;
	if (after && (c.blocks || c.grant))
		abort();
	if (!after && c.nblocks &&
	    (!c.blocks || c.blocks < data || c.blocks + hb + tail != data + size))
		abort();
	struct ckpt_buf b;
	ckpt_buf_init(&b);
	remote_chunk_encode(&b, &c, after);
	same(&b, data, size);
	ckpt_buf_free(&b);
	/* Its HASHES: the chunk's hash and the block hashes announced, exactly (here
	 * taken from the front of data). */
	uint8_t h[CKPT_HASH_BYTES];
	const uint8_t *blocks;
	size_t hlen = hb + CKPT_HASH_BYTES;
	if (!after || size < hlen)
		return;
	if (remote_hashes_decode(data, hlen, c.nblocks, h, &blocks) ||
	    !remote_hashes_decode(data, hlen - 1, c.nblocks, h, &blocks) ||
	    !remote_hashes_decode(data, size > hlen ? hlen + 1 : hlen - 1, c.nblocks, h, &blocks))
		abort();
	remote_hashes_decode(data, hlen, c.nblocks, h, &blocks);
	ckpt_buf_init(&b);
	remote_hashes_encode(&b, h, blocks, c.nblocks);
	same(&b, data, hlen);
	ckpt_buf_free(&b);
}

static void check_chunk(const uint8_t *data, size_t size)
{
	check_chunk_as(data, size, false);
	check_chunk_as(data, size, true);
}

/* HASHES for chunks of any count of blocks: only the exact length decodes. */
static void check_hashes(const uint8_t *data, size_t size)
{
	uint8_t h[CKPT_HASH_BYTES];
	const uint8_t *blocks;
	uint32_t nb = size >= 4 ? ckpt_get_le32(data) % 4096 : 0;
	if (remote_hashes_decode(data, size, nb, h, &blocks))
		return;
	if (size != ((size_t)nb + 1) * CKPT_HASH_BYTES || memcmp(h, data, CKPT_HASH_BYTES) ||
	    (nb ? blocks != data + CKPT_HASH_BYTES : blocks != NULL))
		abort();
}

static void check_read(const uint8_t *data, size_t size)
{
	char path[REMOTE_MAX_PATH + 1];
	uint64_t off, len;
	/* The caller's cap is the bound, whatever the protocol's. */
	size_t cap = size % 3 ? sizeof path : 40;
	if (remote_read_decode(data, size, path, cap, &off, &len))
		return;
	if (!printable(path, cap))
		abort();
	struct ckpt_buf b;
	ckpt_buf_init(&b);
	remote_read_encode(&b, path, off, len);
	same(&b, data, size);
	ckpt_buf_free(&b);
}

static void check_check(const uint8_t *data, size_t size)
{
	struct remote_check k;
	if (remote_check_decode(data, size, &k))
		return;
	if (!printable(k.path, sizeof k.path))
		abort();
	struct ckpt_buf b;
	ckpt_buf_init(&b);
	remote_check_encode(&b, &k);
	same(&b, data, size);
	ckpt_buf_free(&b);
}

/* ERROR{i32 code, u16 len, message}: the code as sent when it is one of ours or an
 * errno (negative, above -100000) and the message fits exactly, else CKPT_EPROTO;
 * the text is printable ASCII whatever the peer sent. */
static void check_error(const uint8_t *data, size_t size)
{
	int rc = remote_error_take(data, size, "fuzz");
	bool well = size >= 6 && size == 6u + ckpt_get_le16(data + 4);
	int32_t code = well ? (int32_t)ckpt_get_le32(data) : 0;
	if (well && code < 0 && code >= -100000) {
		if (rc != code)
			abort();
	} else if (rc != CKPT_EPROTO) {
		abort();
	}
	const char *m = ckpt_err_msg();
	if (strncmp(m, "fuzz: ", 6))
		abort();
	for (const char *p = m; *p; p++)
		if ((uint8_t)*p < 0x20 || (uint8_t)*p >= 0x7f)
			abort();
}

static void check_path_split(const uint8_t *data, size_t size)
{
	char *path = malloc(size + 1);
	memcpy(path, data, size);
	path[size] = '\0';
	char holder[REMOTE_MAX_HOST + 8];
	size_t cap = size % 2 ? sizeof holder : 8;
	const char *rel = NULL;
	int rc = remote_path_split(path, holder, cap, &rel);
	if (rc) {
		if (rc != CKPT_EFORMAT || path[0] != '@')
			abort();
	} else if (path[0] != '@') {
		if (holder[0] || rel != path)
			abort();
	} else {
		/* "@" holder "/" rel, holder non-empty and within cap, rel non-empty. */
		size_t n = strlen(holder);
		if (n == 0 || n >= cap || memchr(holder, '/', n) || !rel || !*rel ||
		    rel != path + 1 + n + 1 || memcmp(path + 1, holder, n) || path[1 + n] != '/')
			abort();
	}
	free(path);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	check_coord(data, size);
	check_open(data, size);
	check_open_ok(data, size);
	check_grant(data, size);
	check_tensor(data, size);
	check_chunk(data, size);
	check_hashes(data, size);
	check_read(data, size);
	check_check(data, size);
	check_remove(data, size);
	check_error(data, size);
	check_path_split(data, size);
	return 0;
}

/* ------------------------------------------------------------------ seeds */

/* Seeded valid messages for the replay driver (not used by libFuzzer). */
size_t fuzz_replay_seeds(uint64_t seed, uint8_t **bufs, size_t *lens, size_t max);

static uint64_t mix(uint64_t *s)
{
	uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}

static size_t keep(struct ckpt_buf *b, uint8_t **bufs, size_t *lens, size_t n)
{
	if (!b->ok)
		abort();
	bufs[n] = b->p;
	lens[n] = b->len;
	return n + 1;
}

/* A shard path as a record names it, with a holder or without. */
static void shard_path(char *out, size_t cap, uint64_t *s, bool holder)
{
	int n = holder ? snprintf(out, cap, "@10.0.%u.%u:%u/", (unsigned)(mix(s) % 256),
	                          (unsigned)(mix(s) % 256), 1 + (unsigned)(mix(s) % 65535)) : 0;
	if (ckpt_path_shard_rel(out + n, cap - (size_t)n, mix(s) % 100000,
	                        (uint32_t)(mix(s) % 4096), mix(s) % 3 ? mix(s) | 1 : 0))
		abort();
}

size_t fuzz_replay_seeds(uint64_t seed, uint8_t **bufs, size_t *lens, size_t max)
{
	static const char *const names[] = { "w", "model/layers.0/attn/q_proj.weight",
	                                     "opt/\xc3\xa9tat", "rng" };
	size_t n = 0;
	uint64_t s = seed;
	while (n + 13 <= max) {   /* the messages one round keeps */
		struct ckpt_buf b;
		/* COORD: 1-3 instances. */
		struct remote_instance in[3];
		unsigned ni = 1 + (unsigned)(mix(&s) % 3);
		for (unsigned i = 0; i < ni; i++) {
			snprintf(in[i].host, sizeof in[i].host, i % 2 ? "storage-%u.example" : "10.1.0.%u",
			         (unsigned)(mix(&s) % 256));
			in[i].port = 1 + (unsigned)(mix(&s) % 65535);
		}
		struct remote_keep rules = { .last = mix(&s) % 4, .every = mix(&s) % 2 ? 100 : 0,
		                             .seconds = mix(&s) % 2 ? 86400 : 0 };
		ckpt_buf_init(&b);
		if (remote_coord_encode(&b, 1 + (uint32_t)(mix(&s) % 4096), in, ni,
		                        mix(&s) % 2 ? &rules : NULL, rules.last % 2 ? 30000 : 0))
			abort();
		n = keep(&b, bufs, lens, n);

		ckpt_buf_init(&b);
		remote_open_encode(&b, &(struct remote_open){
			.step = mix(&s) % 100000, .save_id = mix(&s) | 1, .block_bytes = 1u << 20,
			.size_hint = mix(&s) % (1ull << 34), .chunk_bytes = 16u << 20,
			.flags = (uint32_t)(mix(&s) % 8) });
		n = keep(&b, bufs, lens, n);

		/* OPEN_OK, with the direct path or without; GRANT of 1..8 buffers. */
		ckpt_buf_init(&b);
		remote_open_ok_encode(&b, 4u << 20, (uint32_t)(mix(&s) % 8));
		n = keep(&b, bufs, lens, n);
		struct remote_grant g[REMOTE_MAX_GRANTS];
		unsigned ng = 1 + (unsigned)(mix(&s) % REMOTE_MAX_GRANTS);
		for (unsigned i = 0; i < ng; i++)
			g[i] = (struct remote_grant){ .id = 1 + (uint32_t)(mix(&s) % 100000),
			                              .addr = 0x7f0000000000ull + (mix(&s) % 64) * (4u << 20),
			                              .rkey = (uint32_t)mix(&s), .len = 4u << 20 };
		ckpt_buf_init(&b);
		remote_grant_encode(&b, g, ng);
		n = keep(&b, bufs, lens, n);

		/* TENSOR: ndim 0..16. */
		uint64_t shape[CKPT_MAX_NDIM], off[CKPT_MAX_NDIM], ext[CKPT_MAX_NDIM], elems = 1;
		unsigned nd = (unsigned)(mix(&s) % (CKPT_MAX_NDIM + 1));
		for (unsigned d = 0; d < nd; d++) {
			shape[d] = 1 + mix(&s) % (nd > 4 ? 3 : 1024);
			off[d] = mix(&s) % shape[d];
			ext[d] = shape[d] - off[d];
			elems *= ext[d];
		}
		struct io_tensor_desc t = { .name = names[mix(&s) % 4], .kind = CKPT_KIND_MODEL,
		                            .dtype = CKPT_F32, .policy = CKPT_SHARDED, .ndim = (uint8_t)nd,
		                            .global_shape = shape, .offset = off, .extent = ext,
		                            .raw_bytes = elems * 4 };
		ckpt_buf_init(&b);
		remote_tensor_encode(&b, &t);
		n = keep(&b, bufs, lens, n);

		/* CHUNK: raw with block hashes, raw without, or compressed. */
		uint8_t blocks[8 * CKPT_HASH_BYTES];
		for (size_t i = 0; i < sizeof blocks; i++)
			blocks[i] = (uint8_t)mix(&s);
		struct remote_chunk ch = { .tensor = (uint32_t)(mix(&s) % 8), .codec = IO_CODEC_RAW,
		                           .block_bytes = 1u << 20, .blocks = blocks };
		switch (mix(&s) % 3) {
		case 0:
			ch.raw_len = ch.stored_len = (1 + mix(&s) % 8) << 20;
			break;
		case 1:
			ch.raw_len = ch.stored_len = 1 + mix(&s) % (1u << 20);
			break;
		default:
			ch.codec = IO_CODEC_ZSTD;
			ch.block_bytes = 0;
			ch.raw_len = 1 + mix(&s) % (16u << 20);
			ch.stored_len = 1 + mix(&s) % ch.raw_len;
		}
		ch.nblocks = ch.codec == IO_CODEC_RAW ? (uint32_t)io_nblocks(ch.raw_len, ch.block_bytes) : 0;
		for (unsigned k = 0; k < CKPT_HASH_BYTES; k++)
			ch.hash[k] = (uint8_t)mix(&s);
		ch.grant = mix(&s) % 2 ? 1 + (uint32_t)(mix(&s) % 100000) : 0;   /* direct or DATA */
		ckpt_buf_init(&b);
		remote_chunk_encode(&b, &ch, false);
		n = keep(&b, bufs, lens, n);
		/* The same in the form of a stream with hashes after the bytes, and its
		 * HASHES. */
		ch.grant = 0;
		ckpt_buf_init(&b);
		remote_chunk_encode(&b, &ch, true);
		n = keep(&b, bufs, lens, n);
		ckpt_buf_init(&b);
		remote_hashes_encode(&b, ch.hash, blocks, ch.nblocks);
		n = keep(&b, bufs, lens, n);

		char path[256];
		shard_path(path, sizeof path, &s, false);
		ckpt_buf_init(&b);
		remote_read_encode(&b, path, mix(&s) % (1ull << 30), mix(&s) % (64u << 20));
		n = keep(&b, bufs, lens, n);

		struct remote_check k = { .file_size = 8192 + mix(&s) % (1ull << 32),
		                          .footer_off = mix(&s) % (1ull << 32),
		                          .footer_len = 64 + mix(&s) % 65536 };
		shard_path(k.path, sizeof k.path, &s, false);
		for (unsigned i = 0; i < CKPT_HASH_BYTES; i++)
			k.hash[i] = (uint8_t)mix(&s);
		ckpt_buf_init(&b);
		remote_check_encode(&b, &k);
		n = keep(&b, bufs, lens, n);

		char why[128];
		snprintf(why, sizeof why, "job 'j%u': quota of %llu bytes exceeded",
		         (unsigned)(mix(&s) % 100), (unsigned long long)(mix(&s) % (1ull << 40)));
		static const int codes[] = { CKPT_EPROTO, CKPT_ENOTFOUND, CKPT_ECORRUPT, -EDQUOT,
		                             -ENOSPC, -ETIMEDOUT, CKPT_ENAME };
		ckpt_buf_init(&b);
		remote_error_encode(&b, codes[mix(&s) % 7], why);
		n = keep(&b, bufs, lens, n);

		ckpt_buf_init(&b);
		remote_remove_encode(&b, mix(&s) % 100000, mix(&s) | 1);
		n = keep(&b, bufs, lens, n);

		/* A record's path with its holder, for remote_path_split. */
		shard_path(path, sizeof path, &s, true);
		ckpt_buf_init(&b);
		ckpt_buf_put(&b, path, strlen(path));
		n = keep(&b, bufs, lens, n);
	}
	return n;
}
