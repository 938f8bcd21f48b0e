/*
 * test_gds_abi.c — lib/snapshot/gds_abi.h (cuFile's C ABI as gds.c declares it for
 * dlopen) against the real cufile.h: the same sizes, field offsets and constants.
 * Built only where the CUDA toolkit ships cufile.h (tests/gpu/gpu.cmake); most of
 * the checks are compile-time, the rest run. Exit 0 / 1.
 */
#include <stddef.h>
#include <stdio.h>

#include <cufile.h>

#include "snapshot/gds_abi.h"

_Static_assert(sizeof(gds_status_t) == sizeof(CUfileError_t), "CUfileError_t size");
_Static_assert(offsetof(gds_status_t, err) == offsetof(CUfileError_t, err), "err offset");
_Static_assert(offsetof(gds_status_t, cu_err) == offsetof(CUfileError_t, cu_err), "cu_err");
_Static_assert(sizeof(gds_descr_t) == sizeof(CUfileDescr_t), "CUfileDescr_t size");
_Static_assert(offsetof(gds_descr_t, type) == offsetof(CUfileDescr_t, type), "type offset");
_Static_assert(offsetof(gds_descr_t, handle) == offsetof(CUfileDescr_t, handle), "handle");
_Static_assert(offsetof(gds_descr_t, fs_ops) == offsetof(CUfileDescr_t, fs_ops), "fs_ops");
_Static_assert(sizeof(gds_handle_t) == sizeof(CUfileHandle_t), "CUfileHandle_t size");
/* The functions gds.c resolves by name have the types it calls them with (checked
 * by type only: nothing here links libcufile). */
#define SAME(f, t) _Static_assert(__builtin_types_compatible_p(__typeof__(&f), t), #f)
SAME(cuFileDriverOpen, CUfileError_t (*)(void));
SAME(cuFileHandleRegister, CUfileError_t (*)(CUfileHandle_t *, CUfileDescr_t *));
SAME(cuFileHandleDeregister, void (*)(CUfileHandle_t));
SAME(cuFileRead, ssize_t (*)(CUfileHandle_t, void *, size_t, off_t, off_t));
SAME(cuFileWrite, ssize_t (*)(CUfileHandle_t, const void *, size_t, off_t, off_t));

int main(void)
{
	int bad = 0;
	if (GDS_SUCCESS != CU_FILE_SUCCESS) {
		fprintf(stderr, "FAIL: CU_FILE_SUCCESS is %d, gds_abi.h says %d\n", CU_FILE_SUCCESS,
		        GDS_SUCCESS);
		bad = 1;
	}
	if (GDS_HANDLE_TYPE_OPAQUE_FD != CU_FILE_HANDLE_TYPE_OPAQUE_FD) {
		fprintf(stderr, "FAIL: CU_FILE_HANDLE_TYPE_OPAQUE_FD is %d, gds_abi.h says %d\n",
		        CU_FILE_HANDLE_TYPE_OPAQUE_FD, GDS_HANDLE_TYPE_OPAQUE_FD);
		bad = 1;
	}
	if (!bad)
		printf("PASS test_gds_abi: gds_abi.h matches cufile.h\n");
	return bad;
}
