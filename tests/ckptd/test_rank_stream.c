/*
 * test_rank_stream.c — the rank's side of a shard stream (lib/remote/client.c)
 * against a ckptd scripted in the test's own thread: what a rank asks for in OPEN,
 * the OPEN_OK it refuses, and the messages of a stream whose hashes come after the
 * bytes (docs/ckptd.md, "Protocol"). A chunk appended from the caller's memory
 * without hashes is hashed by the stream's sender, block by block as it sends it;
 * the scripted ckptd checks every HASHES against the hashes the shard format
 * defines for the bytes that came (io_copy_hash128_blocks), and that the CHUNK
 * before them carried none.
 */
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "remote/remote.h"
#include "testutil.h"

#define JOB     "rs"
#define SECRET  "a secret of the rank stream test"
#define BB      4096u               /* the stream's block size: chunks of many blocks */
#define MAX_CHUNK (1u << 20)
#define TMO     10000

/* The scripted ckptd: one connection, one stream. */
struct fake {
	struct net_listener *l;
	uint32_t ok_flags;              /* OPEN_OK says these */
	uint32_t asked;                 /* OPEN asked for these */
	unsigned chunks, good;          /* chunks whose HASHES came; of them, right */
	bool     bare_chunks;           /* every CHUNK came without hashes */
	char     why[512];              /* the first thing wrong */
};

static void fake_fail(struct fake *f, const char *what)
{
	if (!f->why[0])
		snprintf(f->why, sizeof f->why, "%s: %s", what, ckpt_err_msg());
}

/* The DATA and HASHES of the chunk last announced: its bytes hashed here as the
 * format says, against what the rank sent. */
static void fake_check(struct fake *f, const struct remote_chunk *ch, const struct net_msg *d,
                       const struct net_msg *h)
{
	uint8_t want[CKPT_HASH_BYTES], got[CKPT_HASH_BYTES];
	uint8_t *blocks = malloc((size_t)(ch->nblocks + 1) * CKPT_HASH_BYTES);
	const uint8_t *sent;
	f->chunks++;
	if (remote_hashes_decode(h->payload, h->len, ch->nblocks, got, &sent)) {
		fake_fail(f, "HASHES");
	} else if (d->len != ch->stored_len) {
		snprintf(f->why, sizeof f->why, "DATA of %zu bytes for a CHUNK of %llu", d->len,
		         (unsigned long long)ch->stored_len);
	} else {
		io_copy_hash128_blocks(NULL, d->payload, d->len, ch->block_bytes, true, want, blocks);
		bool ok = !memcmp(want, got, sizeof want) &&
		          (!ch->nblocks || !memcmp(blocks, sent, (size_t)ch->nblocks * CKPT_HASH_BYTES));
		f->good += ok;
		if (!ok && !f->why[0])
			snprintf(f->why, sizeof f->why, "chunk %u of %zu bytes: its hashes are not "
			         "those of its bytes", f->chunks, d->len);
	}
	free(blocks);
}

static void *fake_main(void *arg)
{
	struct fake *f = arg;
	struct net_conn *c;
	if (net_accept(f->l, TMO, &c)) {
		fake_fail(f, "accept");
		return NULL;
	}
	struct net_auth a = { .job_id = JOB, .world = 1, .secret = SECRET,
	                      .secret_len = strlen(SECRET) };
	uint32_t rank;
	struct net_msg m;
	struct remote_open o;
	if (net_handshake_server(c, &a, NULL, NULL, &rank, TMO) || net_recv(c, &m, TMO) ||
	    m.type != REMOTE_MSG_OPEN || remote_open_decode(m.payload, m.len, &o)) {
		fake_fail(f, "OPEN");
		net_close(c);
		return NULL;
	}
	net_msg_free(&m);
	f->asked = o.flags;
	struct ckpt_buf b;
	ckpt_buf_init(&b);
	remote_open_ok_encode(&b, MAX_CHUNK, f->ok_flags);
	if (net_send(c, REMOTE_MSG_OPEN_OK, b.p, b.len, TMO))
		fake_fail(f, "OPEN_OK");
	ckpt_buf_free(&b);
	net_conn_set_max_msg(c, MAX_CHUNK);
	/* The stream, until ABORT (the test ends each so) or the rank's close. */
	bool after = f->ok_flags & REMOTE_OPEN_AFTER;
	struct remote_chunk ch;
	struct net_msg chunk = { 0 }, data = { 0 };
	f->bare_chunks = true;
	while (!net_recv(c, &m, TMO) && m.type != REMOTE_MSG_ABORT) {
		if (m.type == REMOTE_MSG_CHUNK) {
			net_msg_free(&chunk);
			chunk = m;
			if (remote_chunk_decode(chunk.payload, chunk.len, after, &ch))
				fake_fail(f, "CHUNK");
			static const uint8_t zero[CKPT_HASH_BYTES];
			f->bare_chunks &= !ch.blocks && !memcmp(ch.hash, zero, sizeof zero);
			continue;
		}
		if (m.type == REMOTE_MSG_DATA) {
			net_msg_free(&data);
			data = m;
			continue;
		}
		if (m.type == REMOTE_MSG_HASHES)
			fake_check(f, &ch, &data, &m);
		net_msg_free(&m);
	}
	net_msg_free(&m);
	net_msg_free(&chunk);
	net_msg_free(&data);
	net_close(c);
	return NULL;
}

struct rank {
	struct fake f;
	pthread_t th;
	struct remote_conn *c;
	struct io_pool *pool;
};

/* A scripted ckptd answering OPEN_OK with ok_flags, and a rank connected to it. */
static void rank_start(struct rank *r, uint32_t ok_flags)
{
	memset(r, 0, sizeof *r);
	r->f.ok_flags = ok_flags;
	ck_assert_int_eq(net_listen(NET_TCP, NULL, "127.0.0.1", 0, &r->f.l), 0);
	ck_assert_int_eq(pthread_create(&r->th, NULL, fake_main, &r->f), 0);
	struct remote_instance in = { .host = "127.0.0.1", .port = net_listener_port(r->f.l) };
	struct remote_auth a = { .job_id = JOB, .rank = 0, .world = 1, .secret = SECRET,
	                         .secret_len = strlen(SECRET), .transport = NET_TCP,
	                         .timeout_ms = TMO };
	ck_assert_msg(remote_connect(&in, &a, &r->c) == 0, "%s", ckpt_err_msg());
	ck_assert_int_eq(io_pool_create(MAX_CHUNK, 4, NULL, &r->pool), 0);
}

static int rank_open(struct rank *r, bool tree, struct remote_writer **w)
{
	struct io_writer_opts wo = { .step = 1, .world = 1, .save_id = 7, .block_bytes = BB,
	                             .mode = 0600, .tree = tree };
	return remote_writer_open(r->c, r->pool, &wo, MAX_CHUNK, w);
}

/* The scripted ckptd's verdict, once the rank is gone. */
static void rank_end(struct rank *r)
{
	remote_close(r->c);
	pthread_join(r->th, NULL);
	net_listener_close(r->f.l);
	io_pool_destroy(r->pool);
}

/* Chunks of no block hashes (up to one block), of two blocks, of a partial last
 * block and of many, appended unhashed from the caller's memory, and one with the
 * caller's hashes: every HASHES is that of the bytes that came, after a CHUNK that
 * carried none. */
START_TEST(sender_hashes_each_block)
{
	struct rank r;
	rank_start(&r, REMOTE_OPEN_TREE | REMOTE_OPEN_AFTER);
	struct remote_writer *w;
	ck_assert_msg(rank_open(&r, true, &w) == 0, "%s", ckpt_err_msg());
	ck_assert(remote_writer_hashes_while_sending(w));
	static const size_t sizes[] = { 1, 100, BB, BB + 1, 2 * BB, 3 * BB + 5, 64 * BB,
	                                MAX_CHUNK };
	size_t total = 0;
	for (size_t i = 0; i < CKPT_ARRAY_SIZE(sizes); i++)
		total += sizes[i];
	uint8_t *src = malloc(total);
	tu_fill(src, total, tu_seed(), 1);
	size_t off = 0;
	for (size_t i = 0; i < CKPT_ARRAY_SIZE(sizes); i++) {
		ck_assert_msg(remote_writer_append_src(w, 0, src + off, sizes[i], NULL) == 0, "%s",
		              ckpt_err_msg());
		off += sizes[i];
	}
	/* A chunk whose hashes the caller took: they follow its bytes as they are. */
	uint8_t blocks[3 * CKPT_HASH_BYTES];
	struct io_hashes h = { .block_bytes = BB, .blocks = blocks, .tree = true };
	io_copy_hash128_blocks(NULL, src, 3 * BB, BB, true, h.chunk, blocks);
	ck_assert_int_eq(remote_writer_append_held(w, 0, src, 3 * BB, &h), 0);
	remote_writer_sent(w);
	remote_writer_abort(w);
	rank_end(&r);
	free(src);
	ck_assert_uint_eq(r.f.asked, REMOTE_OPEN_TREE | REMOTE_OPEN_AFTER);
	ck_assert_msg(!r.f.why[0], "%s", r.f.why);
	ck_assert_uint_eq(r.f.chunks, CKPT_ARRAY_SIZE(sizes) + 1);
	ck_assert_uint_eq(r.f.good, r.f.chunks);
	ck_assert(r.f.bare_chunks);
}
END_TEST

/* An OPEN_OK that does not say back what the rank asked for is refused; a stream
 * that hashes chunks whole cannot take a chunk without its hashes. */
START_TEST(open_ok_must_say_the_flags_back)
{
	static const uint32_t wrong[] = { REMOTE_OPEN_TREE, REMOTE_OPEN_AFTER, 0,
	                                  REMOTE_OPEN_TREE | REMOTE_OPEN_AFTER | REMOTE_OPEN_DIRECT };
	for (size_t i = 0; i < CKPT_ARRAY_SIZE(wrong); i++) {
		struct rank r;
		rank_start(&r, wrong[i]);
		struct remote_writer *w = NULL;
		ck_assert_int_eq(rank_open(&r, true, &w), CKPT_EPROTO);
		ck_assert_ptr_null(w);
		ck_assert_msg(strstr(ckpt_err_msg(), "malformed OPEN_OK"), "%s", ckpt_err_msg());
		rank_end(&r);
		ck_assert_uint_eq(r.f.asked, REMOTE_OPEN_TREE | REMOTE_OPEN_AFTER);
	}
	struct rank r;
	rank_start(&r, REMOTE_OPEN_AFTER);
	struct remote_writer *w;
	ck_assert_msg(rank_open(&r, false, &w) == 0, "%s", ckpt_err_msg());
	ck_assert(!remote_writer_hashes_while_sending(w));
	uint8_t src[100] = { 0 };
	ck_assert_int_eq(remote_writer_append_src(w, 0, src, sizeof src, NULL), -EINVAL);
	ck_assert_msg(strstr(ckpt_err_msg(), "a chunk without its hashes on a stream whose "
	                     "sender cannot hash it"), "%s", ckpt_err_msg());
	remote_writer_abort(w);
	rank_end(&r);
	ck_assert_uint_eq(r.f.asked, REMOTE_OPEN_AFTER);
	ck_assert_msg(!r.f.why[0], "%s", r.f.why);
	ck_assert_uint_eq(r.f.chunks, 0);
}
END_TEST

int main(void)
{
	tu_seed();
	Suite *s = suite_create("rank_stream");
	TCase *tc = tcase_create("stream");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, sender_hashes_each_block);
	tcase_add_test(tc, open_ok_must_say_the_flags_back);
	suite_add_tcase(s, tc);
	SRunner *sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
