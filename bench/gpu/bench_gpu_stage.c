/*
 * bench_gpu_stage.c — the device staging pool and incremental saves on GPU state,
 * with the public API only: the benchmark model of L layers x [bf16 R x C + three
 * fp32 R x C] (default 16 x 4096 x 8192: 7 GiB) in device memory. Prints one JSON
 * object.
 *
 *   bench_gpu_stage --root DIR [--pool-bytes N (8G)] [--layers L] [--rows R] [--cols C]
 *                   [--fill random|model] [--changed FRACTION (0.1)] [--phases LIST]
 *                   [--repeat N (5)]
 *
 * --fill model fills the tensors like a trained model's (bf16 and fp32 weights
 * gaussian with sigma 0.02, Adam's first moment gaussian with sigma 1e-3, the second
 * moment the square of one with sigma 1e-3), for the compression phase; random
 * (default) with uniformly random bytes.
 *
 * Phases (comma-separated, default d2d,pinned,staged,incr,incr_host):
 *   d2d        the device-to-device copy of every tensor into a second set, timed by
 *              events on one stream: the bandwidth the staging copies can have
 *   pinned     a save without a device pool, the caller's stream waiting on the
 *              snapshot event: "modify" = from an event recorded on that stream
 *              just before submit to one recorded after its wait (GPU time: when
 *              the stream may write the tensors again), the host-visible stall
 *              (begin .. the wait queued), durable
 *   staged     the same with a device pool of the state + 64 MiB (one warm-up save
 *              first: it allocates the pool; then --repeat timed saves, the older
 *              steps removed before each: the one of median stall is reported,
 *              with every save's stall and modify), and the device memory the process
 *              holds beyond its tensors, with it and (pinned, whose context is
 *              still open then) without it: the difference is the pool's
 *   incr       incremental saves with the device pool: a save whose every chunk
 *              changed (the full save), then one in which --changed of the bytes
 *              changed (whole tensors, the first ones, as in a fine-tune that trains
 *              some layers): durable times, bytes written, referenced, found
 *              unchanged on the device
 *   incr_host  the same without the device pool (compared on the host after the copy)
 *   compress   a save with CKPT_COMPRESS as set in the environment (e.g.
 *              bytegroup): durable, stored / logical bytes per dtype and kind
 * Also, over all phases: the peak host RSS (VmHWM) against the RSS before the first
 * context was opened, for host RSS <= host pool + 64 MiB. Exit 77 without a device.
 */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "ckpt/ckpt.h"
#include "ckpt/catalog.h"
#include "ckpt/cuda.h"

#include "../bench_gen.h"

#define FAIL(...) do { fprintf(stderr, "bench_gpu_stage: " __VA_ARGS__); fputc('\n', stderr); exit(1); } while (0)
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
	int      dtype, kind;
	uint64_t shape[2];
	size_t   bytes;
	void    *dev;
};

static struct tensor *ts;
static int nts;
static uint64_t total;
static cudaStream_t opt;
static uint8_t *fills[4];          /* pinned, one per kind of tensor */

static double now(void)
{
	struct timespec ts_;
	clock_gettime(CLOCK_MONOTONIC, &ts_);
	return (double)ts_.tv_sec + (double)ts_.tv_nsec / 1e9;
}

static uint64_t parse_size(const char *s)
{
	char *end;
	double v = strtod(s, &end);
	switch (*end) {
	case 'k': case 'K': v *= 1024.0; break;
	case 'm': case 'M': v *= 1048576.0; break;
	case 'g': case 'G': v *= 1073741824.0; break;
	default: break;
	}
	return (uint64_t)v;
}

/* FILL_BYTES of kind k's values (0 bf16 weights, 1 fp32 master weights, 2 exp_avg,
 * 3 exp_avg_sq), or random bytes. */
static void make_fill(uint8_t *f, int k, bool model)
{
	uint64_t s = 0x1234567ull + (uint64_t)k * 7919;
	if (!model) {
		for (size_t i = 0; i < FILL_BYTES / 8; i++) {
			uint64_t x = rnd(&s);
			memcpy(f + 8 * i, &x, 8);
		}
		return;
	}
	if (k == 0) {
		for (size_t i = 0; i < FILL_BYTES / 2; i++) {
			float v = (float)(0.02 * gauss(&s));
			uint32_t b;
			memcpy(&b, &v, 4);
			uint16_t h = (uint16_t)((b + 0x7FFF + ((b >> 16) & 1)) >> 16);
			memcpy(f + 2 * i, &h, 2);
		}
		return;
	}
	for (size_t i = 0; i < FILL_BYTES / 4; i++) {
		double g = gauss(&s);
		float v = k == 1 ? (float)(0.02 * g) : k == 2 ? (float)(1e-3 * g) : (float)(1e-6 * g * g);
		memcpy(f + 4 * i, &v, 4);
	}
}

/* Tensor i from its kind's fill at a phase of its own (seed varies it further). */
static void refill(int i, unsigned seed)
{
	struct tensor *t = &ts[i];
	size_t phase = (((size_t)i * 4099 + seed * 131) * 8) % (FILL_BYTES / 2);
	for (size_t off = 0; off < t->bytes; off += FILL_BYTES / 2) {
		size_t len = t->bytes - off < FILL_BYTES / 2 ? t->bytes - off : FILL_BYTES / 2;
		CUDA_OK(cudaMemcpy((uint8_t *)t->dev + off, fills[i % 4] + phase, len,
		                   cudaMemcpyHostToDevice));
	}
}

static ckpt_ctx *open_ctx(const char *root, uint64_t pool, uint64_t dpool)
{
	struct ckpt_opts o;
	ckpt_opts_init(&o, sizeof o);
	o.root = root;
	o.rank = 0;
	o.world = 1;
	o.pool_bytes = pool;
	o.device_pool_bytes = dpool;
	ckpt_ctx *c;
	CKPT_OK(ckpt_open(&o, &c));
	if (ckpt_cuda_available(c) != 1)
		FAIL("a device is present but libckpt works on host memory only");
	return c;
}

static ckpt_save *begin_all(ckpt_ctx *c, uint64_t step, int incremental)
{
	ckpt_save *s;
	CKPT_OK(ckpt_save_begin(c, step, &s));
	CKPT_OK(ckpt_save_set_incremental(s, incremental));
	for (int i = 0; i < nts; i++) {
		struct ckpt_tensor t = {
			.name = ts[i].name, .kind = ts[i].kind, .dtype = ts[i].dtype,
			.policy = CKPT_SHARDED, .ndim = 2, .global_shape = ts[i].shape,
			.data = ts[i].dev, .mem = CKPT_MEM_AUTO,
		};
		CKPT_OK(ckpt_save_add_tensor(s, &t));
	}
	return s;
}

struct evsave {
	double modify_s, stall_s, durable_s, snapshot_s;
	struct ckpt_save_stats st;
};

/* A save with the caller's stream waiting on the snapshot event. */
static struct evsave event_save(ckpt_ctx *c, uint64_t step, int incremental)
{
	struct evsave r;
	cudaEvent_t e0, e1;
	CUDA_OK(cudaEventCreate(&e0));
	CUDA_OK(cudaEventCreate(&e1));
	CUDA_OK(cudaStreamSynchronize(opt));
	double t0 = now();
	ckpt_save *s = begin_all(c, step, incremental);
	CKPT_OK(ckpt_save_set_stream(s, opt));
	CUDA_OK(cudaEventRecord(e0, opt));
	CKPT_OK(ckpt_save_submit(s));
	cudaEvent_t ev;
	CKPT_OK(ckpt_save_snapshot_event(s, &ev));
	CUDA_OK(cudaStreamWaitEvent(opt, ev, 0));
	r.stall_s = now() - t0;
	CUDA_OK(cudaEventRecord(e1, opt));
	CUDA_OK(cudaEventSynchronize(e1));
	float ms = 0;
	CUDA_OK(cudaEventElapsedTime(&ms, e0, e1));
	r.modify_s = ms / 1e3;
	CKPT_OK(ckpt_save_wait(s, -1));
	r.durable_s = now() - t0;
	r.st = (struct ckpt_save_stats){ .size = sizeof r.st };
	CKPT_OK(ckpt_save_stats(s, &r.st));
	r.snapshot_s = r.st.snapshot_seconds;
	ckpt_save_free(s);
	CUDA_OK(cudaEventDestroy(e0));
	CUDA_OK(cudaEventDestroy(e1));
	return r;
}

static void print_ev(const char *name, const struct evsave *r)
{
	printf("\"%s\": {\"modify_s\": %.6f, \"stall_s\": %.6f, \"snapshot_s\": %.6f, "
	       "\"durable_s\": %.4f, \"stored_bytes\": %llu, \"referenced_bytes\": %llu, "
	       "\"device_staged_bytes\": %llu, \"device_unchanged_bytes\": %llu}, ", name,
	       r->modify_s, r->stall_s, r->snapshot_s, r->durable_s,
	       (unsigned long long)r->st.stored_bytes, (unsigned long long)r->st.referenced_bytes,
	       (unsigned long long)r->st.device_staged_bytes,
	       (unsigned long long)r->st.device_unchanged_bytes);
}

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

static size_t device_used(void)
{
	size_t fr, tot;
	CUDA_OK(cudaMemGetInfo(&fr, &tot));
	return tot - fr;
}

/* The incremental pair: everything changed (full), then the first tensors up to
 * frac of the bytes changed. */
static void incr_pair(const char *root, uint64_t pool, uint64_t dpool, double frac,
                      const char *name, unsigned *seed)
{
	ckpt_ctx *c = open_ctx(root, pool, dpool);
	for (int i = 0; i < nts; i++)
		refill(i, ++*seed);
	struct evsave w = event_save(c, 100, 1);      /* warm-up: the pool, the kernel */
	for (int i = 0; i < nts; i++)
		refill(i, ++*seed);
	CUDA_OK(cudaDeviceSynchronize());
	struct evsave full = event_save(c, 101, 1);
	uint64_t changed = 0;
	for (int i = 0; i < nts && changed < (uint64_t)(frac * (double)total); i++) {
		refill(i, ++*seed);
		changed += ts[i].bytes;
	}
	CUDA_OK(cudaDeviceSynchronize());
	struct evsave inc = event_save(c, 102, 1);
	ckpt_close(c);
	(void)w;
	printf("\"%s\": {\"changed_bytes\": %llu, ", name, (unsigned long long)changed);
	print_ev("full", &full);
	print_ev("step", &inc);
	printf("\"durable_ratio\": %.4f, \"written_fraction\": %.4f}, ", inc.durable_s / full.durable_s,
	       (double)inc.st.stored_bytes / (double)total);
}

static bool has(const char *list, const char *p)
{
	size_t n = strlen(p);
	for (const char *q = list; (q = strstr(q, p)); q += n)
		if ((q == list || q[-1] == ',') && (q[n] == ',' || !q[n]))
			return true;
	return false;
}

int main(int argc, char **argv)
{
	const char *root = NULL, *phases = "d2d,pinned,staged,incr,incr_host", *fill = "random";
	uint64_t pool = 8ull << 30;
	unsigned layers = 16;
	uint64_t rows = 4096, cols = 8192;
	double frac = 0.1;
	int repeat = 5;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (!strcmp(a, "--help")) {
			printf("usage: bench_gpu_stage --root DIR [--pool-bytes N] [--layers L] [--rows R] "
			       "[--cols C] [--fill random|model] [--changed F] [--phases LIST] "
			       "[--repeat N]\n");
			return 0;
		}
		if (!v)
			FAIL("%s needs a value", a);
		if (!strcmp(a, "--root")) root = v;
		else if (!strcmp(a, "--pool-bytes")) pool = parse_size(v);
		else if (!strcmp(a, "--layers")) layers = (unsigned)atoi(v);
		else if (!strcmp(a, "--rows")) rows = strtoull(v, NULL, 10);
		else if (!strcmp(a, "--cols")) cols = strtoull(v, NULL, 10);
		else if (!strcmp(a, "--fill")) fill = v;
		else if (!strcmp(a, "--changed")) frac = atof(v);
		else if (!strcmp(a, "--phases")) phases = v;
		else if (!strcmp(a, "--repeat")) repeat = atoi(v);
		else FAIL("unknown option %s", a);
		i++;
	}
	if (!root)
		FAIL("--root DIR is required");
	if (repeat < 1 || repeat > 16)
		FAIL("--repeat takes 1 to 16");
	int ndev = 0;
	if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
		printf("SKIP bench_gpu_stage: no CUDA device\n");
		return 77;
	}
	CUDA_OK(cudaSetDevice(0));
	struct cudaDeviceProp prop;
	CUDA_OK(cudaGetDeviceProperties(&prop, 0));
	bool model = !strcmp(fill, "model");
	for (int k = 0; k < 4; k++) {
		CUDA_OK(cudaHostAlloc((void **)&fills[k], FILL_BYTES, cudaHostAllocDefault));
		make_fill(fills[k], k, model);
	}
	nts = (int)layers * 4;
	ts = calloc((size_t)nts, sizeof *ts);
	for (int i = 0; i < nts; i++) {
		struct tensor *t = &ts[i];
		static const char *kinds[4] = { "weight", "master", "exp_avg", "exp_avg_sq" };
		snprintf(t->name, sizeof t->name, "layers.%d.%s", i / 4, kinds[i % 4]);
		t->dtype = i % 4 ? CKPT_F32 : CKPT_BF16;
		t->kind = i % 4 >= 2 ? CKPT_KIND_OPTIMIZER : CKPT_KIND_MODEL;
		t->shape[0] = rows;
		t->shape[1] = cols;
		t->bytes = (size_t)(rows * cols * ckpt_dtype_size(t->dtype));
		CUDA_OK(cudaMalloc(&t->dev, t->bytes));
		refill(i, 0);
		total += t->bytes;
	}
	CUDA_OK(cudaDeviceSynchronize());
	CUDA_OK(cudaStreamCreateWithFlags(&opt, cudaStreamNonBlocking));
	size_t used0 = device_used(), pinned_use = 0;
	/* Host memory: the peak over every phase's context against the RSS before the
	 * first (the tensors and the CUDA context are already there). */
	uint64_t rss0 = status_bytes("VmRSS");
	unsigned seed = 0;
	char dir[4096];

	printf("{\"device\": \"%s\", \"tensors\": %d, \"bytes\": %llu, \"pool_bytes\": %llu, "
	       "\"fill\": \"%s\", ", prop.name, nts, (unsigned long long)total,
	       (unsigned long long)pool, fill);
	if (has(phases, "d2d")) {
		void **dst = calloc((size_t)nts, sizeof *dst);
		for (int i = 0; i < nts; i++)
			CUDA_OK(cudaMalloc(&dst[i], ts[i].bytes));
		cudaEvent_t e0, e1;
		CUDA_OK(cudaEventCreate(&e0));
		CUDA_OK(cudaEventCreate(&e1));
		float best = 1e30f;
		for (int rep = 0; rep < 3; rep++) {
			CUDA_OK(cudaEventRecord(e0, opt));
			for (int i = 0; i < nts; i++)
				CUDA_OK(cudaMemcpyAsync(dst[i], ts[i].dev, ts[i].bytes,
				                        cudaMemcpyDeviceToDevice, opt));
			CUDA_OK(cudaEventRecord(e1, opt));
			CUDA_OK(cudaEventSynchronize(e1));
			float ms;
			CUDA_OK(cudaEventElapsedTime(&ms, e0, e1));
			if (ms < best)
				best = ms;
		}
		for (int i = 0; i < nts; i++)
			CUDA_OK(cudaFree(dst[i]));
		free(dst);
		printf("\"d2d_s\": %.6f, \"d2d_Bps\": %.0f, ", best / 1e3, (double)total / (best / 1e3));
	}
	if (has(phases, "pinned")) {
		snprintf(dir, sizeof dir, "%s/pinned", root);
		ckpt_ctx *c = open_ctx(dir, pool, 0);
		struct evsave w = event_save(c, 1, 0);
		(void)w;
		struct evsave r = event_save(c, 2, 0);
		pinned_use = device_used() - used0;
		ckpt_close(c);
		print_ev("pinned", &r);
	}
	if (has(phases, "staged")) {
		snprintf(dir, sizeof dir, "%s/staged", root);
		uint64_t dpool = total + (64u << 20);
		ckpt_ctx *c = open_ctx(dir, pool, dpool);
		struct evsave w = event_save(c, 1, 0);
		(void)w;
		size_t used1 = device_used(), used2 = 0;
		struct evsave rs[16];
		for (int k = 0; k < repeat; k++) {
			struct ckpt_gc_opts go;
			ckpt_gc_opts_init(&go, sizeof go);
			go.keep_last = 1;
			struct ckpt_gc_result gr = { .size = sizeof gr };
			CKPT_OK(ckpt_catalog_gc(c, &go, &gr));
			rs[k] = event_save(c, 2 + (uint64_t)k, 0);
			size_t u = device_used();
			used2 = u > used2 ? u : used2;
		}
		ckpt_close(c);
		/* The median by stall (insertion sort of indexes). */
		int ix[16];
		for (int k = 0; k < repeat; k++) {
			int j = k;
			while (j > 0 && rs[ix[j - 1]].stall_s > rs[k].stall_s) {
				ix[j] = ix[j - 1];
				j--;
			}
			ix[j] = k;
		}
		print_ev("staged", &rs[ix[repeat / 2]]);
		printf("\"staged_runs\": [");
		for (int k = 0; k < repeat; k++)
			printf("%s{\"stall_s\": %.6f, \"modify_s\": %.6f}", k ? ", " : "", rs[k].stall_s,
			       rs[k].modify_s);
		printf("], ");
		size_t peak = used1 > used2 ? used1 : used2;
		/* What the pool adds to what a context uses on the device without one (its
		 * streams and events: the pinned phase's figure). */
		printf("\"device_pool_bytes\": %llu, \"device_use_beyond_state\": %llu, "
		       "\"device_use_without_pool\": %llu, \"device_use_of_pool\": %lld, ",
		       (unsigned long long)dpool, (unsigned long long)(peak - used0),
		       (unsigned long long)pinned_use,
		       pinned_use ? (long long)(peak - used0) - (long long)pinned_use : -1ll);
	}
	if (has(phases, "incr")) {
		snprintf(dir, sizeof dir, "%s/incr", root);
		incr_pair(dir, pool, total + (64u << 20), frac, "incr", &seed);
	}
	if (has(phases, "incr_host")) {
		snprintf(dir, sizeof dir, "%s/incr_host", root);
		incr_pair(dir, pool, 0, frac, "incr_host", &seed);
	}
	if (has(phases, "compress")) {
		snprintf(dir, sizeof dir, "%s/compress", root);
		ckpt_ctx *c = open_ctx(dir, pool, 0);
		struct evsave w = event_save(c, 1, 0);
		(void)w;
		struct evsave r = event_save(c, 2, 0);
		print_ev("compress", &r);
		ckpt_load *l;
		CKPT_OK(ckpt_load_open(c, 2, &l));
		uint64_t lg[4] = { 0 }, st[4] = { 0 };
		int n = ckpt_load_count(l);
		for (int i = 0; i < n; i++) {
			struct ckpt_tensor_info ti;
			CKPT_OK(ckpt_load_info(l, (unsigned)i, &ti, sizeof ti));
			int k = strstr(ti.name, "exp_avg_sq") ? 3 : strstr(ti.name, "exp_avg") ? 2 :
			        strstr(ti.name, "master") ? 1 : 0;
			lg[k] += ti.logical_bytes;
			st[k] += ti.stored_bytes;
		}
		ckpt_load_close(l);
		ckpt_close(c);
		const char *kn[4] = { "bf16_weight", "f32_master", "f32_exp_avg", "f32_exp_avg_sq" };
		printf("\"compress_codec\": \"%s\", \"ratio\": {", getenv("CKPT_COMPRESS") ?
		       getenv("CKPT_COMPRESS") : "none");
		for (int k = 0; k < 4; k++)
			printf("%s\"%s\": %.4f", k ? ", " : "", kn[k], st[k] ? (double)lg[k] / (double)st[k] : 0);
		printf("}, ");
	}
	uint64_t hwm = status_bytes("VmHWM");
	printf("\"host_pool_bytes\": %llu, \"rss_before_open\": %llu, \"rss_peak\": %llu, "
	       "\"rss_growth\": %llu, ", (unsigned long long)pool, (unsigned long long)rss0,
	       (unsigned long long)hwm, (unsigned long long)(hwm > rss0 ? hwm - rss0 : 0));
	printf("\"ok\": true}\n");
	for (int i = 0; i < nts; i++)
		cudaFree(ts[i].dev);
	for (int k = 0; k < 4; k++)
		cudaFreeHost(fills[k]);
	free(ts);
	return 0;
}
