/*
 * io_internal.h — private to lib/io: the engine's request interface used by the
 * shard writer and reader, the pool's address lookup, and the on-disk constants of
 * the shard header and trailer (docs/format.md §2, §4). Other modules include io.h
 * only (CONTRIBUTING.md, "The module graph").
 */
#ifndef CKPT_IO_INTERNAL_H
#define CKPT_IO_INTERNAL_H

#include "io/io.h"

/* ------------------------------------------------------------------ hashing (hash_row.c)
 * The hash of a chunk's row of block hashes (a version-5 chunk hash), fed one
 * block hash at a time, in a state that lives where the caller puts it. */
struct io_hash_row {
	_Alignas(64) unsigned char state[640];
};
void io_hash_row_reset(struct io_hash_row *r);
void io_hash_row_add(struct io_hash_row *r, const uint8_t h[CKPT_HASH_BYTES]);
void io_hash_row_digest(struct io_hash_row *r, uint8_t out[CKPT_HASH_BYTES]);

/* ------------------------------------------------------------------ on-disk constants */

#define IO_HEADER_MAGIC   "CKPTSHRD"
#define IO_TRAILER_MAGIC  "CKPTTRLR"
#define IO_INDEX_MAGIC    "CKPTIDX1"
#define IO_BLOCKS_MAGIC   "CKPTBLKS"
#define IO_MAGIC_BYTES    8u

/* Header block (offset 0, IO_HEADER_BYTES long). */
#define IO_HDR_OFF_VERSION   8u
#define IO_HDR_OFF_LEN       12u
#define IO_HDR_OFF_STEP      16u
#define IO_HDR_OFF_RANK      24u
#define IO_HDR_OFF_WORLD     28u
#define IO_HDR_OFF_CTIME     32u
#define IO_HDR_OFF_SAVE_ID   40u   /* version 3; zero before */
#define IO_HDR_OFF_HASH      (IO_HEADER_BYTES - 8u)   /* XXH3-64 of [0, IO_HDR_OFF_HASH) */

/* Trailer (the last IO_TRAILER_BYTES of the file). */
#define IO_TRL_OFF_VERSION   8u
#define IO_TRL_OFF_FLAGS     12u
#define IO_TRL_OFF_FOOTER    16u
#define IO_TRL_OFF_FLEN      24u
#define IO_TRL_OFF_FHASH     32u
#define IO_TRL_OFF_STEP      48u
#define IO_TRL_HASHED        56u   /* XXH3-64 of [0, 56) stored at 56 */
/* 64 bytes hold: magic 8, version 4, flags 4, footer_offset 8, footer_len 8,
 * footer hash 16, step 8 = 56, then the self-hash 8. rank and world do not fit
 * in a 64-byte trailer next to a 16-byte footer hash, so they live in the header
 * block and in the footer (both covered by hashes); see docs/format.md §4. */

/* Fixed sizes of the index encoding (docs/format.md §3). */
#define IO_INDEX_HDR_BYTES     48u   /* version 1 */
#define IO_INDEX_HDR2_BYTES    88u   /* version 2: + block_bytes, reserved, table place */
#define IO_INDEX_HDR3_BYTES    96u   /* version 3: + save id */
#define IO_INDEX_TENSOR_MIN    24u   /* name_len 2 + name >= 1 + 5 enums + raw 8 + run 8, ndim 0 */
#define IO_INDEX_CHUNK_BYTES   56u
#define IO_INDEX_HDR4_BYTES    104u  /* version 4: + counts of referenced files, references */
#define IO_INDEX_FILE_BYTES    24u   /* step, save id, rank, reserved */
#define IO_INDEX_REF_BYTES     8u    /* chunk, file (1-based) */

/* The block table (docs/format.md §3a): a 32-byte header, then the hashes. */
#define IO_BLOCKS_HDR_BYTES    32u
#define IO_BLOCKS_OFF_VERSION  8u
#define IO_BLOCKS_OFF_BSIZE    12u
#define IO_BLOCKS_OFF_COUNT    16u
#define IO_BLOCKS_OFF_RESERVED 24u
/* First version whose files have block tables. */
#define IO_BLOCKS_VERSION      2u

/* The bytegroup codec's stored bytes (docs/format.md §5): a 4-byte header (layout,
 * element width, reserved 2), one 8-byte entry per plane (method, reserved 3, stored
 * length 4), then the planes in order. */
#define IO_BG_HDR_BYTES    4u
#define IO_BG_PLANE_BYTES  8u
#define IO_BG_LAYOUT       1u    /* the only layout there is */
#define IO_BG_STORED       0u    /* the plane's bytes as they are */
#define IO_BG_ZSTD         1u    /* one zstd frame of the plane's bytes */

/* ------------------------------------------------------------------ pool */

/* The pool buffer that holds [addr, addr+len) entirely, or -1 (not pool memory). */
int io_pool_index_of(const struct io_pool *p, const void *addr, size_t len);

/* ------------------------------------------------------------------ engine requests
 *
 * A request is one read or write of len bytes at a file offset, or an fsync of fd
 * (IO_OP_FSYNC: addr, len and off unused; it runs on the kernel's workers, so the
 * thread that queues it does not wait for the disk). The engine keeps it until the
 * whole length is done: short transfers are resubmitted for the remainder,
 * -EAGAIN/-EINTR are retried. Then done(owner, cookie, res) is called exactly once,
 * from whichever io_engine_reap() call sees the last completion, with res = bytes
 * transferred (< len only for a read that met end of file; 0 for an fsync) or -errno.
 */
typedef void (*io_done_fn)(void *owner, uint64_t cookie, int64_t res);

enum io_op { IO_OP_READ = 0, IO_OP_WRITE = 1, IO_OP_FSYNC = 2 };

/* Queue and submit a request. Blocks (reaping completions) while every slot is
 * busy. 0, or -errno from io_uring_submit (nothing queued, done is not called). */
int io_engine_queue(struct io_engine *e, enum io_op op, int fd, void *addr, size_t len,
                    uint64_t off, io_done_fn done, void *owner, uint64_t cookie);
/* Handle completions: wait for at least one when wait and requests are in flight.
 * Returns the number of requests finished (their done called), or -errno. */
int io_engine_reap(struct io_engine *e, bool wait);
unsigned io_engine_depth(const struct io_engine *e);
/* The caps on the ring's kernel workers as the kernel has them: [0] for regular
 * files and block devices, [1] for the rest. 0, or -errno (before Linux 5.15). */
int      io_engine_workers(struct io_engine *e, unsigned out[2]);

/* Aligned temporary buffer for O_DIRECT (footer, header, oversized chunks). */
void *io_aligned_alloc(size_t bytes);

#endif /* CKPT_IO_INTERNAL_H */
