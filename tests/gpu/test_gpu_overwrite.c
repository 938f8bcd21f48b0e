/*
 * test_gpu_overwrite.c — the snapshot point is a promise: once
 * ckpt_save_wait_snapshot returns, the caller overwrites its device tensors at
 * once, and the checkpoint must still hold the values they had at submit. Run with
 * a state that fits in the pool (every copy issued up front) and with one four
 * times the pool (copies wait for buffers that writes give back, so the snapshot
 * point comes late and copies and writes interleave).
 *
 * Usage: test_gpu_overwrite     exit 0 / 1 / 77 (gpu_test.h)
 */
#include "gpu_test.h"

#define CHUNK (1u << 20)
#define NT 4
#define TBYTES (8u << 20)

static void run(const char *root, size_t pool, uint64_t step)
{
	ckpt_ctx *c = gt_open(root, CHUNK, pool);
	void *dev[NT];
	uint8_t *ref[NT];
	char names[NT][32];
	uint64_t shape[1] = { TBYTES / 4 };
	ckpt_save *s;
	CKPT_OK(c, ckpt_save_begin(c, step, &s));
	for (int i = 0; i < NT; i++) {
		dev[i] = gt_device_data(TBYTES, step * 100 + (uint64_t)i, &ref[i]);
		snprintf(names[i], sizeof names[i], "opt/m%d", i);
		struct ckpt_tensor t = {
			.name = names[i], .kind = CKPT_KIND_OPTIMIZER, .dtype = CKPT_F32,
			.policy = CKPT_SHARDED, .ndim = 1, .global_shape = shape, .data = dev[i],
			.mem = CKPT_MEM_AUTO,
		};
		CKPT_OK(c, ckpt_save_add_tensor(s, &t));
	}
	double t0 = gt_now();
	CKPT_OK(c, ckpt_save_submit(s));
	CKPT_OK(c, ckpt_save_wait_snapshot(s, -1));
	double t1 = gt_now();
	/* The caller's next step: every saved byte changes, right now. */
	for (int i = 0; i < NT; i++)
		CUDA_OK(cudaMemset(dev[i], 0xEE, TBYTES));
	CUDA_OK(cudaDeviceSynchronize());
	CKPT_OK(c, ckpt_save_wait(s, -1));
	double t2 = gt_now();
	ckpt_save_free(s);
	printf("pool %zu MiB, state %u MiB: snapshot point after %.4f s, durable after %.4f s\n",
	       pool >> 20, NT * (TBYTES >> 20), t1 - t0, t2 - t0);

	ckpt_load *l;
	CKPT_OK(c, ckpt_load_open(c, step, &l));
	for (int i = 0; i < NT; i++) {
		gt_check_host_load(c, l, names[i], CKPT_F32, 1, ref[i], TBYTES);
		/* The test could fail: the device really holds the new values. */
		uint8_t probe[16];
		CUDA_OK(cudaMemcpy(probe, (uint8_t *)dev[i] + TBYTES - 16, 16, cudaMemcpyDeviceToHost));
		CHECK(probe[0] == 0xEE && probe[15] == 0xEE, "the overwrite did not happen");
		CUDA_OK(cudaFree(dev[i]));
		free(ref[i]);
	}
	ckpt_load_close(l);
	ckpt_close(c);
}

int main(void)
{
	gt_require_device("test_gpu_overwrite");
	char *root = tu_tmpdir("gpu-ow");
	run(root, 64u << 20, 1);              /* fits: 32 MiB in a 64 MiB pool */
	run(root, 8u << 20, 2);               /* streams: 32 MiB through 8 MiB */
	tu_rmtree(root);
	free(root);
	printf("PASS test_gpu_overwrite\n");
	return 0;
}
