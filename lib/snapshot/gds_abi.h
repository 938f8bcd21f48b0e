/*
 * gds_abi.h — the part of cuFile's C ABI that gds.c calls through dlopen, declared
 * from NVIDIA's public cuFile API reference: the status pair every call returns,
 * the file descriptor record of cuFileHandleRegister, and the opaque handle.
 * tests/gpu/test_gds_abi.c compiles these against cufile.h where it is installed
 * and checks sizes, offsets and constants, so a change in cuFile is a failed test,
 * not a silent misread.
 */
#ifndef CKPT_GDS_ABI_H
#define CKPT_GDS_ABI_H

#include <sys/types.h>

typedef struct gds_status {     /* CUfileError_t */
	int err;                    /* CUfileOpError; 0 = CU_FILE_SUCCESS */
	int cu_err;                 /* CUresult of the CUDA driver */
} gds_status_t;

enum { GDS_SUCCESS = 0, GDS_HANDLE_TYPE_OPAQUE_FD = 1 };

typedef struct gds_descr {      /* CUfileDescr_t */
	int type;                   /* enum CUfileFileHandleType */
	union {
		int   fd;
		void *handle;
	} handle;
	const void *fs_ops;         /* NULL: the kernel's file system */
} gds_descr_t;

typedef void *gds_handle_t;     /* CUfileHandle_t */

#endif /* CKPT_GDS_ABI_H */
