/*
 * bench_raw_io.c — the disk's limit for a save and a load: sequential O_DIRECT
 * writes (with the final fdatasync) and reads of one file as large as the
 * checkpoint, through the same io_uring engine and registered pool buffers that
 * libckpt uses, with no hashing, format or copies. fio may be missing on the GPU
 * machine; this needs nothing but the build. Prints one JSON object with the best
 * of the (chunk, depth) configurations tried, and each of them.
 *
 *   bench_raw_io PATH [MiB total (7168)] [write]
 *
 * PATH is created and removed. Configurations: 16 MiB x 8 (libckpt's defaults) and
 * 4 MiB x 4 (DCP's best configuration in docs/perf.md §3). "write" measures the
 * writes only (bench/ckptd: ckptd's disk takes writes; its reads are not timed there),
 * and read_Bps is then 0.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/io_internal.h"

struct raw { struct io_pool *pool; unsigned inflight; int err; };

static void raw_done(void *owner, uint64_t cookie, int64_t res)
{
	struct raw *r = owner;
	io_pool_put(r->pool, (unsigned)cookie);
	r->inflight--;
	if (res < 0)
		r->err = (int)res;
}

/* One sequential pass; returns bytes/s, or a negative code. */
static double pass(struct io_engine *e, struct io_pool *pool, int fd, enum io_op op,
                   uint64_t total, size_t chunk)
{
	struct raw r = { pool, 0, 0 };
	uint64_t t0 = ckpt_now_ns();
	for (uint64_t off = 0; off < total; off += chunk) {
		int b;
		while ((b = io_pool_get(pool, 0)) < 0)
			if (io_engine_reap(e, true) < 0)
				return -EIO;
		int rc = io_engine_queue(e, op, fd, io_pool_addr(pool, (unsigned)b), chunk, off,
		                         raw_done, &r, (uint64_t)b);
		if (rc < 0)
			return rc;
		r.inflight++;
	}
	while (r.inflight)
		if (io_engine_reap(e, true) < 0)
			return -EIO;
	if (op == IO_OP_WRITE && fdatasync(fd) < 0)
		return -errno;
	uint64_t t1 = ckpt_now_ns();
	return r.err ? r.err : (double)total / ((double)(t1 - t0) / 1e9);
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: bench_raw_io PATH [MiB total] [write]\n");
		return 2;
	}
	const char *path = argv[1];
	uint64_t total = (uint64_t)(argc > 2 ? atol(argv[2]) : 7168) << 20;
	bool write_only = argc > 3 && !strcmp(argv[3], "write");
	struct { size_t chunk; unsigned depth; double w, r; } cfg[] = {
		{ 16u << 20, 8, 0, 0 }, { 4u << 20, 4, 0, 0 },
	};
	double best_w = 0, best_r = 0;
	for (size_t i = 0; i < sizeof cfg / sizeof cfg[0]; i++) {
		uint64_t t = total / cfg[i].chunk * cfg[i].chunk;
		struct io_pool *pool;
		struct io_engine *e;
		if (io_pool_create(cfg[i].chunk, 2 * cfg[i].depth, NULL, &pool) ||
		    io_engine_create(pool, cfg[i].depth, &e)) {
			fprintf(stderr, "bench_raw_io: %s\n", ckpt_err_msg());
			return 1;
		}
		for (unsigned b = 0; b < 2 * cfg[i].depth; b++)
			memset(io_pool_addr(pool, b), (int)(0x40 + b), cfg[i].chunk);
		int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0644);
		if (fd < 0) {
			fprintf(stderr, "bench_raw_io: open %s with O_DIRECT: %s\n", path, strerror(errno));
			return 1;
		}
		/* Sized first, as the shard writer does: extending O_DIRECT writes serialise. */
		if (ftruncate(fd, (off_t)t) < 0) {
			perror("ftruncate");
			return 1;
		}
		cfg[i].w = pass(e, pool, fd, IO_OP_WRITE, t, cfg[i].chunk);
		/* O_DIRECT reads do not touch the page cache: no cache to drop. */
		if (!write_only)
			cfg[i].r = pass(e, pool, fd, IO_OP_READ, t, cfg[i].chunk);
		close(fd);
		unlink(path);
		io_engine_destroy(e);
		io_pool_destroy(pool);
		if (cfg[i].w < 0 || cfg[i].r < 0) {
			fprintf(stderr, "bench_raw_io: %s\n", ckpt_strerror((int)(cfg[i].w < 0 ? cfg[i].w : cfg[i].r)));
			return 1;
		}
		if (cfg[i].w > best_w) best_w = cfg[i].w;
		if (cfg[i].r > best_r) best_r = cfg[i].r;
	}
	printf("{\"bytes\": %llu, \"write_Bps\": %.0f, \"read_Bps\": %.0f, \"configs\": [",
	       (unsigned long long)total, best_w, best_r);
	for (size_t i = 0; i < sizeof cfg / sizeof cfg[0]; i++)
		printf("%s{\"chunk_bytes\": %zu, \"depth\": %u, \"write_Bps\": %.0f, \"read_Bps\": %.0f}",
		       i ? ", " : "", cfg[i].chunk, cfg[i].depth, cfg[i].w, cfg[i].r);
	printf("]}\n");
	return 0;
}
