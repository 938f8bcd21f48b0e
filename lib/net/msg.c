/*
 * msg.c — message framing over any transport: the 16-byte header, the receive
 * limit, partial progress across calls, timeouts, and the msg_send fault point.
 *
 * Header (little-endian, docs/protocol.md §1.1):
 *     0  u32 magic "CKNM"    4  u16 version    6  u16 type
 *     8  u16 flags          10  u16 reserved (0)  12  u32 payload length
 * The receiver checks the whole header before it allocates the payload, so a
 * hostile length costs nothing but a logged warning and the connection.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "net_internal.h"

void net_msg_free(struct net_msg *m)
{
	if (!m)
		return;
	if (!m->borrowed)
		ckpt_free(m->payload);
	m->borrowed = false;
	m->payload = NULL;
	m->len = 0;
}

/* A fatal receive-side error: the stream position is lost, so the connection is
 * unusable for both directions (net.h). */
static int rx_fail(struct net_conn *c, int code, const char *why)
{
	ckpt_log(CKPT_LOG_WARN, "%s: %s; closing the connection", c->name, why);
	net_conn_break(c, code);
	if (!c->rx.borrowed)
		ckpt_free(c->rx.payload);
	memset(&c->rx, 0, sizeof c->rx);
	return ckpt_err(code, "%s: %s", c->name, why);
}

/* A transport call failed: the connection is finished. The message carries the
 * transport's own reason when it has one (which work request, which status). */
static int transport_fail(struct net_conn *c, int code, const char *what)
{
	net_conn_break(c, code);
	const char *detail = c->ops->error_detail ? c->ops->error_detail(c) : NULL;
	if (detail)
		return ckpt_err(code, "%s: %s: %s", c->name, what, detail);
	return ckpt_err(code, "%s: %s", c->name, what);
}

static int fail_fast(const struct net_conn *c)
{
	int code = atomic_load(&c->broken);
	return ckpt_err(code, "%s: connection unusable after an earlier error", c->name);
}

/* All 16 header bytes are in: check them, then allocate the payload. */
static int rx_header_done(struct net_conn *c, size_t max, net_payload_fn into, void *arg)
{
	struct net_rx *rx = &c->rx;
	uint32_t magic = ckpt_get_le32(rx->hdr);
	uint16_t version = ckpt_get_le16(rx->hdr + 4);
	uint16_t reserved = ckpt_get_le16(rx->hdr + 10);
	uint32_t len = ckpt_get_le32(rx->hdr + 12);
	char why[160];

	if (magic != NET_MAGIC) {
		snprintf(why, sizeof why, "bad magic 0x%08x (not a libckpt peer)", magic);
		return rx_fail(c, CKPT_EPROTO, why);
	}
	if (version != NET_PROTO_VERSION) {
		snprintf(why, sizeof why, "protocol version %u, this side speaks %u",
		         version, NET_PROTO_VERSION);
		return rx_fail(c, CKPT_EPROTO, why);
	}
	if (reserved != 0) {
		snprintf(why, sizeof why, "reserved header field is 0x%04x, must be 0", reserved);
		return rx_fail(c, CKPT_EPROTO, why);
	}
	/* The limit check comes before any allocation: a 4 GiB length field from a
	 * hostile peer must not cost 4 GiB. */
	if (len > max) {
		snprintf(why, sizeof why, "message of %u bytes exceeds the limit of %zu", len, max);
		return rx_fail(c, CKPT_EPROTO, why);
	}
	rx->type = ckpt_get_le16(rx->hdr + 6);
	rx->flags = ckpt_get_le16(rx->hdr + 8);
	rx->len = len;
	rx->got = 0;
	if (len > 0 && into) {
		void *dst = NULL;
		int rc = into(arg, rx->type, len, &dst);
		if (rc) {
			snprintf(why, sizeof why, "no place for a message of %u bytes (type %u): %s",
			         len, rx->type, ckpt_err_msg());
			return rx_fail(c, rc, why);
		}
		if (dst) {
			rx->payload = dst;
			rx->borrowed = true;
			return 0;
		}
	}
	if (len > 0) {
		rx->payload = ckpt_malloc(len);
		if (!rx->payload) {
			snprintf(why, sizeof why, "cannot allocate %u bytes for a message", len);
			return rx_fail(c, -ENOMEM, why);
		}
	}
	return 0;
}

int net_msg_recv(struct net_conn *c, struct net_msg *m, size_t max, int timeout_ms)
{
	return net_msg_recv_into(c, m, max, NULL, NULL, timeout_ms);
}

int net_msg_recv_into(struct net_conn *c, struct net_msg *m, size_t max,
                      net_payload_fn into, void *arg, int timeout_ms)
{
	memset(m, 0, sizeof *m);
	if (atomic_load(&c->broken))
		return fail_fast(c);
	struct net_rx *rx = &c->rx;
	uint64_t deadline = ckpt_deadline_ms(timeout_ms);

	for (;;) {
		uint8_t *dst;
		size_t want;
		if (rx->hdr_got < NET_HEADER_BYTES) {
			dst = rx->hdr + rx->hdr_got;
			want = NET_HEADER_BYTES - rx->hdr_got;
		} else {
			want = rx->len - rx->got;
			if (want == 0)
				break;
			dst = rx->payload + rx->got;
		}

		ssize_t n = c->ops->recv_some(c, dst, want);
		if (n > 0) {
			if (rx->hdr_got < NET_HEADER_BYTES) {
				rx->hdr_got += (size_t)n;
				if (rx->hdr_got == NET_HEADER_BYTES) {
					int rc = rx_header_done(c, max, into, arg);
					if (rc)
						return rc;
				}
			} else {
				rx->got += (size_t)n;
			}
			continue;
		}
		if (n == 0) {
			/* An orderly close between messages is the normal end of a peer;
			 * one inside a message is a truncated frame and worth a warning. */
			if (rx->hdr_got == 0) {
				net_conn_break(c, -ECONNRESET);
				return ckpt_err(-ECONNRESET, "%s: peer closed the connection", c->name);
			}
			char why[128];
			snprintf(why, sizeof why, "peer closed the connection inside a message "
			         "(%zu of %zu bytes)", rx->hdr_got + rx->got,
			         NET_HEADER_BYTES + (rx->hdr_got == NET_HEADER_BYTES ? rx->len : 0));
			return rx_fail(c, -ECONNRESET, why);
		}
		if (n == -EINTR)
			continue;
		if (n != -EAGAIN)
			return transport_fail(c, (int)n, "receive failed");
		int left = ckpt_deadline_left_ms(deadline);
		if (left == 0) {
			/* -EAGAIN is the normal answer of a poll loop: no message text. */
			if (timeout_ms == 0)
				return -EAGAIN;
			return ckpt_err(-ETIMEDOUT, "%s: no message within %d ms", c->name, timeout_ms);
		}
		int w = c->ops->wait(c, POLLIN, left);
		if (w < 0 && w != -EINTR)
			return transport_fail(c, w, "waiting to receive");
	}

	m->type = rx->type;
	m->flags = rx->flags;
	m->payload = rx->payload;   /* NULL for an empty payload */
	m->len = rx->len;
	m->borrowed = rx->borrowed;
	memset(rx, 0, sizeof *rx);
	return 0;
}

int net_recv(struct net_conn *c, struct net_msg *m, int timeout_ms)
{
	return net_msg_recv(c, m, c->max_msg, timeout_ms);
}

int net_recv_into(struct net_conn *c, struct net_msg *m, net_payload_fn into, void *arg,
                  int timeout_ms)
{
	return net_msg_recv_into(c, m, c->max_msg, into, arg, timeout_ms);
}

/* Write iov[0..cnt) whole (total bytes) within timeout_ms. what names them in
 * errors ("a 48-byte message (type 69)"); inside: the message's frame is begun
 * whatever this call sends, so that a timeout leaves a partial frame. */
static int send_iov(struct net_conn *c, struct iovec *cur, int cnt, size_t total,
                    int timeout_ms, bool inside, const char *what)
{
	size_t sent = 0;
	uint64_t deadline = ckpt_deadline_ms(timeout_ms);
	while (sent < total) {
		ssize_t n = c->ops->send(c, cur, cnt);
		if (n > 0) {
			sent += (size_t)n;
			size_t k = (size_t)n;
			while (cnt > 0 && k >= cur->iov_len) {
				k -= cur->iov_len;
				cur++;
				cnt--;
			}
			if (cnt > 0) {
				cur->iov_base = (uint8_t *)cur->iov_base + k;
				cur->iov_len -= k;
			}
			continue;
		}
		if (n == -EINTR)
			continue;
		if (n != -EAGAIN && n != 0) {
			char why[128];
			snprintf(why, sizeof why, "send of %s failed", what);
			return transport_fail(c, (int)n, why);
		}
		int left = ckpt_deadline_left_ms(deadline);
		if (left == 0) {
			if (sent == 0 && !inside && timeout_ms == 0)
				return -EAGAIN;
			/* Part of a frame went out: the peer would read the rest of it from
			 * whatever we send next, so the stream is finished. */
			if (sent > 0 || inside)
				net_conn_break(c, -ETIMEDOUT);
			return ckpt_err(-ETIMEDOUT, "%s: send of %s timed out after %zu bytes",
			                c->name, what, sent);
		}
		int w = c->ops->wait(c, POLLOUT, left);
		if (w < 0 && w != -EINTR)
			return transport_fail(c, w, "waiting to send");
	}
	return 0;
}

static void put_header(uint8_t hdr[NET_HEADER_BYTES], uint16_t type, size_t len)
{
	ckpt_put_le32(hdr, NET_MAGIC);
	ckpt_put_le16(hdr + 4, NET_PROTO_VERSION);
	ckpt_put_le16(hdr + 6, type);
	ckpt_put_le16(hdr + 8, 0);        /* flags: none defined in version 1 */
	ckpt_put_le16(hdr + 10, 0);       /* reserved */
	ckpt_put_le32(hdr + 12, (uint32_t)len);
}

/* Before a message's header: the last one sent in pieces must be whole. */
static int send_check(struct net_conn *c, size_t len)
{
	if (atomic_load(&c->broken))
		return fail_fast(c);
	if (c->tx_left) {
		net_conn_break(c, -EINVAL);
		return ckpt_err(-EINVAL, "%s: a message sent while %zu bytes of the last one's "
		                "payload were still to come", c->name, c->tx_left);
	}
	if (len > UINT32_MAX)
		return ckpt_err(-EMSGSIZE, "%s: message of %zu bytes is larger than the 4 GiB "
		                "the frame can carry", c->name, len);
	return 0;
}

int net_msg_send(struct net_conn *c, uint16_t type, const void *payload, size_t len,
                 int timeout_ms)
{
	int rc = send_check(c, len);
	if (rc)
		return rc;
	uint8_t hdr[NET_HEADER_BYTES];
	put_header(hdr, type, len);
	/* Header and payload in one gather write: one segment on the wire for a
	 * small message (TCP_NODELAY is on), no copy for a large one. */
	struct iovec iov[2] = {
		{ .iov_base = hdr, .iov_len = sizeof hdr },
		{ .iov_base = (void *)payload, .iov_len = len },
	};
	char what[64];
	snprintf(what, sizeof what, "a %zu-byte message (type %u)", len, type);
	return send_iov(c, iov, len ? 2 : 1, sizeof hdr + len, timeout_ms, false, what);
}

int net_send_head(struct net_conn *c, uint16_t type, size_t len, const void *p, size_t n,
                  int timeout_ms)
{
	int f = ckpt_fault(CKPT_FP_MSG_SEND);
	if (f < 0)
		return ckpt_err_prefix(f, "%s: send of message type %u", c->name, type);
	int rc = send_check(c, len);
	if (rc)
		return rc;
	if (n > len)
		return ckpt_err(-EINVAL, "%s: a first piece of %zu bytes for a payload of %zu",
		                c->name, n, len);
	/* A lost message, as net_send's: its pieces are taken and go nowhere. */
	c->tx_drop = f == CKPT_FA_DROP;
	if (c->tx_drop) {
		c->tx_left = len - n;
		return 0;
	}
	uint8_t hdr[NET_HEADER_BYTES];
	put_header(hdr, type, len);
	struct iovec iov[2] = {
		{ .iov_base = hdr, .iov_len = sizeof hdr },
		{ .iov_base = (void *)p, .iov_len = n },
	};
	/* From the header on, the rest is owed: a failure breaks the connection. */
	c->tx_left = len - n;
	char what[80];
	snprintf(what, sizeof what, "the head of a %zu-byte message (type %u)", len, type);
	rc = send_iov(c, iov, n ? 2 : 1, sizeof hdr + n, timeout_ms, true, what);
	if (rc && !atomic_load(&c->broken))
		net_conn_break(c, rc);
	return rc;
}

int net_send_more(struct net_conn *c, const void *p, size_t n, int timeout_ms)
{
	if (atomic_load(&c->broken))
		return fail_fast(c);
	if (n > c->tx_left) {
		size_t left = c->tx_left;
		net_conn_break(c, -EINVAL);
		return ckpt_err(-EINVAL, "%s: a piece of %zu bytes where the payload has %zu left",
		                c->name, n, left);
	}
	c->tx_left -= n;
	if (!n || c->tx_drop)
		return 0;
	struct iovec iov = { .iov_base = (void *)p, .iov_len = n };
	char what[80];
	snprintf(what, sizeof what, "%zu bytes of a message's payload, %zu after them", n,
	         c->tx_left);
	int rc = send_iov(c, &iov, 1, n, timeout_ms, true, what);
	if (rc && !atomic_load(&c->broken))
		net_conn_break(c, rc);
	return rc;
}

int net_send(struct net_conn *c, uint16_t type, const void *payload, size_t len,
             int timeout_ms)
{
	int f = ckpt_fault(CKPT_FP_MSG_SEND);
	if (f < 0)
		return ckpt_err_prefix(f, "%s: send of message type %u", c->name, type);
	if (f == CKPT_FA_DROP)
		return 0;   /* a lost message: the caller believes it went out */
	return net_msg_send(c, type, payload, len, timeout_ms);
}
