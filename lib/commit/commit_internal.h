/*
 * commit_internal.h — private to lib/commit: the commit protocol's messages
 * (docs/protocol.md §3) and their codecs. Payloads are little-endian; decoders take
 * untrusted bytes and check every length before use.
 */
#ifndef CKPT_COMMIT_INTERNAL_H
#define CKPT_COMMIT_INTERNAL_H

#include "commit/commit.h"
#include "net/net.h"

enum commit_msg_type {
	COMMIT_MSG_BEGIN       = NET_MSG_USER_FIRST,  /* p -> c: {step} */
	COMMIT_MSG_BEGIN_REPLY = 33,                  /* c -> p: {step, code, reason} */
	COMMIT_MSG_PREPARE     = 34,                  /* p -> c: {step, rank, size, hash, index} */
	COMMIT_MSG_DECISION    = 35,                  /* c -> p: {step, code, reason} */
	COMMIT_MSG_ABORT       = 36,                  /* p -> c: {step, code, reason} */
};

#define COMMIT_MAX_REASON 512u

/* {step, code, reason}: BEGIN_REPLY, DECISION and ABORT share one layout. */
struct commit_status_msg {
	uint64_t step;
	int32_t  code;
	char     reason[COMMIT_MAX_REASON + 1];
};
int commit_status_encode(const struct commit_status_msg *m, struct ckpt_buf *b);
int commit_status_decode(const void *p, size_t n, struct commit_status_msg *m);

int commit_step_encode(uint64_t step, struct ckpt_buf *b);
int commit_step_decode(const void *p, size_t n, uint64_t *step);

/* PREPARE; on decode, v->index points into the payload. */
int commit_prepare_encode(const struct commit_vote *v, struct ckpt_buf *b);
int commit_prepare_decode(const void *p, size_t n, struct commit_vote *v);

#endif /* CKPT_COMMIT_INTERNAL_H */
