/*
 * fuzz_commit_msg.c — libFuzzer target for the decoders of the commit messages
 * (lib/commit/proto.c): BEGIN {step}, the status messages BEGIN_REPLY, DECISION
 * and ABORT {step, code, reason}, and PREPARE {step, rank, size, hash, index} —
 * untrusted bytes from any peer that passed the handshake (and, for the
 * participant, from whatever answers as the coordinator) — and the node leader's:
 * RELAYED / TO_RANK {rank, type, payload}, RELAY_HELLO {node, ranks}, RANK_GONE
 * {rank, reason}.
 *
 * Every input goes to every decoder (a payload carries no type of its own;
 * the frame header does). Besides "no crash, no leak, no overread" (ASan), what
 * decodes must re-encode to the same bytes — except the reason's control bytes,
 * which the decoder replaces with '?' — and a decoded PREPARE's index must lie
 * inside the input; it is then fed to the index decoder, as the coordinator does.
 *
 * fuzz_replay_seeds() gives the replay driver seeded valid messages of every kind
 * to start from (the committed corpus, tests/fuzz/corpus/commit_msg, was written
 * with it: fuzz_commit_msg_replay --emit DIR).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "commit/commit_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_step(const uint8_t *data, size_t size)
{
	uint64_t step;
	if (commit_step_decode(data, size, &step))
		return;
	struct ckpt_buf b;
	ckpt_buf_init(&b);
	if (commit_step_encode(step, &b) || b.len != size || memcmp(b.p, data, size))
		abort();
	ckpt_buf_free(&b);
}

static void check_status(const uint8_t *data, size_t size)
{
	struct commit_status_msg m;
	if (commit_status_decode(data, size, &m))
		return;
	if (m.code > 0 || strlen(m.reason) > COMMIT_MAX_REASON)
		abort();
	struct ckpt_buf b;
	ckpt_buf_init(&b);
	if (commit_status_encode(&m, &b) || b.len != size)
		abort();
	const size_t fixed = 16;        /* version, step, code, reason length */
	const size_t tail = 8;          /* the save id, after the reason */
	if (memcmp(b.p, data, fixed) || memcmp(b.p + size - tail, data + size - tail, tail))
		abort();
	for (size_t i = fixed; i < size - tail; i++)
		if (b.p[i] != (data[i] < 0x20 ? '?' : data[i]))
			abort();
	ckpt_buf_free(&b);
}

static void check_prepare(const uint8_t *data, size_t size)
{
	struct commit_vote v;
	if (commit_prepare_decode(data, size, &v))
		return;
	/* The index ends the message, or the metadata trailer (its u32 length, then
	 * exactly that many bytes) does. */
	const uint8_t *ix = v.index, *end = data + size;
	if (v.index_len == 0 || ix < data || ix + v.index_len > end)
		abort();
	if (v.meta_len) {
		const uint8_t *m = v.meta;
		if (m != ix + v.index_len + 4 || m + v.meta_len != end ||
		    v.meta_len > MANIFEST_MAX_META)
			abort();
	} else if (ix + v.index_len != end) {
		abort();
	}
	struct ckpt_buf b;
	ckpt_buf_init(&b);
	if (commit_prepare_encode(&v, &b) || b.len != size || memcmp(b.p, data, size))
		abort();
	ckpt_buf_free(&b);
	struct io_shard_index *dec = NULL;
	if (io_index_decode(v.index, v.index_len, &dec) == 0 && !dec)
		abort();
	io_index_free(dec);
}

static void check_relay(const uint8_t *data, size_t size)
{
	uint32_t rank;
	uint16_t type;
	const uint8_t *inner;
	size_t n;
	if (commit_relay_decode(data, size, &rank, &type, &inner, &n))
		return;
	if (inner != data + COMMIT_RELAY_TAG_BYTES || inner + n != data + size)
		abort();
	struct ckpt_buf b;
	ckpt_buf_init(&b);
	if (commit_relay_encode(rank, type, inner, n, &b) || b.len != size || memcmp(b.p, data, size))
		abort();
	ckpt_buf_free(&b);
	/* What a leader or the coordinator does next: the inner message's decoder. */
	check_status(inner, n);
	check_prepare(inner, n);
}

static void check_hello(const uint8_t *data, size_t size)
{
	uint32_t node, *ranks, n;
	if (commit_hello_decode(data, size, &node, &ranks, &n))
		return;
	if (n == 0 || n > COMMIT_MAX_NODE_RANKS)
		abort();
	for (uint32_t i = 1; i < n; i++)
		if (ranks[i] <= ranks[i - 1])
			abort();
	struct ckpt_buf b;
	ckpt_buf_init(&b);
	if (commit_hello_encode(node, ranks, n, &b) || b.len != size || memcmp(b.p, data, size))
		abort();
	ckpt_buf_free(&b);
	free(ranks);
}

static void check_gone(const uint8_t *data, size_t size)
{
	uint32_t rank;
	char reason[COMMIT_MAX_REASON + 1];
	if (commit_gone_decode(data, size, &rank, reason))
		return;
	struct ckpt_buf b;
	ckpt_buf_init(&b);
	const size_t fixed = 8;         /* version, rank, reason length */
	if (commit_gone_encode(rank, reason, &b) || b.len != size || memcmp(b.p, data, fixed))
		abort();
	for (size_t i = fixed; i < size; i++)
		if (b.p[i] != (data[i] < 0x20 ? '?' : data[i]))
			abort();
	ckpt_buf_free(&b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	check_step(data, size);
	check_status(data, size);
	check_prepare(data, size);
	check_relay(data, size);
	check_hello(data, size);
	check_gone(data, size);
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
	bufs[n] = b->p;
	lens[n] = b->len;
	return n + 1;
}

size_t fuzz_replay_seeds(uint64_t seed, uint8_t **bufs, size_t *lens, size_t max)
{
	size_t n = 0;
	uint64_t s = seed;
	while (n + 6 <= max) {
		struct ckpt_buf b;
		ckpt_buf_init(&b);
		uint64_t step = mix(&s) % 4 ? mix(&s) % 1000 : mix(&s);
		commit_step_encode(step, &b);
		n = keep(&b, bufs, lens, n);

		struct commit_status_msg m = { .step = step, .code = -(int32_t)(mix(&s) % 2000) };
		size_t rl = mix(&s) % 3 ? (size_t)(mix(&s) % 80) : COMMIT_MAX_REASON;
		for (size_t i = 0; i < rl; i++)
			m.reason[i] = (char)(' ' + mix(&s) % 95);
		m.reason[rl] = '\0';
		m.save_id = mix(&s) % 3 ? mix(&s) : 0;
		ckpt_buf_init(&b);
		commit_status_encode(&m, &b);
		n = keep(&b, bufs, lens, n);

		/* A PREPARE around a small valid index of 0-3 tensors. */
		struct io_tensor_entry t[3];
		struct io_chunk_entry ch[3];
		static const char *const names[] = { "w", "opt/m", "rng" };
		memset(t, 0, sizeof t);
		memset(ch, 0, sizeof ch);
		uint32_t world = 1 + (uint32_t)(mix(&s) % 8);
		uint64_t save_id = mix(&s) % 4 ? mix(&s) | 1 : 0;
		struct io_shard_index ix = { .step = step, .world = world,
		                             .rank = (uint32_t)(mix(&s) % world),
		                             .data_end = IO_HEADER_BYTES,
		                             .ntensors = (uint32_t)(mix(&s) % 4),
		                             .tensors = t, .chunks = ch, .save_id = save_id,
		                             .block_bytes = save_id ? 1u << 20 : 0 };
		for (uint32_t i = 0; i < ix.ntensors; i++) {
			uint64_t elems = 1 + mix(&s) % 64;
			t[i] = (struct io_tensor_entry){ .name = names[i], .kind = CKPT_KIND_MODEL,
			        .dtype = CKPT_F32, .policy = (uint8_t)(1 + i), .ndim = 1,
			        .raw_bytes = elems * 4, .first_chunk = i, .nchunks = 1 };
			t[i].global_shape[0] = elems;
			t[i].extent[0] = elems;
			ch[i] = (struct io_chunk_entry){ .tensor = i, .codec = IO_CODEC_RAW,
			         .raw_len = elems * 4, .stored_len = elems * 4,
			         .file_offset = ix.data_end };
			for (unsigned k = 0; k < CKPT_HASH_BYTES; k++)
				ch[i].hash[k] = (uint8_t)mix(&s);
			ix.data_end += CKPT_ALIGN;
			ix.nchunks++;
		}
		void *enc = NULL;
		size_t len = 0;
		if (io_index_encode(&ix, &enc, &len))
			abort();
		struct commit_vote v = { .rank = ix.rank, .step = step, .save_id = save_id, .index = enc,
		                         .index_len = len, .file_size = ix.data_end + 4096 };
		for (unsigned k = 0; k < CKPT_HASH_BYTES; k++)
			v.footer_hash[k] = (uint8_t)mix(&s);
		ckpt_buf_init(&b);
		commit_prepare_encode(&v, &b);
		free(enc);
		/* The same vote relayed by a leader (RELAYED), ... */
		struct ckpt_buf r;
		ckpt_buf_init(&r);
		commit_relay_encode(v.rank, 34, b.p, b.len, &r);
		n = keep(&b, bufs, lens, n);
		n = keep(&r, bufs, lens, n);
		/* ... its node's announcement, and a rank of it gone. */
		uint32_t ranks[16], nr = 1 + (uint32_t)(mix(&s) % 16), first = (uint32_t)(mix(&s) % 4096);
		for (uint32_t i = 0; i < nr; i++)
			ranks[i] = first + i;
		ckpt_buf_init(&b);
		commit_hello_encode((uint32_t)(mix(&s) % 512), ranks, nr, &b);
		n = keep(&b, bufs, lens, n);
		ckpt_buf_init(&b);
		commit_gone_encode(first, m.reason, &b);
		n = keep(&b, bufs, lens, n);
	}
	return n;
}
