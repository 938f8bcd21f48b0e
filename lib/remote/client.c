/*
 * client.c — a rank's side of ckptd (remote.h): connections, requests, and the
 * shard stream.
 *
 * The stream: the save worker hands each chunk to remote_writer_append, which
 * compresses it when the job does, and queues it for the writer's sender thread;
 * the worker goes on copying the next chunk meanwhile. The queue is short (ready()
 * says when it is full), so the pool buffers in it are bounded, and the network
 * paces the save: when ckptd's disks fall behind, ckptd stops reading, the sender
 * blocks, the queue fills and the worker waits. ckptd may answer ERROR at any time
 * (a full disk, a quota): the worker sees it at its next call and stops.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "remote/remote.h"

struct remote_conn {
	struct net_conn *net;
	pthread_mutex_t  lock;         /* one request at a time */
	char             name[REMOTE_MAX_HOST + 16];
	int              timeout_ms;
};

int remote_connect(const struct remote_instance *to, const struct remote_auth *a,
                   struct remote_conn **out)
{
	*out = NULL;
	struct remote_conn *c = ckpt_calloc(1, sizeof *c);
	if (!c)
		return ckpt_err(-ENOMEM, "ckptd connection");
	snprintf(c->name, sizeof c->name, "ckptd %s:%u", to->host, to->port);
	c->timeout_ms = (int)a->timeout_ms;
	pthread_mutex_init(&c->lock, NULL);
	int rc = net_connect(a->transport, a->rdma, to->host, to->port, (int)a->timeout_ms, &c->net);
	if (!rc) {
		struct net_auth na = { .job_id = a->job_id, .rank = a->rank, .world = a->world,
		                       .secret = a->secret, .secret_len = a->secret_len };
		rc = net_handshake_client(c->net, &na, (int)a->timeout_ms);
	}
	if (rc) {
		ckpt_err_prefix(rc, "%s", c->name);
		remote_close(c);
		return rc;
	}
	net_conn_set_max_msg(c->net, REMOTE_MAX_CONTROL);
	*out = c;
	return 0;
}

void remote_close(struct remote_conn *c)
{
	if (!c)
		return;
	net_close(c->net);
	pthread_mutex_destroy(&c->lock);
	ckpt_free(c);
}

const char *remote_name(const struct remote_conn *c) { return c->name; }

bool remote_broken(const struct remote_conn *c) { return net_conn_broken(c->net); }

/* Receive the answer to a request: want, or ERROR (its code and message), or
 * anything else (CKPT_EPROTO). The payload is the caller's on success. */
static int answer(struct remote_conn *c, uint16_t want, struct net_msg *m, size_t max,
                  net_payload_fn into, void *arg)
{
	net_conn_set_max_msg(c->net, max);
	int rc = net_recv_into(c->net, m, into, arg, c->timeout_ms);
	net_conn_set_max_msg(c->net, REMOTE_MAX_CONTROL);
	if (rc)
		return ckpt_err_prefix(rc, "%s", c->name);
	if (m->type == want)
		return 0;
	rc = m->type == REMOTE_MSG_ERROR ? remote_error_take(m->payload, m->len, c->name)
	                                 : ckpt_err(CKPT_EPROTO, "%s: answered with message type "
	                                            "%u where %u was expected", c->name, m->type, want);
	net_msg_free(m);
	return rc;
}

static int request(struct remote_conn *c, uint16_t type, const struct ckpt_buf *b)
{
	if (b && !b->ok)
		return ckpt_err(-ENOMEM, "%s: request", c->name);
	int rc = net_send(c->net, type, b ? b->p : NULL, b ? b->len : 0, c->timeout_ms);
	return rc ? ckpt_err_prefix(rc, "%s", c->name) : 0;
}

int remote_coord(struct remote_conn *c, uint32_t world, const struct remote_instance *in,
                 unsigned n, const struct remote_keep *keep, uint32_t timeout_ms,
                 unsigned *port)
{
	struct ckpt_buf b;
	ckpt_buf_init(&b);
	int rc = remote_coord_encode(&b, world, in, n, keep, timeout_ms);
	struct net_msg m = { 0 };
	pthread_mutex_lock(&c->lock);
	if (!rc)
		rc = request(c, REMOTE_MSG_COORD, &b);
	if (!rc)
		rc = answer(c, REMOTE_MSG_COORD_OK, &m, REMOTE_MAX_CONTROL, NULL, NULL);
	pthread_mutex_unlock(&c->lock);
	ckpt_buf_free(&b);
	if (rc)
		return rc;
	if (m.len != 2 || ckpt_get_le16(m.payload) == 0)
		rc = ckpt_err(CKPT_EPROTO, "%s: malformed COORD_OK", c->name);
	else
		*port = ckpt_get_le16(m.payload);
	net_msg_free(&m);
	return rc;
}

struct into_buf { void *buf; size_t len; };

/* A DATA answer goes straight into the caller's buffer, and must be its length. */
static int into_exact(void *arg, uint16_t type, size_t len, void **dst)
{
	struct into_buf *ib = arg;
	if (type != REMOTE_MSG_DATA)
		return 0;
	if (len != ib->len)
		return ckpt_err(CKPT_EPROTO, "DATA of %zu bytes where %zu were asked", len, ib->len);
	*dst = ib->buf;
	return 0;
}

int remote_fetch(struct remote_conn *c, const char *rel, void *buf, size_t len, uint64_t off)
{
	if (len > REMOTE_MAX_READ)
		return ckpt_err(-EINVAL, "%s: read of %zu bytes (at most %u at once)", c->name, len,
		                REMOTE_MAX_READ);
	struct ckpt_buf b;
	ckpt_buf_init(&b);
	remote_read_encode(&b, rel, off, len);
	struct net_msg m = { 0 };
	struct into_buf ib = { buf, len };
	pthread_mutex_lock(&c->lock);
	int rc = request(c, REMOTE_MSG_READ, &b);
	if (!rc)
		rc = answer(c, REMOTE_MSG_DATA, &m, len ? len : 1, into_exact, &ib);
	pthread_mutex_unlock(&c->lock);
	ckpt_buf_free(&b);
	if (!rc && m.len != len)
		rc = ckpt_err(CKPT_EPROTO, "%s: %zu bytes of %s at %llu, %zu asked", c->name, m.len,
		              rel, (unsigned long long)off, len);
	net_msg_free(&m);
	return rc;
}

int remote_manifest_copy(struct remote_conn *c, const char *dir)
{
	struct net_msg m = { 0 };
	pthread_mutex_lock(&c->lock);
	int rc = request(c, REMOTE_MSG_MANIFEST, NULL);
	if (!rc)
		rc = answer(c, REMOTE_MSG_MANIFEST_OK, &m, REMOTE_MAX_MANIFEST, NULL, NULL);
	pthread_mutex_unlock(&c->lock);
	if (rc)
		return rc;
	char path[4200];
	snprintf(path, sizeof path, "%s/data.mdb", dir);
	int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (fd < 0)
		rc = ckpt_err(-errno, "%s: manifest copy %s", c->name, path);
	for (size_t done = 0; !rc && done < m.len;) {
		ssize_t w = write(fd, (uint8_t *)m.payload + done, m.len - done);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			rc = ckpt_err(w < 0 ? -errno : -EIO, "%s: write %s", c->name, path);
		else
			done += (size_t)w;
	}
	if (fd >= 0)
		close(fd);
	net_msg_free(&m);
	return rc;
}

int remote_check(struct remote_conn *c, const struct remote_check *chk)
{
	struct ckpt_buf b;
	ckpt_buf_init(&b);
	remote_check_encode(&b, chk);
	struct net_msg m = { 0 };
	pthread_mutex_lock(&c->lock);
	int rc = request(c, REMOTE_MSG_CHECK, &b);
	if (!rc)
		rc = answer(c, REMOTE_MSG_CHECK_OK, &m, REMOTE_MAX_CONTROL, NULL, NULL);
	pthread_mutex_unlock(&c->lock);
	ckpt_buf_free(&b);
	net_msg_free(&m);
	return rc;
}

int remote_remove(struct remote_conn *c, uint64_t step, uint64_t save_id)
{
	struct ckpt_buf b;
	ckpt_buf_init(&b);
	remote_remove_encode(&b, step, save_id);
	struct net_msg m = { 0 };
	pthread_mutex_lock(&c->lock);
	int rc = request(c, REMOTE_MSG_REMOVE, &b);
	if (!rc)
		rc = answer(c, REMOTE_MSG_REMOVE_OK, &m, REMOTE_MAX_CONTROL, NULL, NULL);
	pthread_mutex_unlock(&c->lock);
	ckpt_buf_free(&b);
	net_msg_free(&m);
	return rc;
}

/* ------------------------------------------------------------------ the shard stream */

/* Tell ckptd to drop the stream, best effort. Its failure (a ckptd that is gone, a
 * connection already broken) must not replace the error that ends the stream:
 * that one goes to the caller and, as the rank's abort reason, to the coordinator. */
static void send_abort(struct remote_conn *c)
{
	char msg[1024];
	snprintf(msg, sizeof msg, "%s", ckpt_err_msg());
	(void)net_send(c->net, REMOTE_MSG_ABORT, NULL, 0, c->timeout_ms);
	ckpt_err_restore(msg);
}

#define RW_QUEUE 4u     /* chunks queued for the sender: enough to keep the wire busy */

struct rw_item {
	uint16_t type;          /* REMOTE_MSG_TENSOR or REMOTE_MSG_CHUNK (then DATA) */
	struct ckpt_buf head;   /* the message (CHUNK: its header) */
	int      buf;           /* CHUNK: the pool buffer holding the stored bytes */
	size_t   stored;
};

struct remote_writer {
	struct remote_conn *c;
	struct io_pool     *pool;
	int                 zstd_level;
	uint8_t             codec;          /* IO_CODEC_ZSTD or IO_CODEC_BYTEGROUP */
	uint8_t            *dtypes;         /* of the tensors declared, for bytegroup */
	uint32_t            ntensors, tcap;
	pthread_t           sender;
	bool                sender_started;
	pthread_mutex_t     lock;
	pthread_cond_t      cond;
	struct rw_item      q[RW_QUEUE];
	unsigned            head, count;
	bool                closing;
	int                 send_rc;        /* the sender's first failure */
	char                send_msg[1024];
	int                 peer_rc;        /* an ERROR ckptd sent during the stream */
	char                peer_msg[1024];
	uint64_t            logical;
};

static void item_release(struct remote_writer *w, struct rw_item *it)
{
	ckpt_buf_free(&it->head);
	if (it->buf >= 0)
		io_pool_put(w->pool, (unsigned)it->buf);
	it->buf = -1;
}

static void *rw_sender(void *arg)
{
	struct remote_writer *w = arg;
	struct net_conn *net = w->c->net;
	pthread_mutex_lock(&w->lock);
	for (;;) {
		while (!w->count && !w->closing)
			pthread_cond_wait(&w->cond, &w->lock);
		if (!w->count)
			break;
		struct rw_item *it = &w->q[w->head];
		bool failed = w->send_rc != 0;
		pthread_mutex_unlock(&w->lock);
		int rc = 0;
		if (!failed) {
			rc = net_send(net, it->type, it->head.p, it->head.len, w->c->timeout_ms);
			if (!rc && it->type == REMOTE_MSG_CHUNK)
				rc = net_send(net, REMOTE_MSG_DATA, io_pool_addr(w->pool, (unsigned)it->buf),
				              it->stored, w->c->timeout_ms);
		}
		item_release(w, it);
		pthread_mutex_lock(&w->lock);
		if (rc && !w->send_rc) {
			w->send_rc = rc;
			snprintf(w->send_msg, sizeof w->send_msg, "%s: %s", w->c->name, ckpt_err_msg());
		}
		w->head = (w->head + 1) % RW_QUEUE;
		w->count--;
		pthread_cond_broadcast(&w->cond);
	}
	pthread_mutex_unlock(&w->lock);
	return NULL;
}

/* An ERROR that ckptd sent during the stream, read without waiting. */
static void rw_poll_peer(struct remote_writer *w)
{
	if (w->peer_rc)
		return;
	struct net_msg m;
	int rc = net_recv(w->c->net, &m, 0);
	if (rc == -EAGAIN)
		return;
	if (rc)
		/* The connection failed (a ckptd that died, a reset): say which ckptd. */
		w->peer_rc = ckpt_err_prefix(rc, "%s", w->c->name);
	else if (m.type == REMOTE_MSG_ERROR)
		w->peer_rc = remote_error_take(m.payload, m.len, w->c->name);
	else
		w->peer_rc = ckpt_err(CKPT_EPROTO, "%s: message type %u during a shard stream",
		                      w->c->name, m.type);
	if (w->peer_rc)
		snprintf(w->peer_msg, sizeof w->peer_msg, "%s", ckpt_err_msg());
	net_msg_free(&m);
}

/* The stream's failure, if any, as this thread's error: ckptd's own word first. */
static int rw_failed(struct remote_writer *w)
{
	rw_poll_peer(w);
	if (w->peer_rc) {
		ckpt_err_restore(w->peer_msg);
		return w->peer_rc;
	}
	pthread_mutex_lock(&w->lock);
	int rc = w->send_rc;
	if (rc)
		ckpt_err_restore(w->send_msg);
	pthread_mutex_unlock(&w->lock);
	return rc;
}

/* Queue an item; waits while the queue is full. Takes it over in every case. */
static int rw_push(struct remote_writer *w, struct rw_item *it)
{
	int rc = rw_failed(w);
	if (!rc && !it->head.ok)
		rc = ckpt_err(-ENOMEM, "%s: message", w->c->name);
	if (rc) {
		item_release(w, it);
		return rc;
	}
	pthread_mutex_lock(&w->lock);
	while (w->count == RW_QUEUE)
		pthread_cond_wait(&w->cond, &w->lock);
	w->q[(w->head + w->count) % RW_QUEUE] = *it;
	w->count++;
	pthread_cond_broadcast(&w->cond);
	pthread_mutex_unlock(&w->lock);
	return 0;
}

/* Stop the sender once what is queued has gone (or failed). */
static void rw_drain(struct remote_writer *w)
{
	pthread_mutex_lock(&w->lock);
	w->closing = true;
	pthread_cond_broadcast(&w->cond);
	pthread_mutex_unlock(&w->lock);
	if (w->sender_started)
		pthread_join(w->sender, NULL);
	w->sender_started = false;
}

static void rw_free(struct remote_writer *w)
{
	rw_drain(w);
	pthread_mutex_destroy(&w->lock);
	pthread_cond_destroy(&w->cond);
	pthread_mutex_unlock(&w->c->lock);
	ckpt_free(w->dtypes);
	ckpt_free(w);
}

int remote_writer_open(struct remote_conn *c, struct io_pool *pool,
                       const struct io_writer_opts *o, size_t chunk_bytes,
                       struct remote_writer **out)
{
	*out = NULL;
	struct remote_writer *w = ckpt_calloc(1, sizeof *w);
	if (!w)
		return ckpt_err(-ENOMEM, "%s: shard stream", c->name);
	w->c = c;
	w->pool = pool;
	w->zstd_level = o->zstd_level;
	w->codec = o->codec == IO_CODEC_BYTEGROUP ? IO_CODEC_BYTEGROUP : IO_CODEC_ZSTD;
	pthread_mutex_init(&w->lock, NULL);
	pthread_cond_init(&w->cond, NULL);
	/* The connection is the stream's until finish or abort. */
	pthread_mutex_lock(&c->lock);
	struct ckpt_buf b;
	ckpt_buf_init(&b);
	remote_open_encode(&b, &(struct remote_open){
		.step = o->step, .save_id = o->save_id, .block_bytes = o->block_bytes,
		.size_hint = o->size_hint, .chunk_bytes = chunk_bytes });
	int rc = request(c, REMOTE_MSG_OPEN, &b);
	ckpt_buf_free(&b);
	struct net_msg m = { 0 };
	if (!rc)
		rc = answer(c, REMOTE_MSG_OPEN_OK, &m, REMOTE_MAX_CONTROL, NULL, NULL);
	if (!rc) {
		uint64_t max = m.len == 8 ? ckpt_get_le64(m.payload) : 0;
		if (m.len != 8)
			rc = ckpt_err(CKPT_EPROTO, "%s: malformed OPEN_OK", c->name);
		else if (chunk_bytes > max)
			rc = ckpt_err(-EINVAL, "%s takes chunks of at most %llu bytes; this job's are "
			              "%zu (CKPT_CHUNK_BYTES)", c->name, (unsigned long long)max,
			              chunk_bytes);
		net_msg_free(&m);
		if (rc)
			send_abort(c);
	}
	if (!rc) {
		rc = -ckpt_thread_create(&w->sender, NULL, rw_sender, w);
		if (rc)
			ckpt_err(rc, "%s: sender thread", c->name);
		else
			w->sender_started = true;
	}
	if (rc) {
		rw_free(w);
		return rc;
	}
	*out = w;
	return 0;
}

int remote_writer_add_tensor(struct remote_writer *w, const struct io_tensor_desc *t)
{
	if (w->ntensors == w->tcap) {
		uint32_t cap = w->tcap ? w->tcap * 2 : 64;
		uint8_t *d = cap > w->tcap ? ckpt_realloc(w->dtypes, cap) : NULL;
		if (!d)
			return ckpt_err(-ENOMEM, "%s: tensor table", w->c->name);
		w->dtypes = d;
		w->tcap = cap;
	}
	w->dtypes[w->ntensors++] = t->dtype;
	struct rw_item it = { .type = REMOTE_MSG_TENSOR, .buf = -1 };
	ckpt_buf_init(&it.head);
	remote_tensor_encode(&it.head, t);
	return rw_push(w, &it);
}

bool remote_writer_ready(struct remote_writer *w)
{
	pthread_mutex_lock(&w->lock);
	bool room = w->count < RW_QUEUE || w->send_rc;
	pthread_mutex_unlock(&w->lock);
	if (room)
		return true;
	rw_poll_peer(w);
	return w->peer_rc != 0;
}

int remote_writer_append(struct remote_writer *w, uint32_t t, unsigned buf, size_t len,
                         const struct io_hashes *h)
{
	struct remote_chunk ch = {
		.tensor = t, .codec = IO_CODEC_RAW, .raw_len = len, .stored_len = len,
		.block_bytes = h->block_bytes, .nblocks = (uint32_t)io_nblocks(len, h->block_bytes),
		.blocks = h->blocks,
	};
	memcpy(ch.hash, h->chunk, CKPT_HASH_BYTES);
	struct rw_item it = { .type = REMOTE_MSG_CHUNK, .buf = (int)buf, .stored = len };
	if (w->zstd_level > 0 && len > 1) {
		/* Compressed here, before the wire: what pays on the disk pays twice. */
		int ob = io_pool_get(w->pool, 0);
		if (ob >= 0) {
			/* cap len - 1: compression counts only if it is strictly smaller. */
			uint8_t used;
			size_t clen = io_chunk_encode(w->codec, w->zstd_level,
			                              t < w->ntensors ? w->dtypes[t] : 0,
			                              io_pool_addr(w->pool, (unsigned)ob), len - 1,
			                              io_pool_addr(w->pool, buf), len, &used);
			if (clen && clen < len) {
				io_pool_put(w->pool, buf);
				it.buf = ob;
				it.stored = clen;
				ch.codec = used;
				ch.stored_len = clen;
				ch.nblocks = 0;
				ch.block_bytes = 0;
			} else {
				io_pool_put(w->pool, (unsigned)ob);
			}
		}
	}
	ckpt_buf_init(&it.head);
	remote_chunk_encode(&it.head, &ch);
	w->logical += len;
	return rw_push(w, &it);
}

int remote_writer_finish(struct remote_writer *w, struct io_shard_result *res)
{
	memset(res, 0, sizeof *res);
	struct remote_conn *c = w->c;
	rw_drain(w);
	int rc = rw_failed(w);
	struct net_msg m = { 0 };
	if (!rc)
		rc = request(c, REMOTE_MSG_FINISH, NULL);
	if (!rc)
		rc = answer(c, REMOTE_MSG_DURABLE, &m, IO_MAX_FOOTER_BYTES + 64, NULL, NULL);
	if (rc) {
		send_abort(c);
		rw_free(w);
		return rc;
	}
	struct ckpt_cursor cur;
	ckpt_cursor_init(&cur, m.payload, m.len);
	res->file_size = ckpt_cursor_u64(&cur);
	res->logical_bytes = ckpt_cursor_u64(&cur);
	res->stored_bytes = ckpt_cursor_u64(&cur);
	const uint8_t *fh = ckpt_cursor_take(&cur, CKPT_HASH_BYTES);
	uint8_t h[CKPT_HASH_BYTES];
	if (!cur.ok || !fh || !cur.left) {
		rc = ckpt_err(CKPT_EPROTO, "%s: malformed DURABLE", c->name);
	} else {
		io_hash128(cur.p, cur.left, h);
		if (memcmp(h, fh, CKPT_HASH_BYTES))
			rc = ckpt_err(CKPT_ECORRUPT, "%s: the footer of the durable shard does not match "
			              "its hash", c->name);
		else if (res->logical_bytes != w->logical)
			rc = ckpt_err(CKPT_ECORRUPT, "%s: the durable shard holds %llu bytes, %llu were sent",
			              c->name, (unsigned long long)res->logical_bytes,
			              (unsigned long long)w->logical);
	}
	if (!rc && (rc = io_index_decode(cur.p, cur.left, &res->index)))
		ckpt_err_prefix(rc, "%s: footer of the durable shard", c->name);
	if (!rc && !(res->footer = ckpt_malloc(cur.left)))
		rc = ckpt_err(-ENOMEM, "%s: footer", c->name);
	if (!rc) {
		memcpy(res->footer, cur.p, cur.left);
		res->footer_len = cur.left;
		memcpy(res->footer_hash, h, CKPT_HASH_BYTES);
	} else {
		io_index_free(res->index);
		memset(res, 0, sizeof *res);
	}
	net_msg_free(&m);
	rw_free(w);
	return rc;
}

void remote_writer_abort(struct remote_writer *w)
{
	if (!w)
		return;
	rw_drain(w);
	send_abort(w->c);
	rw_free(w);
}
