/*
 * test_gpu_two_ranks.c — two rank processes, each on its own GPU, save one step of
 * device tensors with the two-phase commit; each overwrites its tensors right after
 * its snapshot point; then one process restores the step resharded (2 -> 1) onto a
 * single GPU and compares every byte with what was there before the overwrite.
 * Prints each rank's snapshot and commit times. Exit 77 with fewer than two devices.
 *
 *   test_gpu_two_ranks [BYTES_PER_TENSOR]   (default 64 MiB; CKPT_TEST_SEED)
 */
#include <errno.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpu_test.h"

#define NT 6

static const int dtypes[NT] = { CKPT_BF16, CKPT_F32, CKPT_F16, CKPT_I64, CKPT_F8_E4M3, CKPT_BOOL };

/* Tensor i of the global model: [rows, 1021] of dtypes[i]; its bytes from the seed. */
static uint64_t rows_of(size_t per_tensor, int i)
{
	return per_tensor / (1021 * ckpt_dtype_size(dtypes[i])) + (uint64_t)i;
}

static void global_bytes(int i, uint64_t rows, uint8_t *out)
{
	tu_fill(out, rows * 1021 * ckpt_dtype_size(dtypes[i]), tu_seed(), 4000 + (uint64_t)i);
}

static int rank_main(const char *root, int rank, size_t per_tensor, unsigned port)
{
	CUDA_OK(cudaSetDevice(rank));
	struct ckpt_opts o;
	ckpt_opts_init(&o, sizeof o);
	o.root = root;
	o.rank = rank;
	o.world = 2;
	o.coord_addr = "127.0.0.1";
	o.coord_port = port;
	o.job_id = "gpu-two-ranks";
	o.secret = "gpu-two-ranks-test-secret";      /* a job of two ranks authenticates */
	o.secret_len = strlen(o.secret);
	o.pool_bytes = 1ull << 30;
	ckpt_ctx *c = NULL;
	CKPT_OK(c, ckpt_open(&o, &c));
	CHECK(ckpt_cuda_available(c) == 1, "rank %d: libckpt sees no CUDA device", rank);
	void *dev[NT];
	uint64_t shape[NT][2], off[NT][2], ext[NT][2];
	ckpt_save *s = NULL;
	CKPT_OK(c, ckpt_save_begin(c, 1, &s));
	for (int i = 0; i < NT; i++) {
		uint64_t rows = rows_of(per_tensor, i), half = rows / 2;
		size_t es = ckpt_dtype_size(dtypes[i]);
		shape[i][0] = rows;
		shape[i][1] = 1021;
		off[i][0] = rank ? half : 0;
		ext[i][0] = rank ? rows - half : half;
		off[i][1] = 0;
		ext[i][1] = 1021;
		size_t gbytes = rows * 1021 * es, mine = ext[i][0] * 1021 * es;
		uint8_t *g = malloc(gbytes);
		CHECK(g != NULL, "host memory");
		global_bytes(i, rows, g);
		CUDA_OK(cudaMalloc(&dev[i], mine));
		CUDA_OK(cudaMemcpy(dev[i], g + off[i][0] * 1021 * es, mine, cudaMemcpyHostToDevice));
		free(g);
		char name[32];
		snprintf(name, sizeof name, "model/t%d", i);
		struct ckpt_tensor t = { .name = name, .kind = CKPT_KIND_MODEL, .dtype = dtypes[i],
		                         .policy = CKPT_SHARDED, .ndim = 2, .global_shape = shape[i],
		                         .offset = off[i], .extent = ext[i], .data = dev[i],
		                         .mem = CKPT_MEM_AUTO };
		CKPT_OK(c, ckpt_save_add_tensor(s, &t));
	}
	struct timespec a, b, d;
	clock_gettime(CLOCK_MONOTONIC, &a);
	CKPT_OK(c, ckpt_save_submit(s));
	CKPT_OK(c, ckpt_save_wait_snapshot(s, -1));
	clock_gettime(CLOCK_MONOTONIC, &b);
	/* Training goes on: the checkpoint must keep the values of the snapshot point. */
	for (int i = 0; i < NT; i++)
		CUDA_OK(cudaMemset(dev[i], 0x5A, ext[i][0] * 1021 * ckpt_dtype_size(dtypes[i])));
	CUDA_OK(cudaDeviceSynchronize());
	CKPT_OK(c, ckpt_save_wait(s, -1));
	clock_gettime(CLOCK_MONOTONIC, &d);
	printf("rank %d (GPU %d): snapshot point %.3f s, committed %.3f s\n", rank, rank,
	       (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) / 1e9,
	       (double)(d.tv_sec - a.tv_sec) + (double)(d.tv_nsec - a.tv_nsec) / 1e9);
	ckpt_save_free(s);
	for (int i = 0; i < NT; i++)
		CUDA_OK(cudaFree(dev[i]));
	ckpt_close(c);
	fflush(stdout);      /* the rank ends with _exit, which does not flush */
	return 0;
}

int main(int argc, char **argv)
{
	const char *me = "test_gpu_two_ranks";
	/* CUDA must not be initialised in a process that forks CUDA users: count the
	 * devices in a child of its own. */
	int n = 0;
	pid_t probe = fork();
	if (probe == 0) {
		int k = 0;
		_exit(cudaGetDeviceCount(&k) == cudaSuccess ? (k > 100 ? 100 : k) : 0);
	}
	int pst;
	if (probe > 0 && waitpid(probe, &pst, 0) == probe && WIFEXITED(pst))
		n = WEXITSTATUS(pst);
	if (n < 2) {
		printf("SKIP %s: needs two CUDA devices, found %d\n", me, n);
		return GT_SKIP;
	}
	size_t per_tensor = argc > 1 ? strtoull(argv[1], NULL, 0) : (64u << 20);
	/* One seed for the ranks and the checker: fixed here, before the forks. */
	char seed[32];
	snprintf(seed, sizeof seed, "%llu", (unsigned long long)tu_seed());
	setenv("CKPT_TEST_SEED", seed, 1);
	char *root = tu_tmpdir("gpu2");
	unsigned port = 21000u + (unsigned)(getpid() % 20000);
	fflush(stdout);
	pid_t pid[2];
	for (int r = 0; r < 2; r++) {
		pid[r] = fork();
		CHECK(pid[r] >= 0, "fork: %s", strerror(errno));
		if (pid[r] == 0)
			_exit(rank_main(root, r, per_tensor, port));
	}
	for (int r = 0; r < 2; r++) {
		int st;
		waitpid(pid[r], &st, 0);
		CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "rank %d failed (status %d)", r, st);
	}
	/* Restore onto one GPU: the two saved pieces are read and joined on device 0. */
	CUDA_OK(cudaSetDevice(0));
	struct ckpt_opts o;
	ckpt_opts_init(&o, sizeof o);
	o.root = root;
	o.rank = 0;
	o.world = 1;
	o.flags = CKPT_OPEN_READONLY;
	ckpt_ctx *c = NULL;
	CKPT_OK(c, ckpt_open(&o, &c));
	ckpt_load *l = NULL;
	CKPT_OK(c, ckpt_load_open(c, 1, &l));
	for (int i = 0; i < NT; i++) {
		uint64_t rows = rows_of(per_tensor, i);
		size_t bytes = rows * 1021 * ckpt_dtype_size(dtypes[i]);
		uint8_t *want = malloc(bytes), *got = malloc(bytes);
		void *dev;
		CHECK(want && got, "host memory");
		global_bytes(i, rows, want);
		CUDA_OK(cudaMalloc(&dev, bytes));
		CUDA_OK(cudaMemset(dev, 0, bytes));
		char name[32];
		snprintf(name, sizeof name, "model/t%d", i);
		CKPT_OK(c, ckpt_load_tensor(l, name, dtypes[i], 2, NULL, NULL, dev, CKPT_MEM_DEVICE));
		CUDA_OK(cudaMemcpy(got, dev, bytes, cudaMemcpyDeviceToHost));
		CHECK(!memcmp(got, want, bytes), "'%s' (%s) differs after the 2 -> 1 restore", name,
		      ckpt_dtype_name(dtypes[i]));
		CUDA_OK(cudaFree(dev));
		free(want);
		free(got);
	}
	ckpt_load_close(l);
	ckpt_close(c);
	printf("%s: 2 ranks on 2 GPUs saved %d tensors; restored 2 -> 1 onto GPU 0, bit-exact\n",
	       me, NT);
	tu_rmtree(root);
	free(root);
	return 0;
}
