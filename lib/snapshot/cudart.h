/*
 * cudart.h — private to lib/snapshot: the CUDA runtime, loaded when a context first
 * looks for a device (cudart.c), never linked. A libckpt built with CUDA then runs,
 * host memory only, where no GPU or no CUDA runtime is installed; the runtime is
 * needed only where device memory is used.
 *
 * Call sites read as the runtime's own calls with the "cuda" prefix moved into the
 * table: cudart.MemcpyAsync(...) is cudaMemcpyAsync(...). The table is valid only
 * after cudart_load() returned 0.
 */
#ifndef CKPT_SNAPSHOT_CUDART_H
#define CKPT_SNAPSHOT_CUDART_H

#include <cuda_runtime_api.h>

#include "ckpt_internal.h"

/* X(name): every runtime function libckpt calls, by its name without "cuda". */
#define CKPT_CUDART_FUNCTIONS(X)                                                       \
	X(GetDeviceCount) X(GetDevice) X(SetDevice) X(GetLastError) X(GetErrorName)       \
	X(GetErrorString) X(HostRegister) X(HostUnregister) X(PointerGetAttributes)      \
	X(StreamCreateWithFlags) X(StreamDestroy) X(StreamSynchronize)                   \
	X(StreamWaitEvent) X(EventCreateWithFlags) X(EventRecord) X(EventSynchronize)    \
	X(EventDestroy) X(MemcpyAsync) X(LaunchHostFunc) X(Malloc) X(Free)

/* X(name): functions of newer runtimes (CUDA 12 and later), used where present: a
 * runtime without them still loads, and only what needs them is off (the device
 * staging pool's compare-and-copy). */
#define CKPT_CUDART_OPTIONAL(X) \
	X(LibraryLoadData) X(LibraryUnload) X(LibraryGetKernel) X(LaunchKernel) X(MemsetAsync)

struct cudart_api {
#define CKPT_CUDART_MEMBER(f) __typeof__(&cuda##f) f;
	CKPT_CUDART_FUNCTIONS(CKPT_CUDART_MEMBER)
	CKPT_CUDART_OPTIONAL(CKPT_CUDART_MEMBER)
#undef CKPT_CUDART_MEMBER
};

/* Filled once by cudart_load; read-only after. An optional function the runtime
 * lacks is NULL. */
extern struct cudart_api cudart;

/* Load the runtime once per process: CKPT_CUDART (a file name or path) if set, else
 * the runtime of the CUDA version this libckpt was built with, else libcudart.so.
 * Returns 0, or CKPT_ENODEV with the reason recorded (the same on every call). The
 * library stays loaded until the process ends: streams and pinned memory of the
 * runtime may outlive any one context. */
int cudart_load(void);

/* Convert e (not cudaSuccess) to our code and record the message with CUDA's own
 * name and words. Clears CUDA's last error so that a non-sticky failure does not
 * resurface in an unrelated later call. Only after cudart_load() returned 0. */
int snap_cuda_err(cudaError_t e, const char *fmt_what, ...) CKPT_PRINTF(2, 3);

#endif /* CKPT_SNAPSHOT_CUDART_H */
