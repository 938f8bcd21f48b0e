/*
 * ckpt/cuda.h — libckpt's CUDA additions to the public API (ckpt.h): whether a
 * context copies device memory, the stream whose writes a save waits for, and the
 * snapshot event of an asynchronous save.
 *
 * Include it after the CUDA runtime headers are reachable (it includes
 * <cuda_runtime_api.h>). The functions exist in every libckpt, with or without
 * CUDA; without it ckpt_cuda_available reports 0, ckpt_save_snapshot_event
 * CKPT_ENODEV, and ckpt_save_set_stream accepts the stream and has no effect.
 *
 * Device tensors: pass device pointers to ckpt_save_add_tensor (mem CKPT_MEM_AUTO
 * detects them with cudaPointerGetAttributes; CKPT_MEM_DEVICE says so). A context
 * saves from one device: the device of its first device tensor. Select the device
 * (cudaSetDevice, torch.cuda.set_device) before ckpt_open: the pinned pool is
 * registered with the device current then, and streams are created on it.
 *
 * What a save sees: every write queued on the caller's stream before
 * ckpt_save_submit. The copies run on the library's own non-blocking stream, which
 * by itself would not wait for the caller's kernels; so, when the save has device
 * tensors, ckpt_save_submit records an event on the caller's stream, in the
 * caller's thread, and the save's first copy waits for it on the GPU (the host
 * waits for nothing). The caller's stream is, by default, the legacy default stream
 * (cudaStreamLegacy) of the device the save's tensors are on, whichever device is
 * current in the caller's thread: it orders after all work queued before submit
 * on every blocking stream of that device — the legacy
 * default stream itself, the per-thread default streams (cudaStreamPerThread,
 * --default-stream per-thread), and streams made by cudaStreamCreate. Work on a
 * stream created with cudaStreamNonBlocking, or on another device, is NOT covered:
 * name that stream with ckpt_save_set_stream (a framework passes its current
 * stream, e.g. torch.cuda.current_stream().cuda_stream), or synchronise it before
 * submit. So the training loop may submit right after the optimizer step, with no
 * synchronisation, as long as the step ran on the default or the named stream.
 * Work queued after submit is not waited for (the next forward runs alongside the
 * copies). A save of host memory only records nothing and never calls CUDA. If
 * the record fails, ckpt_save_submit returns the CUDA error converted (-EINVAL,
 * -EIO, ..., CUDA's words in ckpt_last_error) and nothing is queued.
 *
 * The snapshot point of a save is when the last byte of its tensors has been
 * copied out (device-to-host copies into the pinned pool, chunk by chunk, on the
 * library's own non-blocking stream; with a device staging pool,
 * ckpt_opts.device_pool_bytes, device-to-device copies into it for the part of the
 * state it holds). From then on the caller may modify its tensors. Two ways to
 * wait for it:
 *   - block the host: ckpt_save_wait_snapshot(s, timeout_ms);
 *   - block only the GPU: ckpt_save_snapshot_event(s, &ev), then
 *     cudaStreamWaitEvent(optimizer_stream, ev, 0) before the kernels that modify
 *     the saved tensors (the optimizer step). Forward and backward of the next step
 *     do not modify them, so they run while the copies drain.
 *
 * Caveats
 *   - The event exists once every copy of the save has been *issued*. When the
 *     state fits in the buffer pool (ckpt_opts.pool_bytes) that is right after
 *     submit (the copies are only queued). When it does not fit, the copies of the
 *     last chunks wait for pool buffers that the disk gives back, and
 *     ckpt_save_snapshot_event blocks the host until the last copy is issued: the
 *     stall is the part that did not fit. Size the pool to the per-rank state for a
 *     stall near zero, or give the context a device staging pool: what it holds is
 *     copied on the device before the event, and the rest of the pinned path
 *     waits only for what it does not hold.
 *   - The event is owned by the save: valid until ckpt_save_free(s). Do not
 *     destroy it. A stream already waiting on it when the save is freed is safe.
 *   - The event says the copies are done, not that the save is durable or
 *     committed: that is ckpt_save_wait, which also reports failures.
 */
#ifndef CKPT_CUDA_H
#define CKPT_CUDA_H

#include <cuda_runtime_api.h>

#include "ckpt/ckpt.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 1 if c copies device memory (built with CUDA, and a device was found at
 * ckpt_open), 0 if it works on host memory only. No error but the -EINVAL rule of
 * ckpt.h. Any thread. */
CKPT_API int ckpt_cuda_available(const ckpt_ctx *c);

/*
 * Between ckpt_save_begin and ckpt_save_submit: the save's copies follow the work
 * queued on stream before submit, instead of the work of the legacy default stream
 * (see above). stream NULL (0) restores that default; cudaStreamPerThread means the
 * per-thread stream of the thread that calls ckpt_save_submit. A second call
 * replaces the stream. The stream must belong to the device of the save's tensors
 * (the event is recorded there), else ckpt_save_submit fails (the CUDA error
 * converted, -EINVAL or -EIO, naming the stream and the device).
 * The stream stays the caller's: libckpt only records one event on it, inside
 * ckpt_save_submit, and keeps no reference afterwards (it may be destroyed once
 * submit has returned). A save without device tensors records nothing; in a context
 * without a CUDA device, or a libckpt built without CUDA, the call is accepted and
 * has no effect.
 * Errors: CKPT_ESTATE (already submitted).
 * Thread: the save's thread (ckpt_save rules); the record at submit happens in the
 * thread that calls ckpt_save_submit.
 */
CKPT_API int ckpt_save_set_stream(ckpt_save *s, cudaStream_t stream);

/*
 * After ckpt_save_submit(s): *ev is a CUDA event recorded on the library's copy
 * stream after the last device-to-host copy of s; it completes at the snapshot
 * point. Blocks until every copy of s has been issued (see Caveats above: at once
 * when the state fits in the pool). The event belongs to s (valid until
 * ckpt_save_free). For a save of host memory only, the event is recorded after the
 * host copies and is already complete.
 * Errors: CKPT_ESTATE (not submitted; or the save ended without issuing its copies
 * and without a failure of its own), CKPT_ENODEV (no CUDA device in this context, or
 * libckpt built without CUDA), or the save's own failure (as ckpt_save_wait) if it
 * failed before every copy was issued. *ev is NULL on error.
 * Thread: the save's thread (ckpt_save rules).
 */
CKPT_API int ckpt_save_snapshot_event(ckpt_save *s, cudaEvent_t *ev);


#ifdef __cplusplus
}
#endif
#endif /* CKPT_CUDA_H */
