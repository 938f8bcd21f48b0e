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
 *
 * The direct path (over rdma, when ckptd agrees in OPEN_OK): ckptd grants pool
 * buffers of its own (GRANT), and the sender RDMA-writes each chunk from this rank's
 * pool buffer into a granted one, then sends the CHUNK naming the grant, which the
 * queue pair delivers after the bytes. The sender is then the stream's only
 * receiver (GRANTs, or an ERROR); the worker learns of an ERROR through it. A pool
 * buffer goes back once its WRITE has completed; when the disks on ckptd fall
 * behind, no grants come, the sender waits, and the save is paced as over tcp.
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
	bool             direct;       /* remote_auth's */
	struct net_mr   *pool_mr;      /* the direct path's source: mr_pool, registered once */
	const struct io_pool *mr_pool;
};

/* Connecting again after ckptd closed a connection in its handshake: the waits. */
#define REMOTE_RETRY_MIN_MS 10
#define REMOTE_RETRY_MAX_MS 250

int remote_connect(const struct remote_instance *to, const struct remote_auth *a,
                   struct remote_conn **out)
{
	*out = NULL;
	struct remote_conn *c = ckpt_calloc(1, sizeof *c);
	if (!c)
		return ckpt_err(-ENOMEM, "ckptd connection");
	snprintf(c->name, sizeof c->name, "ckptd %s:%u", to->host, to->port);
	c->timeout_ms = (int)a->timeout_ms;
	c->direct = a->direct;
	pthread_mutex_init(&c->lock, NULL);
	/* ckptd closes a connection in its handshake at once where the peer's address
	 * has its --max-handshakes in flight (many ranks of a node connecting together,
	 * or someone holding connections open): connect again, as connect itself does
	 * while nobody listens, until the timeout. */
	struct net_auth na = { .job_id = a->job_id, .rank = a->rank, .world = a->world,
	                       .secret = a->secret, .secret_len = a->secret_len };
	uint64_t deadline = ckpt_deadline_ms((int)a->timeout_ms);
	int rc, backoff = REMOTE_RETRY_MIN_MS;
	for (;;) {
		int left = ckpt_deadline_left_ms(deadline);
		rc = net_connect(a->transport, a->rdma, to->host, to->port, left, &c->net);
		if (!rc && !(rc = net_handshake_client(c->net, &na, ckpt_deadline_left_ms(deadline))))
			break;
		bool closed = c->net && (rc == -ECONNRESET || rc == -EPIPE);
		left = ckpt_deadline_left_ms(deadline);
		if (!closed || left == 0)
			break;
		ckpt_log(CKPT_LOG_DEBUG, "%s: closed in the handshake (busy): again in %d ms",
		         c->name, backoff);
		net_close(c->net);
		c->net = NULL;
		ckpt_sleep_ms((unsigned)(left > 0 && left < backoff ? left : backoff));
		backoff = backoff * 2 > REMOTE_RETRY_MAX_MS ? REMOTE_RETRY_MAX_MS : backoff * 2;
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
	net_mr_deregister(c->pool_mr);
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
	/* Grants of a direct stream that ended while they travelled: void (ckptd took
	 * them back when the stream ended), never an answer. */
	while (!rc && m->type == REMOTE_MSG_GRANT) {
		net_msg_free(m);
		rc = net_recv_into(c->net, m, into, arg, c->timeout_ms);
	}
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
#define RW_PENDING 8u   /* direct: chunks whose WRITE is posted and not yet complete */
#define RW_SLICE_MS 100 /* direct: how often a sender waiting for a grant looks up */

struct rw_item {
	uint16_t type;          /* REMOTE_MSG_TENSOR or REMOTE_MSG_CHUNK (then DATA) */
	struct ckpt_buf head;   /* the message (CHUNK: its header) */
	int      buf;           /* CHUNK: the pool buffer holding the stored bytes */
	const uint8_t *src;     /* CHUNK: or memory of the caller's (remote_writer_append_src,
	                         * _held) */
	bool     caller;        /* src is the caller's state: counts in src_pending */
	size_t   stored;
	/* A stream with hashes after the bytes: its HASHES, filled by the sender when
	 * hash_here (each block hashed just before it is sent) */
	struct ckpt_buf hashes;
	bool     hash_here;
};

struct remote_writer {
	struct remote_conn *c;
	struct io_pool     *pool;
	int                 zstd_level;
	bool                tree;           /* chunk hashes over block hashes (format 5) */
	bool                after;          /* hashes after the bytes (REMOTE_OPEN_AFTER) */
	uint32_t            block_bytes;
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
	char                peer_msg[1024]; /* (direct: set by the sender, under lock) */
	uint64_t            logical;
	/* the direct path; grants and pend are the sender's alone */
	bool                direct;
	bool                aborting;       /* under lock: stop waiting for grants */
	struct remote_grant grants[REMOTE_MAX_GRANTS];
	unsigned            ngrants;
	struct rw_pend { uint64_t ticket; unsigned buf; } pend[RW_PENDING];
	unsigned            npend;
	/* Where the stream's time went (CKPT_LOG=debug at finish): since open; the
	 * sender sending and waiting for chunks; the worker waiting for the queue. */
	uint64_t            t_open, ns_send, ns_idle, ns_full, chunks, sent, src_chunks;
	/* Chunks sent from the caller's memory: queued and not yet sent (under lock),
	 * and what to call once none is left after remote_writer_src_seal. */
	unsigned            src_pending;
	void              (*src_done)(void *);
	void               *src_arg;
};

static void item_release(struct remote_writer *w, struct rw_item *it)
{
	ckpt_buf_free(&it->head);
	ckpt_buf_free(&it->hashes);
	if (it->buf >= 0)
		io_pool_put(w->pool, (unsigned)it->buf);
	it->buf = -1;
}

/* Direct: give back the pool buffers whose WRITE has completed (they complete in
 * order); with wait, wait for all of them. A failed or timed-out wait keeps them
 * out until the connection's end makes them safe: the caller fails the stream. */
static int rw_reap(struct remote_writer *w, bool wait)
{
	unsigned done = 0;
	int rc = 0;
	while (done < w->npend) {
		rc = net_rdma_write_wait(w->c->net, w->pend[done].ticket, wait ? w->c->timeout_ms : 0);
		if (rc)
			break;
		io_pool_put(w->pool, w->pend[done++].buf);
	}
	memmove(w->pend, w->pend + done, (w->npend - done) * sizeof w->pend[0]);
	w->npend -= done;
	if (rc == -EAGAIN)
		rc = 0;
	if (rc) {
		/* Broken (or, for a timeout, broken now): the queue pair is in error and no
		 * WRITE reads them any more. Whatever such a WRITE carried into ckptd's
		 * buffer is never used: no CHUNK naming it follows on this connection. */
		net_conn_shutdown(w->c->net);
		while (w->npend)
			io_pool_put(w->pool, w->pend[--w->npend].buf);
	}
	return rc;
}

/* Direct: take what ckptd sent (GRANTs; an ERROR ends the stream), waiting up to
 * timeout_ms for the first message. */
static int rw_take_msgs(struct remote_writer *w, int timeout_ms)
{
	struct net_conn *net = w->c->net;
	for (;;) {
		struct net_msg m;
		int rc = net_recv(net, &m, timeout_ms);
		if (rc == -EAGAIN || rc == -ETIMEDOUT)
			return 0;
		if (rc)
			return ckpt_err_prefix(rc, "%s", w->c->name);
		if (m.type == REMOTE_MSG_GRANT) {
			unsigned k = 0;
			rc = remote_grant_decode(m.payload, m.len, w->grants + w->ngrants,
			                         REMOTE_MAX_GRANTS - w->ngrants, &k);
			if (rc)
				ckpt_err_prefix(rc, "%s: more grants than a stream holds, or", w->c->name);
			w->ngrants += k;
		} else if (m.type == REMOTE_MSG_ERROR) {
			rc = remote_error_take(m.payload, m.len, w->c->name);
			pthread_mutex_lock(&w->lock);
			w->peer_rc = rc;
			snprintf(w->peer_msg, sizeof w->peer_msg, "%s", ckpt_err_msg());
			pthread_mutex_unlock(&w->lock);
		} else {
			rc = ckpt_err(CKPT_EPROTO, "%s: message type %u during a shard stream",
			              w->c->name, m.type);
		}
		net_msg_free(&m);
		if (rc)
			return rc;
		timeout_ms = 0;
	}
}

/* Direct: a chunk of it->stored bytes, from its pool buffer into a granted one, then
 * its CHUNK naming the grant. The buffer goes to pend (back to the pool once the
 * WRITE completed). */
static int rw_send_direct(struct remote_writer *w, struct rw_item *it)
{
	struct net_conn *net = w->c->net;
	uint64_t deadline = ckpt_deadline_ms(w->c->timeout_ms);
	int rc = rw_take_msgs(w, 0);
	while (!rc && !w->ngrants) {
		/* ckptd's pool is empty (its disks are behind): wait, and meanwhile give
		 * back what the network has carried. */
		if ((rc = rw_reap(w, false)))
			break;
		pthread_mutex_lock(&w->lock);
		bool stop = w->aborting;
		pthread_mutex_unlock(&w->lock);
		if (stop)
			return ckpt_err(-ECANCELED, "%s: shard stream aborted", w->c->name);
		int left = ckpt_deadline_left_ms(deadline);
		if (left == 0)
			return ckpt_err(-ETIMEDOUT, "%s: no buffer granted within %d ms (ckptd's pool "
			                "stayed full)", w->c->name, w->c->timeout_ms);
		rc = rw_take_msgs(w, left < 0 || left > RW_SLICE_MS ? RW_SLICE_MS : left);
	}
	if (rc)
		return rc;
	struct remote_grant g = w->grants[0];
	memmove(w->grants, w->grants + 1, --w->ngrants * sizeof w->grants[0]);
	if (it->stored > g.len)
		return ckpt_err(CKPT_EPROTO, "%s: granted a buffer of %u bytes for a chunk of %zu",
		                w->c->name, g.len, it->stored);
	if (w->npend == RW_PENDING && (rc = rw_reap(w, true)))
		return rc;
	uint64_t ticket;
	rc = net_rdma_write(net, w->c->pool_mr, io_pool_addr(w->pool, (unsigned)it->buf),
	                    it->stored, g.addr, g.rkey, &ticket, w->c->timeout_ms);
	if (rc)
		return ckpt_err_prefix(rc, "%s", w->c->name);
	w->pend[w->npend++] = (struct rw_pend){ ticket, (unsigned)it->buf };
	it->buf = -1;
	ckpt_buf_u32(&it->head, g.id);   /* the CHUNK's last field: names the grant */
	if (!it->head.ok)
		return ckpt_err(-ENOMEM, "%s: CHUNK", w->c->name);
	if ((rc = net_send(net, REMOTE_MSG_CHUNK, it->head.p, it->head.len, w->c->timeout_ms)))
		return rc;
	return rw_reap(w, false);
}

/* A chunk sent from where it lies, unhashed so far: each block is hashed just
 * before it goes into the socket, so that the kernel's copy reads it from the
 * CPU's cache and not from memory a second time. Its HASHES (it->hashes, sized
 * for them) are filled on the way, and the chunk's hash at the end. */
static int rw_send_hashing(struct remote_writer *w, struct rw_item *it)
{
	struct net_conn *net = w->c->net;
	const uint8_t *p = it->src;
	size_t n = it->stored;
	uint8_t *hash = it->hashes.p, *blocks = hash + CKPT_HASH_BYTES;
	uint64_t nb = io_nblocks(n, w->block_bytes);
	size_t piece = nb ? w->block_bytes : n;
	int rc = 0;
	for (size_t off = 0, b = 0; !rc && off < n; off += piece, b++) {
		size_t k = n - off < piece ? n - off : piece;
		io_hash128(p + off, k, nb ? blocks + b * CKPT_HASH_BYTES : hash);
		rc = off ? net_send_more(net, p + off, k, w->c->timeout_ms)
		         : net_send_head(net, REMOTE_MSG_DATA, n, p, k, w->c->timeout_ms);
	}
	if (!rc && nb)
		io_tree_hash(blocks, nb, hash);
	return rc;
}

static void *rw_sender(void *arg)
{
	struct remote_writer *w = arg;
	struct net_conn *net = w->c->net;
	pthread_mutex_lock(&w->lock);
	for (;;) {
		if (!w->count && w->npend) {
			/* Nothing to send: the pool buffers still out come back now, for the
			 * worker may be waiting for one. */
			pthread_mutex_unlock(&w->lock);
			int rc = rw_reap(w, true);
			pthread_mutex_lock(&w->lock);
			if (rc && !w->send_rc) {
				w->send_rc = rc;
				snprintf(w->send_msg, sizeof w->send_msg, "%s: %s", w->c->name,
				         ckpt_err_msg());
			}
			continue;
		}
		uint64_t t0 = ckpt_now_ns();
		while (!w->count && !w->closing)
			pthread_cond_wait(&w->cond, &w->lock);
		uint64_t t1 = ckpt_now_ns();
		w->ns_idle += t1 - t0;
		if (!w->count)
			break;
		struct rw_item *it = &w->q[w->head];
		bool failed = w->send_rc != 0 || w->peer_rc != 0;
		pthread_mutex_unlock(&w->lock);
		int rc = 0;
		bool from_src = it->caller;
		if (it->type == REMOTE_MSG_CHUNK) {
			w->chunks++;
			w->sent += it->stored;
			w->src_chunks += from_src;
		}
		if (!failed && w->direct && it->type == REMOTE_MSG_CHUNK) {
			rc = rw_send_direct(w, it);
		} else if (!failed) {
			rc = net_send(net, it->type, it->head.p, it->head.len, w->c->timeout_ms);
			if (!rc && it->type == REMOTE_MSG_CHUNK && it->hash_here)
				rc = rw_send_hashing(w, it);
			else if (!rc && it->type == REMOTE_MSG_CHUNK)
				rc = net_send(net, REMOTE_MSG_DATA,
				              it->src ? it->src : io_pool_addr(w->pool, (unsigned)it->buf),
				              it->stored, w->c->timeout_ms);
			if (!rc && it->type == REMOTE_MSG_CHUNK && w->after)
				rc = net_send(net, REMOTE_MSG_HASHES, it->hashes.p, it->hashes.len,
				              w->c->timeout_ms);
		}
		item_release(w, it);
		pthread_mutex_lock(&w->lock);
		w->ns_send += ckpt_now_ns() - t1;
		if (rc && !w->send_rc) {
			w->send_rc = rc;
			snprintf(w->send_msg, sizeof w->send_msg, "%s: %s", w->c->name, ckpt_err_msg());
		}
		w->head = (w->head + 1) % RW_QUEUE;
		w->count--;
		pthread_cond_broadcast(&w->cond);
		/* The kernel has the bytes of the last chunk read from the caller's memory
		 * (or the stream failed, and nothing reads them any more). */
		if (from_src && --w->src_pending == 0 && w->src_done) {
			void (*done)(void *) = w->src_done;
			w->src_done = NULL;
			pthread_mutex_unlock(&w->lock);
			done(w->src_arg);
			pthread_mutex_lock(&w->lock);
		}
	}
	pthread_mutex_unlock(&w->lock);
	return NULL;
}

/* An ERROR that ckptd sent during the stream, read without waiting (direct: the
 * sender reads, and this only looks at what it found). */
static void rw_poll_peer(struct remote_writer *w)
{
	pthread_mutex_lock(&w->lock);
	bool skip = w->peer_rc || (w->direct && w->sender_started);
	pthread_mutex_unlock(&w->lock);
	if (skip)
		return;
	struct net_msg m;
	int rc = net_recv(w->c->net, &m, 0);
	/* Grants left over from a direct stream's sender: void now (see answer). */
	while (rc == 0 && m.type == REMOTE_MSG_GRANT) {
		net_msg_free(&m);
		rc = net_recv(w->c->net, &m, 0);
	}
	if (rc == -EAGAIN)
		return;
	if (rc)
		/* The connection failed (a ckptd that died, a reset): say which ckptd. */
		rc = ckpt_err_prefix(rc, "%s", w->c->name);
	else if (m.type == REMOTE_MSG_ERROR)
		rc = remote_error_take(m.payload, m.len, w->c->name);
	else
		rc = ckpt_err(CKPT_EPROTO, "%s: message type %u during a shard stream", w->c->name,
		              m.type);
	net_msg_free(&m);
	/* Under the lock: the sender reads them to stop sending. */
	pthread_mutex_lock(&w->lock);
	if (rc && !w->peer_rc) {
		w->peer_rc = rc;
		snprintf(w->peer_msg, sizeof w->peer_msg, "%s", ckpt_err_msg());
	}
	pthread_mutex_unlock(&w->lock);
}

/* The stream's failure, if any, as this thread's error: ckptd's own word first. */
static int rw_failed(struct remote_writer *w)
{
	rw_poll_peer(w);
	pthread_mutex_lock(&w->lock);
	int rc = w->peer_rc;
	if (rc)
		ckpt_err_restore(w->peer_msg);
	else if ((rc = w->send_rc))
		ckpt_err_restore(w->send_msg);
	pthread_mutex_unlock(&w->lock);
	return rc;
}

/* Queue an item; waits while the queue is full. Takes it over in every case. */
static int rw_push(struct remote_writer *w, struct rw_item *it)
{
	int rc = rw_failed(w);
	if (!rc && (!it->head.ok || !it->hashes.ok))
		rc = ckpt_err(-ENOMEM, "%s: message", w->c->name);
	if (rc) {
		item_release(w, it);
		return rc;
	}
	pthread_mutex_lock(&w->lock);
	uint64_t t0 = ckpt_now_ns();
	while (w->count == RW_QUEUE)
		pthread_cond_wait(&w->cond, &w->lock);
	w->ns_full += ckpt_now_ns() - t0;
	w->q[(w->head + w->count) % RW_QUEUE] = *it;
	w->count++;
	w->src_pending += it->caller;
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
	pthread_mutex_lock(&w->lock);
	w->sender_started = false;
	pthread_mutex_unlock(&w->lock);
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

/* The direct path's source: the whole pool, registered with the connection once
 * (again only for another pool). A failure leaves the stream on DATA. */
static int pool_register(struct remote_conn *c, struct io_pool *pool)
{
	if (c->pool_mr && c->mr_pool == pool)
		return 0;
	net_mr_deregister(c->pool_mr);
	c->pool_mr = NULL;
	size_t len = (size_t)io_pool_bytes(pool);   /* every class: one mapping */
	int rc = net_mr_register(c->net, io_pool_addr(pool, 0), len, NET_MR_LOCAL, &c->pool_mr);
	if (rc) {
		ckpt_log(CKPT_LOG_INFO, "%s: chunks go as DATA messages: %s", c->name, ckpt_err_msg());
		return rc;
	}
	c->mr_pool = pool;
	return 0;
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
	w->t_open = ckpt_now_ns();
	w->zstd_level = o->zstd_level;
	w->tree = o->tree;
	w->block_bytes = o->block_bytes;
	w->codec = o->codec == IO_CODEC_BYTEGROUP ? IO_CODEC_BYTEGROUP : IO_CODEC_ZSTD;
	pthread_mutex_init(&w->lock, NULL);
	pthread_cond_init(&w->cond, NULL);
	/* The connection is the stream's until finish or abort. */
	pthread_mutex_lock(&c->lock);
	bool ask = c->direct && net_conn_can_write(c->net) && pool_register(c, pool) == 0;
	struct ckpt_buf b;
	ckpt_buf_init(&b);
	remote_open_encode(&b, &(struct remote_open){
		.step = o->step, .save_id = o->save_id, .block_bytes = o->block_bytes,
		.size_hint = o->size_hint, .chunk_bytes = chunk_bytes,
		.flags = (ask ? REMOTE_OPEN_DIRECT : REMOTE_OPEN_AFTER) |
		         (o->tree ? REMOTE_OPEN_TREE : 0) });
	int rc = request(c, REMOTE_MSG_OPEN, &b);
	ckpt_buf_free(&b);
	struct net_msg m = { 0 };
	if (!rc)
		rc = answer(c, REMOTE_MSG_OPEN_OK, &m, REMOTE_MAX_CONTROL, NULL, NULL);
	if (!rc) {
		uint64_t max;
		uint32_t flags;
		/* ckptd says each flag back (the direct path only where it can). */
		if (remote_open_ok_decode(m.payload, m.len, &max, &flags) ||
		    ((flags & REMOTE_OPEN_DIRECT) && !ask) ||
		    !(flags & REMOTE_OPEN_TREE) != !o->tree || !(flags & REMOTE_OPEN_AFTER) != ask)
			rc = ckpt_err(CKPT_EPROTO, "%s: malformed OPEN_OK", c->name);
		else if (chunk_bytes > max)
			rc = ckpt_err(-EINVAL, "%s takes chunks of at most %llu bytes; this job's are "
			              "%zu (CKPT_CHUNK_BYTES)", c->name, (unsigned long long)max,
			              chunk_bytes);
		else
			w->direct = flags & REMOTE_OPEN_DIRECT;
		w->after = flags & REMOTE_OPEN_AFTER;
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
	ckpt_buf_init(&it.hashes);
	remote_tensor_encode(&it.head, t);
	return rw_push(w, &it);
}

bool remote_writer_ready(struct remote_writer *w)
{
	pthread_mutex_lock(&w->lock);
	bool room = w->count < RW_QUEUE || w->send_rc || w->peer_rc;
	pthread_mutex_unlock(&w->lock);
	if (room)
		return true;
	rw_poll_peer(w);
	pthread_mutex_lock(&w->lock);
	room = w->peer_rc != 0;
	pthread_mutex_unlock(&w->lock);
	return room;
}

bool remote_writer_hashes_while_sending(const struct remote_writer *w)
{
	return w->after && w->tree;
}

/* A CHUNK of len raw bytes: from pool buffer buf (compressed here when the job
 * compresses), or, buf -1, sent from src where it lies (the caller's state when
 * caller: remote_writer_src_seal waits for it). h NULL: src is not hashed yet, and
 * the sender hashes it as it sends it (remote_writer_hashes_while_sending). */
static int rw_append(struct remote_writer *w, uint32_t t, int buf, const void *src, bool caller,
                     size_t len, const struct io_hashes *h)
{
	bool hash_here = !h;
	struct io_hashes none = { .block_bytes = w->block_bytes, .tree = w->tree };
	if (hash_here && (!remote_writer_hashes_while_sending(w) || !src)) {
		if (buf >= 0)
			io_pool_put(w->pool, (unsigned)buf);
		return ckpt_err(-EINVAL, "%s: a chunk without its hashes on a stream whose sender "
		                "cannot hash it", w->c->name);
	}
	if (hash_here)
		h = &none;
	if (h->tree != w->tree) {
		if (buf >= 0)
			io_pool_put(w->pool, (unsigned)buf);
		return ckpt_err(-EINVAL, "%s: a chunk hashed %s for a stream that %s", w->c->name,
		                h->tree ? "as a tree" : "whole",
		                w->tree ? "hashes trees" : "hashes chunks whole");
	}
	struct remote_chunk ch = {
		.tensor = t, .codec = IO_CODEC_RAW, .raw_len = len, .stored_len = len,
		.block_bytes = h->block_bytes, .nblocks = (uint32_t)io_nblocks(len, h->block_bytes),
		.blocks = h->blocks,
	};
	memcpy(ch.hash, h->chunk, CKPT_HASH_BYTES);
	struct rw_item it = { .type = REMOTE_MSG_CHUNK, .buf = buf, .src = src, .caller = caller,
	                      .stored = len, .hash_here = hash_here };
	if (buf >= 0 && w->zstd_level > 0 && len > 1) {
		/* Compressed here, before the wire: what pays on the disk pays twice. */
		int ob = io_pool_get_fit(w->pool, len, 0);
		if (ob >= 0) {
			/* cap len - 1: compression counts only if it is strictly smaller. */
			uint8_t used;
			size_t clen = io_chunk_encode(w->codec, w->zstd_level,
			                              t < w->ntensors ? w->dtypes[t] : 0,
			                              io_pool_addr(w->pool, (unsigned)ob), len - 1,
			                              io_pool_addr(w->pool, (unsigned)buf), len, &used);
			if (clen && clen < len) {
				io_pool_put(w->pool, (unsigned)buf);
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
	remote_chunk_encode(&it.head, &ch, w->after);
	ckpt_buf_init(&it.hashes);
	if (w->after && hash_here) {     /* room for the sender to fill */
		static const uint8_t zero[CKPT_HASH_BYTES];
		for (uint32_t i = 0; i <= ch.nblocks; i++)
			ckpt_buf_put(&it.hashes, zero, sizeof zero);
	} else if (w->after) {
		remote_hashes_encode(&it.hashes, ch.hash, ch.blocks, ch.nblocks);
	}
	w->logical += len;
	return rw_push(w, &it);
}

int remote_writer_append(struct remote_writer *w, uint32_t t, unsigned buf, size_t len,
                         const struct io_hashes *h)
{
	return rw_append(w, t, (int)buf, NULL, false, len, h);
}

/* Such a chunk goes as it lies: never compressed, never RDMA-written (the direct
 * path writes from the registered pool's buffers only). */
static int rw_append_mem(struct remote_writer *w, uint32_t t, const void *src, bool caller,
                         size_t len, const struct io_hashes *h)
{
	if (w->zstd_level > 0 || w->direct)
		return ckpt_err(-EINVAL, "%s: a chunk from the caller's memory on a stream that %s",
		                w->c->name, w->direct ? "RDMA-writes its chunks" : "compresses");
	return rw_append(w, t, -1, src, caller, len, h);
}

int remote_writer_append_src(struct remote_writer *w, uint32_t t, const void *src, size_t len,
                             const struct io_hashes *h)
{
	return rw_append_mem(w, t, src, true, len, h);
}

int remote_writer_append_held(struct remote_writer *w, uint32_t t, const void *src, size_t len,
                              const struct io_hashes *h)
{
	return rw_append_mem(w, t, src, false, len, h);
}

void remote_writer_src_seal(struct remote_writer *w, void (*done)(void *), void *arg)
{
	pthread_mutex_lock(&w->lock);
	bool now = w->src_pending == 0;
	if (!now) {
		w->src_done = done;
		w->src_arg = arg;
	}
	pthread_mutex_unlock(&w->lock);
	if (now)
		done(arg);
}

void remote_writer_sent(struct remote_writer *w)
{
	rw_drain(w);
}

int remote_writer_finish(struct remote_writer *w, struct io_shard_result *res)
{
	memset(res, 0, sizeof *res);
	struct remote_conn *c = w->c;
	rw_drain(w);
	int rc = rw_failed(w);
	/* The sender has stopped (rw_drain joined it): its figures are final. */
	ckpt_log(CKPT_LOG_DEBUG, "%s: stream of %llu chunk(s) (%llu sent from the caller's "
	         "memory), %.1f MiB, %.3f s since open; "
	         "sender sending %.3f s, waiting for chunks %.3f s; worker waiting for the "
	         "sender's queue %.3f s", c->name, (unsigned long long)w->chunks,
	         (unsigned long long)w->src_chunks,
	         (double)w->sent / 1048576.0, (double)(ckpt_now_ns() - w->t_open) / 1e9,
	         (double)w->ns_send / 1e9, (double)w->ns_idle / 1e9, (double)w->ns_full / 1e9);
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
	pthread_mutex_lock(&w->lock);
	w->aborting = true;
	pthread_mutex_unlock(&w->lock);
	rw_drain(w);
	send_abort(w->c);
	rw_free(w);
}
