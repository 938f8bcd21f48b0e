/*
 * rdma_stream.c — the rdma transport's byte stream: what net_transport_ops'
 * send, recv_some, wait and shutdown do over an RC queue pair, so that msg.c's
 * framing and auth.c's handshake run on it unchanged.
 *
 * Small pieces of the stream travel inside SENDs (RDMA_K_INLINE) into receive
 * slots posted in advance; larger ones are copied into a registered staging
 * area, RDMA-WRITten into the ring the peer registered for that purpose (its
 * address and rkey came in its RING_INFO control message) and announced by a
 * SEND (RDMA_K_RING) that follows the WRITE on the same queue pair, so it
 * cannot overtake it. Flow control is by credits: a data SEND is posted only
 * while the peer has a free receive slot for it, and a WRITE only into ring
 * space the peer has freed; both are returned in every header, or by a CREDIT
 * message when half of either is owed (docs/protocol-rdma.md has the proof that
 * the extra receive slots suffice for those).
 *
 * Progress is driven by the callers: every send, recv_some and wait polls the
 * completion queue (after re-arming its notification, so nothing is missed)
 * and the connection's rdma_cm events. Any error completion becomes the
 * connection's error, naming the work request and ibv_wc_status_str, and the
 * connection is torn down (rdma_disconnect: the peer learns at once).
 *
 * Direct writes (net.h's net_rdma_write, docs/protocol-rdma.md §4a) share the
 * queue pair: an RDMA WRITE from a caller's registered range into one the peer
 * registered, numbered so that the caller knows when its source may be reused,
 * ordered before the stream's next SEND like the ring's own WRITEs.
 */
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "rdma_internal.h"

static uint64_t wr_id_make(enum rdma_op op, uint32_t len, uint32_t low)
{
	return (uint64_t)op << 56 | (uint64_t)(len & 0xFFFFFFu) << 32 | low;
}
static enum rdma_op wr_id_op(uint64_t id) { return (enum rdma_op)(id >> 56); }
static uint32_t wr_id_len(uint64_t id) { return (uint32_t)(id >> 32) & 0xFFFFFFu; }
static uint32_t wr_id_low(uint64_t id) { return (uint32_t)id; }

static const char *op_name(enum rdma_op op)
{
	switch (op) {
	case RDMA_OP_RECV:  return "RECV";
	case RDMA_OP_SEND:  return "SEND";
	case RDMA_OP_WRITE: return "RDMA WRITE";
	case RDMA_OP_DWRITE: return "RDMA WRITE";
	}
	return "work request";
}

static void ev_set(int fd)
{
	uint64_t one = 1;
	/* EAGAIN only when the counter is already huge: it is set either way. */
	if (write(fd, &one, sizeof one) < 0 && errno != EAGAIN)
		ckpt_log(CKPT_LOG_DEBUG, "rdma: eventfd write: %s", ckpt_strerror(-errno));
}

static void ev_clear(int fd)
{
	uint64_t v;
	(void)!read(fd, &v, sizeof v);   /* EAGAIN: was not set */
}

/* The first fatal error wins; it tears the connection down so that the peer
 * sees the close at once and every WR still queued is flushed. Locked. */
static int conn_fail(struct rdma_conn *r, int code, const char *fmt, ...) CKPT_PRINTF(3, 4);
static int conn_fail(struct rdma_conn *r, int code, const char *fmt, ...)
{
	if (r->err)
		return r->err;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(r->why, sizeof r->why, fmt, ap);
	va_end(ap);
	__atomic_store_n(&r->err, code, __ATOMIC_RELEASE);   /* after why: rdma_error_detail */
	ckpt_log(CKPT_LOG_WARN, "rdma %s (%s): %s; closing the connection", r->peer, r->dev,
	         r->why);
	if (!r->shut)
		(void)rdma_disconnect(r->id);
	r->shut = true;
	ev_set(r->evrx);
	ev_set(r->evtx);
	return code;
}

/* A failed completion as one of our codes: the peer went away, or something is
 * wrong with the memory or the protocol (a bug or a hostile peer). */
static int wc_code(enum ibv_wc_status s)
{
	switch (s) {
	case IBV_WC_WR_FLUSH_ERR:
	case IBV_WC_RETRY_EXC_ERR:
	case IBV_WC_RNR_RETRY_EXC_ERR:
	case IBV_WC_REM_ABORT_ERR:
	case IBV_WC_RESP_TIMEOUT_ERR:
		return -ECONNRESET;
	case IBV_WC_LOC_PROT_ERR:
	case IBV_WC_LOC_ACCESS_ERR:
	case IBV_WC_REM_ACCESS_ERR:
		return -EACCES;
	case IBV_WC_LOC_LEN_ERR:
		return -EMSGSIZE;
	case IBV_WC_REM_INV_REQ_ERR:
	case IBV_WC_REM_OP_ERR:
	case IBV_WC_BAD_RESP_ERR:
	case IBV_WC_REM_INV_RD_REQ_ERR:
		return CKPT_EPROTO;
	default:
		return -EIO;
	}
}

int rdma_post_recv_slot(struct rdma_conn *r, uint32_t slot)
{
	struct ibv_sge sge = { .addr = (uintptr_t)(r->rbuf + (size_t)slot * RDMA_SLOT_BYTES),
	                       .length = RDMA_SLOT_BYTES, .lkey = r->rmr->lkey };
	struct ibv_recv_wr wr = { .wr_id = wr_id_make(RDMA_OP_RECV, 0, slot), .sg_list = &sge,
	                          .num_sge = 1 }, *bad;
	int e = ibv_post_recv(r->qp, &wr, &bad);   /* positive errno */
	if (e)
		return conn_fail(r, -e, "ibv_post_recv of slot %u: %s", slot, ckpt_strerror(-e));
	return 0;
}

/* The header of every SEND; it hands over all that is owed to the peer. Locked. */
static void hdr_fill(struct rdma_conn *r, uint8_t *h, enum rdma_kind kind, uint32_t len,
                     uint32_t ring_off)
{
	h[0] = (uint8_t)kind;
	h[1] = RDMA_WIRE_VERSION;
	ckpt_put_le16(h + 2, (uint16_t)r->owed_slots);
	ckpt_put_le32(h + 4, r->owed_ring);
	ckpt_put_le32(h + 8, len);
	ckpt_put_le32(h + 12, ring_off);
	r->owed_slots = 0;
	r->owed_ring = 0;
}

/* Post one SEND from send slot `s` (already filled, `bytes` long), after an
 * optional WRITE chained in front of it. Locked. */
static int post_send(struct rdma_conn *r, uint32_t s, uint32_t bytes, struct ibv_send_wr *write)
{
	struct ibv_sge sge = { .addr = (uintptr_t)(r->sbuf + (size_t)s * RDMA_SLOT_BYTES),
	                       .length = bytes, .lkey = r->smr->lkey };
	struct ibv_send_wr wr = { .wr_id = wr_id_make(RDMA_OP_SEND, bytes, s), .sg_list = &sge,
	                          .num_sge = 1, .opcode = IBV_WR_SEND,
	                          .send_flags = IBV_SEND_SIGNALED }, *bad;
	struct ibv_send_wr *first = &wr;
	if (write) {
		write->next = &wr;
		first = write;
	}
	int e = ibv_post_send(r->qp, first, &bad);   /* positive errno */
	if (e)
		return conn_fail(r, -e, "ibv_post_send (%s): %s", write ? "RDMA WRITE + SEND" : "SEND",
		                 ckpt_strerror(-e));
	r->sq_busy += write ? 2u : 1u;
	return 0;
}

/* A control message that needs no credit (CREDIT, RING_INFO). Locked. */
static int send_ctrl(struct rdma_conn *r, enum rdma_kind kind, const void *body, uint32_t len)
{
	if (r->nsfree == 0)
		return -EAGAIN;
	uint32_t s = r->sfree[--r->nsfree];
	uint8_t *p = r->sbuf + (size_t)s * RDMA_SLOT_BYTES;
	hdr_fill(r, p, kind, len, 0);
	if (len)
		memcpy(p + RDMA_HDR_BYTES, body, len);
	int rc = post_send(r, s, RDMA_HDR_BYTES + len, NULL);
	if (rc)
		r->sfree[r->nsfree++] = s;
	return rc;
}

/* Return credits by themselves when half of the slots or half of the ring is
 * owed (the bound docs/protocol-rdma.md relies on); otherwise they ride on the
 * next data message. Locked. */
static void maybe_send_credit(struct rdma_conn *r)
{
	if (r->err || r->shut || r->peer_gone)
		return;
	if (r->owed_slots >= RDMA_DATA_SLOTS / 2 || r->owed_ring >= RDMA_RING_BYTES / 2)
		(void)send_ctrl(r, RDMA_K_CREDIT, NULL, 0);   /* no slot: retried at next progress */
}

int rdma_stream_start(struct net_conn *c)
{
	struct rdma_conn *r = c->priv;
	uint8_t body[16];
	ckpt_put_le64(body, (uintptr_t)r->ring);
	ckpt_put_le32(body + 8, r->ring_mr->rkey);
	ckpt_put_le32(body + 12, RDMA_RING_BYTES);
	pthread_mutex_lock(&r->lock);
	r->established = true;
	int rc = send_ctrl(r, RDMA_K_RING_INFO, body, sizeof body);
	pthread_mutex_unlock(&r->lock);
	if (rc)
		return ckpt_err(rc, "rdma %s: sending RING_INFO: %s", c->peer, r->why);
	return 0;
}

/* ---------------------------------------------------------------- completions */

static int peer_ring_set(struct rdma_conn *r, const uint8_t *b)
{
	uint64_t addr = ckpt_get_le64(b);
	uint32_t rkey = ckpt_get_le32(b + 8), size = ckpt_get_le32(b + 12);
	if (size < RDMA_RING_MIN || size > RDMA_RING_MAX)
		return conn_fail(r, CKPT_EPROTO, "peer offers a ring of %u bytes (accepted: %u..%u)",
		                 size, RDMA_RING_MIN, RDMA_RING_MAX);
	/* The bytes are copied into registered memory before the WRITE: the caller's
	 * buffer may be read-only (EFAULT to register) or freed right after. */
	r->stage = ckpt_aligned_alloc(4096, size);
	if (!r->stage)
		return conn_fail(r, -ENOMEM, "staging area of %u bytes", size);
	r->stage_mr = ibv_reg_mr(r->pd, r->stage, size, IBV_ACCESS_LOCAL_WRITE);
	if (!r->stage_mr) {
		int e = errno ? -errno : -ENOMEM;
		return conn_fail(r, e, "ibv_reg_mr of the %u-byte staging area: %s", size,
		                 ckpt_strerror(e));
	}
	r->peer_addr = addr;
	r->peer_rkey = rkey;
	r->peer_size = size;
	r->have_peer_ring = true;
	r->tx_grew = true;
	return 0;
}

/* One received message in slot s: check every field against what contains it
 * before using it (CONTRIBUTING.md, "Style"), then file it. Locked. */
static int on_recv(struct rdma_conn *r, uint32_t s, uint32_t byte_len)
{
	const uint8_t *h = r->rbuf + (size_t)s * RDMA_SLOT_BYTES;
	if (byte_len < RDMA_HDR_BYTES)
		return conn_fail(r, CKPT_EPROTO, "message of %u bytes is shorter than the %u-byte "
		                 "header", byte_len, RDMA_HDR_BYTES);
	uint8_t kind = h[0], version = h[1];
	uint32_t cred = ckpt_get_le16(h + 2), ring_back = ckpt_get_le32(h + 4);
	uint32_t len = ckpt_get_le32(h + 8), off = ckpt_get_le32(h + 12);
	if (version != RDMA_WIRE_VERSION)
		return conn_fail(r, CKPT_EPROTO, "rdma wire version %u, this side speaks %u", version,
		                 RDMA_WIRE_VERSION);
	/* Credits back: never more than are out, or the peer is confused or hostile. */
	if (cred > RDMA_DATA_SLOTS - r->credits)
		return conn_fail(r, CKPT_EPROTO, "peer returns %u credits, only %u are out", cred,
		                 RDMA_DATA_SLOTS - r->credits);
	if (ring_back > r->tx_written - r->tx_freed)
		return conn_fail(r, CKPT_EPROTO, "peer frees %u ring bytes, only %llu are in use",
		                 ring_back, (unsigned long long)(r->tx_written - r->tx_freed));
	r->credits += cred;
	r->tx_freed += ring_back;
	if (cred || ring_back)
		r->tx_grew = true;

	switch (kind) {
	case RDMA_K_CREDIT:
		if (byte_len != RDMA_HDR_BYTES || len != 0)
			return conn_fail(r, CKPT_EPROTO, "CREDIT message of %u bytes", byte_len);
		return rdma_post_recv_slot(r, s);   /* needs no credit: back at once */
	case RDMA_K_RING_INFO:
		if (byte_len != RDMA_HDR_BYTES + 16 || len != 16)
			return conn_fail(r, CKPT_EPROTO, "RING_INFO message of %u bytes", byte_len);
		if (r->have_peer_ring)
			return conn_fail(r, CKPT_EPROTO, "second RING_INFO message");
		if (peer_ring_set(r, h + RDMA_HDR_BYTES))
			return r->err;
		return rdma_post_recv_slot(r, s);
	case RDMA_K_INLINE:
		if (len > RDMA_INLINE_MAX || byte_len != RDMA_HDR_BYTES + len)
			return conn_fail(r, CKPT_EPROTO, "INLINE message of %u bytes says %u", byte_len, len);
		break;
	case RDMA_K_RING:
		if (byte_len != RDMA_HDR_BYTES)
			return conn_fail(r, CKPT_EPROTO, "RING message of %u bytes", byte_len);
		/* Segments follow each other in the ring, wrapping only at its end. */
		if (off != r->rx_ring_total % RDMA_RING_BYTES || len > RDMA_RING_BYTES - off ||
		    len > RDMA_RING_BYTES - r->rx_ring_used)
			return conn_fail(r, CKPT_EPROTO, "RING segment of %u bytes at offset %u (expected "
			                 "offset %llu, %u bytes free)", len, off,
			                 (unsigned long long)(r->rx_ring_total % RDMA_RING_BYTES),
			                 RDMA_RING_BYTES - r->rx_ring_used);
		r->rx_ring_total += len;
		r->rx_ring_used += len;
		break;
	default:
		return conn_fail(r, CKPT_EPROTO, "unknown message kind %u", kind);
	}
	if (r->rxq_len + r->owed_slots >= RDMA_DATA_SLOTS)
		return conn_fail(r, CKPT_EPROTO, "peer sent more data messages than it had credits for");
	r->rx[s] = (struct rdma_rx_slot){ .kind = kind, .len = len, .ring_off = off };
	r->rxq[(r->rxq_head + r->rxq_len) % RDMA_RECV_SLOTS] = s;
	r->rxq_len++;
	return 0;
}

static void on_completion(struct rdma_conn *r, const struct ibv_wc *wc)
{
	enum rdma_op op = wr_id_op(wc->wr_id);
	if (op == RDMA_OP_SEND) {
		r->sfree[r->nsfree++] = wr_id_low(wc->wr_id);
		r->tx_grew = true;
	}
	if (op != RDMA_OP_RECV && r->sq_busy)
		r->sq_busy--;
	if (op == RDMA_OP_DWRITE && r->dw_busy) {
		r->dw_busy--;
		r->tx_grew = true;
	}
	if (wc->status != IBV_WC_SUCCESS) {
		/* Flushes follow a disconnect (ours or the peer's, when the cm moved the
		 * QP to the error state): the end of the stream, not a new error. */
		if (wc->status == IBV_WC_WR_FLUSH_ERR && (r->shut || r->err || op == RDMA_OP_RECV)) {
			r->peer_gone = true;
			return;
		}
		if (op == RDMA_OP_DWRITE)
			conn_fail(r, wc_code(wc->status), "RDMA WRITE #%u of %u bytes into the peer's "
			          "buffer failed: %s (wc status %d, vendor error 0x%x)",
			          wr_id_low(wc->wr_id), r->dw_len[wr_id_low(wc->wr_id) % RDMA_DWRITES],
			          ibv_wc_status_str(wc->status), (int)wc->status, wc->vendor_err);
		else if (op == RDMA_OP_WRITE)
			conn_fail(r, wc_code(wc->status), "RDMA WRITE of %u bytes into the peer's ring at "
			          "offset %u failed: %s (wc status %d, vendor error 0x%x)",
			          wr_id_len(wc->wr_id), wr_id_low(wc->wr_id), ibv_wc_status_str(wc->status),
			          (int)wc->status, wc->vendor_err);
		else
			conn_fail(r, wc_code(wc->status), "%s of %u bytes failed: %s (wc status %d, vendor "
			          "error 0x%x)", op_name(op), op == RDMA_OP_RECV ? wc->byte_len :
			          wr_id_len(wc->wr_id), ibv_wc_status_str(wc->status), (int)wc->status,
			          wc->vendor_err);
		return;
	}
	/* A send queue completes in order: the direct writes are done up to this one. */
	if (op == RDMA_OP_DWRITE)
		r->dw_done++;
	if (op == RDMA_OP_RECV) {
		uint32_t s = wr_id_low(wc->wr_id);
		if (s >= RDMA_RECV_SLOTS || wc->opcode != IBV_WC_RECV) {
			conn_fail(r, CKPT_EPROTO, "unexpected receive completion (slot %u, opcode %d)", s,
			          (int)wc->opcode);
			return;
		}
		on_recv(r, s, wc->byte_len);
	}
}

/* Bring the connection up to date: cm events, then completions. The CQ is
 * re-armed before the final poll, so a completion that arrives after it still
 * makes the channel fd readable. Locked. */
static void progress(struct rdma_conn *r)
{
	struct rdma_cm_event *ev;
	while (rdma_get_cm_event(r->ch, &ev) == 0) {
		enum rdma_cm_event_type t = ev->event;
		rdma_ack_cm_event(ev);
		if (t == RDMA_CM_EVENT_DISCONNECTED || t == RDMA_CM_EVENT_TIMEWAIT_EXIT)
			r->peer_gone = true;
		else if (t == RDMA_CM_EVENT_DEVICE_REMOVAL)
			conn_fail(r, CKPT_ENODEV, "RDMA device %s was removed", r->dev);
	}
	struct ibv_cq *cq;
	void *ctx;
	while (ibv_get_cq_event(r->cc, &cq, &ctx) == 0)
		ibv_ack_cq_events(cq, 1);
	if (!r->err) {
		int e = ibv_req_notify_cq(r->cq, 0);
		if (e)
			conn_fail(r, -e, "ibv_req_notify_cq: %s", ckpt_strerror(-e));
	}
	struct ibv_wc wc[16];
	int n;
	while ((n = ibv_poll_cq(r->cq, 16, wc)) > 0)
		for (int i = 0; i < n; i++)
			on_completion(r, &wc[i]);
	if (n < 0)
		conn_fail(r, -EIO, "ibv_poll_cq failed");
	maybe_send_credit(r);

	bool readable = r->rxq_len > 0 || r->peer_gone || r->err || r->shut;
	if (readable && !r->evrx_set)
		ev_set(r->evrx);
	else if (!readable && r->evrx_set)
		ev_clear(r->evrx);
	r->evrx_set = readable;
	if (r->tx_grew && r->tx_waiters)
		ev_set(r->evtx);
	r->tx_grew = false;
}

/* ---------------------------------------------------------------- ops */

ssize_t rdma_recv_some(struct net_conn *c, void *buf, size_t len)
{
	struct rdma_conn *r = c->priv;
	pthread_mutex_lock(&r->lock);
	progress(r);
	size_t got = 0;
	while (r->rxq_len && got < len && !r->err) {
		uint32_t s = r->rxq[r->rxq_head];
		struct rdma_rx_slot *m = &r->rx[s];
		size_t n = m->len - m->done;
		if (n > len - got)
			n = len - got;
		const uint8_t *src = m->kind == RDMA_K_INLINE
		                     ? r->rbuf + (size_t)s * RDMA_SLOT_BYTES + RDMA_HDR_BYTES + m->done
		                     : r->ring + m->ring_off + m->done;
		memcpy((uint8_t *)buf + got, src, n);
		got += n;
		m->done += (uint32_t)n;
		if (m->kind == RDMA_K_RING) {
			r->rx_ring_used -= (uint32_t)n;
			r->owed_ring += (uint32_t)n;
		}
		if (m->done == m->len) {
			/* The slot is free again: post it and owe the peer the credit. */
			r->rxq_head = (r->rxq_head + 1) % RDMA_RECV_SLOTS;
			r->rxq_len--;
			if (rdma_post_recv_slot(r, s) == 0)
				r->owed_slots++;
		}
	}
	if (got)
		progress(r);   /* returns the credits if enough are owed; updates evrx */
	ssize_t ret;
	if (got)
		ret = (ssize_t)got;
	else if (r->err)
		ret = r->err;
	else if (r->peer_gone)
		ret = 0;          /* everything before the peer's close has been handed out */
	else if (r->shut)
		ret = -ECONNRESET;
	else
		ret = -EAGAIN;
	pthread_mutex_unlock(&r->lock);
	return ret;
}

ssize_t rdma_send(struct net_conn *c, const struct iovec *iov, int iovcnt)
{
	struct rdma_conn *r = c->priv;
	size_t total = 0;
	for (int i = 0; i < iovcnt; i++)
		total += iov[i].iov_len;
	pthread_mutex_lock(&r->lock);
	progress(r);
	ssize_t ret;
	if (r->err) {
		ret = r->err;
	} else if (r->peer_gone || r->shut) {
		ret = -EPIPE;
	} else if (total <= RDMA_INLINE_MAX) {
		/* Small: the bytes ride inside the SEND. */
		r->tx_want_ring = false;
		if (r->credits == 0 || r->nsfree == 0) {
			ret = -EAGAIN;
		} else {
			uint32_t s = r->sfree[--r->nsfree];
			uint8_t *p = r->sbuf + (size_t)s * RDMA_SLOT_BYTES;
			hdr_fill(r, p, RDMA_K_INLINE, (uint32_t)total, 0);
			size_t at = RDMA_HDR_BYTES;
			for (int i = 0; i < iovcnt; i++) {
				memcpy(p + at, iov[i].iov_base, iov[i].iov_len);
				at += iov[i].iov_len;
			}
			ret = post_send(r, s, (uint32_t)at, NULL);
			if (ret == 0) {
				r->credits--;
				ret = (ssize_t)total;
			} else {
				r->sfree[r->nsfree++] = s;
			}
		}
	} else {
		/* Large: as much as fits contiguously in the peer's ring, by RDMA WRITE,
		 * then the SEND that announces it. msg.c calls again for the rest. */
		r->tx_want_ring = true;
		uint64_t used = r->tx_written - r->tx_freed;
		if (!r->have_peer_ring || r->credits == 0 || r->nsfree == 0 || used >= r->peer_size) {
			ret = -EAGAIN;
		} else {
			uint32_t pos = (uint32_t)(r->tx_written % r->peer_size);
			size_t n = r->peer_size - used;
			if (n > r->peer_size - pos)
				n = r->peer_size - pos;
			if (n > total)
				n = total;
			/* Reusing staging bytes is safe once the peer has freed them: it can
			 * free only what it read, and it read only what our WRITE carried. */
			size_t at = 0;
			for (int i = 0; i < iovcnt && at < n; i++) {
				size_t k = iov[i].iov_len < n - at ? iov[i].iov_len : n - at;
				memcpy(r->stage + pos + at, iov[i].iov_base, k);
				at += k;
			}
			struct ibv_sge wsge = { .addr = (uintptr_t)(r->stage + pos), .length = (uint32_t)n,
			                        .lkey = r->stage_mr->lkey };
			struct ibv_send_wr w = {
				.wr_id = wr_id_make(RDMA_OP_WRITE, (uint32_t)n, pos), .sg_list = &wsge,
				.num_sge = 1, .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED,
				.wr.rdma = { .remote_addr = r->peer_addr + pos, .rkey = r->peer_rkey },
			};
			uint32_t s = r->sfree[--r->nsfree];
			hdr_fill(r, r->sbuf + (size_t)s * RDMA_SLOT_BYTES, RDMA_K_RING, (uint32_t)n, pos);
			ret = post_send(r, s, RDMA_HDR_BYTES, &w);
			if (ret == 0) {
				r->credits--;
				r->tx_written += n;
				ret = (ssize_t)n;
			} else {
				r->sfree[r->nsfree++] = s;
			}
		}
	}
	pthread_mutex_unlock(&r->lock);
	return ret;
}

/* Can the send that last returned -EAGAIN make progress now? Locked. */
static bool send_ready(const struct rdma_conn *r)
{
	if (r->err || r->peer_gone || r->shut)
		return true;   /* the next send reports it */
	if (r->credits == 0 || r->nsfree == 0)
		return false;
	return !r->tx_want_ring ||
	       (r->have_peer_ring && r->tx_written - r->tx_freed < r->peer_size);
}

int rdma_wait(struct net_conn *c, short events, int timeout_ms)
{
	struct rdma_conn *r = c->priv;
	if (!(events & POLLOUT)) {
		/* evrx is in the epoll set: readable also when another thread already
		 * took the completion that brought our data. */
		struct pollfd p = { .fd = r->epfd, .events = POLLIN };
		int n = poll(&p, 1, timeout_ms);
		return n >= 0 ? n : -errno;
	}
	/* A sender waits for credits, a send slot or ring space. Clearing evtx
	 * before looking means a change made by the receiving thread after the
	 * look still wakes the poll below. */
	pthread_mutex_lock(&r->lock);
	ev_clear(r->evtx);
	progress(r);
	bool ready = send_ready(r);
	if (!ready)
		r->tx_waiters++;
	pthread_mutex_unlock(&r->lock);
	if (ready)
		return 1;
	struct pollfd p[2] = { { .fd = r->epfd, .events = POLLIN }, { .fd = r->evtx, .events = POLLIN } };
	int n = poll(p, 2, timeout_ms);
	int e = errno;
	pthread_mutex_lock(&r->lock);
	r->tx_waiters--;
	pthread_mutex_unlock(&r->lock);
	return n >= 0 ? n : -e;
}

void rdma_shutdown(struct net_conn *c)
{
	struct rdma_conn *r = c->priv;
	pthread_mutex_lock(&r->lock);
	if (!r->shut) {
		r->shut = true;
		(void)rdma_disconnect(r->id);   /* EINVAL when the peer already went: fine */
	}
	ev_set(r->evrx);
	ev_set(r->evtx);
	pthread_mutex_unlock(&r->lock);
}

/* Before close: let sends already posted reach the peer (their completions mean
 * it acknowledged them), so that a message sent just before net_close arrives. */
void rdma_conn_linger(struct rdma_conn *r)
{
	uint64_t deadline = ckpt_deadline_ms(RDMA_LINGER_MS);
	pthread_mutex_lock(&r->lock);
	for (;;) {
		progress(r);
		if (!r->established || r->sq_busy == 0 || r->err || r->shut || r->peer_gone)
			break;
		int left = ckpt_deadline_left_ms(deadline);
		if (left == 0)
			break;
		pthread_mutex_unlock(&r->lock);
		struct pollfd p = { .fd = r->cc->fd, .events = POLLIN };
		(void)poll(&p, 1, left);
		pthread_mutex_lock(&r->lock);
	}
	pthread_mutex_unlock(&r->lock);
}

/* ---------------------------------------------------------------- direct writes */

int rdma_mr_register(struct net_conn *c, void *addr, size_t len, int access,
                     struct net_mr **out)
{
	struct rdma_conn *r = c->priv;
	struct rdma_mr *m = ckpt_calloc(1, sizeof *m);
	if (!m)
		return ckpt_err(-ENOMEM, "%s: registration", c->peer);
	/* The peer may write only where a NET_MR_REMOTE_WRITE registration lets it,
	 * and only until it is deregistered. */
	int flags = IBV_ACCESS_LOCAL_WRITE |
	            (access == NET_MR_REMOTE_WRITE ? IBV_ACCESS_REMOTE_WRITE : 0);
	m->mr = ibv_reg_mr(r->pd, addr, len, flags);
	if (!m->mr) {
		int e = errno > 0 ? -errno : -ENOMEM;
		ckpt_free(m);
		return ckpt_err(e, "rdma %s: ibv_reg_mr of %zu bytes at %p for %s", r->dev, len, addr,
		                c->peer);
	}
	m->pub = (struct net_mr){ .c = c, .addr = addr, .len = len, .lkey = m->mr->lkey,
	                          .rkey = m->mr->rkey };
	pthread_mutex_lock(&r->lock);
	m->next = r->mrs;
	if (r->mrs)
		r->mrs->prev = m;
	r->mrs = m;
	pthread_mutex_unlock(&r->lock);
	*out = &m->pub;
	return 0;
}

void rdma_mr_deregister(struct net_mr *pub)
{
	struct rdma_mr *m = (struct rdma_mr *)pub;
	struct rdma_conn *r = pub->c->priv;
	pthread_mutex_lock(&r->lock);
	if (m->prev)
		m->prev->next = m->next;
	else
		r->mrs = m->next;
	if (m->next)
		m->next->prev = m->prev;
	pthread_mutex_unlock(&r->lock);
	int e = ibv_dereg_mr(m->mr);   /* positive errno */
	if (e)
		ckpt_log(CKPT_LOG_WARN, "rdma %s (%s): ibv_dereg_mr of %zu bytes: %s", r->peer, r->dev,
		         pub->len, ckpt_strerror(-e));
	ckpt_free(m);
}

void rdma_mr_release_all(struct rdma_conn *r)
{
	while (r->mrs)
		rdma_mr_deregister(&r->mrs->pub);
}

/* Wait for send capacity or a completion (evtx, the CQ, cm events) until deadline:
 * as rdma_wait's POLLOUT. Called unlocked. */
static int dw_sleep(struct rdma_conn *r, uint64_t deadline)
{
	int left = ckpt_deadline_left_ms(deadline);
	if (left == 0)
		return -ETIMEDOUT;
	struct pollfd p[2] = { { .fd = r->epfd, .events = POLLIN }, { .fd = r->evtx, .events = POLLIN } };
	if (poll(p, 2, left) < 0 && errno != EINTR)
		return -errno;
	return 0;
}

int rdma_write_direct(struct net_conn *c, const struct net_mr *pub, const void *local, size_t len,
                      uint64_t remote_addr, uint32_t rkey, uint64_t *ticket, int timeout_ms)
{
	struct rdma_conn *r = c->priv;
	uint64_t deadline = ckpt_deadline_ms(timeout_ms);
	pthread_mutex_lock(&r->lock);
	for (;;) {
		/* Cleared before looking: a completion taken by the receiving thread
		 * after the look still wakes the sleep below. */
		ev_clear(r->evtx);
		progress(r);
		int rc = r->err ? r->err : r->peer_gone || r->shut ? -EPIPE : 0;
		if (rc) {
			pthread_mutex_unlock(&r->lock);
			return rc;
		}
		if (r->dw_busy < RDMA_DWRITES)
			break;
		if (timeout_ms == 0) {
			pthread_mutex_unlock(&r->lock);
			return -EAGAIN;
		}
		r->tx_waiters++;
		pthread_mutex_unlock(&r->lock);
		rc = dw_sleep(r, deadline);
		pthread_mutex_lock(&r->lock);
		r->tx_waiters--;
		if (rc) {
			pthread_mutex_unlock(&r->lock);
			return rc;
		}
	}
	uint64_t n = r->dw_posted + 1;
	struct ibv_sge sge = { .addr = (uintptr_t)local, .length = (uint32_t)len,
	                       .lkey = pub->lkey };
	/* Signalled like every work request here (sq_sig_all): its completion is what
	 * lets the caller reuse local. */
	struct ibv_send_wr wr = {
		.wr_id = wr_id_make(RDMA_OP_DWRITE, 0, (uint32_t)n), .sg_list = &sge, .num_sge = 1,
		.opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED,
		.wr.rdma = { .remote_addr = remote_addr, .rkey = rkey },
	}, *bad;
	int e = ibv_post_send(r->qp, &wr, &bad);   /* positive errno */
	int rc = 0;
	if (e) {
		rc = conn_fail(r, -e, "ibv_post_send (RDMA WRITE of %zu bytes): %s", len,
		               ckpt_strerror(-e));
	} else {
		r->dw_posted = n;
		r->dw_len[n % RDMA_DWRITES] = (uint32_t)len;
		r->dw_busy++;
		r->sq_busy++;
		*ticket = n;
	}
	pthread_mutex_unlock(&r->lock);
	return rc;
}

int rdma_write_wait(struct net_conn *c, uint64_t ticket, int timeout_ms)
{
	struct rdma_conn *r = c->priv;
	uint64_t deadline = ckpt_deadline_ms(timeout_ms);
	pthread_mutex_lock(&r->lock);
	for (;;) {
		ev_clear(r->evtx);
		progress(r);
		int rc = r->dw_done >= ticket ? 0 : r->err ? r->err
		         : r->peer_gone || r->shut ? -ECONNRESET : timeout_ms == 0 ? -EAGAIN : 1;
		if (rc <= 0) {
			pthread_mutex_unlock(&r->lock);
			return rc;
		}
		r->tx_waiters++;
		pthread_mutex_unlock(&r->lock);
		rc = dw_sleep(r, deadline);
		pthread_mutex_lock(&r->lock);
		r->tx_waiters--;
		if (rc) {
			pthread_mutex_unlock(&r->lock);
			return rc;
		}
	}
}

const char *rdma_error_detail(const struct net_conn *c)
{
	const struct rdma_conn *r = c->priv;
	/* err and why are written once, together, and never again: reading them
	 * without the lock sees either nothing or the complete reason. */
	return r && __atomic_load_n(&r->err, __ATOMIC_ACQUIRE) ? r->why : NULL;
}
