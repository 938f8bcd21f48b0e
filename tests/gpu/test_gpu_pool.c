/*
 * test_gpu_pool.c — pool exhaustion: 40 MiB of device state through a 4 MiB pinned
 * pool (ten times over). ckpt_save_snapshot_event must still come back (once the
 * last copy is issued, which waits for buffers that completed writes give back),
 * the event must complete, the bytes must round-trip, host memory must stay the
 * pool's (no buffer beyond its count, every buffer back after the save), and a
 * second save in flight behind the first must work through the same pool.
 *
 * Usage: test_gpu_pool     exit 0 / 1 / 77 (gpu_test.h)
 */
#include "gpu_test.h"
#include "glue.h"          /* the context's pool: buffers back after the save */

#define CHUNK (512u << 10)
#define POOL  (4u << 20)

int main(void)
{
	gt_require_device("test_gpu_pool");
	char *root = tu_tmpdir("gpu-pool");
	ckpt_ctx *c = gt_open(root, CHUNK, POOL);
	CHECK(io_pool_nbufs(c->pool) == POOL / CHUNK, "pool of %u buffers", io_pool_nbufs(c->pool));
	uint64_t sizes[3] = { 24u << 20, (12u << 20) + 4096 * 3 + 2, (4u << 20) - 2 };
	void *dev[2][3];
	uint8_t *ref[2][3];
	char names[3][16] = { "a", "b", "c" };
	ckpt_save *s[2];
	cudaEvent_t ev[2];
	double stall[2];
	for (int k = 0; k < 2; k++) {
		CKPT_OK(c, ckpt_save_begin(c, (uint64_t)k + 1, &s[k]));
		for (int i = 0; i < 3; i++) {
			dev[k][i] = gt_device_data(sizes[i], (uint64_t)(10 * k + i), &ref[k][i]);
			uint64_t shape[1] = { sizes[i] / 2 };
			struct ckpt_tensor t = {
				.name = names[i], .kind = CKPT_KIND_MODEL, .dtype = CKPT_BF16,
				.policy = CKPT_SHARDED, .ndim = 1, .global_shape = shape,
				.data = dev[k][i], .mem = CKPT_MEM_DEVICE,
			};
			CKPT_OK(c, ckpt_save_add_tensor(s[k], &t));
		}
		double t0 = gt_now();
		CKPT_OK(c, ckpt_save_submit(s[k]));
		CKPT_OK(c, ckpt_save_snapshot_event(s[k], &ev[k]));
		stall[k] = gt_now() - t0;
		CHECK(ev[k] != NULL, "no event");
	}
	for (int k = 0; k < 2; k++) {
		/* Completes at the snapshot point; then the tensors are the caller's again. */
		CUDA_OK(cudaEventSynchronize(ev[k]));
		for (int i = 0; i < 3; i++)
			CUDA_OK(cudaMemset(dev[k][i], 0x11, sizes[i]));
		CUDA_OK(cudaDeviceSynchronize());
		CKPT_OK(c, ckpt_save_wait(s[k], -1));
		ckpt_save_free(s[k]);
		printf("save %d: 40 MiB through a %u MiB pool, event after %.4f s of host stall\n",
		       k + 1, POOL >> 20, stall[k]);
	}
	CHECK(io_pool_nfree(c->pool) == io_pool_nbufs(c->pool), "%u of %u buffers back",
	      io_pool_nfree(c->pool), io_pool_nbufs(c->pool));
	for (int k = 0; k < 2; k++) {
		ckpt_load *l;
		CKPT_OK(c, ckpt_load_open(c, (uint64_t)k + 1, &l));
		for (int i = 0; i < 3; i++) {
			gt_check_host_load(c, l, names[i], CKPT_BF16, 1, ref[k][i], sizes[i]);
			CUDA_OK(cudaFree(dev[k][i]));
			free(ref[k][i]);
		}
		ckpt_load_close(l);
	}
	ckpt_close(c);
	tu_rmtree(root);
	free(root);
	printf("PASS test_gpu_pool\n");
	return 0;
}
