/*
 * cudart.c — the CUDA runtime, loaded on demand (see cudart.h), and the conversion
 * of its errors to ours. The lowest layer of the CUDA path: cuda.c (the snapshot
 * object) and gds.c (GPUDirect Storage) both call down into it, never into each
 * other's internals.
 *
 * The runtime's SONAME carries its major version (libcudart.so.13); a process that
 * already loaded it — a PyTorch job — gets the same copy back from dlopen, so the
 * caller's streams and events are ours to use. When it cannot be loaded the context
 * runs host memory only, as on a machine without a GPU; where the CUDA driver is
 * already in the process (someone uses the GPU) that is a warning naming CKPT_CUDART.
 */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>

#include "snapshot/cudart.h"

#ifndef CKPT_CUDART_SONAME
#define CKPT_CUDART_SONAME "libcudart.so"
#endif

struct cudart_api cudart;

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static int  load_rc;
static char load_why[512];

#define CUDART_STR(x)  #x
#define CUDART_XSTR(x) CUDART_STR(x)
/* The symbol's name after the header's macros (cudaMemcpyAsync may be _ptsz). */
#define CUDART_NAME(f) CUDART_XSTR(cuda##f)

static void load(void)
{
	const char *env = ckpt_env("CKPT_CUDART");
	const char *names[] = { env ? env : CKPT_CUDART_SONAME, env ? NULL : "libcudart.so" };
	void *lib = NULL;
	const char *tried = names[0];
	for (size_t i = 0; i < CKPT_ARRAY_SIZE(names) && names[i] && !lib; i++) {
		lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
		if (!lib)
			snprintf(load_why, sizeof load_why, "%s", dlerror());
	}
	if (!lib) {
		load_rc = CKPT_ENODEV;
		return;
	}
	struct cudart_api t;
	const char *missing = NULL;
#define CUDART_BIND(f)                                                    \
	if (!missing && !(t.f = (__typeof__(t.f))dlsym(lib, CUDART_NAME(f)))) \
		missing = CUDART_NAME(f);
	CKPT_CUDART_FUNCTIONS(CUDART_BIND)
#undef CUDART_BIND
#define CUDART_BIND_OPTIONAL(f) t.f = (__typeof__(t.f))dlsym(lib, CUDART_NAME(f));
	CKPT_CUDART_OPTIONAL(CUDART_BIND_OPTIONAL)
#undef CUDART_BIND_OPTIONAL
	if (missing) {
		snprintf(load_why, sizeof load_why, "%s has no %s", tried, missing);
		dlclose(lib);
		load_rc = CKPT_ENODEV;
		return;
	}
	cudart = t;
	load_rc = 0;
}

int cudart_load(void)
{
	pthread_once(&load_once, load);
	if (load_rc == 0)
		return 0;
	/* The driver in the process means the caller uses the GPU: host-only would be a
	 * surprise there, so say it loudly; elsewhere it is the normal CPU-only case. */
	void *drv = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
	if (drv)
		dlclose(drv);
	ckpt_log(drv ? CKPT_LOG_WARN : CKPT_LOG_INFO,
	         "CUDA runtime not loaded (%s): host memory only; CKPT_CUDART names the "
	         "runtime library to load", load_why);
	return ckpt_err(CKPT_ENODEV, "CUDA runtime not loaded (%s)", load_why);
}

int snap_cuda_err(cudaError_t e, const char *fmt_what, ...)
{
	char what[512];
	va_list ap;
	va_start(ap, fmt_what);
	vsnprintf(what, sizeof what, fmt_what, ap);
	va_end(ap);
	(void)cudart.GetLastError();
	int code;
	switch (e) {
	case cudaErrorMemoryAllocation:   code = -ENOMEM; break;
	case cudaErrorInvalidValue:       code = -EINVAL; break;
	case cudaErrorNoDevice:
	case cudaErrorInsufficientDriver:
	case cudaErrorInvalidDevice:
	case cudaErrorDevicesUnavailable: code = CKPT_ENODEV; break;
	default:                          code = -EIO; break;
	}
	return ckpt_err(code, "%s: CUDA %s (%s)", what, cudart.GetErrorName(e),
	                cudart.GetErrorString(e));
}
