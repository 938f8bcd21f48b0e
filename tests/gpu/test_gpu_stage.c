/*
 * test_gpu_stage.c — the device staging pool (ckpt_opts.device_pool_bytes,
 * docs/gpu.md "Device staging pool"):
 *
 *   event     pool >= state, a slow disk (every chunk write delayed), a host pool of
 *             four chunks, after a first save: the caller's stream waits on the
 *             snapshot event and
 *             overwrites every tensor at once; the checkpoint holds the old values,
 *             every byte was staged, and the snapshot point did not wait for the
 *             disk (it came before a quarter of the save's time)
 *   partial   device pool a third of the state: the last tensors are staged, the
 *             first take the pinned path; overwrite after ckpt_save_wait_snapshot;
 *             old values; staged bytes between 0 and the state
 *   mixed     host tensors (after and between device ones, one at an odd address)
 *             in the staged part: host-to-device staging, overwritten on the host
 *             right after the snapshot point: old values
 *   incr      incremental steps with the pool holding the previous snapshot: the
 *             tensors that did not change are found unchanged on the device (neither
 *             copied to the host nor written: device_unchanged_bytes, references),
 *             one byte changed in the middle of a chunk is found, a tensor at an
 *             address not aligned to 16 is copied (not compared); every step loads
 *             bit-exact, also after the older step is deleted
 *   small     a device pool smaller than the last chunk (with the flags): nothing
 *             fits, the save takes the pinned path; overwrite after the snapshot
 *             point; bit-exact
 *   unaligned a tensor at an address not aligned to 16 in an incremental save:
 *             staged by a plain copy, never compared, still referenced (by its hash,
 *             after the copy) when unchanged
 *   incrhost  incremental steps without the device pool: device chunks hashed on
 *             helper threads after their copy, unchanged ones referenced; bit-exact
 *   compress  a compressing save (bytegroup, two workers) of device tensors, whose
 *             chunks the writer's workers hash: bf16 weights compress, random bytes
 *             are stored raw with their block hashes; everything loads bit-exact,
 *             a slice of the raw tensor too (its blocks' hashes checked)
 *   many      more tensors than one kernel launch takes, of lengths that are not
 *             multiples of 16, one of them a chunk and 5 bytes: copied, then
 *             compared; one changed byte in a short tensor and the last byte of the
 *             5-byte chunk are found, the rest unchanged; bit-exact loads (on the
 *             stand-in runtime also: the launches, a few per save, not one a tensor)
 *
 * On the stand-in runtime with FAKE_CUDART_NO_KERNEL set (a runtime that cannot load
 * the staging kernel) the same cases but incr: staging by cudaMemcpyAsync, nothing
 * compared on the device, no launch.
 *
 * Usage: test_gpu_stage     exit 0 / 1 / 77 (gpu_test.h)
 */
#include "gpu_test.h"

#define CHUNK   (1u << 20)
#define NT      6
#define TBYTES  (6u << 20)                 /* each tensor: 6 chunks */
#define STATE   ((size_t)NT * TBYTES)

static ckpt_ctx *open_stage(const char *root, size_t pool, size_t device_pool, int incr)
{
	struct ckpt_opts o;
	ckpt_opts_init(&o, sizeof o);
	o.root = root;
	o.rank = 0;
	o.world = 1;
	o.chunk_bytes = CHUNK;
	o.pool_bytes = pool;
	o.device_pool_bytes = device_pool;
	o.incremental = incr;
	ckpt_ctx *c = NULL;
	int rc = ckpt_open(&o, &c);
	CHECK(rc == 0, "open %s: %s", root, ckpt_last_error());
	CHECK(ckpt_cuda_available(c) == 1, "a device is present but libckpt works on host memory");
	return c;
}

struct state {
	void    *dev[NT];
	uint8_t *ref[NT];          /* what the device holds now */
	char     names[NT][32];
};

static void state_make(struct state *st, uint64_t seed)
{
	for (int i = 0; i < NT; i++) {
		st->dev[i] = gt_device_data(TBYTES, seed * 100 + (uint64_t)i, &st->ref[i]);
		snprintf(st->names[i], sizeof st->names[i], "model/w%d", i);
	}
}

static void state_free(struct state *st)
{
	for (int i = 0; i < NT; i++) {
		CUDA_OK(cudaFree(st->dev[i]));
		free(st->ref[i]);
	}
}

static void add_all(ckpt_ctx *c, ckpt_save *s, struct state *st)
{
	static uint64_t shape[1] = { TBYTES / 2 };
	for (int i = 0; i < NT; i++) {
		struct ckpt_tensor t = {
			.name = st->names[i], .kind = CKPT_KIND_MODEL, .dtype = CKPT_BF16,
			.policy = CKPT_SHARDED, .ndim = 1, .global_shape = shape, .data = st->dev[i],
			.mem = CKPT_MEM_AUTO,
		};
		CKPT_OK(c, ckpt_save_add_tensor(s, &t));
	}
}

static void check_step(ckpt_ctx *c, uint64_t step, uint8_t *const want[NT], char names[NT][32])
{
	ckpt_load *l;
	CKPT_OK(c, ckpt_load_open(c, step, &l));
	for (int i = 0; i < NT; i++)
		gt_check_host_load(c, l, names[i], CKPT_BF16, 1, want[i], TBYTES);
	ckpt_load_close(l);
}

static struct ckpt_save_stats stats_of(ckpt_save *s)
{
	struct ckpt_save_stats st = { .size = sizeof st };
	CKPT_OK(NULL, ckpt_save_stats(s, &st));
	return st;
}

/* The caller's stream waits on the event and overwrites everything at once. */
static void test_event(const char *root)
{
	setenv("CKPT_FAULT", "after_chunk_write:slow:15", 1);
	ckpt_ctx *c = open_stage(root, 4 * CHUNK, STATE + (8u << 20), 0);
	unsetenv("CKPT_FAULT");
	struct state st;
	state_make(&st, 1);
	cudaStream_t stream;
	CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
	/* A first save takes the pool (and, without a GPU, faults its memory in): the
	 * timed one is the second. */
	ckpt_save *s;
	CKPT_OK(c, ckpt_save_begin(c, 1, &s));
	add_all(c, s, &st);
	CKPT_OK(c, ckpt_save_submit(s));
	CKPT_OK(c, ckpt_save_wait(s, -1));
	ckpt_save_free(s);
	CKPT_OK(c, ckpt_save_begin(c, 2, &s));
	add_all(c, s, &st);
	CKPT_OK(c, ckpt_save_set_stream(s, stream));
	CKPT_OK(c, ckpt_save_submit(s));
	cudaEvent_t ev;
	CKPT_OK(c, ckpt_save_snapshot_event(s, &ev));
	CUDA_OK(cudaStreamWaitEvent(stream, ev, 0));
	for (int i = 0; i < NT; i++)
		CUDA_OK(cudaMemsetAsync(st.dev[i], 0xEE, TBYTES, stream));
	CUDA_OK(cudaStreamSynchronize(stream));
	CKPT_OK(c, ckpt_save_wait(s, -1));
	struct ckpt_save_stats ss = stats_of(s);
	ckpt_save_free(s);
	printf("event: staged %llu of %zu bytes; snapshot point %.4f s, durable %.4f s\n",
	       (unsigned long long)ss.device_staged_bytes, STATE, ss.snapshot_seconds,
	       ss.durable_seconds);
	CHECK(ss.device_staged_bytes == STATE, "staged %llu bytes of %zu",
	      (unsigned long long)ss.device_staged_bytes, STATE);
	/* 36 writes of 15 ms each: on the pinned path with a pool of four chunks the
	 * snapshot point would come after ~32 of them. */
	CHECK(ss.snapshot_seconds < 0.25 * ss.durable_seconds, "the snapshot point (%.3f s) "
	      "waited for the disk (durable %.3f s)", ss.snapshot_seconds, ss.durable_seconds);
	check_step(c, 2, st.ref, st.names);
	CHECK(!gt_device_equals(st.dev[0], st.ref[0], TBYTES), "the overwrite did not happen");
	CUDA_OK(cudaStreamDestroy(stream));
	state_free(&st);
	ckpt_close(c);
}

/* Save st as step, overwrite every tensor right after the snapshot point, wait for
 * the commit: the save's stats. */
static struct ckpt_save_stats save_overwrite(ckpt_ctx *c, uint64_t step, struct state *st)
{
	ckpt_save *s;
	CKPT_OK(c, ckpt_save_begin(c, step, &s));
	add_all(c, s, st);
	CKPT_OK(c, ckpt_save_submit(s));
	CKPT_OK(c, ckpt_save_wait_snapshot(s, -1));
	for (int i = 0; i < NT; i++)
		CUDA_OK(cudaMemset(st->dev[i], 0xEE, TBYTES));
	CUDA_OK(cudaDeviceSynchronize());
	CKPT_OK(c, ckpt_save_wait(s, -1));
	struct ckpt_save_stats ss = stats_of(s);
	ckpt_save_free(s);
	return ss;
}

/* A device pool of a third of the state. */
static void test_partial(const char *root)
{
	ckpt_ctx *c = open_stage(root, 4 * CHUNK, STATE / 3, 0);
	struct state st;
	state_make(&st, 2);
	struct ckpt_save_stats ss = save_overwrite(c, 3, &st);
	printf("partial: staged %llu of %zu bytes\n", (unsigned long long)ss.device_staged_bytes,
	       STATE);
	CHECK(ss.device_staged_bytes > 0 && ss.device_staged_bytes < STATE &&
	      ss.device_staged_bytes % CHUNK == 0, "staged %llu bytes",
	      (unsigned long long)ss.device_staged_bytes);
	check_step(c, 3, st.ref, st.names);
	state_free(&st);
	ckpt_close(c);
}

/* Host tensors in the staged part. */
static void test_mixed(const char *root)
{
	ckpt_ctx *c = open_stage(root, 4 * CHUNK, STATE * 2, 0);
	struct state st;
	state_make(&st, 3);
	size_t hb = 3 * CHUNK + 5;
	uint8_t *hbuf = malloc(hb + 1), *href = malloc(hb);
	uint8_t *hmid = malloc(CHUNK), *hmid_ref = malloc(CHUNK);
	CHECK(hbuf && href && hmid && hmid_ref, "malloc");
	uint8_t *host = hbuf + 1;                  /* not aligned to 16 */
	tu_fill(host, hb, tu_seed(), 301);
	memcpy(href, host, hb);
	tu_fill(hmid, CHUNK, tu_seed(), 302);
	memcpy(hmid_ref, hmid, CHUNK);
	ckpt_save *s;
	CKPT_OK(c, ckpt_save_begin(c, 4, &s));
	uint64_t shape[1] = { CHUNK };
	struct ckpt_tensor mid = {
		.name = "rng/mid", .kind = CKPT_KIND_RNG, .dtype = CKPT_U8, .policy = CKPT_SHARDED,
		.ndim = 1, .global_shape = shape, .data = hmid, .mem = CKPT_MEM_HOST,
	};
	CKPT_OK(c, ckpt_save_add_tensor(s, &mid));
	add_all(c, s, &st);
	uint64_t hshape[1] = { hb };
	struct ckpt_tensor last = {
		.name = "rng/last", .kind = CKPT_KIND_RNG, .dtype = CKPT_U8, .policy = CKPT_SHARDED,
		.ndim = 1, .global_shape = hshape, .data = host, .mem = CKPT_MEM_AUTO,
	};
	CKPT_OK(c, ckpt_save_add_tensor(s, &last));
	CKPT_OK(c, ckpt_save_submit(s));
	CKPT_OK(c, ckpt_save_wait_snapshot(s, -1));
	memset(host, 0xEE, hb);
	memset(hmid, 0xEE, CHUNK);
	for (int i = 0; i < NT; i++)
		CUDA_OK(cudaMemset(st.dev[i], 0xEE, TBYTES));
	CUDA_OK(cudaDeviceSynchronize());
	CKPT_OK(c, ckpt_save_wait(s, -1));
	struct ckpt_save_stats ss = stats_of(s);
	ckpt_save_free(s);
	CHECK(ss.device_staged_bytes == STATE + hb + CHUNK, "staged %llu bytes of %zu",
	      (unsigned long long)ss.device_staged_bytes, STATE + hb + CHUNK);
	check_step(c, 4, st.ref, st.names);
	ckpt_load *l;
	CKPT_OK(c, ckpt_load_open(c, 4, &l));
	gt_check_host_load(c, l, "rng/last", CKPT_U8, 1, href, hb);
	gt_check_host_load(c, l, "rng/mid", CKPT_U8, 1, hmid_ref, CHUNK);
	ckpt_load_close(l);
	free(hbuf);
	free(href);
	free(hmid);
	free(hmid_ref);
	state_free(&st);
	ckpt_close(c);
}

static struct ckpt_save_stats save_step(ckpt_ctx *c, uint64_t step, struct state *st)
{
	ckpt_save *s;
	CKPT_OK(c, ckpt_save_begin(c, step, &s));
	add_all(c, s, st);
	CKPT_OK(c, ckpt_save_submit(s));
	CKPT_OK(c, ckpt_save_wait_snapshot(s, -1));
	CKPT_OK(c, ckpt_save_wait(s, -1));
	struct ckpt_save_stats ss = stats_of(s);
	ckpt_save_free(s);
	printf("incr step %llu: staged %llu, unchanged on the device %llu, referenced %llu, "
	       "stored %llu of %llu\n", (unsigned long long)step,
	       (unsigned long long)ss.device_staged_bytes,
	       (unsigned long long)ss.device_unchanged_bytes,
	       (unsigned long long)ss.referenced_bytes, (unsigned long long)ss.stored_bytes,
	       (unsigned long long)ss.logical_bytes);
	return ss;
}

/* Rewrite tensor i on the device and in its reference (seeded). */
static void change(struct state *st, int i, uint64_t seed)
{
	tu_fill(st->ref[i], TBYTES, tu_seed(), seed);
	CUDA_OK(cudaMemcpy(st->dev[i], st->ref[i], TBYTES, cudaMemcpyHostToDevice));
}

static uint8_t **snapshot_refs(struct state *st)
{
	uint8_t **r = malloc(NT * sizeof *r);
	CHECK(r, "malloc");
	for (int i = 0; i < NT; i++) {
		r[i] = malloc(TBYTES);
		CHECK(r[i], "malloc");
		memcpy(r[i], st->ref[i], TBYTES);
	}
	return r;
}

static void free_refs(uint8_t **r)
{
	for (int i = 0; i < NT; i++)
		free(r[i]);
	free(r);
}

static void test_incr(const char *root)
{
	ckpt_ctx *c = open_stage(root, 4 * CHUNK, STATE + (4u << 20), 1);
	struct state st;
	state_make(&st, 4);
	struct ckpt_save_stats s1 = save_step(c, 10, &st);
	CHECK(s1.device_unchanged_bytes == 0 && s1.referenced_bytes == 0,
	      "the first step found %llu bytes unchanged", (unsigned long long)s1.device_unchanged_bytes);
	uint8_t **r10 = snapshot_refs(&st);

	/* Step 11: tensor 1 rewritten, one byte of tensor 4's third chunk changed. */
	change(&st, 1, 4001);
	size_t at = 2 * CHUNK + 12345;
	st.ref[4][at] ^= 0x01;
	CUDA_OK(cudaMemcpy((uint8_t *)st.dev[4] + at, &st.ref[4][at], 1, cudaMemcpyHostToDevice));
	struct ckpt_save_stats s2 = save_step(c, 11, &st);
	uint64_t want = STATE - TBYTES - CHUNK;
	CHECK(s2.device_unchanged_bytes == want, "unchanged on the device: %llu, expected %llu",
	      (unsigned long long)s2.device_unchanged_bytes, (unsigned long long)want);
	CHECK(s2.referenced_bytes == want, "referenced %llu, expected %llu",
	      (unsigned long long)s2.referenced_bytes, (unsigned long long)want);
	uint8_t **r11 = snapshot_refs(&st);

	/* Step 12: nothing changed but tensor 0. */
	change(&st, 0, 4002);
	struct ckpt_save_stats s3 = save_step(c, 12, &st);
	CHECK(s3.device_unchanged_bytes == STATE - TBYTES, "unchanged on the device: %llu",
	      (unsigned long long)s3.device_unchanged_bytes);
	check_step(c, 10, r10, st.names);
	check_step(c, 11, r11, st.names);
	check_step(c, 12, st.ref, st.names);

	/* Deleting the older steps keeps the newest loadable. */
	struct ckpt_gc_opts go;
	ckpt_gc_opts_init(&go, sizeof go);
	go.keep_last = 1;
	struct ckpt_gc_result gr = { .size = sizeof gr };
	CKPT_OK(c, ckpt_catalog_gc(c, &go, &gr));
	CHECK(gr.steps_removed == 2, "gc removed %llu steps", (unsigned long long)gr.steps_removed);
	check_step(c, 12, st.ref, st.names);
	free_refs(r10);
	free_refs(r11);
	state_free(&st);
	ckpt_close(c);

	/* A fresh context: the pool holds nothing, every chunk is copied and compared
	 * after the copy (references still, by hash). */
	c = open_stage(root, 4 * CHUNK, STATE + (4u << 20), 1);
	struct state st2;
	state_make(&st2, 4);          /* step 10's seeds: differs from 12 only in 0, 1, 4 */
	struct ckpt_save_stats s4 = save_step(c, 13, &st2);
	CHECK(s4.device_unchanged_bytes == 0, "a new context found %llu bytes unchanged on the "
	      "device", (unsigned long long)s4.device_unchanged_bytes);
	check_step(c, 13, st2.ref, st2.names);
	state_free(&st2);
	ckpt_close(c);
}

/* Incremental without the device pool: the pipe's hashing helpers hash every
 * device chunk after its copy; the unchanged ones become references. */
static void test_incr_host(const char *root)
{
	ckpt_ctx *c = open_stage(root, 8 * CHUNK, 0, 1);
	struct state st;
	state_make(&st, 6);
	struct ckpt_save_stats s1 = save_step(c, 60, &st);
	CHECK(s1.referenced_bytes == 0 && s1.device_staged_bytes == 0, "step 60: referenced %llu",
	      (unsigned long long)s1.referenced_bytes);
	uint8_t **r60 = snapshot_refs(&st);
	change(&st, 2, 6002);
	size_t at = 4 * CHUNK + 777;
	st.ref[5][at] ^= 0x10;
	CUDA_OK(cudaMemcpy((uint8_t *)st.dev[5] + at, &st.ref[5][at], 1, cudaMemcpyHostToDevice));
	struct ckpt_save_stats s2 = save_step(c, 61, &st);
	uint64_t want = STATE - TBYTES - CHUNK;
	CHECK(s2.referenced_bytes == want && s2.device_unchanged_bytes == 0, "step 61: referenced "
	      "%llu, expected %llu", (unsigned long long)s2.referenced_bytes,
	      (unsigned long long)want);
	check_step(c, 60, r60, st.names);
	check_step(c, 61, st.ref, st.names);
	free_refs(r60);
	state_free(&st);
	ckpt_close(c);
}

/* A tensor at an address not aligned to 16: staged by a plain copy, never compared. */
static void test_unaligned(const char *root)
{
	ckpt_ctx *c = open_stage(root, 4 * CHUNK, 4 * CHUNK + (1u << 20), 1);
	uint8_t *ref = malloc(2 * CHUNK);
	CHECK(ref, "malloc");
	tu_fill(ref, 2 * CHUNK, tu_seed(), 501);
	uint8_t *base;
	CUDA_OK(cudaMalloc((void **)&base, 2 * CHUNK + 16));
	uint8_t *dev = base + 4;
	CUDA_OK(cudaMemcpy(dev, ref, 2 * CHUNK, cudaMemcpyHostToDevice));
	uint64_t shape[1] = { 2 * CHUNK };
	for (uint64_t step = 20; step < 22; step++) {
		ckpt_save *s;
		CKPT_OK(c, ckpt_save_begin(c, step, &s));
		struct ckpt_tensor t = {
			.name = "odd", .kind = CKPT_KIND_MODEL, .dtype = CKPT_U8, .policy = CKPT_SHARDED,
			.ndim = 1, .global_shape = shape, .data = dev, .mem = CKPT_MEM_AUTO,
		};
		CKPT_OK(c, ckpt_save_add_tensor(s, &t));
		CKPT_OK(c, ckpt_save_submit(s));
		CKPT_OK(c, ckpt_save_wait(s, -1));
		struct ckpt_save_stats ss = stats_of(s);
		ckpt_save_free(s);
		CHECK(ss.device_staged_bytes == 2 * CHUNK && ss.device_unchanged_bytes == 0,
		      "step %llu: staged %llu, unchanged %llu", (unsigned long long)step,
		      (unsigned long long)ss.device_staged_bytes,
		      (unsigned long long)ss.device_unchanged_bytes);
		/* Unchanged all the same: referenced by its hash after the copy. */
		CHECK(step == 20 || ss.referenced_bytes == 2 * CHUNK, "referenced %llu",
		      (unsigned long long)ss.referenced_bytes);
		ckpt_load *l;
		CKPT_OK(c, ckpt_load_open(c, step, &l));
		gt_check_host_load(c, l, "odd", CKPT_U8, 1, ref, 2 * CHUNK);
		ckpt_load_close(l);
	}
	CUDA_OK(cudaFree(base));
	free(ref);
	ckpt_close(c);
}

#ifdef CKPT_FAKE_CUDART
unsigned long long fake_cudart_kernel_launches(void);
static bool no_kernel(void) { return getenv("FAKE_CUDART_NO_KERNEL") != NULL; }
#else
static bool no_kernel(void) { return false; }
#endif

#define NMANY 250

static uint64_t many_save(ckpt_ctx *c, uint64_t step, void *const dev[NMANY],
                          const size_t len[NMANY], uint64_t *staged)
{
	static char names[NMANY][16];
	uint64_t shape[NMANY][1];
	ckpt_save *s;
	CKPT_OK(c, ckpt_save_begin(c, step, &s));
	for (int i = 0; i < NMANY; i++) {
		snprintf(names[i], sizeof names[i], "m/t%03d", i);
		shape[i][0] = len[i];
		struct ckpt_tensor t = {
			.name = names[i], .kind = CKPT_KIND_MODEL, .dtype = CKPT_U8,
			.policy = CKPT_SHARDED, .ndim = 1, .global_shape = shape[i], .data = dev[i],
			.mem = CKPT_MEM_AUTO,
		};
		CKPT_OK(c, ckpt_save_add_tensor(s, &t));
	}
	CKPT_OK(c, ckpt_save_submit(s));
	CKPT_OK(c, ckpt_save_wait(s, -1));
	struct ckpt_save_stats ss = stats_of(s);
	ckpt_save_free(s);
	*staged = ss.device_staged_bytes;
	return ss.device_unchanged_bytes;
}

static void many_check(ckpt_ctx *c, uint64_t step, uint8_t *const ref[NMANY],
                       const size_t len[NMANY])
{
	ckpt_load *l;
	CKPT_OK(c, ckpt_load_open(c, step, &l));
	for (int i = 0; i < NMANY; i++) {
		char name[16];
		snprintf(name, sizeof name, "m/t%03d", i);
		gt_check_host_load(c, l, name, CKPT_U8, 1, ref[i], len[i]);
	}
	ckpt_load_close(l);
}

static void test_many(const char *root)
{
	void *dev[NMANY];
	uint8_t *ref[NMANY];
	size_t len[NMANY], total = 0;
	for (int i = 0; i < NMANY; i++) {
		len[i] = i == NMANY - 1 ? CHUNK + 5 : 1000 + 37 * (size_t)i;
		dev[i] = gt_device_data(len[i], 7000 + (uint64_t)i, &ref[i]);
		total += len[i];
	}
	ckpt_ctx *c = open_stage(root, 4 * CHUNK, 8 * CHUNK, 1);
	uint64_t staged;
#ifdef CKPT_FAKE_CUDART
	unsigned long long k0 = fake_cudart_kernel_launches();
#endif
	uint64_t same = many_save(c, 40, dev, len, &staged);
	CHECK(staged == total && same == 0, "step 40: staged %llu of %zu, unchanged %llu",
	      (unsigned long long)staged, total, (unsigned long long)same);
#ifdef CKPT_FAKE_CUDART
	unsigned long long k1 = fake_cudart_kernel_launches();
	/* 250 ranges, STAGE_BATCH_MAX (120) a launch; none without the kernel. */
	CHECK(k1 - k0 == (no_kernel() ? 0 : 3), "step 40: %llu kernel launches for %d tensors",
	      k1 - k0, NMANY);
#endif
	many_check(c, 40, ref, len);
	/* One byte of a short tensor, and the last byte of the 5-byte chunk. */
	size_t at[2][2] = { { 7, 3 }, { NMANY - 1, CHUNK + 4 } };
	for (int k = 0; k < 2; k++) {
		size_t i = at[k][0], b = at[k][1];
		ref[i][b] ^= 0x5a;
		CUDA_OK(cudaMemcpy((uint8_t *)dev[i] + b, &ref[i][b], 1, cudaMemcpyHostToDevice));
	}
	same = many_save(c, 41, dev, len, &staged);
	size_t want = no_kernel() ? 0 : total - len[7] - 5;
	CHECK(staged == total && same == want, "step 41: staged %llu, unchanged %llu, expected "
	      "%zu", (unsigned long long)staged, (unsigned long long)same, want);
#ifdef CKPT_FAKE_CUDART
	unsigned long long k2 = fake_cudart_kernel_launches();
	CHECK(k2 - k1 == (no_kernel() ? 0 : 3), "step 41: %llu kernel launches for %d tensors",
	      k2 - k1, NMANY);
#endif
	many_check(c, 41, ref, len);
	printf("many: %d tensors, %zu bytes, %llu found unchanged on the device\n", NMANY, total,
	       (unsigned long long)same);
	for (int i = 0; i < NMANY; i++) {
		CUDA_OK(cudaFree(dev[i]));
		free(ref[i]);
	}
	ckpt_close(c);
}

static void test_compress(const char *root)
{
	struct ckpt_opts o;
	ckpt_opts_init(&o, sizeof o);
	o.root = root;
	o.rank = 0;
	o.world = 1;
	o.chunk_bytes = CHUNK;
	o.pool_bytes = 16 * CHUNK;
	o.zstd_level = 1;
	o.compress_codec = CKPT_CODEC_BYTEGROUP;
	o.compress_threads = 2;
	ckpt_ctx *c = NULL;
	CHECK(ckpt_open(&o, &c) == 0, "open %s: %s", root, ckpt_last_error());
	/* bf16 of small values: the exponent planes compress. */
	size_t wn = 3 * CHUNK + 4096, rn = 2 * CHUNK + 12288;
	uint8_t *wref = malloc(wn), *rref;
	CHECK(wref, "malloc");
	uint64_t x = 88172645463325252ull;
	for (size_t i = 0; i < wn / 2; i++) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		float f = ((float)(x % 2001) - 1000.0f) * 2e-5f;
		uint32_t u;
		memcpy(&u, &f, sizeof u);
		wref[2 * i] = (uint8_t)(u >> 16);
		wref[2 * i + 1] = (uint8_t)(u >> 24);
	}
	void *wdev, *rdev = gt_device_data(rn, 9001, &rref);
	CUDA_OK(cudaMalloc(&wdev, wn));
	CUDA_OK(cudaMemcpy(wdev, wref, wn, cudaMemcpyHostToDevice));
	uint64_t wshape[1] = { wn / 2 }, rshape[1] = { rn };
	ckpt_save *s;
	CKPT_OK(c, ckpt_save_begin(c, 50, &s));
	struct ckpt_tensor tw = {
		.name = "w", .kind = CKPT_KIND_MODEL, .dtype = CKPT_BF16, .policy = CKPT_SHARDED,
		.ndim = 1, .global_shape = wshape, .data = wdev, .mem = CKPT_MEM_AUTO,
	}, tr = {
		.name = "r", .kind = CKPT_KIND_MODEL, .dtype = CKPT_U8, .policy = CKPT_SHARDED,
		.ndim = 1, .global_shape = rshape, .data = rdev, .mem = CKPT_MEM_AUTO,
	};
	CKPT_OK(c, ckpt_save_add_tensor(s, &tw));
	CKPT_OK(c, ckpt_save_add_tensor(s, &tr));
	CKPT_OK(c, ckpt_save_submit(s));
	CKPT_OK(c, ckpt_save_wait(s, -1));
	struct ckpt_save_stats ss = stats_of(s);
	ckpt_save_free(s);
	printf("compress: stored %llu of %llu bytes\n", (unsigned long long)ss.stored_bytes,
	       (unsigned long long)ss.logical_bytes);
	CHECK(ss.stored_bytes < ss.logical_bytes && ss.stored_bytes > rn,
	      "stored %llu of %llu: the weights did not compress, or the random bytes did",
	      (unsigned long long)ss.stored_bytes, (unsigned long long)ss.logical_bytes);
	ckpt_load *l;
	CKPT_OK(c, ckpt_load_open(c, 50, &l));
	gt_check_host_load(c, l, "w", CKPT_BF16, 1, wref, wn);
	gt_check_host_load(c, l, "r", CKPT_U8, 1, rref, rn);
	/* A slice across the first two chunks of the raw tensor: read by its blocks. */
	uint64_t off[1] = { CHUNK - 5000 }, ext[1] = { 70000 };
	uint8_t *got = malloc(ext[0]);
	CHECK(got, "malloc");
	CKPT_OK(c, ckpt_load_tensor(l, "r", CKPT_U8, 1, off, ext, got, CKPT_MEM_HOST));
	CHECK(!memcmp(got, rref + off[0], ext[0]), "a slice of the raw tensor differs");
	free(got);
	ckpt_load_close(l);
	CUDA_OK(cudaFree(wdev));
	CUDA_OK(cudaFree(rdev));
	free(wref);
	free(rref);
	ckpt_close(c);
}

/* Nothing fits: the last tensor's last chunk is bigger than the pool. */
static void test_small(const char *root)
{
	ckpt_ctx *c = open_stage(root, 4 * CHUNK, CHUNK, 0);
	struct state st;
	state_make(&st, 5);
	struct ckpt_save_stats ss = save_overwrite(c, 30, &st);
	CHECK(ss.device_staged_bytes == 0, "staged %llu bytes in a pool smaller than a chunk "
	      "and its flags", (unsigned long long)ss.device_staged_bytes);
	check_step(c, 30, st.ref, st.names);
	state_free(&st);
	ckpt_close(c);
}

int main(void)
{
	gt_require_device("test_gpu_stage");
	char *root = tu_tmpdir("gpu-stage");
	test_event(root);
	test_partial(root);
	test_mixed(root);
	test_small(root);
	test_compress(root);
	tu_rmtree(root);
	free(root);
	root = tu_tmpdir("gpu-stage-incr");   /* its steps start with nothing below them */
	if (!no_kernel())
		test_incr(root);
	test_unaligned(root);
	test_many(root);
	tu_rmtree(root);
	free(root);
	root = tu_tmpdir("gpu-stage-incr-host");
	test_incr_host(root);
	tu_rmtree(root);
	free(root);
	printf("PASS test_gpu_stage%s\n", no_kernel() ? " (a runtime without the kernel)" : "");
	return 0;
}
