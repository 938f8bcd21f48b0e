/*
 * snapshot.h — lib/snapshot's interface: copying the caller's state into pool
 * buffers (the snapshot) and, on load, copying verified bytes out to the caller.
 *
 * The host implementation is a fused copy+hash. A CUDA build adds device memory:
 * device-to-host copies on a dedicated stream with an event per chunk, so the
 * writer waits on each chunk, not on the whole stream (DESIGN §8).
 *
 * Depends on: io (the pool, the hash).
 */
#ifndef CKPT_SNAPSHOT_H
#define CKPT_SNAPSHOT_H

#include <stddef.h>
#include <stdint.h>

#include "ckpt_internal.h"
#include "io/io.h"

/* Copy n bytes of the caller's state at src (memory kind mem) into dst, a pool
 * buffer, and compute the XXH3-128 of those bytes. After 0 the caller's bytes are
 * not read again. Errors: CKPT_ENODEV (device memory without CUDA), -EIO (copy). */
int snapshot_copy_in(void *dst, const void *src, size_t n, int mem,
                     uint8_t hash[CKPT_HASH_BYTES]);

/* Copy n verified bytes to the caller's destination (memory kind mem). */
int snapshot_copy_out(void *dst, const void *src, size_t n, int mem);

/* Resolve CKPT_MEM_AUTO for a pointer: CKPT_MEM_DEVICE if CUDA says so, else HOST. */
int snapshot_mem_kind(const void *p, int mem);

#endif /* CKPT_SNAPSHOT_H */
