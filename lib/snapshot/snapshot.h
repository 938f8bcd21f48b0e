/*
 * snapshot.h — lib/snapshot's interface: copying the caller's state into pool
 * buffers (the snapshot) and, on load, copying verified bytes out to the caller,
 * from and to host or CUDA device memory (docs/gpu.md, "Design (lib/snapshot)").
 *
 * One struct snapshot per context. It decides once, at create, whether device
 * memory can be used (a CUDA build, a driver, at least one device); without that
 * everything works on host memory and device pointers are refused with
 * CKPT_ENODEV. In device mode it supplies the pool's pinned allocator and owns the
 * CUDA objects: a non-blocking copy stream for saves, one for loads, and one event
 * per window slot. It holds no global state.
 *
 * A save streams through a struct snapshot_pipe: a window of pool buffers whose
 * copies are in flight. Chunks are issued ahead (device chunks as asynchronous
 * device-to-host copies, each followed by its own event; host chunks as a fused
 * copy+hash) and taken out in issue order once their own copy has landed, so the
 * copies of chunks k+1..k+d run while chunk k is hashed and written. The copy
 * stream does not synchronise with the caller's streams, so a save's first device
 * copy waits for the save's fence, recorded on the caller's stream at submit.
 *
 * Buffer ownership: a buffer taken by issue belongs to the pipe until next() hands
 * it to the caller (who passes it on to the shard writer), or until close() puts it
 * back. close() first waits for the copies in flight, so that no DMA ever writes
 * into a buffer that the pool has handed to someone else.
 *
 * Threads: snapshot_create/destroy with no other call running; snapshot_mem_kind
 * from any thread; one pipe at a time per snapshot, used by one thread (the save
 * worker); snapshot_copy_out/_wait by one thread at a time (loads hold the
 * context's load lock). The landed callback of seal may run on a CUDA thread.
 *
 * Depends on: io (the pool, the hash).
 */
#ifndef CKPT_SNAPSHOT_H
#define CKPT_SNAPSHOT_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ckpt_internal.h"
#include "io/io.h"

struct snapshot;

/* Probe for a usable device and set up. Never fails for lack of CUDA (the object
 * is then in host mode; the reason is logged at INFO). Errors: -ENOMEM. */
int  snapshot_create(struct snapshot **out);
/* Waits for copies still in flight. NULL: no-op. */
void snapshot_destroy(struct snapshot *sn);
/* Device mode: device memory can be saved and loaded. */
bool snapshot_has_device(const struct snapshot *sn);
/* The pool's memory provider: in device mode page-aligned anonymous memory pinned
 * with cudaHostRegister (portable); NULL otherwise (io's own pre-faulted memory).
 * The pointer lives as long as sn; the pool must be destroyed before sn. */
const struct io_pool_alloc *snapshot_pool_alloc(struct snapshot *sn);
/* Whether the pool memory handed out by the allocator is pinned (device mode, and
 * cudaHostRegister succeeded). */
bool snapshot_pool_pinned(const struct snapshot *sn);

/* Resolve the memory kind of p: CKPT_MEM_HOST or CKPT_MEM_DEVICE (mem AUTO asks
 * CUDA; HOST is taken as said; DEVICE is checked, and a pointer CUDA calls host
 * memory is treated as host memory). *device gets the pointer's device, or -1.
 * Errors: CKPT_ENODEV (device memory without a usable device), -EINVAL (unknown
 * mem). The message says what; the caller prefixes the tensor's name. */
int  snapshot_mem_kind(struct snapshot *sn, const void *p, int mem, int *device);
/* Saves copy on one device's stream: the first call binds it, a later call with
 * another device fails with -EINVAL (naming both). Loads need no binding. */
int  snapshot_bind(struct snapshot *sn, int device);

/* ------------------------------------------------------------------ order after the caller */

/*
 * The fence of a save with device tensors: a new CUDA event recorded, in the calling
 * thread, on stream (a cudaStream_t; NULL: the legacy default stream, which orders
 * after every prior work of the device's blocking streams), with the bound device
 * current for the record and the thread's own device current again on return. The
 * save's copies wait for it (snapshot_pipe_after), so they see every write queued
 * before it. *fence is owned by the caller (snapshot_event_destroy); it is NULL in
 * host mode and when no device was bound: nothing to order. Errors: CUDA failures
 * converted (a stream of another device among them), *fence then NULL.
 */
int  snapshot_fence(struct snapshot *sn, void *stream, void **fence);

/* ------------------------------------------------------------------ save pipeline */

struct snapshot_pipe;

/* A sensible window for a pool of nbufs buffers when up to queue_depth writes are
 * in flight: the rest of the pool holds copies ahead of the writer. >= 1. */
unsigned snapshot_pipe_window(unsigned nbufs, unsigned queue_depth);

/* A pipeline of at most window chunks (>= 1; clamped to the pool's size) over
 * pool. block_bytes: each chunk's blocks of that size are hashed with it (the shard
 * writer's block size; 0: none). tree: chunk hashes are taken over the block hashes
 * (io_copy_hash128_blocks; a file of version 5), as the chunks' writer expects.
 * Errors: -EINVAL, -ENOMEM. */
int  snapshot_pipe_open(struct snapshot *sn, struct io_pool *pool, unsigned window,
                        uint32_t block_bytes, bool tree, struct snapshot_pipe **out);
/*
 * Start the copy of n bytes (0 < n <= pool buffer size) of the caller's memory src
 * of kind mem (resolved: HOST or DEVICE) into a pool buffer; tag comes back with
 * the chunk from next(). A host chunk is copied and hashed here; a device chunk is
 * queued on the copy stream with its event. Returns 0, or -EAGAIN when the window
 * is full or no buffer is free while chunks are pending: take one out with next()
 * and call again. With nothing pending it waits for a buffer (the writer's writes
 * give them back). Errors: CKPT_ENODEV, -EIO and the like from CUDA (the message
 * has CUDA's words), -EINVAL.
 */
int  snapshot_pipe_issue(struct snapshot_pipe *p, const void *src, size_t n, int mem,
                         uint64_t tag);
/* Like snapshot_pipe_issue for a chunk whose bytes come from a source callback (a
 * tensor streamed from elsewhere): fill(arg, off, dst, n) writes them into the pool
 * buffer, here, in this thread; they are hashed as they land. fill's error is
 * returned (the buffer goes back to the pool). -EAGAIN as snapshot_pipe_issue. */
typedef int (*snapshot_fill_fn)(void *arg, uint64_t off, void *dst, size_t n);
int  snapshot_pipe_issue_fill(struct snapshot_pipe *p, snapshot_fill_fn fill, void *arg,
                              uint64_t off, size_t n, uint64_t tag);
/* A chunk of n bytes that needs no copy: the caller hashed it where it lies and
 * found its bytes stored already (an incremental save's unchanged chunk). It keeps
 * its place in issue order, takes no pool buffer and does not count against the
 * window (the pipe holds a bounded number of such chunks beyond it);
 * next() gives it back with *buf SNAPSHOT_NO_BUF and the hashes given here (h's
 * block hashes, of the pipe's block size, are copied; h->blocks NULL: none). Returns 0, or -EAGAIN when the pipe is full (take a
 * chunk out first; snapshot_pipe_room says so beforehand). Errors: -EINVAL. */
#define SNAPSHOT_NO_BUF UINT_MAX
int  snapshot_pipe_issue_stored(struct snapshot_pipe *p, size_t n, const struct io_hashes *h,
                                uint64_t tag);
/* A chunk of host memory of n bytes that is not copied: with hash, it is hashed
 * here, where it lies (the chunk and its blocks); without, its consumer hashes it
 * (a stream to ckptd whose sender hashes each block just before it sends it) and
 * next() gives it back unhashed. Its bytes are read from there again by its
 * consumer, which must be done with them before the caller's memory is released (a
 * stream to ckptd sends it from there: lib/save.c, save_direct). Like a stored chunk
 * it takes no pool buffer and does not count against the window; next() gives it
 * back with *buf SNAPSHOT_SRC_BUF. Returns 0, or -EAGAIN when the pipe is full.
 * Errors: -EINVAL. */
#define SNAPSHOT_SRC_BUF (UINT_MAX - 1)
int  snapshot_pipe_issue_inplace(struct snapshot_pipe *p, const void *src, size_t n, bool hash,
                                 uint64_t tag);
/* A chunk of host memory of n bytes copied into dst, memory the caller holds until
 * its consumer is done with it (a direct save's tail, carved out of the whole pool:
 * lib/save.c), and hashed on the way. Like an in-place chunk it takes no pool
 * buffer of the pipe's and does not count against the window; next() gives it back
 * with *buf SNAPSHOT_DST_BUF. Returns 0, or -EAGAIN when the pipe is full. Errors:
 * -EINVAL. */
#define SNAPSHOT_DST_BUF (UINT_MAX - 2)
int  snapshot_pipe_issue_into(struct snapshot_pipe *p, void *dst, const void *src, size_t n,
                              uint64_t tag);
/* Whether the pipe has room for a stored chunk (a copy may still find the window
 * full, or wait for a buffer). */
bool snapshot_pipe_room(const struct snapshot_pipe *p);
/* Whether the oldest pending chunk is one issued by snapshot_pipe_issue_stored. */
bool snapshot_pipe_head_stored(const struct snapshot_pipe *p);
/* The pipe's first device copy waits, on the GPU, for fence (snapshot_fence; NULL:
 * no wait). The fence must live until the pipe is closed. Call before the first
 * issue. */
void snapshot_pipe_after(struct snapshot_pipe *p, void *fence);
/* Chunks issued and not yet taken out. */
unsigned snapshot_pipe_pending(const struct snapshot_pipe *p);
/* Whether the oldest pending chunk can be taken out without waiting: a chunk of host
 * memory (or from a fill callback) is copied and hashed when issued; a device copy
 * may still be in flight. */
bool snapshot_pipe_head_ready(const struct snapshot_pipe *p);
/* Device chunks issued since open. */
uint64_t snapshot_pipe_device_chunks(const struct snapshot_pipe *p);
/*
 * Take out the oldest chunk once its copy has landed (waits on that chunk's event
 * only): its pool buffer (the caller owns it from now on; SNAPSHOT_NO_BUF for a
 * chunk issued by snapshot_pipe_issue_stored, SNAPSHOT_SRC_BUF for one issued by
 * snapshot_pipe_issue_inplace, SNAPSHOT_DST_BUF by snapshot_pipe_issue_into), length, the XXH3-128 of
 * its bytes and of its blocks (computed from the pool buffer for device chunks;
 * h->blocks points into the pipe and stays valid until the next issue or close)
 * and tag. Returns 0, or 1 for a device chunk left unhashed after
 * snapshot_pipe_leave_hashing or a chunk issued in place without hash (*h is then
 * zero). Errors: -ENOENT (nothing pending),
 * CUDA failures converted (the buffer is then still the pipe's, and close()
 * returns it).
 */
int  snapshot_pipe_next(struct snapshot_pipe *p, unsigned *buf, size_t *len,
                        struct io_hashes *h, uint64_t *tag);
/* From now on device chunks come out of snapshot_pipe_next unhashed: the consumer
 * hashes them elsewhere (a writer whose compression workers hash what they
 * compress). Host chunks are hashed as they are copied, as before. */
void snapshot_pipe_leave_hashing(struct snapshot_pipe *p);
/* Hash device chunks on n helper threads (at most SNAPSHOT_PIPE_MAX_HASHERS),
 * started at the first device chunk; snapshot_pipe_next then only waits for its
 * chunk's hashes. Before the first device chunk, and not with leave_hashing (which
 * wins). 0: the caller's thread hashes at next(), as by default. */
#define SNAPSHOT_PIPE_MAX_HASHERS 16u
void snapshot_pipe_hash_threads(struct snapshot_pipe *p, unsigned n);
/*
 * Every copy has been issued. In device mode, *event (a cudaEvent_t, owned by the
 * caller: snapshot_event_destroy) is recorded on the copy stream after the last
 * copy, and landed(arg) runs once every copy has completed (from a CUDA thread, via
 * cudaLaunchHostFunc; it must not call CUDA). With no device copies landed(arg) runs
 * here, before seal returns; in host mode *event is NULL. Call at most once.
 * Errors: CUDA failures converted (landed is then not called).
 */
int  snapshot_pipe_seal(struct snapshot_pipe *p, void **event, void (*landed)(void *),
                        void *arg);
/* Wait for the copies in flight (and the landed callback), put every buffer still
 * held back into the pool, free. NULL: no-op. */
void snapshot_pipe_close(struct snapshot_pipe *p);

/* ------------------------------------------------------------------ device staging pool */

/*
 * The device staging pool (stage.c; docs/gpu.md, "Device staging pool"): one
 * allocation of device memory on the bound device, made by the first reserve and
 * held until destroy; the last SNAPSHOT_STAGE_FLAG_BYTES of it hold the flags of the
 * compare-and-copy. A save copies chunks of the caller's tensors into it on the
 * device (snapshot_pipe_stage), releases the caller's memory once every read of it
 * is queued (snapshot_pipe_release: the snapshot event), and then copies the staged
 * chunks to the host through the pipe like any device chunk, from the pool.
 *
 * The pool's bytes stay there after a save: the next save may compare against them
 * (compare-and-copy) and learn which chunks did not change without copying them.
 */
#define SNAPSHOT_STAGE_FLAGS      16384u                       /* chunks compared per save */
#define SNAPSHOT_STAGE_FLAG_BYTES ((size_t)SNAPSHOT_STAGE_FLAGS * 4u)
#define SNAPSHOT_STAGE_ALIGN      4096u   /* of each staged range */

/* Reserve the staging pool of bytes (> SNAPSHOT_STAGE_FLAG_BYTES) on the bound
 * device, once, and load the staging kernel (once). Returns the bytes chunks may
 * use, 0 when there is no pool: host mode, no bound device, or the allocation failed
 * (logged once, WARN, with CUDA's words; not tried again). A kernel that cannot be
 * loaded is logged once (INFO): copies are then one cudaMemcpyAsync a range, and
 * the comparison is off (snapshot_stage_can_diff). Worker thread only (after
 * snapshot_pipe_open). */
size_t snapshot_stage_reserve(struct snapshot *sn, size_t bytes);
/* What reserve returned last (0: no pool), and whether the kernel is loaded. */
size_t snapshot_stage_room(const struct snapshot *sn);
bool   snapshot_stage_can_diff(const struct snapshot *sn);

/*
 * Queue the copy of n bytes of src (mem HOST or DEVICE, resolved) to offset off of
 * the staging pool (aligned to SNAPSHOT_STAGE_ALIGN) on the copy stream, after the
 * fence (snapshot_pipe_after); *staged: their address in the pool. With chunk_bytes
 * > 0 (device memory, src aligned to 16, snapshot_stage_can_diff): a compare-and-copy
 * against what the pool holds there: only the 16-byte words that differ are written,
 * and staged chunk flag + i (the i-th chunk_bytes piece of the range) is marked
 * changed if any of its words differed (snapshot_pipe_stage_changed). Before
 * snapshot_pipe_release. Errors: -EINVAL (outside the pool, flags beyond
 * SNAPSHOT_STAGE_FLAGS, a comparison not possible), CUDA failures converted.
 */
int  snapshot_pipe_stage(struct snapshot_pipe *p, const void *src, size_t n, int mem,
                         uint64_t off, size_t chunk_bytes, uint32_t flag,
                         const void **staged);
/*
 * Every read of the caller's memory is queued: what is issued after this reads the
 * staging pool (or the caller's host memory, which the caller must not do: the save
 * decides). *event and landed as snapshot_pipe_seal, which then records nothing
 * more. At most once, before seal. Errors: CUDA failures converted.
 */
int  snapshot_pipe_release(struct snapshot_pipe *p, void **event, void (*landed)(void *),
                           void *arg);
/* After the compare-and-copies: whether staged chunk flag changed. The first call
 * waits for them (the worker waits, after the release). Errors: CUDA's. */
int  snapshot_pipe_stage_changed(struct snapshot_pipe *p, uint32_t flag, bool *changed);

/* Destroy an event from seal. NULL: no-op. Safe while a stream still waits on it. */
void snapshot_event_destroy(struct snapshot *sn, void *event);

/* ------------------------------------------------------------------ load */

/*
 * Copy n verified bytes at src (valid only until the chunk callback returns) to the
 * caller's dst of kind mem (resolved). Host: memcpy. Device: an asynchronous
 * host-to-device copy on the load stream; snapshot_copy_out_wait must run before
 * src's buffer goes back to the pool (at the end of the chunk callback).
 * Errors: CKPT_ENODEV, CUDA failures converted.
 */
int  snapshot_copy_out(struct snapshot *sn, void *dst, const void *src, size_t n, int mem);
/* Wait for the device copies queued by snapshot_copy_out. 0 when none. */
int  snapshot_copy_out_wait(struct snapshot *sn);

/* ------------------------------------------------------------------ GPUDirect Storage */

/*
 * Load libcufile and open its driver (gds.c). 0, or why not: CKPT_ENODEV (host
 * mode or a build without CUDA), -ENOENT (no libcufile), -EIO (its driver would not
 * open); the caller logs the reason and keeps the pinned path. Call with no other
 * call running, like snapshot_create.
 */
int  snapshot_gds_enable(struct snapshot *sn);
bool snapshot_gds_on(const struct snapshot *sn);
/* chunks read, bytes read, chunks written, bytes written by cuFile so far, and
 * files cuFile refused to register (served by the pinned path instead). */
void snapshot_gds_counters(struct snapshot *sn, uint64_t out[5]);
/*
 * io_read_batch through cuFile: each chunk (all stored raw) is read into device
 * staging memory, copied device-to-host into a pool buffer and hashed there, then
 * handed to cb with those verified host bytes (whole chunks: a request's range
 * [lo, hi) does not narrow the read here); while cb runs, snapshot_copy_out of
 * those bytes to device memory copies from the staging memory instead (device to
 * device). Errors: as io_read_batch (CKPT_ECORRUPT naming tensor, chunk, file and
 * offset), -ENOTSUP (not enabled, or a compressed chunk) and -EOPNOTSUPP (cuFile
 * refuses a file) before anything was read, -EIO from cuFile, CUDA failures
 * converted.
 */
int  snapshot_gds_read_batch(struct snapshot *sn, struct io_pool *pool,
                             const struct io_read_req *reqs, size_t n, io_chunk_cb cb);
/* Open path for cuFile writes (a descriptor of its own, registered, and writer
 * threads); *file for snapshot_gds_write. -EOPNOTSUPP when cuFile refuses the file
 * (the caller writes through the pinned path instead). */
int  snapshot_gds_file_open(struct snapshot *sn, const char *path, void **file);
/* Queue the write of n bytes of device memory src at offset off (both as O_DIRECT
 * needs them); up to four run at once. src must stay unchanged until
 * snapshot_gds_file_close returns. Returns an earlier write's failure, if any. */
int  snapshot_gds_write(void *file, const void *src, size_t n, uint64_t off);
/* Wait for every queued write, release. Returns the first write's failure (-EIO,
 * -ENOSPC for a short write, naming path and offset), else 0. NULL: 0. */
int  snapshot_gds_file_close(struct snapshot *sn, void *file);

#endif /* CKPT_SNAPSHOT_H */
