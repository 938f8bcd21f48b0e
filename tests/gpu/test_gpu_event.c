/*
 * test_gpu_event.c — the snapshot event: the host does not wait; an "optimizer"
 * stream waits on the event (cudaStreamWaitEvent) and then rewrites every saved
 * byte with a kernel. The checkpoint must hold the values from before the kernel,
 * and the kernel must really have run. The host-visible stall (begin .. event in
 * hand) is printed.
 *
 * A control run launches the same kernel without waiting on the event: the
 * checkpoint then usually catches some rewritten chunks. It is reported, not
 * asserted (it is a race by construction), as evidence that the main check is
 * able to fail.
 *
 * Usage: test_gpu_event     exit 0 / 1 / 77 (gpu_test.h)
 */
#include "gpu_test.h"

#ifdef CKPT_TEST_HAVE_KERNEL
int test_flip_bytes(void *p, size_t n, cudaStream_t s);   /* flip_kernel.cu */
#endif

#define NT     8
#define TBYTES (32u << 20)

/* Rewrite the n bytes at p on stream s: every byte to ~byte (kernel), or to 0xC3
 * without the CUDA language (memset on the same stream: the same ordering test). */
static void modify(void *p, size_t n, cudaStream_t s)
{
#ifdef CKPT_TEST_HAVE_KERNEL
	cudaError_t e = (cudaError_t)test_flip_bytes(p, n, s);
	CHECK(e == cudaSuccess, "kernel launch: %s", cudaGetErrorString(e));
#else
	CUDA_OK(cudaMemsetAsync(p, 0xC3, n, s));
#endif
}

static bool modified(const uint8_t *got, const uint8_t *ref, size_t n)
{
#ifdef CKPT_TEST_HAVE_KERNEL
	for (size_t i = 0; i < n; i++)
		if ((uint8_t)(got[i] ^ ref[i]) != 0xFF)
			return false;
	return true;
#else
	(void)ref;
	for (size_t i = 0; i < n; i++)
		if (got[i] != 0xC3)
			return false;
	return true;
#endif
}

/* One save of NT device tensors; wait_event: the optimizer stream waits on the
 * snapshot event. Returns how many of the saved chunks differ from the references. */
static int run(const char *root, uint64_t step, bool wait_event, double *stall)
{
	ckpt_ctx *c = gt_open(root, 4u << 20, 512u << 20);   /* the state fits: 256 MiB */
	cudaStream_t opt;
	CUDA_OK(cudaStreamCreateWithFlags(&opt, cudaStreamNonBlocking));
	void *dev[NT];
	uint8_t *ref[NT];
	char names[NT][32];
	uint64_t shape[2] = { 2048, TBYTES / 2048 / 4 };
	for (int i = 0; i < NT; i++) {
		dev[i] = gt_device_data(TBYTES, step * 100 + (uint64_t)i, &ref[i]);
		snprintf(names[i], sizeof names[i], "layers.%d.weight", i);
	}
	double t0 = gt_now();
	ckpt_save *s;
	CKPT_OK(c, ckpt_save_begin(c, step, &s));
	for (int i = 0; i < NT; i++) {
		struct ckpt_tensor t = {
			.name = names[i], .kind = CKPT_KIND_MODEL, .dtype = CKPT_F32,
			.policy = CKPT_SHARDED, .ndim = 2, .global_shape = shape, .data = dev[i],
			.mem = CKPT_MEM_AUTO,
		};
		CKPT_OK(c, ckpt_save_add_tensor(s, &t));
	}
	CKPT_OK(c, ckpt_save_submit(s));
	if (wait_event) {
		cudaEvent_t ev;
		CKPT_OK(c, ckpt_save_snapshot_event(s, &ev));
		CUDA_OK(cudaStreamWaitEvent(opt, ev, 0));
	}
	*stall = gt_now() - t0;
	/* The optimizer step, queued without the host waiting for anything. */
	for (int i = 0; i < NT; i++)
		modify(dev[i], TBYTES, opt);
	CUDA_OK(cudaStreamSynchronize(opt));
	CKPT_OK(c, ckpt_save_wait(s, -1));
	ckpt_save_free(s);

	int bad = 0;
	ckpt_load *l;
	CKPT_OK(c, ckpt_load_open(c, step, &l));
	uint8_t *got = malloc(TBYTES);
	CHECK(got, "malloc");
	for (int i = 0; i < NT; i++) {
		CKPT_OK(c, ckpt_load_tensor(l, names[i], CKPT_F32, 2, NULL, NULL, got, CKPT_MEM_HOST));
		for (size_t off = 0; off < TBYTES; off += 4u << 20)
			bad += memcmp(got + off, ref[i] + off, 4u << 20) != 0;
		/* The kernel ran: the device holds the rewritten values. */
		CUDA_OK(cudaMemcpy(got, dev[i], TBYTES, cudaMemcpyDeviceToHost));
		CHECK(modified(got, ref[i], TBYTES), "the optimizer step did not rewrite '%s'", names[i]);
		CUDA_OK(cudaFree(dev[i]));
		free(ref[i]);
	}
	free(got);
	ckpt_load_close(l);
	CUDA_OK(cudaStreamDestroy(opt));
	ckpt_close(c);
	return bad;
}

int main(void)
{
	gt_require_device("test_gpu_event");
#ifndef CKPT_TEST_HAVE_KERNEL
	printf("note: built without the CUDA language: the optimizer step is a cudaMemsetAsync\n");
#endif
	char *root = tu_tmpdir("gpu-ev");
	double stall;
	int bad = run(root, 1, true, &stall);
	printf("with the event: %d of %d chunks differ; host-visible stall %.3f ms\n", bad,
	       NT * (int)(TBYTES >> 22), stall * 1e3);
	CHECK(bad == 0, "%d chunks of the checkpoint hold values written after the snapshot event",
	      bad);
	double stall2;
	int raced = run(root, 2, false, &stall2);
	printf("control without the event (a race, not asserted): %d of %d chunks caught the "
	       "kernel's writes\n", raced, NT * (int)(TBYTES >> 22));
	tu_rmtree(root);
	free(root);
	printf("PASS test_gpu_event\n");
	return 0;
}
