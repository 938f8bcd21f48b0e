/*
 * test_snapshot.c — lib/snapshot's pipeline on host memory (runs in CI on every
 * build, with or without CUDA, and on machines without a GPU): buffer ownership in
 * the pipe, the -EAGAIN backpressure rule, order of chunks, and through the public
 * API a pool smaller than one tensor, the layout of the shard, a write failing
 * mid-pipeline that must give every buffer back, and the CUDA entry points'
 * answers when there is no device.
 */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "glue.h"
#include "snapshot/snapshot.h"
#include "testutil.h"

/* From the fault table (lib/base/fault.c). */
void ckpt_fault_reload(void);
/* lib/gpu.c, declared without the CUDA headers (a cudaEvent_t is this pointer). */
struct CUevent_st;
int ckpt_save_snapshot_event(ckpt_save *s, struct CUevent_st **ev);
int ckpt_cuda_available(const ckpt_ctx *c);

#define BUF (64u << 10)

static char *root;

static void setup(void)
{
	root = tu_tmpdir("snapshot");
	unsetenv("CKPT_FAULT");
	ckpt_fault_reload();
}

static void teardown(void)
{
	unsetenv("CKPT_FAULT");
	ckpt_fault_reload();
	tu_rmtree(root);
	free(root);
	root = NULL;
}

/* ------------------------------------------------------------------ the pipe itself */

static struct snapshot *host_snapshot(void)
{
	struct snapshot *sn;
	ck_assert_int_eq(snapshot_create(&sn), 0);
	/* CI machines have no GPU; a GPU machine runs tests/gpu instead. */
	if (snapshot_has_device(sn)) {
		snapshot_destroy(sn);
		return NULL;
	}
	return sn;
}

START_TEST(pipe_owns_buffers_in_order)
{
	struct snapshot *sn = host_snapshot();
	if (!sn)
		return;
	struct io_pool *pool;
	ck_assert_int_eq(io_pool_create(BUF, 8, snapshot_pool_alloc(sn), &pool), 0);
	struct snapshot_pipe *p;
	/* 16 KiB blocks: a 64 KiB chunk has 4 block hashes, a shorter one fewer; the
	 * chunk's hash is over them (a tree, as format 5 has it). */
	ck_assert_int_eq(snapshot_pipe_open(sn, pool, 5, 16384, true, &p), 0);
	uint8_t *src = malloc(8 * (size_t)BUF);
	tu_fill(src, 8 * (size_t)BUF, tu_seed(), 1);
	/* Fill the window: 5 chunks of different lengths, then -EAGAIN (window full). */
	unsigned issued = 0;
	int rc;
	while ((rc = snapshot_pipe_issue(p, src + issued * BUF, BUF - issued * 100, CKPT_MEM_HOST,
	                                 100 + issued)) == 0)
		issued++;
	ck_assert_int_eq(rc, -EAGAIN);
	ck_assert_uint_eq(issued, 5);
	ck_assert_uint_eq(snapshot_pipe_pending(p), 5);
	ck_assert_uint_eq(io_pool_nfree(pool), 3);
	/* Out in issue order, each with its bytes and the hash of exactly those bytes. */
	for (unsigned k = 0; k < 3; k++) {
		unsigned b;
		size_t len;
		uint64_t tag;
		uint8_t want[CKPT_HASH_BYTES];
		struct io_hashes h;
		ck_assert_int_eq(snapshot_pipe_next(p, &b, &len, &h, &tag), 0);
		ck_assert_uint_eq(tag, 100 + k);
		ck_assert_uint_eq(len, BUF - k * 100);
		ck_assert(!memcmp(io_pool_addr(pool, b), src + k * BUF, len));
		/* Each block's hash, the last one short, and the chunk's over them. */
		ck_assert_uint_eq(h.block_bytes, 16384);
		ck_assert(h.tree);
		ck_assert_uint_eq(io_nblocks(len, 16384), 4);
		uint8_t row[4 * CKPT_HASH_BYTES];
		for (unsigned j = 0; j < 4; j++) {
			size_t from = j * 16384u, n = len - from < 16384 ? len - from : 16384;
			io_hash128(src + k * BUF + from, n, row + j * CKPT_HASH_BYTES);
			ck_assert(!memcmp(h.blocks + j * CKPT_HASH_BYTES, row + j * CKPT_HASH_BYTES,
			                  CKPT_HASH_BYTES));
		}
		io_hash128(row, sizeof row, want);
		ck_assert(!memcmp(h.chunk, want, sizeof want));
		io_pool_put(pool, b);   /* ours after next(): the test plays the writer */
	}
	ck_assert_uint_eq(snapshot_pipe_pending(p), 2);
	ck_assert_uint_eq(snapshot_pipe_device_chunks(p), 0);
	/* Close with chunks pending: they go back to the pool. */
	snapshot_pipe_close(p);
	ck_assert_uint_eq(io_pool_nfree(pool), 8);
	io_pool_destroy(pool);
	snapshot_destroy(sn);
	free(src);
}
END_TEST

/* Chunks hashed in place take no buffer and no place in the window: three of them
 * between two copies, with the window (2) full of copies, come out in issue order as
 * SNAPSHOT_SRC_BUF with the hashes of the caller's bytes, chunk and blocks (the one
 * issued without hash unhashed, for its consumer to hash); closing with one pending
 * gives back only the copies' buffers. */
START_TEST(pipe_inplace_chunks_take_no_buffer)
{
	struct snapshot *sn = host_snapshot();
	if (!sn)
		return;
	struct io_pool *pool;
	ck_assert_int_eq(io_pool_create(BUF, 4, snapshot_pool_alloc(sn), &pool), 0);
	struct snapshot_pipe *p;
	ck_assert_int_eq(snapshot_pipe_open(sn, pool, 2, 16384, false, &p), 0);
	uint8_t *src = malloc(6 * (size_t)BUF);
	tu_fill(src, 6 * (size_t)BUF, tu_seed(), 3);
	ck_assert_int_eq(snapshot_pipe_issue(p, src, BUF, CKPT_MEM_HOST, 0), 0);
	for (unsigned k = 1; k < 4; k++)
		ck_assert_int_eq(snapshot_pipe_issue_inplace(p, src + k * BUF, BUF - k * 1000, k != 2,
		                                             k), 0);
	ck_assert_int_eq(snapshot_pipe_issue(p, src + 4 * BUF, BUF, CKPT_MEM_HOST, 4), 0);
	ck_assert_int_eq(snapshot_pipe_issue(p, src + 5 * BUF, BUF, CKPT_MEM_HOST, 5), -EAGAIN);
	ck_assert_uint_eq(snapshot_pipe_pending(p), 5);
	ck_assert_uint_eq(io_pool_nfree(pool), 2);
	ck_assert(!snapshot_pipe_head_stored(p));
	for (unsigned k = 0; k < 4; k++) {
		unsigned b;
		size_t len;
		uint64_t tag;
		struct io_hashes h;
		memset(&h, 0xee, sizeof h);
		ck_assert_int_eq(snapshot_pipe_next(p, &b, &len, &h, &tag), k == 2);
		ck_assert_uint_eq(tag, k);
		if (k == 2) {
			static const uint8_t zero[CKPT_HASH_BYTES];
			ck_assert_uint_eq(b, SNAPSHOT_SRC_BUF);
			ck_assert_uint_eq(len, BUF - 2000);
			ck_assert(!memcmp(h.chunk, zero, sizeof zero) && !h.blocks && !h.block_bytes);
			continue;
		}
		if (k == 0) {
			/* A copy out: room in the window for one more copy. */
			ck_assert_uint_ne(b, SNAPSHOT_SRC_BUF);
			io_pool_put(pool, b);
			ck_assert_int_eq(snapshot_pipe_issue(p, src + 5 * BUF, BUF, CKPT_MEM_HOST, 5), 0);
			continue;
		}
		ck_assert_uint_eq(b, SNAPSHOT_SRC_BUF);
		ck_assert_uint_eq(len, BUF - k * 1000);
		uint8_t want[CKPT_HASH_BYTES];
		io_hash128(src + k * BUF, len, want);
		ck_assert(!memcmp(h.chunk, want, sizeof want));
		ck_assert_uint_eq(h.block_bytes, 16384);
		for (unsigned j = 0; j < io_nblocks(len, 16384); j++) {
			size_t from = j * 16384u, n = len - from < 16384 ? len - from : 16384;
			io_hash128(src + k * BUF + from, n, want);
			ck_assert(!memcmp(h.blocks + j * CKPT_HASH_BYTES, want, sizeof want));
		}
		/* Taking an in-place chunk out frees no place in the window. */
		ck_assert_int_eq(snapshot_pipe_issue(p, src, BUF, CKPT_MEM_HOST, 6), -EAGAIN);
	}
	/* The copies of chunks 4 and 5 pending, the window full; one more in place. */
	ck_assert_int_eq(snapshot_pipe_issue_inplace(p, src, BUF, true, 6), 0);
	ck_assert_uint_eq(snapshot_pipe_pending(p), 3);
	snapshot_pipe_close(p);
	ck_assert_uint_eq(io_pool_nfree(pool), 4);
	io_pool_destroy(pool);
	snapshot_destroy(sn);
	free(src);
}
END_TEST

START_TEST(pipe_eagain_when_pool_empty)
{
	struct snapshot *sn = host_snapshot();
	if (!sn)
		return;
	struct io_pool *pool;
	ck_assert_int_eq(io_pool_create(BUF, 4, NULL, &pool), 0);
	/* Another owner (the writer's writes) holds two buffers. */
	int held[2] = { io_pool_get(pool, 0), io_pool_get(pool, 0) };
	ck_assert(held[0] >= 0 && held[1] >= 0);
	struct snapshot_pipe *p;
	ck_assert_int_eq(snapshot_pipe_open(sn, pool, 4, IO_BLOCK_BYTES, false, &p), 0);
	uint8_t src[100] = { 1, 2, 3 };
	ck_assert_int_eq(snapshot_pipe_issue(p, src, sizeof src, CKPT_MEM_HOST, 0), 0);
	ck_assert_int_eq(snapshot_pipe_issue(p, src, sizeof src, CKPT_MEM_HOST, 1), 0);
	/* Window not full, pool empty, chunks pending: must not block. */
	ck_assert_int_eq(snapshot_pipe_issue(p, src, sizeof src, CKPT_MEM_HOST, 2), -EAGAIN);
	io_pool_put(pool, (unsigned)held[0]);
	ck_assert_int_eq(snapshot_pipe_issue(p, src, sizeof src, CKPT_MEM_HOST, 2), 0);
	/* Bad requests leave the pool as it was. */
	ck_assert_int_eq(snapshot_pipe_issue(p, src, 0, CKPT_MEM_HOST, 3), -EINVAL);
	ck_assert_int_eq(snapshot_pipe_issue(p, src, BUF + 1, CKPT_MEM_HOST, 3), -EINVAL);
	ck_assert_int_eq(snapshot_pipe_issue(p, src, 10, CKPT_MEM_AUTO, 3), -EINVAL);
	ck_assert_uint_eq(snapshot_pipe_pending(p), 3);
	snapshot_pipe_close(p);
	io_pool_put(pool, (unsigned)held[1]);
	ck_assert_uint_eq(io_pool_nfree(pool), 4);
	io_pool_destroy(pool);
	snapshot_destroy(sn);
}
END_TEST

/* A pool in halving classes (a rank saving through ckptd): short chunks take short
 * buffers, so the window holds many more of them than the pool has buffers of the
 * chunk size; a chunk of the chunk size still takes a large one, and with none of
 * those free it gets -EAGAIN, not a short one. Bytes and hashes as from any pool. */
START_TEST(pipe_fits_chunks_in_halving_pool)
{
	struct snapshot *sn = host_snapshot();
	if (!sn)
		return;
	struct io_pool *pool;
	/* 1 MiB chunks, 16 MiB: 12 of 1 MiB and 4 each of 512 down to 64 KiB. */
	ck_assert_int_eq(io_pool_create_halving(1u << 20, 16u << 20, snapshot_pool_alloc(sn),
	                                        &pool), 0);
	ck_assert_uint_eq(io_pool_nbufs(pool), 12);
	ck_assert_uint_eq(io_pool_nslots(pool), 28);
	struct snapshot_pipe *p;
	ck_assert_int_eq(snapshot_pipe_open(sn, pool, io_pool_nslots(pool), 0, false, &p), 0);
	size_t total = 16u << 20;
	uint8_t *src = malloc(total);
	tu_fill(src, total, tu_seed(), 1);
	/* 16 short chunks, four for each short class (each longer than the class below
	 * holds), then 12 of 1 MiB: 28 chunks in a pool of 16 MiB, where buffers of
	 * one size would have held 16. */
	size_t lens[29], off[29], at = 0;
	for (unsigned i = 0; i < 28; i++) {
		lens[i] = i < 16 ? ((size_t)64 << 10 << (i / 4)) - 1000 * (i % 4) - 1 : 1u << 20;
		off[i] = at;
		at += lens[i];
	}
	lens[28] = 4096;
	off[28] = 0;
	ck_assert_uint_le(at, total);
	for (unsigned i = 0; i < 28; i++)
		ck_assert_int_eq(snapshot_pipe_issue(p, src + off[i], lens[i], CKPT_MEM_HOST, i), 0);
	ck_assert_uint_eq(snapshot_pipe_pending(p), 28);
	ck_assert_uint_eq(io_pool_bytes_out(pool), io_pool_bytes(pool));
	/* Out in order, each in the smallest class that holds it, bytes and hash. */
	for (unsigned k = 0; k < 29; k++) {
		unsigned b;
		size_t len;
		uint64_t tag;
		uint8_t want[CKPT_HASH_BYTES];
		struct io_hashes h;
		ck_assert_int_eq(snapshot_pipe_next(p, &b, &len, &h, &tag), 0);
		ck_assert_uint_eq(tag, k);
		ck_assert_uint_eq(len, lens[k]);
		size_t fit = 64u << 10;
		while (fit < len)
			fit *= 2;
		ck_assert_uint_eq(io_pool_len(pool, b), fit);
		ck_assert(!memcmp(io_pool_addr(pool, b), src + off[k], len));
		io_hash128(src + off[k], len, want);
		ck_assert(!memcmp(h.chunk, want, sizeof want));
		io_pool_put(pool, b);
		if (k == 0) {
			/* A 64 KiB buffer is free and the window has room: a chunk of 1 MiB
			 * does not take it (-EAGAIN: chunks are pending), a short one does. */
			ck_assert_int_eq(snapshot_pipe_issue(p, src, 1u << 20, CKPT_MEM_HOST, 99),
			                 -EAGAIN);
			ck_assert_int_eq(snapshot_pipe_issue(p, src + off[28], lens[28], CKPT_MEM_HOST,
			                                     28), 0);
		}
	}
	snapshot_pipe_close(p);
	ck_assert_uint_eq(io_pool_bytes_out(pool), 0);
	io_pool_destroy(pool);
	snapshot_destroy(sn);
	free(src);
}
END_TEST

static int landed_calls;
static void count_landed(void *arg)
{
	ck_assert_ptr_eq(arg, &landed_calls);
	landed_calls++;
}

START_TEST(pipe_seal_and_device_refused)
{
	struct snapshot *sn = host_snapshot();
	if (!sn)
		return;
	struct io_pool *pool;
	ck_assert_int_eq(io_pool_create(BUF, 2, NULL, &pool), 0);
	struct snapshot_pipe *p;
	ck_assert_int_eq(snapshot_pipe_open(sn, pool, 9, 0, false, &p), 0);   /* clamped to the pool */
	uint8_t src[64] = { 0 };
	ck_assert_int_eq(snapshot_pipe_issue(p, src, sizeof src, CKPT_MEM_DEVICE, 0), CKPT_ENODEV);
	ck_assert_uint_eq(io_pool_nfree(pool), 2);
	ck_assert_int_eq(snapshot_pipe_issue(p, src, sizeof src, CKPT_MEM_HOST, 0), 0);
	ck_assert_int_eq(snapshot_pipe_issue(p, src, sizeof src, CKPT_MEM_HOST, 1), 0);
	ck_assert_int_eq(snapshot_pipe_issue(p, src, sizeof src, CKPT_MEM_HOST, 2), -EAGAIN);
	/* Host mode: seal calls landed at once and hands out no event. */
	void *ev = (void *)1;
	landed_calls = 0;
	ck_assert_int_eq(snapshot_pipe_seal(p, &ev, count_landed, &landed_calls), 0);
	ck_assert_int_eq(landed_calls, 1);
	ck_assert_ptr_null(ev);
	ck_assert_int_eq(snapshot_pipe_seal(p, &ev, count_landed, &landed_calls), -EINVAL);
	ck_assert_int_eq(snapshot_pipe_issue(p, src, sizeof src, CKPT_MEM_HOST, 3), -EINVAL);
	ck_assert_int_eq(landed_calls, 1);
	snapshot_pipe_close(p);
	ck_assert_uint_eq(io_pool_nfree(pool), 2);
	io_pool_destroy(pool);
	/* Memory kinds on a host-only snapshot. */
	int dev = 7;
	ck_assert_int_eq(snapshot_mem_kind(sn, src, CKPT_MEM_AUTO, &dev), CKPT_MEM_HOST);
	ck_assert_int_eq(dev, -1);
	ck_assert_int_eq(snapshot_mem_kind(sn, src, CKPT_MEM_HOST, &dev), CKPT_MEM_HOST);
	ck_assert_int_eq(snapshot_mem_kind(sn, src, CKPT_MEM_DEVICE, &dev), CKPT_ENODEV);
	ck_assert_int_eq(snapshot_mem_kind(sn, src, 9, &dev), -EINVAL);
	/* Window sizes: at least one, never the whole pool while writes need buffers. */
	ck_assert_uint_eq(snapshot_pipe_window(2, 8), 1);
	ck_assert_uint_eq(snapshot_pipe_window(1, 8), 1);
	ck_assert_uint_eq(snapshot_pipe_window(16, 8), 8);
	ck_assert_uint_eq(snapshot_pipe_window(512, 8), 504);
	/* Load side, host memory: a plain copy, nothing to wait for. */
	uint8_t out[64];
	memset(src, 0xAB, sizeof src);
	ck_assert_int_eq(snapshot_copy_out(sn, out, src, sizeof out, CKPT_MEM_HOST), 0);
	ck_assert(!memcmp(out, src, sizeof out));
	ck_assert_int_eq(snapshot_copy_out(sn, out, src, sizeof out, CKPT_MEM_DEVICE), CKPT_ENODEV);
	ck_assert_int_eq(snapshot_copy_out_wait(sn), 0);
	snapshot_destroy(sn);
}
END_TEST

/* ------------------------------------------------------------------ through the API */

static ckpt_ctx *open_ctx(size_t chunk, size_t pool)
{
	struct ckpt_opts o;
	ckpt_opts_init(&o, sizeof o);
	o.root = root;
	o.rank = 0;
	o.world = 1;
	o.chunk_bytes = chunk;
	o.pool_bytes = pool;
	o.queue_depth = 2;
	ckpt_ctx *c = NULL;
	ck_assert_msg(ckpt_open(&o, &c) == 0, "open %s: %s", root, ckpt_last_error());
	return c;
}

struct item {
	char     name[48];
	int      dtype;
	bool     blob;
	unsigned ndim;
	uint64_t shape[2];
	size_t   bytes;
	uint8_t *data;
};

static void item_make(struct item *it, const char *name, int dtype, unsigned ndim, uint64_t d0,
                      uint64_t d1, uint64_t stream)
{
	memset(it, 0, sizeof *it);
	snprintf(it->name, sizeof it->name, "%s", name);
	it->dtype = dtype;
	it->ndim = ndim;
	it->shape[0] = d0;
	it->shape[1] = d1;
	it->bytes = ckpt_dtype_size(dtype);
	for (unsigned d = 0; d < ndim; d++)
		it->bytes *= it->shape[d];
	it->data = malloc(it->bytes + 1);
	tu_fill(it->data, it->bytes, tu_seed(), stream);
}

static int save_items(ckpt_ctx *c, uint64_t step, struct item *its, size_t n)
{
	ckpt_save *s;
	int rc = ckpt_save_begin(c, step, &s);
	if (rc)
		return rc;
	for (size_t i = 0; i < n && !rc; i++) {
		if (its[i].blob) {
			rc = ckpt_save_add_blob(s, its[i].name, CKPT_KIND_EXTRA, CKPT_RANK_BOUND,
			                        its[i].data, its[i].bytes);
			continue;
		}
		struct ckpt_tensor t = {
			.name = its[i].name, .kind = CKPT_KIND_OPTIMIZER, .dtype = its[i].dtype,
			.policy = CKPT_SHARDED, .ndim = its[i].ndim, .global_shape = its[i].shape,
			.data = its[i].data, .mem = CKPT_MEM_AUTO,
		};
		rc = ckpt_save_add_tensor(s, &t);
	}
	if (!rc)
		rc = ckpt_save_submit(s);
	if (!rc) {
		rc = ckpt_save_wait_snapshot(s, -1);
		int w = ckpt_save_wait(s, -1);
		rc = rc ? rc : w;
	}
	if (!rc) {
		struct ckpt_save_stats st = { .size = sizeof st };
		ck_assert_int_eq(ckpt_save_stats(s, &st), 0);
		ck_assert(st.snapshot_seconds > 0 && st.snapshot_seconds <= st.durable_seconds);
	}
	ckpt_save_free(s);
	return rc;
}

static void check_items(ckpt_ctx *c, uint64_t step, struct item *its, size_t n, size_t chunk)
{
	ckpt_load *l;
	ck_assert_msg(ckpt_load_open(c, step, &l) == 0, "%s", ckpt_last_error());
	ck_assert_int_eq(ckpt_load_count(l), (int)n);
	for (size_t i = 0; i < n; i++) {
		uint8_t *got = malloc(its[i].bytes + 1);
		memset(got, 0x5A, its[i].bytes + 1);
		int rc;
		if (its[i].blob) {
			size_t len = 0;
			rc = ckpt_load_blob(l, its[i].name, got, its[i].bytes, &len);
			ck_assert_uint_eq(len, its[i].bytes);
		} else {
			rc = ckpt_load_tensor(l, its[i].name, its[i].dtype, its[i].ndim, NULL, NULL, got,
			                      CKPT_MEM_AUTO);
		}
		ck_assert_msg(rc == 0, "%s: %s", its[i].name, ckpt_last_error());
		ck_assert_msg(!memcmp(got, its[i].data, its[i].bytes), "%s differs (seed %llu)",
		              its[i].name, (unsigned long long)tu_seed());
		ck_assert_uint_eq(got[its[i].bytes], 0x5A);
		free(got);
	}
	/* The shard lists the items in the order they were added, each with its chunks
	 * consecutive and in raw order, whatever ran ahead in the pipe. */
	const struct io_shard_index *ix = l->ix[0];
	ck_assert_uint_eq(ix->ntensors, n);
	uint32_t next_chunk = 0;
	for (uint32_t t = 0; t < ix->ntensors; t++) {
		const struct io_tensor_entry *te = &ix->tensors[t];
		ck_assert_str_eq(te->name, its[t].name);
		ck_assert_uint_eq(te->nchunks, (its[t].bytes + chunk - 1) / chunk);
		if (!te->nchunks)
			continue;
		ck_assert_uint_eq(te->first_chunk, next_chunk);
		for (uint32_t k = 0; k < te->nchunks; k++) {
			const struct io_chunk_entry *ch = &ix->chunks[te->first_chunk + k];
			ck_assert_uint_eq(ch->tensor, t);
			ck_assert_uint_eq(ch->raw_offset, (uint64_t)k * chunk);
		}
		next_chunk = te->first_chunk + te->nchunks;
	}
	ck_assert_uint_eq(next_chunk, ix->nchunks);
	ckpt_load_close(l);
}

static void items_free(struct item *its, size_t n)
{
	for (size_t i = 0; i < n; i++)
		free(its[i].data);
}

START_TEST(pool_smaller_than_one_tensor)
{
	/* Two buffers of 64 KiB; a 1.3 MiB tensor must stream through them. */
	ckpt_ctx *c = open_ctx(BUF, 2 * BUF);
	struct item its[3];
	item_make(&its[0], "big", CKPT_F32, 2, 333, 1031, 1);        /* ~21 chunks */
	item_make(&its[1], "small", CKPT_BF16, 1, 7, 0, 2);
	item_make(&its[2], "exact", CKPT_U8, 1, 2 * BUF, 0, 3);      /* two full chunks */
	ck_assert_msg(save_items(c, 1, its, 3) == 0, "%s", ckpt_last_error());
	ck_assert_uint_eq(io_pool_nfree(c->pool), io_pool_nbufs(c->pool));
	check_items(c, 1, its, 3, BUF);
	ckpt_close(c);
	items_free(its, 3);
}
END_TEST

START_TEST(order_of_many_items)
{
	/* Empty items, scalars, blobs and multi-chunk tensors interleaved, with a window
	 * of several chunks: declaration order, chunk order and bytes must all hold. */
	ckpt_ctx *c = open_ctx(BUF, 6 * BUF);
	enum { N = 40 };
	struct item its[N];
	uint64_t rs = tu_seed() ^ 0x5eed;
	for (int i = 0; i < N; i++) {
		char name[48];
		snprintf(name, sizeof name, "layer%02d/%s", i, i % 5 == 0 ? "blob" : "w");
		int dtype = 1 + (int)(tu_rand(&rs) % CKPT_DTYPE_MAX_);
		uint64_t d0 = tu_rand(&rs) % 5 == 0 ? 0 : 1 + tu_rand(&rs) % 300;
		uint64_t d1 = 1 + tu_rand(&rs) % 700;
		if (i % 7 == 3)
			item_make(&its[i], name, dtype, 0, 0, 0, 100 + (uint64_t)i);     /* scalar */
		else
			item_make(&its[i], name, dtype, 2, d0, d1, 100 + (uint64_t)i);
		if (i % 5 == 0) {
			its[i].blob = true;
			its[i].dtype = CKPT_U8;
		}
	}
	ck_assert_msg(save_items(c, 5, its, N) == 0, "%s", ckpt_last_error());
	ck_assert_uint_eq(io_pool_nfree(c->pool), io_pool_nbufs(c->pool));
	check_items(c, 5, its, N, BUF);
	ckpt_close(c);
	items_free(its, N);
}
END_TEST

START_TEST(write_fails_mid_pipeline)
{
	ckpt_ctx *c = open_ctx(BUF, 4 * BUF);
	struct item good[1], big[2];
	item_make(&good[0], "w", CKPT_F32, 1, 3000, 0, 7);
	ck_assert_int_eq(save_items(c, 1, good, 1), 0);
	item_make(&big[0], "a", CKPT_F32, 2, 64, 1024, 8);      /* 16 chunks */
	item_make(&big[1], "b", CKPT_I16, 2, 64, 1024, 9);      /* 8 chunks */
	/* The third chunk's write fails while later copies are in the window. */
	setenv("CKPT_FAULT", "after_chunk_write:3:eio", 1);
	ckpt_fault_reload();
	int rc = save_items(c, 2, big, 2);
	ck_assert_msg(rc == -EIO, "rc %d (%s)", rc, ckpt_last_error());
	unsetenv("CKPT_FAULT");
	ckpt_fault_reload();
	/* Every buffer is back: the pipe's, the writer's, the compressor's. */
	ck_assert_uint_eq(io_pool_nfree(c->pool), io_pool_nbufs(c->pool));
	struct ckpt_step_info steps[4];
	ck_assert_int_eq(ckpt_steps(c, 0, steps, 4, sizeof *steps), 1);
	ck_assert_uint_eq(steps[0].step, 1);
	check_items(c, 1, good, 1, BUF);
	/* And the context still saves. */
	ck_assert_int_eq(save_items(c, 3, big, 2), 0);
	check_items(c, 3, big, 2, BUF);
	ck_assert_uint_eq(io_pool_nfree(c->pool), io_pool_nbufs(c->pool));
	ckpt_close(c);
	items_free(good, 1);
	items_free(big, 2);
}
END_TEST

START_TEST(cuda_entry_points_without_device)
{
	ckpt_ctx *c = open_ctx(BUF, 2 * BUF);
	if (ckpt_cuda_available(c)) {
		fprintf(stderr, "a CUDA device is present: tests/gpu covers the event\n");
		ckpt_close(c);
		return;
	}
	ck_assert_int_eq(ckpt_cuda_available(NULL), -EINVAL);
	ckpt_save *s;
	ck_assert_int_eq(ckpt_save_begin(c, 1, &s), 0);
	uint8_t data[100] = { 0 };
	uint64_t shape[1] = { 100 };
	struct ckpt_tensor t = {
		.name = "d", .kind = CKPT_KIND_MODEL, .dtype = CKPT_U8, .policy = CKPT_SHARDED,
		.ndim = 1, .global_shape = shape, .data = data, .mem = CKPT_MEM_DEVICE,
	};
	/* Refused when added, with the tensor's name, not half-way through the save. */
	ck_assert_int_eq(ckpt_save_add_tensor(s, &t), CKPT_ENODEV);
	ck_assert_msg(strstr(ckpt_last_error(), "'d'"), "%s", ckpt_last_error());
	t.mem = CKPT_MEM_AUTO;
	ck_assert_int_eq(ckpt_save_add_tensor(s, &t), 0);
	struct CUevent_st *ev = (struct CUevent_st *)1;
	ck_assert_int_eq(ckpt_save_snapshot_event(s, &ev), CKPT_ESTATE);
	ck_assert_ptr_null(ev);
	ck_assert_int_eq(ckpt_save_submit(s), 0);
	ck_assert_int_eq(ckpt_save_snapshot_event(s, &ev), CKPT_ENODEV);
	ck_assert_int_eq(ckpt_save_snapshot_event(s, NULL), -EINVAL);
	ck_assert_int_eq(ckpt_save_wait(s, -1), 0);
	ckpt_save_free(s);
	ckpt_close(c);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("snapshot");
	TCase *tc = tcase_create("pipe");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, pipe_owns_buffers_in_order);
	tcase_add_test(tc, pipe_inplace_chunks_take_no_buffer);
	tcase_add_test(tc, pipe_eagain_when_pool_empty);
	tcase_add_test(tc, pipe_fits_chunks_in_halving_pool);
	tcase_add_test(tc, pipe_seal_and_device_refused);
	tcase_add_test(tc, pool_smaller_than_one_tensor);
	tcase_add_test(tc, order_of_many_items);
	tcase_add_test(tc, write_fails_mid_pipeline);
	tcase_add_test(tc, cuda_entry_points_without_device);
	suite_add_tcase(s, tc);
	SRunner *sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
