/*
 * stage_kernel.h — the argument of the staging kernel (stage_kernel.cu), shared by
 * the kernel and the C code that launches it (stage.c). Plain C types only: nvcc
 * and the C compiler must lay it out the same way.
 *
 * One launch copies up to STAGE_BATCH_MAX ranges into the device staging pool, each
 * a run of blocks of the grid: range k owns blocks [r[k].first_block,
 * r[k + 1].first_block), the last one up to the grid's end. A range with a flag is
 * compare-and-copied (only differing 16-byte words are written, and the flag of each
 * chunk with a difference raised); one with STAGE_NO_FLAG is copied. The whole batch
 * is passed by value, as the kernel's one parameter: 4 KiB at most, the limit every
 * CUDA version takes.
 */
#ifndef CKPT_STAGE_KERNEL_H
#define CKPT_STAGE_KERNEL_H

#define STAGE_BATCH_MAX 120u
#define STAGE_NO_FLAG   0xffffffffu

struct stage_range {
	unsigned long long src;          /* device addresses, 16-byte aligned */
	unsigned long long dst;
	unsigned long long nbytes;       /* > 0 */
	unsigned           first_block;  /* its first block in the grid */
	unsigned           flag;         /* its first chunk's flag, or STAGE_NO_FLAG */
};

struct stage_batch {
	unsigned long long flags;        /* the flag words (a device address) */
	unsigned           n;            /* ranges, 1 .. STAGE_BATCH_MAX */
	unsigned           seg_words;    /* 16-byte words a block covers */
	unsigned           chunk_segs;   /* blocks a chunk is (flagged ranges) */
	unsigned           pad;
	struct stage_range r[STAGE_BATCH_MAX];
};

#endif
