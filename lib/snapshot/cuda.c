/*
 * cuda.c — the snapshot object with the CUDA runtime (C API, no kernels): device
 * detection, the pinned pool allocator, pointer classification, the copy streams
 * and per-slot events of the save pipeline, and host-to-device copies for loads.
 *
 * The runtime is loaded at the first create (cudart.c), not linked; every cudaError_t
 * is converted at the module boundary to our codes, with CUDA's own name and words in
 * the message (snap_cuda_err). A machine without the runtime, a driver or a device
 * puts the object in host mode at create: nothing else changes.
 *
 * The pinned pool is anonymous memory pinned with cudaHostRegister rather than
 * cudaHostAlloc: cudaHostAlloc memory is a mapping of the NVIDIA device file, which
 * io_uring refuses to register as fixed buffers on kernels that still check for
 * file-backed memory (EOPNOTSUPP), and which O_DIRECT cannot always pin. Anonymous
 * memory works with both, and cudaHostRegister makes it just as fast for DMA.
 * The registration is "portable" so that every CUDA context sees it as pinned.
 *
 * Built only with CKPT_HAVE_CUDA (CMakeLists.txt); host.c stands in otherwise.
 *
 * Streams are created non-blocking: the copy stream must not synchronise with the
 * legacy default stream, or every copy would wait for the caller's kernels there,
 * also those queued after the save (the next step's forward). What the copies must
 * wait for is exactly the work queued before submit: the save's fence, an event
 * recorded on the caller's stream in the caller's thread (snapshot_fence), which
 * the copy stream waits for before the save's first copy (snap_dev_after).
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "snapshot/snapshot_internal.h"

/* ------------------------------------------------------------------ pinned pool memory */

static void *pinned_alloc(size_t bytes, void *arg)
{
	struct snapshot *sn = arg;
	/* Huge pages: fewer pages to fault, pin and map for DMA, and whole-buffer direct
	 * I/O in few requests. */
	void *m = io_map_buffers(bytes);
	if (!m)
		return NULL;
	cudaError_t e = cudart.HostRegister(m, bytes, cudaHostRegisterPortable);
	sn->pool_pinned = e == cudaSuccess;
	if (e != cudaSuccess) {
		/* Still correct: copies from device memory into pageable memory are staged
		 * by the driver, slower and synchronous with the host. */
		(void)cudart.GetLastError();
		ckpt_log(CKPT_LOG_WARN, "buffer pool of %zu bytes not pinned (cudaHostRegister: %s); "
		         "device copies will be slower", bytes, cudart.GetErrorString(e));
	}
	return m;
}

static void pinned_free(void *p, size_t bytes, void *arg)
{
	struct snapshot *sn = arg;
	if (sn->pool_pinned) {
		cudaError_t e = cudart.HostUnregister(p);
		/* At process exit the runtime may already be gone: the unmap below is what
		 * matters, and the kernel drops the pin with the mapping. */
		if (e != cudaSuccess && e != cudaErrorCudartUnloading)
			ckpt_log(CKPT_LOG_WARN, "buffer pool: cudaHostUnregister: %s",
			         cudart.GetErrorString(e));
		(void)cudart.GetLastError();
		sn->pool_pinned = false;
	}
	io_unmap_buffers(p, bytes);
}

/* ------------------------------------------------------------------ object */

int snapshot_create(struct snapshot **out)
{
	struct snapshot *sn = ckpt_calloc(1, sizeof *sn);
	*out = NULL;
	if (!sn)
		return ckpt_err(-ENOMEM, "snapshot state");
	pthread_mutex_init(&sn->lock, NULL);
	sn->bound = -1;
	sn->home = -1;
	int n = 0;
	cudaError_t e = cudaSuccess;
	if (cudart_load() != 0) {
		/* Logged by cudart_load: this context runs host memory only. */
		ckpt_err_clear();
	} else if ((e = cudart.GetDeviceCount(&n)) != cudaSuccess || n <= 0) {
		(void)cudart.GetLastError();
		ckpt_log(CKPT_LOG_INFO, "no CUDA device (%s): host memory only",
		         e != cudaSuccess ? cudart.GetErrorString(e) : "none found");
	} else if ((e = cudart.GetDevice(&sn->home)) != cudaSuccess) {
		(void)cudart.GetLastError();
		ckpt_log(CKPT_LOG_INFO, "CUDA: cudaGetDevice: %s: host memory only",
		         cudart.GetErrorString(e));
	} else {
		sn->device = true;
		sn->alloc.alloc = pinned_alloc;
		sn->alloc.free = pinned_free;
		sn->alloc.arg = sn;
	}
	*out = sn;
	return 0;
}

void snapshot_destroy(struct snapshot *sn)
{
	if (!sn)
		return;
	/* Errors are ignored: this runs at close, maybe at process exit after the
	 * runtime has unloaded, and there is nobody left to tell. */
	snap_gds_destroy(sn);
	if (!sn->device)
		goto out;          /* the runtime may not even be loaded */
	if (sn->save_stream) {
		cudart.StreamSynchronize(sn->save_stream);
		cudart.StreamDestroy(sn->save_stream);
	}
	if (sn->load_stream) {
		cudart.StreamSynchronize(sn->load_stream);
		cudart.StreamDestroy(sn->load_stream);
	}
	snap_stage_destroy(sn);     /* the save stream is idle: nothing reads the pool */
	for (unsigned i = 0; i < sn->nevents; i++)
		cudart.EventDestroy(sn->events[i]);
	(void)cudart.GetLastError();
out:
	ckpt_free(sn->events);
	pthread_mutex_destroy(&sn->lock);
	ckpt_free(sn);
}

int snapshot_mem_kind(struct snapshot *sn, const void *p, int mem, int *device)
{
	*device = -1;
	if (mem != CKPT_MEM_AUTO && mem != CKPT_MEM_HOST && mem != CKPT_MEM_DEVICE)
		return ckpt_err(-EINVAL, "unknown memory kind %d", mem);
	if (mem == CKPT_MEM_HOST)
		return CKPT_MEM_HOST;
	if (!sn->device) {
		if (mem == CKPT_MEM_DEVICE)
			return ckpt_err(CKPT_ENODEV, "device memory, but no CUDA device is usable here");
		return CKPT_MEM_HOST;
	}
	struct cudaPointerAttributes a;
	memset(&a, 0, sizeof a);
	cudaError_t e = cudart.PointerGetAttributes(&a, p);
	if (e != cudaSuccess) {
		/* Old runtimes fail for memory CUDA never saw: that is host memory. */
		if (mem == CKPT_MEM_AUTO) {
			(void)cudart.GetLastError();
			return CKPT_MEM_HOST;
		}
		return snap_cuda_err(e, "classify pointer %p", p);
	}
	if (a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged) {
		/* Managed memory is copied by the DMA engine too: a host memcpy would
		 * fault every page over to the host. */
		*device = a.device;
		return CKPT_MEM_DEVICE;
	}
	return CKPT_MEM_HOST;
}

int snapshot_bind(struct snapshot *sn, int device)
{
	if (device < 0)
		return 0;
	if (!sn->device)
		return ckpt_err(CKPT_ENODEV, "device memory, but no CUDA device is usable here");
	int rc = 0;
	pthread_mutex_lock(&sn->lock);
	if (sn->bound < 0)
		sn->bound = device;
	else if (sn->bound != device)
		rc = ckpt_err(-EINVAL, "memory on CUDA device %d; this context saves from device %d "
		              "(one device per context)", device, sn->bound);
	pthread_mutex_unlock(&sn->lock);
	return rc;
}

/* Run under sn->lock: make the bound (else home) device current for the creation
 * of streams and events, which belong to the device current at creation. A
 * caller's thread gets its own device back (with_device_end); the save worker,
 * our own thread, keeps the bound device current: since CUDA 12 cudaSetDevice
 * creates the device's primary context, and switching the worker back to device
 * 0 would cost every rank a context on GPU 0. */
static int with_device_begin(struct snapshot *sn, int *prev)
{
	int dev = sn->bound >= 0 ? sn->bound : sn->home;
	cudaError_t e = cudart.GetDevice(prev);
	if (e == cudaSuccess && *prev != dev)
		e = cudart.SetDevice(dev);
	return e == cudaSuccess ? 0 : snap_cuda_err(e, "select CUDA device %d", dev);
}

static void with_device_end(int prev, bool restore)
{
	if (!restore)
		return;
	int cur;
	if (cudart.GetDevice(&cur) == cudaSuccess && cur != prev)
		cudart.SetDevice(prev);
}

static int stream_create(struct snapshot *sn, cudaStream_t *s, const char *what, bool restore)
{
	if (*s)
		return 0;
	int prev, rc = with_device_begin(sn, &prev);
	if (rc)
		return rc;
	cudaError_t e = cudart.StreamCreateWithFlags(s, cudaStreamNonBlocking);
	with_device_end(prev, restore);
	if (e != cudaSuccess) {
		*s = NULL;
		return snap_cuda_err(e, "create the %s stream", what);
	}
	return 0;
}

/* ------------------------------------------------------------------ the fence */

int snapshot_fence(struct snapshot *sn, void *stream, void **fence)
{
	*fence = NULL;
	if (!sn->device)
		return 0;
	pthread_mutex_lock(&sn->lock);
	int dev = sn->bound;          /* set once, never changed after */
	pthread_mutex_unlock(&sn->lock);
	if (dev < 0)
		return 0;
	/* The event belongs to the device current at its creation, and the legacy
	 * default stream (stream NULL) is the current device's: both must be the
	 * tensors' device, which may not be the caller's current one. The caller's
	 * thread gets its own device back. */
	int prev;
	cudaError_t e = cudart.GetDevice(&prev);
	if (e == cudaSuccess && prev != dev)
		e = cudart.SetDevice(dev);
	if (e != cudaSuccess)
		return snap_cuda_err(e, "select CUDA device %d", dev);
	cudaEvent_t ev = NULL;
	int rc = 0;
	/* No timing, no blocking sync: it exists for cudaStreamWaitEvent. */
	e = cudart.EventCreateWithFlags(&ev, cudaEventDisableTiming);
	if (e != cudaSuccess) {
		ev = NULL;
		rc = snap_cuda_err(e, "create the fence event on CUDA device %d", dev);
	} else if ((e = cudart.EventRecord(ev, stream ? (cudaStream_t)stream : cudaStreamLegacy)) !=
	           cudaSuccess) {
		rc = stream
			? snap_cuda_err(e, "record the fence on stream %p (it must be a stream of "
			                "CUDA device %d, the device of the save's tensors)", stream, dev)
			: snap_cuda_err(e, "record the fence on the default stream of CUDA device %d",
			                dev);
		cudart.EventDestroy(ev);
		ev = NULL;
	}
	if (prev != dev)
		cudart.SetDevice(prev);
	*fence = ev;
	return rc;
}

int snap_dev_after(struct snapshot *sn, void *fence)
{
	/* Resolved by the GPU: the worker does not wait, and the copies queued after
	 * this start as soon as the caller's writes are done. */
	cudaError_t e = cudart.StreamWaitEvent(sn->save_stream, (cudaEvent_t)fence, 0);
	return e == cudaSuccess ? 0 : snap_cuda_err(e, "make the snapshot copies wait for the "
	                                            "caller's writes (the fence)");
}

/* ------------------------------------------------------------------ device backend */

int snap_dev_prepare(struct snapshot *sn, unsigned n)
{
	if (!sn->device)
		return ckpt_err(CKPT_ENODEV, "device memory, but no CUDA device is usable here");
	pthread_mutex_lock(&sn->lock);
	int rc = stream_create(sn, &sn->save_stream, "snapshot copy", false);
	if (!rc && n > sn->nevents) {
		cudaEvent_t *ev = ckpt_realloc(sn->events, n * sizeof *ev);
		if (!ev) {
			rc = ckpt_err(-ENOMEM, "%u snapshot events", n);
		} else {
			sn->events = ev;
			int prev;
			if (!(rc = with_device_begin(sn, &prev))) {
				while (sn->nevents < n) {
					/* No cudaEventBlockingSync: with it, recording these events
					 * made issuing the copies wait for them (448 x 16 MiB: 120 ms
					 * on an H200 instead of 1.3 ms), which is the caller's stall.
					 * Waiting on one chunk's event spins for ~0.3 ms at most. */
					cudaError_t e = cudart.EventCreateWithFlags(&ev[sn->nevents],
					        cudaEventDisableTiming);
					if (e != cudaSuccess) {
						rc = snap_cuda_err(e, "create snapshot event %u", sn->nevents);
						break;
					}
					sn->nevents++;
				}
				with_device_end(prev, false);
			}
		}
	}
	pthread_mutex_unlock(&sn->lock);
	return rc;
}

int snap_dev_copy(struct snapshot *sn, void *dst, const void *src, size_t n, unsigned slot)
{
	/* cudaMemcpyDefault: with unified addressing the runtime knows both sides, and
	 * a managed or host source is still copied correctly. */
	cudaError_t e = cudart.MemcpyAsync(dst, src, n, cudaMemcpyDefault, sn->save_stream);
	if (e != cudaSuccess)
		return snap_cuda_err(e, "copy %zu bytes from device memory %p", n, src);
	e = cudart.EventRecord(sn->events[slot], sn->save_stream);
	if (e != cudaSuccess)
		return snap_cuda_err(e, "record the event of snapshot slot %u", slot);
	return 0;
}

int snap_dev_bind_thread(struct snapshot *sn)
{
	pthread_mutex_lock(&sn->lock);
	int dev = sn->bound >= 0 ? sn->bound : sn->home;
	pthread_mutex_unlock(&sn->lock);
	cudaError_t e = cudart.SetDevice(dev);
	return e == cudaSuccess ? 0 : snap_cuda_err(e, "select CUDA device %d for hashing", dev);
}

int snap_dev_wait(struct snapshot *sn, unsigned slot)
{
	cudaError_t e = cudart.EventSynchronize(sn->events[slot]);
	return e == cudaSuccess ? 0 : snap_cuda_err(e, "wait for the copy of snapshot slot %u", slot);
}

int snap_dev_seal(struct snapshot *sn, void **event, void (*landed)(void *), void *arg)
{
	*event = NULL;
	int rc = snap_dev_prepare(sn, 0);
	if (rc)
		return rc;
	cudaEvent_t ev = NULL;
	int prev;
	pthread_mutex_lock(&sn->lock);
	if (!(rc = with_device_begin(sn, &prev))) {
		/* No timing, no blocking sync: it exists for cudaStreamWaitEvent, which the
		 * GPU resolves without the host. */
		cudaError_t e = cudart.EventCreateWithFlags(&ev, cudaEventDisableTiming);
		with_device_end(prev, false);
		if (e != cudaSuccess)
			rc = snap_cuda_err(e, "create the snapshot event");
	}
	pthread_mutex_unlock(&sn->lock);
	if (rc)
		return rc;
	cudaError_t e = cudart.EventRecord(ev, sn->save_stream);
	if (e == cudaSuccess && landed)
		e = cudart.LaunchHostFunc(sn->save_stream, landed, arg);
	if (e != cudaSuccess) {
		rc = snap_cuda_err(e, "record the snapshot event");
		cudart.EventDestroy(ev);
		return rc;
	}
	*event = ev;
	return 0;
}

void snap_dev_quiesce(struct snapshot *sn)
{
	/* Staging copies batched and never launched are dropped: a failed save's, which
	 * the next save must not launch. */
	if (sn->batch) {
		sn->batch->n = 0;
		sn->batch_blocks = 0;
	}
	if (!sn->save_stream)
		return;
	cudaError_t e = cudart.StreamSynchronize(sn->save_stream);
	if (e != cudaSuccess) {
		ckpt_log(CKPT_LOG_ERROR, "snapshot copy stream: %s", cudart.GetErrorString(e));
		(void)cudart.GetLastError();
	}
}

void snapshot_event_destroy(struct snapshot *sn, void *event)
{
	CKPT_UNUSED(sn);
	/* A stream that still waits on it keeps it alive until then (CUDA's rule). */
	if (event)
		cudart.EventDestroy((cudaEvent_t)event);
}

/* ------------------------------------------------------------------ load */

int snapshot_copy_out(struct snapshot *sn, void *dst, const void *src, size_t n, int mem)
{
	if (mem != CKPT_MEM_DEVICE) {
		memcpy(dst, src, n);
		return 0;
	}
	if (!sn->device)
		return ckpt_err(CKPT_ENODEV, "device memory, but no CUDA device is usable here");
	if (!sn->load_stream) {
		pthread_mutex_lock(&sn->lock);
		int rc = stream_create(sn, &sn->load_stream, "load copy", true);
		pthread_mutex_unlock(&sn->lock);
		if (rc)
			return rc;
	}
	/* A chunk read by GPUDirect Storage is also in device memory: copy from there
	 * (device to device) rather than back up from its verified host copy. */
	const uint8_t *s8 = src;
	if (sn->mirror_len && s8 >= sn->mirror_host && n <= sn->mirror_len &&
	    (size_t)(s8 - sn->mirror_host) <= sn->mirror_len - n)
		src = sn->mirror_dev + (s8 - sn->mirror_host);
	cudaError_t e = cudart.MemcpyAsync(dst, src, n, cudaMemcpyDefault, sn->load_stream);
	if (e != cudaSuccess)
		return snap_cuda_err(e, "copy %zu bytes to device memory %p", n, dst);
	sn->load_queued = true;
	return 0;
}

int snapshot_copy_out_wait(struct snapshot *sn)
{
	if (!sn->load_queued)
		return 0;
	sn->load_queued = false;
	cudaError_t e = cudart.StreamSynchronize(sn->load_stream);
	return e == cudaSuccess ? 0 : snap_cuda_err(e, "wait for copies to device memory");
}
