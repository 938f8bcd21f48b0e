/*
 * bench_shard.c — shard save bandwidth against the raw limit: the same engine,
 * pool, depth and O_DIRECT file writing the same bytes with no hashing, footer or
 * codec ("raw"), then the shard writer ("shard", raw codec), then zstd level 1 on
 * compressible data ("shard+zstd1"). Both include fdatasync. Pool buffers are filled
 * once, so no copy is measured (the snapshot copy is lib/snapshot's cost).
 *
 * Usage: bench_shard DIR [MiB total] [MiB per chunk] [depth] [reps]
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/io_internal.h"

struct raw_ctx { struct io_pool *pool; unsigned inflight; int err; };

static void raw_done(void *owner, uint64_t cookie, int64_t res)
{
	struct raw_ctx *c = owner;
	io_pool_put(c->pool, (unsigned)cookie);
	c->inflight--;
	if (res < 0)
		c->err = (int)res;
}

static double raw_write(struct io_engine *e, struct io_pool *pool, const char *path,
                        uint64_t total, size_t chunk)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0644);
	if (fd < 0) { perror(path); exit(1); }
	if (ftruncate(fd, (off_t)total) < 0) { perror("ftruncate"); exit(1); }
	struct raw_ctx c = { pool, 0, 0 };
	uint64_t t0 = ckpt_now_ns();
	for (uint64_t off = 0; off < total; off += chunk) {
		int b;
		while ((b = io_pool_get(pool, 0)) < 0)
			io_engine_reap(e, true);
		if (io_engine_queue(e, IO_OP_WRITE, fd, io_pool_addr(pool, (unsigned)b), chunk, off,
		                    raw_done, &c, (uint64_t)b)) { fprintf(stderr, "queue\n"); exit(1); }
		c.inflight++;
	}
	while (c.inflight)
		io_engine_reap(e, true);
	fdatasync(fd);
	uint64_t t1 = ckpt_now_ns();
	close(fd);
	unlink(path);
	if (c.err) { fprintf(stderr, "raw: %s\n", ckpt_strerror(c.err)); exit(1); }
	return (double)total / ((double)(t1 - t0) / 1e9) / (1 << 20);
}

static double shard_write(struct io_engine *e, struct io_pool *pool, const char *path,
                          uint64_t total, size_t chunk, int zstd, double *ratio)
{
	struct io_shard_writer *w;
	uint64_t t0 = ckpt_now_ns();
	unlink(path);          /* the writer never replaces a file: each run writes it anew */
	struct io_writer_opts o = { .step = 1, .rank = 0, .world = 1, .size_hint = total + (1 << 20),
	                            .zstd_level = zstd, .block_bytes = IO_BLOCK_BYTES };
	if (io_shard_writer_open(e, path, &o, &w)) {
		fprintf(stderr, "%s\n", ckpt_err_msg()); exit(1);
	}
	uint64_t shape = total;
	uint64_t zero = 0;
	struct io_tensor_desc d = { "bench/w", CKPT_KIND_MODEL, CKPT_U8, CKPT_SHARDED, 0, 1,
	                            &shape, &zero, &shape, total };
	if (io_shard_writer_add_tensor(w, &d) != 0) { fprintf(stderr, "%s\n", ckpt_err_msg()); exit(1); }
	for (uint64_t off = 0; off < total; off += chunk) {
		int b = io_pool_get(pool, -1);
		if (io_shard_writer_append(w, 0, (unsigned)b, chunk, NULL)) {
			fprintf(stderr, "%s\n", ckpt_err_msg()); exit(1);
		}
	}
	struct io_shard_result res;
	if (io_shard_writer_finish(w, &res)) { fprintf(stderr, "%s\n", ckpt_err_msg()); exit(1); }
	uint64_t t1 = ckpt_now_ns();
	*ratio = (double)res.stored_bytes / (double)res.logical_bytes;
	io_index_free(res.index);
	free(res.footer);
	unlink(path);
	return (double)total / ((double)(t1 - t0) / 1e9) / (1 << 20);
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: %s DIR [MiB total] [MiB per chunk] [depth] [reps]\n", argv[0]);
		return 2;
	}
	uint64_t total = (argc > 2 ? strtoull(argv[2], NULL, 10) : 256) << 20;
	size_t chunk = (size_t)(argc > 3 ? strtoull(argv[3], NULL, 10) : 4) << 20;
	unsigned depth = argc > 4 ? (unsigned)atoi(argv[4]) : 4;
	int reps = argc > 5 ? atoi(argv[5]) : 3;
	total -= total % chunk;
	struct io_pool *pool;
	struct io_engine *e;
	if (io_pool_create(chunk, depth * 2 + 2, NULL, &pool) || io_engine_create(pool, depth, &e)) {
		fprintf(stderr, "%s\n", ckpt_err_msg());
		return 1;
	}
	char path[4096];
	snprintf(path, sizeof path, "%s/bench-%d.shard", argv[1], (int)getpid());
	printf("total %llu MiB, chunk %zu MiB, depth %u, %d reps (MiB/s, best of reps)\n",
	       (unsigned long long)(total >> 20), chunk >> 20, depth, reps);
	double best[3] = { 0, 0, 0 }, ratio = 1;
	for (int r = 0; r < reps; r++) {
		/* Random bytes for raw and shard: incompressible like real weights. */
		uint64_t s = 42 + (uint64_t)r;
		for (unsigned b = 0; b < io_pool_nbufs(pool); b++) {
			uint64_t *p = io_pool_addr(pool, b);
			for (size_t i = 0; i < chunk / 8; i++) {
				s = s * 6364136223846793005ull + 1442695040888963407ull;
				p[i] = s ^ (s >> 29);
			}
		}
		double v = raw_write(e, pool, path, total, chunk);
		best[0] = v > best[0] ? v : best[0];
		v = shard_write(e, pool, path, total, chunk, 0, &ratio);
		best[1] = v > best[1] ? v : best[1];
		/* Compressible bytes for zstd. */
		for (unsigned b = 0; b < io_pool_nbufs(pool); b++) {
			uint8_t *p = io_pool_addr(pool, b);
			for (size_t i = 0; i < chunk; i++)
				p[i] = (uint8_t)((i / 100) % 7 + (i % 3 == 0));
		}
		v = shard_write(e, pool, path, total, chunk, 1, &ratio);
		best[2] = v > best[2] ? v : best[2];
	}
	printf("%-14s %10s %8s\n", "mode", "MiB/s", "x raw");
	printf("%-14s %10.0f %8.2f\n", "raw", best[0], 1.0);
	printf("%-14s %10.0f %8.2f\n", "shard", best[1], best[1] / best[0]);
	printf("%-14s %10.0f %8.2f   (stored/logical %.3f)\n", "shard+zstd1", best[2],
	       best[2] / best[0], ratio);
	io_engine_destroy(e);
	io_pool_destroy(pool);
	return 0;
}
