/*
 * bench_gpu_ckpt.c — libckpt on GPU state, with the public API only (ckpt.h,
 * ckpt/cuda.h): the benchmark model of L layers x [bf16 R x C + three fp32 R x C]
 * (default 16 x 4096 x 8192: 7 GiB) in device memory. Prints one JSON object.
 *
 *   bench_gpu_ckpt --root DIR [--pool-bytes N (8G)] [--layers L] [--rows R] [--cols C]
 *                  [--queue-depth D] [--chunk-bytes N]
 *
 * Measured, in this order:
 *   open          ckpt_open, i.e. allocating and pinning the pool (not a save cost)
 *   warm-up       a 16 MiB save (creates the io_uring engine, streams and events)
 *   save A        begin .. submit .. ckpt_save_wait_snapshot (the snapshot point: the
 *                 caller may modify its tensors) .. ckpt_save_wait (durable+committed)
 *   load          every tensor of A into a second set of device tensors
 *                 (one ckpt_load_tensors batch with CKPT_MEM_DEVICE), then verified bit-exact
 *                 against the originals; if this libckpt's load does not take device
 *                 destinations yet (CKPT_ENODEV) the load goes through a pinned host
 *                 buffer and cudaMemcpy, and "load_mode" says "staged"
 *   save B        the same with the snapshot event: the host-visible stall is begin ..
 *                 the optimizer stream waiting on the event; the optimizer stream then
 *                 rewrites the weights; the event's completion and durability follow
 *   rss           VmHWM growth over the RSS before ckpt_open, read after both saves
 *   gds_*         whether GPUDirect Storage served (CKPT_GDS in the environment) and
 *                 how many chunks cuFile read and wrote
 * Exit 77 without a device.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "ckpt/ckpt.h"
#include "ckpt/cuda.h"

#define FAIL(...) do { fprintf(stderr, "bench_gpu_ckpt: " __VA_ARGS__); fputc('\n', stderr); exit(1); } while (0)
#define CUDA_OK(call) do {                                                           \
	cudaError_t e_ = (call);                                                         \
	if (e_ != cudaSuccess) FAIL("%s: %s", #call, cudaGetErrorString(e_));             \
} while (0)
#define CKPT_OK(call) do {                                                           \
	int rc_ = (call);                                                                \
	if (rc_) FAIL("%s: %s: %s", #call, ckpt_strerror(rc_), ckpt_last_error());   \
} while (0)

#define FILL_BYTES (64u << 20)

struct tensor {
	char     name[64];
	int      dtype;
	uint64_t shape[2];
	size_t   bytes;
	void    *dev;        /* the state */
	void    *dst;        /* load destination */
};

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* kB field of /proc/self/status, in bytes. */
static uint64_t status_bytes(const char *field)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	uint64_t v = 0;
	size_t n = strlen(field);
	while (f && fgets(line, sizeof line, f))
		if (!strncmp(line, field, n) && line[n] == ':')
			v = strtoull(line + n + 1, NULL, 10) * 1024;
	if (f)
		fclose(f);
	return v;
}

static uint64_t parse_size(const char *s)
{
	char *end;
	double v = strtod(s, &end);
	switch (*end) {
	case 'k': case 'K': v *= 1024.0; break;
	case 'm': case 'M': v *= 1048576.0; break;
	case 'g': case 'G': v *= 1073741824.0; break;
	case 't': case 'T': v *= 1099511627776.0; break;
	default: break;
	}
	return (uint64_t)v;
}

static ckpt_save *save_begin_all(ckpt_ctx *c, uint64_t step, struct tensor *ts, int n)
{
	ckpt_save *s;
	CKPT_OK(ckpt_save_begin(c, step, &s));
	for (int i = 0; i < n; i++) {
		struct ckpt_tensor t = {
			.name = ts[i].name, .kind = i % 4 ? CKPT_KIND_OPTIMIZER : CKPT_KIND_MODEL,
			.dtype = ts[i].dtype, .policy = CKPT_SHARDED, .ndim = 2,
			.global_shape = ts[i].shape, .data = ts[i].dev, .mem = CKPT_MEM_AUTO,
		};
		CKPT_OK(ckpt_save_add_tensor(s, &t));
	}
	return s;
}

int main(int argc, char **argv)
{
	const char *root = NULL;
	uint64_t pool = 8ull << 30, chunk = 0;
	unsigned layers = 16, qd = 0;
	uint64_t rows = 4096, cols = 8192;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (!strcmp(a, "--help")) {
			printf("usage: bench_gpu_ckpt --root DIR [--pool-bytes N] [--layers L] [--rows R] "
			       "[--cols C] [--queue-depth D] [--chunk-bytes N]\n");
			return 0;
		}
		if (!v)
			FAIL("%s needs a value", a);
		if (!strcmp(a, "--root")) root = v;
		else if (!strcmp(a, "--pool-bytes")) pool = parse_size(v);
		else if (!strcmp(a, "--chunk-bytes")) chunk = parse_size(v);
		else if (!strcmp(a, "--layers")) layers = (unsigned)atoi(v);
		else if (!strcmp(a, "--rows")) rows = strtoull(v, NULL, 10);
		else if (!strcmp(a, "--cols")) cols = strtoull(v, NULL, 10);
		else if (!strcmp(a, "--queue-depth")) qd = (unsigned)atoi(v);
		else FAIL("unknown option %s", a);
		i++;
	}
	if (!root)
		FAIL("--root DIR is required");
	int ndev = 0;
	if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
		printf("SKIP bench_gpu_ckpt: no CUDA device\n");
		return 77;
	}
	CUDA_OK(cudaSetDevice(0));
	struct cudaDeviceProp prop;
	CUDA_OK(cudaGetDeviceProperties(&prop, 0));

	/* The state, filled from one random pinned buffer at a different phase per
	 * tensor, so that no two tensors hold the same bytes. */
	int n = (int)layers * 4;
	struct tensor *ts = calloc((size_t)n, sizeof *ts);
	uint8_t *fill;
	CUDA_OK(cudaHostAlloc((void **)&fill, FILL_BYTES, cudaHostAllocDefault));
	uint64_t x = 0x9E3779B97F4A7C15ull;
	for (size_t i = 0; i < FILL_BYTES / 8; i++) {
		x ^= x << 13; x ^= x >> 7; x ^= x << 17;
		memcpy(fill + 8 * i, &x, 8);
	}
	uint64_t total = 0;
	for (int i = 0; i < n; i++) {
		struct tensor *t = &ts[i];
		static const char *kinds[4] = { "weight", "master", "exp_avg", "exp_avg_sq" };
		snprintf(t->name, sizeof t->name, "layers.%d.%s", i / 4, kinds[i % 4]);
		t->dtype = i % 4 ? CKPT_F32 : CKPT_BF16;
		t->shape[0] = rows;
		t->shape[1] = cols;
		t->bytes = (size_t)(rows * cols * ckpt_dtype_size(t->dtype));
		CUDA_OK(cudaMalloc(&t->dev, t->bytes));
		size_t phase = ((size_t)i * 4099 * 8) % (FILL_BYTES / 2);
		for (size_t off = 0; off < t->bytes; off += FILL_BYTES / 2) {
			size_t len = t->bytes - off < FILL_BYTES / 2 ? t->bytes - off : FILL_BYTES / 2;
			CUDA_OK(cudaMemcpy((uint8_t *)t->dev + off, fill + phase, len, cudaMemcpyHostToDevice));
		}
		total += t->bytes;
	}
	CUDA_OK(cudaDeviceSynchronize());
	cudaStream_t opt;
	CUDA_OK(cudaStreamCreateWithFlags(&opt, cudaStreamNonBlocking));

	uint64_t rss0 = status_bytes("VmRSS");
	struct ckpt_opts o;
	ckpt_opts_init(&o, sizeof o);
	o.root = root;
	o.rank = 0;
	o.world = 1;
	o.pool_bytes = pool;
	o.chunk_bytes = chunk;
	o.queue_depth = qd;
	ckpt_ctx *c;
	double t0 = now();
	CKPT_OK(ckpt_open(&o, &c));
	double open_s = now() - t0;
	if (ckpt_cuda_available(c) != 1)
		FAIL("a device is present but libckpt works on host memory only");

	/* Warm-up: 16 MiB of the first tensor. */
	{
		ckpt_save *s;
		CKPT_OK(ckpt_save_begin(c, 1, &s));
		uint64_t shape[1] = { 16u << 20 };
		struct ckpt_tensor t = {
			.name = "warmup", .kind = CKPT_KIND_EXTRA, .dtype = CKPT_U8,
			.policy = CKPT_SHARDED, .ndim = 1, .global_shape = shape, .data = ts[0].dev,
			.mem = CKPT_MEM_AUTO,
		};
		CKPT_OK(ckpt_save_add_tensor(s, &t));
		CKPT_OK(ckpt_save_submit(s));
		CKPT_OK(ckpt_save_wait(s, -1));
		ckpt_save_free(s);
	}

	/* Save A: the host waits for the snapshot point. */
	t0 = now();
	ckpt_save *s = save_begin_all(c, 2, ts, n);
	CKPT_OK(ckpt_save_submit(s));
	CKPT_OK(ckpt_save_wait_snapshot(s, -1));
	double a_snap = now() - t0;
	CKPT_OK(ckpt_save_wait(s, -1));
	double a_durable = now() - t0;
	struct ckpt_save_stats st = { .size = sizeof st };
	CKPT_OK(ckpt_save_stats(s, &st));
	ckpt_save_free(s);

	/* Save B: the optimizer stream waits on the snapshot event; the host does not. */
	t0 = now();
	s = save_begin_all(c, 3, ts, n);
	CKPT_OK(ckpt_save_submit(s));
	cudaEvent_t ev;
	CKPT_OK(ckpt_save_snapshot_event(s, &ev));
	CUDA_OK(cudaStreamWaitEvent(opt, ev, 0));
	double b_stall = now() - t0;
	/* The optimizer step rewrites what was saved, behind the event. */
	for (int i = 0; i < n; i++)
		CUDA_OK(cudaMemsetAsync(ts[i].dev, 0x11, ts[i].bytes, opt));
	CUDA_OK(cudaEventSynchronize(ev));
	double b_event = now() - t0;
	CKPT_OK(ckpt_save_wait(s, -1));
	double b_durable = now() - t0;
	CUDA_OK(cudaStreamSynchronize(opt));
	ckpt_save_free(s);
	uint64_t hwm = status_bytes("VmHWM");

	/* Load A to the device, then verify against the originals of A, which the
	 * optimizer step of B has overwritten: refill them from the same source. */
	for (int i = 0; i < n; i++)
		CUDA_OK(cudaMalloc(&ts[i].dst, ts[i].bytes));
	const char *mode = "device";
	void *staging = NULL;
	ckpt_load *l;
	t0 = now();
	CKPT_OK(ckpt_load_open(c, 2, &l));
	/* All tensors in one batch, as a restore loads them: the reads of every tensor are
	 * in flight together. */
	struct ckpt_load_req *reqs = calloc((size_t)n, sizeof *reqs);
	if (!reqs)
		FAIL("out of memory");
	for (int i = 0; i < n; i++)
		reqs[i] = (struct ckpt_load_req){ .name = ts[i].name, .dtype = ts[i].dtype, .ndim = 2,
		                                  .dst = ts[i].dst, .mem = CKPT_MEM_DEVICE,
		                                  .saved_rank = -1 };
	int brc = ckpt_load_tensors(l, reqs, (size_t)n, NULL);
	free(reqs);
	if (brc && brc != CKPT_ENODEV)
		FAIL("load: %s", ckpt_last_error());
	for (int i = 0; brc && i < n; i++) {
		int rc = brc;
		if (rc == CKPT_ENODEV && i == 0) {
			/* This libckpt's load does not take device destinations yet. */
			mode = "staged";
			fprintf(stderr, "bench_gpu_ckpt: load to device: %s; staging through pinned "
			        "host memory\n", ckpt_last_error());
			CUDA_OK(cudaHostAlloc(&staging, ts[1].bytes > ts[0].bytes ? ts[1].bytes : ts[0].bytes,
			                      cudaHostAllocDefault));
		}
		if (staging) {
			CKPT_OK(ckpt_load_tensor(l, ts[i].name, ts[i].dtype, 2, NULL, NULL, staging,
			                         CKPT_MEM_HOST));
			CUDA_OK(cudaMemcpy(ts[i].dst, staging, ts[i].bytes, cudaMemcpyHostToDevice));
		} else if (rc) {
			FAIL("load '%s': %s", ts[i].name, ckpt_last_error());
		}
	}
	CUDA_OK(cudaDeviceSynchronize());
	double load_s = now() - t0;
	ckpt_load_close(l);
	if (staging)
		CUDA_OK(cudaFreeHost(staging));

	bool verified = true;
	uint8_t *h1 = malloc(FILL_BYTES / 2), *h2 = malloc(FILL_BYTES / 2);
	for (int i = 0; i < n && verified; i++) {
		size_t phase = ((size_t)i * 4099 * 8) % (FILL_BYTES / 2);
		for (size_t off = 0; off < ts[i].bytes && verified; off += FILL_BYTES / 2) {
			size_t len = ts[i].bytes - off < FILL_BYTES / 2 ? ts[i].bytes - off : FILL_BYTES / 2;
			CUDA_OK(cudaMemcpy(h2, (uint8_t *)ts[i].dst + off, len, cudaMemcpyDeviceToHost));
			memcpy(h1, fill + phase, len);
			if (memcmp(h1, h2, len)) {
				fprintf(stderr, "bench_gpu_ckpt: '%s' differs after the load (offset %zu)\n",
				        ts[i].name, off);
				verified = false;
			}
		}
	}
	free(h1);
	free(h2);
	struct ckpt_gds_stats gs = { .size = sizeof gs };
	CKPT_OK(ckpt_gds_stats(c, &gs));
	ckpt_close(c);

	printf("{\"device\": \"%s\", \"tensors\": %d, \"bytes\": %llu, \"pool_bytes\": %llu, "
	       "\"open_s\": %.4f, \"save_snapshot_s\": %.4f, \"save_durable_s\": %.4f, "
	       "\"stats_snapshot_s\": %.4f, \"stats_durable_s\": %.4f, \"stats_commit_s\": %.4f, "
	       "\"event_stall_s\": %.6f, \"event_complete_s\": %.4f, \"event_save_durable_s\": %.4f, "
	       "\"load_s\": %.4f, \"load_mode\": \"%s\", \"verified\": %s, "
	       "\"rss_before_open\": %llu, \"rss_peak\": %llu, \"rss_growth\": %llu, "
	       "\"gds_active\": %d, \"gds_chunks_read\": %llu, \"gds_chunks_written\": %llu}\n",
	       prop.name, n, (unsigned long long)total, (unsigned long long)pool, open_s, a_snap,
	       a_durable, st.snapshot_seconds, st.durable_seconds, st.commit_seconds, b_stall,
	       b_event, b_durable, load_s, mode, verified ? "true" : "false",
	       (unsigned long long)rss0, (unsigned long long)hwm,
	       (unsigned long long)(hwm > rss0 ? hwm - rss0 : 0), gs.active,
	       (unsigned long long)gs.chunks_read, (unsigned long long)gs.chunks_written);
	for (int i = 0; i < n; i++) {
		cudaFree(ts[i].dev);
		cudaFree(ts[i].dst);
	}
	cudaFreeHost(fill);
	free(ts);
	return verified ? 0 : 1;
}
