/*
 * auth.c — the connection handshake (net.h, docs/protocol.md §1.2): job id,
 * rank and world size, and a mutual challenge-response over the job secret
 * with HMAC-SHA256 from OpenSSL libcrypto. Transport-independent: it speaks
 * only framed messages through msg.c.
 *
 * Why this shape:
 *   - Both nonces are fresh per session (RAND_bytes), and each MAC covers both,
 *     so a RESPONSE recorded from one session is worthless in another.
 *   - The two MACs carry different labels ("srv", "cli"), so a peer cannot
 *     reflect the server's proof back as its own.
 *   - The client checks the server's proof before it answers: a process that
 *     poses as the coordinator without the secret learns nothing it can reuse.
 *   - MACs are compared in constant time (CRYPTO_memcmp).
 *   - The payload limit is NET_HANDSHAKE_MAX_MSG until the peer is known, so an
 *     unauthenticated peer cannot make the coordinator allocate much.
 * What it does not do: encrypt or authenticate the messages that follow. An
 * attacker on the path can still read or alter them (no TLS); the handshake
 * keeps stray and misconfigured processes, and other jobs, out.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "net_internal.h"

#define HS_HELLO_FIXED (2u + 4u + 4u + NET_NONCE_BYTES)  /* HELLO without the job id */
#define HS_REJECT_TIMEOUT_MS 1000                         /* best effort: the peer may be gone */

/* What a HELLO claims; job points into the received payload. */
struct hs_hello {
	const uint8_t *job;
	size_t   job_len;
	uint32_t rank, world;
	const uint8_t *nonce;
};

/* OpenSSL reports failures on its own error queue: convert at the boundary. */
static int hs_crypto_err(const char *what)
{
	char buf[256];
	unsigned long e = ERR_get_error();
	ERR_error_string_n(e, buf, sizeof buf);
	ERR_clear_error();
	return ckpt_err(-EIO, "%s failed: %s", what, e ? buf : "no OpenSSL error recorded");
}

/* A peer's bytes for a message: printable ASCII only, shortened, so that a
 * hostile job id or reason cannot forge log lines or flood them. */
static void hs_printable(char *out, size_t cap, const uint8_t *p, size_t n)
{
	size_t max = cap - 1, o = 0;
	bool cut = n > max;
	if (cut && max > 3)
		max -= 3;
	for (size_t i = 0; i < n && o < max; i++)
		out[o++] = p[i] >= 0x20 && p[i] < 0x7f ? (char)p[i] : '?';
	if (cut && cap > 3)
		for (int k = 0; k < 3 && o < cap - 1; k++)
			out[o++] = '.';
	out[o] = '\0';
}

/*
 * MAC = HMAC-SHA256(secret, label ‖ nonce1 ‖ nonce2 ‖ u16 job_len ‖ job ‖ u32 rank ‖ u32 world)
 * Server proof: label "srv", nonce1 = client nonce, nonce2 = server nonce.
 * Client proof: label "cli", nonce1 = server nonce, nonce2 = client nonce.
 * The job id is length-prefixed so that no two (job, rank) pairs share an input.
 */
static int hs_mac(const struct net_auth *a, const char *label, const uint8_t *nonce1,
                  const uint8_t *nonce2, const struct hs_hello *h, uint8_t out[NET_MAC_BYTES])
{
	uint8_t in[3 + 2 * NET_NONCE_BYTES + 2 + NET_MAX_JOB_ID + 4 + 4];
	size_t n = 0;
	memcpy(in, label, 3);
	n += 3;
	memcpy(in + n, nonce1, NET_NONCE_BYTES);
	n += NET_NONCE_BYTES;
	memcpy(in + n, nonce2, NET_NONCE_BYTES);
	n += NET_NONCE_BYTES;
	ckpt_put_le16(in + n, (uint16_t)h->job_len);
	n += 2;
	memcpy(in + n, h->job, h->job_len);
	n += h->job_len;
	ckpt_put_le32(in + n, h->rank);
	n += 4;
	ckpt_put_le32(in + n, h->world);
	n += 4;

	/* HMAC with a NULL key means "reuse the previous key" in parts of OpenSSL's
	 * API; an empty secret is a zero-length key at a valid address instead. */
	static const uint8_t empty_key[1];
	const void *key = a->secret_len ? a->secret : empty_key;
	unsigned int len = 0;
	if (!HMAC(EVP_sha256(), key, (int)a->secret_len, in, n, out, &len) || len != NET_MAC_BYTES)
		return hs_crypto_err("HMAC-SHA256");
	return 0;
}

static int hs_check_args(const struct net_auth *a)
{
	if (!a || !a->job_id)
		return ckpt_err(-EINVAL, "handshake: no job id");
	size_t n = strlen(a->job_id);
	if (n == 0 || n > NET_MAX_JOB_ID)
		return ckpt_err(-EINVAL, "handshake: job id of %zu bytes (1..%u allowed)", n,
		                NET_MAX_JOB_ID);
	if (a->world == 0)
		return ckpt_err(-EINVAL, "handshake: world size 0");
	if ((a->secret_len && !a->secret) || a->secret_len > INT_MAX)
		return ckpt_err(-EINVAL, "handshake: bad secret (%zu bytes)", a->secret_len);
	return 0;
}

static int hs_timed_out(const struct net_conn *c, const char *waiting_for)
{
	return ckpt_err(-ETIMEDOUT, "%s: handshake timed out waiting for %s", c->name, waiting_for);
}

static int hs_send(struct net_conn *c, uint16_t type, const void *p, size_t len,
                   uint64_t deadline, const char *what)
{
	int left = ckpt_deadline_left_ms(deadline);
	if (left == 0)
		return hs_timed_out(c, what);
	int rc = net_msg_send(c, type, p, len, left);
	if (rc == -ETIMEDOUT)
		return hs_timed_out(c, what);
	return rc ? ckpt_err_prefix(rc, "handshake, sending %s", what) : 0;
}

static int hs_recv(struct net_conn *c, struct net_msg *m, uint64_t deadline,
                   const char *waiting_for)
{
	int left = ckpt_deadline_left_ms(deadline);
	if (left == 0)
		return hs_timed_out(c, waiting_for);
	int rc = net_msg_recv(c, m, NET_HANDSHAKE_MAX_MSG, left);
	if (rc == -ETIMEDOUT)
		return hs_timed_out(c, waiting_for);
	return rc ? ckpt_err_prefix(rc, "handshake, waiting for %s", waiting_for) : 0;
}

/* Tell the peer why, best effort (it may be gone, or the stream broken), then
 * return code with the local message. */
static int hs_reject(struct net_conn *c, int code, const char *reason, uint64_t deadline,
                     const char *local_fmt_reason)
{
	uint8_t buf[4 + 2 + NET_REASON_MAX];
	size_t rlen = strlen(reason);
	if (rlen > NET_REASON_MAX)
		rlen = NET_REASON_MAX;
	ckpt_put_le32(buf, (uint32_t)code);
	ckpt_put_le16(buf + 4, (uint16_t)rlen);
	memcpy(buf + 6, reason, rlen);
	int left = ckpt_deadline_left_ms(deadline);
	if (left <= 0 || left > HS_REJECT_TIMEOUT_MS)
		left = HS_REJECT_TIMEOUT_MS;
	(void)net_msg_send(c, NET_MSG_REJECT, buf, 6 + rlen, left);
	return ckpt_err(code, "%s: %s", c->name, local_fmt_reason ? local_fmt_reason : reason);
}

/* The peer sent REJECT{code, reason}: our error carries its reason. Only codes of
 * net.h's contract leave here (a foreign code is not ours to return); any other
 * code of the peer is named in the text. */
static int hs_rejected(struct net_conn *c, const struct net_msg *m, const char *by)
{
	struct ckpt_cursor cur;
	ckpt_cursor_init(&cur, m->payload, m->len);
	int32_t code = (int32_t)ckpt_cursor_u32(&cur);
	uint16_t rlen = ckpt_cursor_u16(&cur);
	const uint8_t *reason = ckpt_cursor_take(&cur, rlen);
	if (!cur.ok || cur.left != 0 || rlen > NET_REASON_MAX)
		return ckpt_err(CKPT_EPROTO, "%s: malformed REJECT from the %s (%zu bytes)",
		                c->name, by, m->len);
	char text[NET_REASON_MAX + 1];
	hs_printable(text, sizeof text, reason, rlen);
	int local = code == CKPT_EAUTH || code == CKPT_EPROTO ? code : CKPT_EPEER;
	if (code != local)
		return ckpt_err(local, "%s: rejected by the %s: %s [%s: %s]", c->name, by, text, by,
		                ckpt_strerror(code));
	return ckpt_err(local, "%s: rejected by the %s: %s", c->name, by, text);
}

static const char *hs_type_name(uint16_t type)
{
	switch (type) {
	case NET_MSG_HELLO:     return "HELLO";
	case NET_MSG_CHALLENGE: return "CHALLENGE";
	case NET_MSG_RESPONSE:  return "RESPONSE";
	case NET_MSG_WELCOME:   return "WELCOME";
	case NET_MSG_REJECT:    return "REJECT";
	default:                return "a non-handshake message";
	}
}

/* ---------------------------------------------------------------- client */

int net_handshake_client(struct net_conn *c, const struct net_auth *a, int timeout_ms)
{
	int rc = hs_check_args(a);
	if (rc)
		return rc;
	uint64_t deadline = ckpt_deadline_ms(timeout_ms);
	struct hs_hello me = {
		.job = (const uint8_t *)a->job_id, .job_len = strlen(a->job_id),
		.rank = a->rank, .world = a->world,
	};
	uint8_t cnonce[NET_NONCE_BYTES];
	if (RAND_bytes(cnonce, (int)sizeof cnonce) != 1)
		return hs_crypto_err("RAND_bytes");

	/* 1. HELLO{u16 job_len, job, u32 rank, u32 world, client nonce}. The rank is
	 * not checked here: the server judges it against the job's world. */
	uint8_t hello[HS_HELLO_FIXED + NET_MAX_JOB_ID];
	size_t n = 0;
	ckpt_put_le16(hello, (uint16_t)me.job_len);
	n += 2;
	memcpy(hello + n, me.job, me.job_len);
	n += me.job_len;
	ckpt_put_le32(hello + n, me.rank);
	n += 4;
	ckpt_put_le32(hello + n, me.world);
	n += 4;
	memcpy(hello + n, cnonce, NET_NONCE_BYTES);
	n += NET_NONCE_BYTES;
	if ((rc = hs_send(c, NET_MSG_HELLO, hello, n, deadline, "HELLO")))
		return rc;

	/* 2. CHALLENGE{server nonce, server proof}, or REJECT (wrong job, world, rank). */
	struct net_msg m;
	if ((rc = hs_recv(c, &m, deadline, "CHALLENGE")))
		return rc;
	if (m.type == NET_MSG_REJECT) {
		rc = hs_rejected(c, &m, "server");
		net_msg_free(&m);
		return rc;
	}
	if (m.type != NET_MSG_CHALLENGE || m.len != 2 * NET_NONCE_BYTES) {
		rc = ckpt_err(CKPT_EPROTO, "%s: expected CHALLENGE (%u bytes), got %s (type %u, "
		              "%zu bytes)", c->name, 2 * NET_NONCE_BYTES, hs_type_name(m.type),
		              m.type, m.len);
		net_msg_free(&m);
		return rc;
	}
	uint8_t snonce[NET_NONCE_BYTES], proof[NET_MAC_BYTES], expect[NET_MAC_BYTES];
	memcpy(snonce, m.payload, NET_NONCE_BYTES);
	memcpy(proof, (uint8_t *)m.payload + NET_NONCE_BYTES, NET_MAC_BYTES);
	net_msg_free(&m);
	if ((rc = hs_mac(a, "srv", cnonce, snonce, &me, expect)))
		return rc;
	bool server_ok = CRYPTO_memcmp(proof, expect, NET_MAC_BYTES) == 0;
	OPENSSL_cleanse(expect, sizeof expect);
	if (!server_ok)
		return hs_reject(c, CKPT_EAUTH, "server failed to prove the job secret", deadline,
		                 "server failed to prove the job secret (a different secret, or "
		                 "not the coordinator of this job)");

	/* 3. RESPONSE{client proof}: only now, after the server proved itself. */
	uint8_t resp[NET_MAC_BYTES];
	if ((rc = hs_mac(a, "cli", snonce, cnonce, &me, resp)))
		return rc;
	rc = hs_send(c, NET_MSG_RESPONSE, resp, sizeof resp, deadline, "RESPONSE");
	OPENSSL_cleanse(resp, sizeof resp);
	if (rc)
		return rc;

	/* 4. WELCOME{} or REJECT{code, reason}. */
	if ((rc = hs_recv(c, &m, deadline, "WELCOME")))
		return rc;
	if (m.type == NET_MSG_REJECT) {
		rc = hs_rejected(c, &m, "server");
	} else if (m.type != NET_MSG_WELCOME || m.len != 0) {
		rc = ckpt_err(CKPT_EPROTO, "%s: expected WELCOME, got %s (type %u, %zu bytes)",
		              c->name, hs_type_name(m.type), m.type, m.len);
	} else {
		char suffix[32];
		snprintf(suffix, sizeof suffix, "as rank %u", a->rank);
		net_conn_name_suffix(c, suffix);
	}
	net_msg_free(&m);
	return rc;
}

/* ---------------------------------------------------------------- server */

/* HELLO: exact length, job id 1..NET_MAX_JOB_ID bytes. */
static bool hs_parse_hello(const struct net_msg *m, struct hs_hello *h)
{
	struct ckpt_cursor cur;
	ckpt_cursor_init(&cur, m->payload, m->len);
	h->job_len = ckpt_cursor_u16(&cur);
	if (!cur.ok || h->job_len == 0 || h->job_len > NET_MAX_JOB_ID)
		return false;
	h->job = ckpt_cursor_take(&cur, h->job_len);
	h->rank = ckpt_cursor_u32(&cur);
	h->world = ckpt_cursor_u32(&cur);
	h->nonce = ckpt_cursor_take(&cur, NET_NONCE_BYTES);
	return cur.ok && cur.left == 0;
}

/* The server side, for one job (a given) or for the job the HELLO names (find). */
static int hs_server(struct net_conn *c, const struct net_auth *fixed, net_job_find_fn find,
                     void *find_arg, net_rank_check_fn accept_rank, void *arg,
                     struct net_hello *out, int timeout_ms)
{
	int rc = fixed ? hs_check_args(fixed) : 0;
	if (rc)
		return rc;
	uint64_t deadline = ckpt_deadline_ms(timeout_ms);
	char why[NET_REASON_MAX];
	struct net_auth found = { 0 };
	const struct net_auth *a = fixed;
	/* The job id as the HELLO said it: a found job's id points here. */
	char job_copy[NET_MAX_JOB_ID + 1];

	/* 1. HELLO. Job, world and rank are checked before any proof is exchanged:
	 * they are not secret, and a misconfigured rank should hear why at once. */
	struct net_msg hello;
	if ((rc = hs_recv(c, &hello, deadline, "HELLO")))
		return rc;
	struct hs_hello h;
	if (hello.type != NET_MSG_HELLO || !hs_parse_hello(&hello, &h)) {
		snprintf(why, sizeof why, "expected HELLO, got %s (type %u, %zu bytes)",
		         hs_type_name(hello.type), hello.type, hello.len);
		net_msg_free(&hello);
		return hs_reject(c, CKPT_EPROTO, why, deadline, NULL);
	}
	if (!a) {
		/* A server of many jobs: which one, and its secret. The peer's bytes are
		 * copied and handed over with their length (they may hold a NUL). */
		char fwhy[NET_JOB_WHY_MAX] = "";
		memcpy(job_copy, h.job, h.job_len);
		job_copy[h.job_len] = '\0';
		rc = find(find_arg, job_copy, h.job_len, h.world, &found, fwhy);
		if (!rc && (!found.job_id || strlen(found.job_id) != h.job_len ||
		            memcmp(found.job_id, h.job, h.job_len) || (rc = hs_check_args(&found))))
			rc = rc ? rc : CKPT_EPEER;
		if (rc) {
			char theirs[80];
			hs_printable(theirs, sizeof theirs, h.job, h.job_len);
			fwhy[NET_JOB_WHY_MAX - 1] = '\0';
			snprintf(why, sizeof why, "job '%s': %s", theirs, fwhy[0] ? fwhy : "not served here");
			net_msg_free(&hello);
			return hs_reject(c, rc > 0 || rc == -EINVAL ? CKPT_EPEER : rc, why, deadline, NULL);
		}
		a = &found;
	}
	size_t my_len = strlen(a->job_id);
	if (h.job_len != my_len || memcmp(h.job, a->job_id, my_len) != 0) {
		char theirs[80], mine[80];
		hs_printable(theirs, sizeof theirs, h.job, h.job_len);
		hs_printable(mine, sizeof mine, (const uint8_t *)a->job_id, my_len);
		snprintf(why, sizeof why, "wrong job '%s', expected '%s'", theirs, mine);
		net_msg_free(&hello);
		return hs_reject(c, CKPT_EPEER, why, deadline, NULL);
	}
	if (h.world != a->world) {
		snprintf(why, sizeof why, "rank %u: wrong world size %u, the job has %u",
		         h.rank, h.world, a->world);
		net_msg_free(&hello);
		return hs_reject(c, CKPT_EPEER, why, deadline, NULL);
	}
	if (h.rank >= h.world) {
		snprintf(why, sizeof why, "rank %u out of range for world size %u", h.rank, h.world);
		net_msg_free(&hello);
		return hs_reject(c, CKPT_EPEER, why, deadline, NULL);
	}
	uint8_t cnonce[NET_NONCE_BYTES];
	memcpy(cnonce, h.nonce, sizeof cnonce);
	/* From here h.job refers to our own copy of the (equal) job id. */
	h.job = (const uint8_t *)a->job_id;
	h.nonce = NULL;
	net_msg_free(&hello);

	/* 2. CHALLENGE{server nonce, server proof}. */
	uint8_t chal[NET_NONCE_BYTES + NET_MAC_BYTES];
	if (RAND_bytes(chal, NET_NONCE_BYTES) != 1)
		return hs_crypto_err("RAND_bytes");
	if ((rc = hs_mac(a, "srv", cnonce, chal, &h, chal + NET_NONCE_BYTES)))
		return rc;
	if ((rc = hs_send(c, NET_MSG_CHALLENGE, chal, sizeof chal, deadline, "CHALLENGE")))
		return rc;

	/* 3. RESPONSE{client proof}, or REJECT if we failed the client's check. */
	struct net_msg m;
	if ((rc = hs_recv(c, &m, deadline, "RESPONSE")))
		return rc;
	if (m.type == NET_MSG_REJECT) {
		rc = hs_rejected(c, &m, "client");
		net_msg_free(&m);
		return rc;
	}
	if (m.type != NET_MSG_RESPONSE || m.len != NET_MAC_BYTES) {
		snprintf(why, sizeof why, "expected RESPONSE (%u bytes), got %s (type %u, %zu bytes)",
		         NET_MAC_BYTES, hs_type_name(m.type), m.type, m.len);
		net_msg_free(&m);
		return hs_reject(c, CKPT_EPROTO, why, deadline, NULL);
	}
	uint8_t expect[NET_MAC_BYTES];
	if ((rc = hs_mac(a, "cli", chal, cnonce, &h, expect))) {
		net_msg_free(&m);
		return rc;
	}
	bool client_ok = CRYPTO_memcmp(m.payload, expect, NET_MAC_BYTES) == 0;
	OPENSSL_cleanse(expect, sizeof expect);
	net_msg_free(&m);
	if (!client_ok) {
		/* The peer hears only "authentication failed": which input was wrong
		 * would help a guesser. The log here can say more. */
		snprintf(why, sizeof why, "rank %u failed authentication (a different job secret, "
		         "or a forged or replayed RESPONSE)", h.rank);
		return hs_reject(c, CKPT_EAUTH, "authentication failed", deadline, why);
	}

	/* 4. The caller's admission (duplicate rank, ...), only for proven peers so
	 * that strangers cannot probe which ranks are connected. */
	if (accept_rank) {
		const char *reason = NULL;
		int code = accept_rank(arg, h.rank, &reason);
		if (code) {
			if (code > 0)
				code = CKPT_EPEER;
			snprintf(why, sizeof why, "rank %u refused: %s", h.rank,
			         reason ? reason : "not admitted");
			return hs_reject(c, code, why, deadline, NULL);
		}
	}
	if ((rc = hs_send(c, NET_MSG_WELCOME, NULL, 0, deadline, "WELCOME")))
		return rc;
	snprintf(out->job_id, sizeof out->job_id, "%s", a->job_id);
	out->rank = h.rank;
	out->world = h.world;
	char suffix[24];
	snprintf(suffix, sizeof suffix, "rank %u", h.rank);
	net_conn_name_suffix(c, suffix);
	return 0;
}

int net_handshake_server(struct net_conn *c, const struct net_auth *a,
                         net_rank_check_fn accept_rank, void *arg, uint32_t *rank,
                         int timeout_ms)
{
	struct net_hello h;
	int rc = hs_server(c, a, NULL, NULL, accept_rank, arg, &h, timeout_ms);
	if (!rc)
		*rank = h.rank;
	return rc;
}

int net_handshake_server_find(struct net_conn *c, net_job_find_fn find, void *find_arg,
                              net_rank_check_fn accept_rank, void *arg,
                              struct net_hello *hello, int timeout_ms)
{
	if (!find)
		return ckpt_err(-EINVAL, "handshake: no job lookup");
	return hs_server(c, NULL, find, find_arg, accept_rank, arg, hello, timeout_ms);
}
