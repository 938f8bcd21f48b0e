/*
 * remote.h — lib/remote's interface: a rank's side of ckptd, the snapshot service of
 * storage nodes (docs/ckptd.md), and the messages both sides speak.
 *
 * A rank saving through ckptd streams its shard to one ckptd instead of writing it:
 * the chunks leave already hashed (at the snapshot copy) and, when the job
 * compresses, already compressed, so that ckptd writes what the rank made and the
 * hashes are checked where the bytes are used again (end to end). ckptd writes the
 * normal shard format and answers DURABLE after fdatasync, with the shard's footer;
 * the rank then votes as it does for a local file. Restores fetch byte ranges of
 * shard files and verify them here (io_shard_reader_open_fetch).
 *
 * Messages (lib/net framing, after the handshake as the job's rank; types 64..95):
 *   COORD{u32 world, u16 n, n x (u16 len, host, u16 port)
 *         [, u64 keep_last, keep_every, keep_seconds] [, u32 timeout_ms]}
 *                                                           -> COORD_OK{u16 port}
 *   OPEN{u64 step, u64 save_id, u32 block_bytes, u64 size_hint, u64 chunk_bytes
 *        [, u32 flags]}                         -> OPEN_OK{u64 max_chunk [, u32 flags]}
 *     (flags REMOTE_OPEN_DIRECT, asked for only over rdma: the rank would rather
 *     RDMA WRITE its chunks into buffers ckptd grants; OPEN_OK says whether it will.
 *     A rank that does not ask, or is not answered with the flag, sends DATA.
 *     REMOTE_OPEN_TREE: the chunks' hashes are trees, and the file is of format 5
 *     (docs/format.md §5); OPEN_OK says it back. A ckptd that does not know the
 *     flag refuses the OPEN, so that no file says one kind and holds the other.
 *     REMOTE_OPEN_AFTER, asked for by a rank that does not ask for the direct path:
 *     each chunk's hashes come after its bytes, in HASHES, so that the rank can hash
 *     each block of a chunk sent from where it lies just before the kernel copies
 *     it (one read of the bytes from memory, not two); OPEN_OK says it back. A
 *     ckptd refuses it together with REMOTE_OPEN_DIRECT.)
 *   GRANT{u16 n, n x (u32 id, u64 addr, u32 rkey, u32 len)}  (ckptd, during a direct
 *     stream, whenever it has taken pool buffers for it: each one the rank may
 *     RDMA WRITE one chunk into, once, then name in its CHUNK)
 *   TENSOR{u16 len, name, u8 kind, dtype, policy, flags, ndim,
 *          ndim x u64 global_shape, offset, extent, u64 raw_bytes}
 *   CHUNK{u32 tensor, u8 codec, u64 raw_len, u64 stored_len, hash[16],
 *         u32 block_bytes, u32 nblocks, nblocks x hash[16] [, u32 grant]}
 *         then DATA{stored bytes}; or, with a grant, no DATA: the stored bytes were
 *         RDMA-written into the granted buffer before the CHUNK was sent.
 *     With REMOTE_OPEN_AFTER: CHUNK{u32 tensor, u8 codec, u64 raw_len,
 *         u64 stored_len, u32 block_bytes, u32 nblocks}, then DATA{stored bytes},
 *         then HASHES{hash[16], nblocks x hash[16]}; ckptd appends the chunk to its
 *         file once its HASHES came
 *   FINISH{}             -> DURABLE{u64 file_size, u64 logical, u64 stored,
 *                                   hash[16] of the footer, footer bytes}
 *   ABORT{}
 *   MANIFEST{}           -> MANIFEST_OK{a consistent copy of the job's LMDB file}
 *   READ{u16 len, path, u64 off, u64 len}                   -> DATA{len bytes}
 *   CHECK{u16 len, path, u64 file_size, u64 footer_off, u64 footer_len, hash[16]}
 *                                                           -> CHECK_OK{}
 *   REMOVE{u64 step, u64 save_id}                           -> REMOVE_OK{}
 *     (the home instance, about an attempt that did not commit or a step its
 *     retention removes: the shard files of that attempt go)
 * Any request may be answered ERROR{i32 code, u16 len, message}. During a shard
 * stream ERROR may come at any time; the rank stops sending and ckptd discards
 * what still arrives until FINISH or ABORT.
 */
#ifndef CKPT_REMOTE_H
#define CKPT_REMOTE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ckpt_internal.h"
#include "io/io.h"
#include "net/net.h"

enum remote_msg_type {
	REMOTE_MSG_COORD = 64, REMOTE_MSG_COORD_OK, REMOTE_MSG_OPEN, REMOTE_MSG_OPEN_OK,
	REMOTE_MSG_TENSOR, REMOTE_MSG_CHUNK, REMOTE_MSG_DATA, REMOTE_MSG_FINISH,
	REMOTE_MSG_DURABLE, REMOTE_MSG_ABORT, REMOTE_MSG_ERROR, REMOTE_MSG_MANIFEST,
	REMOTE_MSG_MANIFEST_OK, REMOTE_MSG_READ, REMOTE_MSG_CHECK, REMOTE_MSG_CHECK_OK,
	REMOTE_MSG_REMOVE, REMOTE_MSG_REMOVE_OK, REMOTE_MSG_GRANT, REMOTE_MSG_HASHES,
};
#define REMOTE_OPEN_DIRECT    1u               /* OPEN and OPEN_OK flags */
#define REMOTE_OPEN_TREE      2u
#define REMOTE_OPEN_AFTER     4u               /* each chunk's hashes after its bytes */
#define REMOTE_OPEN_FLAGS     (REMOTE_OPEN_DIRECT | REMOTE_OPEN_TREE | REMOTE_OPEN_AFTER)
#define REMOTE_MAX_GRANTS     8u               /* grants a stream holds at once */
#define REMOTE_MAX_HOST       255u
#define REMOTE_MAX_INSTANCES  256u
#define REMOTE_MAX_READ       (64u << 20)      /* longest READ answered */
#define REMOTE_MAX_MANIFEST   (1024u << 20)    /* largest manifest copy accepted */
#define REMOTE_MAX_CONTROL    (1u << 20)       /* any other message */
#define REMOTE_MAX_PATH       1024u            /* a shard path in READ and CHECK */

struct remote_instance { char host[REMOTE_MAX_HOST + 1]; unsigned port; };

/* ------------------------------------------------------------------ codec (proto.c)
 * Decoders check every length against the payload and return CKPT_EPROTO naming
 * the message and field. */
/* flags: REMOTE_OPEN_DIRECT or 0 (then the message is the shorter one, which every
 * ckptd takes). */
struct remote_open { uint64_t step, save_id, size_hint, chunk_bytes; uint32_t block_bytes, flags; };
/* One buffer of ckptd's pool the rank may RDMA WRITE a chunk into: id (never 0) names
 * it in the CHUNK; addr, rkey and len (bytes) are where. */
struct remote_grant { uint32_t id, rkey, len; uint64_t addr; };
struct remote_chunk {
	uint32_t tensor;
	uint8_t  codec;
	uint64_t raw_len, stored_len;
	uint8_t  hash[CKPT_HASH_BYTES];
	uint32_t block_bytes, nblocks;
	const uint8_t *blocks;        /* into the payload */
	uint32_t grant;               /* 0: DATA follows; else the grant holding the bytes */
};
struct remote_tensor {
	char     name[CKPT_MAX_NAME + 1];
	uint8_t  kind, dtype, policy, flags, ndim;
	uint64_t global_shape[CKPT_MAX_NDIM], offset[CKPT_MAX_NDIM], extent[CKPT_MAX_NDIM];
	uint64_t raw_bytes;
};
struct remote_check {
	char     path[REMOTE_MAX_PATH + 1];
	uint64_t file_size, footer_off, footer_len;
	uint8_t  hash[CKPT_HASH_BYTES];
};
/* The job's retention rules travel with COORD: the home instance applies them. So
 * does its timeout (CKPT_TIMEOUT_MS; 0: not sent): the coordinator the home starts
 * for it waits that long for a step's missing votes. Each is there or not, and the
 * message's length says which (a timeout sent is not 0). */
struct remote_keep { uint64_t last, every, seconds; };
int  remote_coord_encode(struct ckpt_buf *b, uint32_t world, const struct remote_instance *in,
                         unsigned n, const struct remote_keep *keep, uint32_t timeout_ms);
int  remote_coord_decode(const void *p, size_t n, uint32_t *world,
                         struct remote_instance *in, unsigned cap, unsigned *count,
                         struct remote_keep *keep, uint32_t *timeout_ms);
void remote_remove_encode(struct ckpt_buf *b, uint64_t step, uint64_t save_id);
int  remote_remove_decode(const void *p, size_t n, uint64_t *step, uint64_t *save_id);
void remote_open_encode(struct ckpt_buf *b, const struct remote_open *o);
int  remote_open_decode(const void *p, size_t n, struct remote_open *o);
void remote_tensor_encode(struct ckpt_buf *b, const struct io_tensor_desc *t);
int  remote_tensor_decode(const void *p, size_t n, struct remote_tensor *t);
/* OPEN_OK: flags 0 sends the shorter form. n is 8 or 12 when decoding. */
void remote_open_ok_encode(struct ckpt_buf *b, uint64_t max_chunk, uint32_t flags);
int  remote_open_ok_decode(const void *p, size_t n, uint64_t *max_chunk, uint32_t *flags);
/* GRANT of n (1..REMOTE_MAX_GRANTS) grants; the decoder takes at most cap. */
void remote_grant_encode(struct ckpt_buf *b, const struct remote_grant *g, unsigned n);
int  remote_grant_decode(const void *p, size_t n, struct remote_grant *g, unsigned cap,
                         unsigned *count);
/* after: the form of a stream opened with REMOTE_OPEN_AFTER (no hashes, no grant;
 * decoded, hash is zero and blocks NULL). */
void remote_chunk_encode(struct ckpt_buf *b, const struct remote_chunk *c, bool after);
int  remote_chunk_decode(const void *p, size_t n, bool after, struct remote_chunk *c);
/* HASHES of a chunk of nblocks blocks (its CHUNK says how many); *blocks points
 * into p (NULL for none). */
void remote_hashes_encode(struct ckpt_buf *b, const uint8_t hash[CKPT_HASH_BYTES],
                          const uint8_t *blocks, uint32_t nblocks);
int  remote_hashes_decode(const void *p, size_t n, uint32_t nblocks,
                          uint8_t hash[CKPT_HASH_BYTES], const uint8_t **blocks);
void remote_read_encode(struct ckpt_buf *b, const char *path, uint64_t off, uint64_t len);
int  remote_read_decode(const void *p, size_t n, char *path, size_t cap, uint64_t *off,
                        uint64_t *len);
void remote_check_encode(struct ckpt_buf *b, const struct remote_check *c);
int  remote_check_decode(const void *p, size_t n, struct remote_check *c);
void remote_error_encode(struct ckpt_buf *b, int code, const char *msg);
/* "CHUNK", "READ", ... for a type of enum remote_msg_type; "unknown" for others.
 * Static storage. */
const char *remote_msg_name(unsigned type);
/* An ERROR message as this thread's error: its code (a negative code of ours or an
 * errno), the message prefixed with who said it. */
int  remote_error_take(const void *p, size_t n, const char *who);
/* Send ERROR{code, msg}; best effort. */
void remote_send_error(struct net_conn *c, int code, const char *msg, int timeout_ms);

/* Where a shard record's path says its file is: "@HOST:PORT/<rel>" names the ckptd
 * holding it (*holder gets HOST:PORT, *rel the rest), a path without '@' is under
 * the job's root on its home ckptd (*holder ""). CKPT_EFORMAT for a malformed one. */
int  remote_path_split(const char *path, char *holder, size_t cap, const char **rel);

/* ------------------------------------------------------------------ client (client.c) */
struct remote_conn;
struct remote_auth {
	const char *job_id;
	uint32_t    rank, world;
	const void *secret;
	size_t      secret_len;
	int         transport;       /* enum net_transport (tcp or rdma) */
	const struct net_rdma_opts *rdma;
	unsigned    timeout_ms;
	/* Shard streams ask for the direct path (REMOTE_OPEN_DIRECT): chunks RDMA-written
	 * from the rank's pool into buffers ckptd grants. Only where the transport can
	 * (rdma); CKPT_RDMA_DIRECT=0 turns it off. */
	bool        direct;
};
/* Connect to one ckptd as the job's rank. Errors: those of net_connect and the
 * handshake (CKPT_EAUTH, CKPT_EPEER with ckptd's reason, -ETIMEDOUT, ...). */
int  remote_connect(const struct remote_instance *to, const struct remote_auth *a,
                    struct remote_conn **out);
void remote_close(struct remote_conn *c);             /* NULL: no-op */
const char *remote_name(const struct remote_conn *c); /* "ckptd HOST:PORT" */
/* Is the connection over (ckptd closed it: it restarted, or the connection was idle
 * past its --idle-ms)? Then connect again. */
bool remote_broken(const struct remote_conn *c);
/* Ask the job's home ckptd for its commit coordinator's port, starting it for a job
 * of world ranks whose shards are spread over the n instances. timeout_ms is the
 * job's: a coordinator started now waits that long (at most ckptd's --timeout-ms)
 * for a step's missing votes, as rank 0's does without ckptd. */
int  remote_coord(struct remote_conn *c, uint32_t world, const struct remote_instance *in,
                  unsigned n, const struct remote_keep *keep, uint32_t timeout_ms,
                  unsigned *port);
/* Remove the shard files of attempt save_id of step on this instance. */
int  remote_remove(struct remote_conn *c, uint64_t step, uint64_t save_id);
/* Bytes [off, off+len) of the shard file at path (a record's path without its
 * holder). Thread-safe (one request at a time per connection). */
int  remote_fetch(struct remote_conn *c, const char *rel, void *buf, size_t len, uint64_t off);
/* A consistent copy of the job's manifest, written to <dir>/data.mdb (0600). */
int  remote_manifest_copy(struct remote_conn *c, const char *dir);
/* Ask the holder of a shard whether it is the file a vote describes (the commit
 * coordinator of ckptd does, for shards of another instance). */
int  remote_check(struct remote_conn *c, const struct remote_check *chk);

/* The shard stream: the writer's interface (io.h) over a connection. Chunks are
 * sent by a thread of the writer's own, so that the caller copies the next chunk
 * while the last one is on the wire; a pool buffer returns to the pool once sent
 * (on the direct path: once its RDMA WRITE completed). On the direct path the pool
 * is registered with the connection, once, for as long as the connection lasts:
 * it must outlive it (remote_close before io_pool_destroy).
 * zstd_level > 0: chunks are compressed here with o->codec (zstd, or bytegroup for the
 * dtypes with planes), kept raw when that does not pay. */
struct remote_writer;
int  remote_writer_open(struct remote_conn *c, struct io_pool *pool,
                        const struct io_writer_opts *o, size_t chunk_bytes,
                        struct remote_writer **out);
int  remote_writer_add_tensor(struct remote_writer *w, const struct io_tensor_desc *t);
bool remote_writer_ready(struct remote_writer *w);
int  remote_writer_append(struct remote_writer *w, uint32_t t, unsigned buf, size_t len,
                          const struct io_hashes *h);
/* A chunk of len raw bytes hashed where they lie, sent from src by the sender: src
 * must stay as hashed until the sender has sent it (remote_writer_src_seal says
 * when). Not on a stream that compresses or RDMA-writes its chunks (-EINVAL).
 * h NULL: not hashed yet; the sender hashes each block just before it sends it,
 * and the hashes follow the bytes (only where remote_writer_hashes_while_sending;
 * else -EINVAL). */
int  remote_writer_append_src(struct remote_writer *w, uint32_t t, const void *src, size_t len,
                              const struct io_hashes *h);
/* The same for a chunk in memory the caller holds until the writer is finished or
 * aborted (a direct save's tail, copied out of its state): remote_writer_src_seal
 * does not wait for it. */
int  remote_writer_append_held(struct remote_writer *w, uint32_t t, const void *src,
                               size_t len, const struct io_hashes *h);
/* Whether the stream's sender can hash chunks as it sends them (ckptd took
 * REMOTE_OPEN_AFTER, and the hashes are trees): a rank opens every stream that
 * sends DATA so. */
bool remote_writer_hashes_while_sending(const struct remote_writer *w);
/* No more chunks from the caller's memory: done(arg) runs once every one appended
 * has been sent (the kernel has its bytes) or given up by a failed stream — here if
 * none is pending, else on the sender's thread. Called at most once per stream. */
void remote_writer_src_seal(struct remote_writer *w, void (*done)(void *), void *arg);
/* Waits until every chunk appended has been sent (or the stream failed): from then
 * on nothing reads their memory. Only finish or abort may follow. */
void remote_writer_sent(struct remote_writer *w);
/* Waits for DURABLE: then *res is the shard as ckptd made it durable (its footer
 * decoded and checked against its hash). The writer is freed in every case. */
int  remote_writer_finish(struct remote_writer *w, struct io_shard_result *res);
void remote_writer_abort(struct remote_writer *w);    /* NULL: no-op */

#endif /* CKPT_REMOTE_H */
