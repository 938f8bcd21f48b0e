# tests/gpu — the CUDA tests (plain C programs, no Check: the GPU machine may lack
# it). Included from the top-level CMakeLists.txt whenever CKPT_HAVE_CUDA, also with
# CKPT_BUILD_TESTS=OFF, which is why this file is not a CMakeLists.txt that the
# tests/ folder would pick up a second time. Each test exits 77 without a device.
#
# Run them on the GPU machine:  ctest --test-dir BUILD -L gpu --output-on-failure
enable_testing()

# The CUDA language (nvcc) only for the one kernel of test_gpu_event; the library
# and every other test use the runtime API from C.
include(CheckLanguage)
check_language(CUDA)
if(CMAKE_CUDA_COMPILER)
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    # sm_90 (H100/H200) plus its PTX, which newer GPUs JIT-compile; 75/80 for the rest.
    set(CMAKE_CUDA_ARCHITECTURES 75 80 90)
  endif()
  enable_language(CUDA)
else()
  message(STATUS "libckpt: no CUDA compiler for the test kernel; test_gpu_event uses a memset")
endif()

set(CKPT_GPU_TEST_DIR ${CMAKE_CURRENT_LIST_DIR})
function(ckpt_gpu_test name)
  cmake_parse_arguments(T "" "" "SOURCES;ARGS" ${ARGN})
  add_executable(${name} ${T_SOURCES} ${PROJECT_SOURCE_DIR}/tests/testutil.c)
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/tests ${PROJECT_SOURCE_DIR}/lib
                             ${CKPT_GPU_TEST_DIR})
  target_compile_definitions(${name} PRIVATE _GNU_SOURCE)
  target_link_libraries(${name} PRIVATE ckpt_static CUDA::cudart)
endfunction()
function(ckpt_gpu_add name exe)
  add_test(NAME ${name} COMMAND ${exe} ${ARGN})
  set_tests_properties(${name} PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600 LABELS "gpu")
endfunction()

ckpt_gpu_test(test_gpu_roundtrip SOURCES ${CKPT_GPU_TEST_DIR}/test_gpu_roundtrip.c)
ckpt_gpu_add(test_gpu_roundtrip test_gpu_roundtrip)
ckpt_gpu_add(test_gpu_load_device test_gpu_roundtrip --load-device)
ckpt_gpu_add(test_gpu_gds test_gpu_roundtrip --gds)
# cuFile cannot read the udev volume attributes of a VM's virtio disk and then refuses
# every file; CUFILE_EXPERIMENTAL_FS lets it register them (docs/gpu.md). Where it
# refuses anyway, the test checks the fallback and skips the rest.
ckpt_gpu_add(test_gpu_gds_refused test_gpu_roundtrip --gds)
set_tests_properties(test_gpu_gds PROPERTIES ENVIRONMENT "CUFILE_EXPERIMENTAL_FS=true;CUFILE_SKIP_TOPOLOGY_DETECTION=true")
# cuFile's ABI as lib/snapshot/gds_abi.h declares it, checked against cufile.h where
# the toolkit has it (the GPU machine does; a toolkit without GDS skips this).
find_path(CKPT_CUFILE_INCLUDE cufile.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
if(CKPT_CUFILE_INCLUDE)
  ckpt_gpu_test(test_gds_abi SOURCES ${CKPT_GPU_TEST_DIR}/test_gds_abi.c)
  target_include_directories(test_gds_abi PRIVATE ${CKPT_CUFILE_INCLUDE})
  ckpt_gpu_add(test_gds_abi test_gds_abi)
endif()
ckpt_gpu_test(test_gpu_overwrite SOURCES ${CKPT_GPU_TEST_DIR}/test_gpu_overwrite.c)
ckpt_gpu_add(test_gpu_overwrite test_gpu_overwrite)
ckpt_gpu_test(test_gpu_pool SOURCES ${CKPT_GPU_TEST_DIR}/test_gpu_pool.c)
ckpt_gpu_add(test_gpu_pool test_gpu_pool)
ckpt_gpu_test(test_gpu_stage SOURCES ${CKPT_GPU_TEST_DIR}/test_gpu_stage.c)
ckpt_gpu_add(test_gpu_stage test_gpu_stage)
if(CMAKE_CUDA_COMPILER)
  ckpt_gpu_test(test_gpu_event SOURCES ${CKPT_GPU_TEST_DIR}/test_gpu_event.c
                ${CKPT_GPU_TEST_DIR}/flip_kernel.cu)
  target_compile_definitions(test_gpu_event PRIVATE CKPT_TEST_HAVE_KERNEL=1)
  # One CUDA runtime in the process: the shared one libckpt links, not nvcc's
  # default static copy next to it.
  set_target_properties(test_gpu_event PROPERTIES CUDA_RUNTIME_LIBRARY Shared)
else()
  ckpt_gpu_test(test_gpu_event SOURCES ${CKPT_GPU_TEST_DIR}/test_gpu_event.c)
endif()
ckpt_gpu_add(test_gpu_event test_gpu_event)
ckpt_gpu_test(test_gpu_two_ranks SOURCES ${CKPT_GPU_TEST_DIR}/test_gpu_two_ranks.c)
ckpt_gpu_add(test_gpu_two_ranks test_gpu_two_ranks)
# A save sees the writes queued before submit (the late optimizer step is a kernel:
# without the CUDA language the test skips).
if(CMAKE_CUDA_COMPILER)
  ckpt_gpu_test(test_gpu_order SOURCES ${CKPT_GPU_TEST_DIR}/test_gpu_order.c
                ${CKPT_GPU_TEST_DIR}/flip_kernel.cu)
  target_compile_definitions(test_gpu_order PRIVATE CKPT_TEST_HAVE_KERNEL=1)
  set_target_properties(test_gpu_order PROPERTIES CUDA_RUNTIME_LIBRARY Shared)
else()
  ckpt_gpu_test(test_gpu_order SOURCES ${CKPT_GPU_TEST_DIR}/test_gpu_order.c)
endif()
ckpt_gpu_add(test_gpu_order test_gpu_order)
# The CUDA runtime is loaded on demand, not linked (lib/snapshot/cudart.c).
add_test(NAME test_cudart_on_demand COMMAND bash ${CKPT_GPU_TEST_DIR}/test_cudart_on_demand.sh
         $<TARGET_FILE:ckpt> $<TARGET_FILE:ckpt-synth>)
set_tests_properties(test_cudart_on_demand PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300 LABELS "gpu")

# The same programs against a stand-in runtime on host memory (fake_cudart.c), where
# no GPU is: libckpt's device path — pinned pipe, snapshot events, loads to device
# memory, the staging pool and its compare-and-copy — runs in every build, under the
# sanitizers too. The stand-in is the test's CUDA runtime and, through CKPT_CUDART,
# libckpt's.
add_library(fakecudart SHARED ${CKPT_GPU_TEST_DIR}/fake_cudart.c)
target_include_directories(fakecudart PRIVATE ${CUDAToolkit_INCLUDE_DIRS} ${PROJECT_SOURCE_DIR}/lib)
set_target_properties(fakecudart PROPERTIES C_VISIBILITY_PRESET hidden)
function(ckpt_gpu_fake name src)
  add_executable(${name}_fake ${src} ${PROJECT_SOURCE_DIR}/tests/testutil.c)
  target_include_directories(${name}_fake PRIVATE ${PROJECT_SOURCE_DIR}/tests
                             ${PROJECT_SOURCE_DIR}/lib ${CKPT_GPU_TEST_DIR})
  target_compile_definitions(${name}_fake PRIVATE _GNU_SOURCE CKPT_FAKE_CUDART)
  target_link_libraries(${name}_fake PRIVATE ckpt_static fakecudart)
endfunction()
function(ckpt_gpu_fake_add name exe)
  add_test(NAME ${name} COMMAND ${exe} ${ARGN})
  set_tests_properties(${name} PROPERTIES TIMEOUT 300 LABELS "unit;snapshot"
                       ENVIRONMENT "CKPT_CUDART=$<TARGET_FILE:fakecudart>")
endfunction()
ckpt_gpu_fake(test_gpu_roundtrip ${CKPT_GPU_TEST_DIR}/test_gpu_roundtrip.c)
ckpt_gpu_fake_add(test_gpu_roundtrip_fake test_gpu_roundtrip_fake)
ckpt_gpu_fake_add(test_gpu_load_device_fake test_gpu_roundtrip_fake --load-device)
ckpt_gpu_fake(test_gpu_overwrite ${CKPT_GPU_TEST_DIR}/test_gpu_overwrite.c)
ckpt_gpu_fake_add(test_gpu_overwrite_fake test_gpu_overwrite_fake)
ckpt_gpu_fake(test_gpu_pool ${CKPT_GPU_TEST_DIR}/test_gpu_pool.c)
ckpt_gpu_fake_add(test_gpu_pool_fake test_gpu_pool_fake)
ckpt_gpu_fake(test_gpu_stage ${CKPT_GPU_TEST_DIR}/test_gpu_stage.c)
ckpt_gpu_fake_add(test_gpu_stage_fake test_gpu_stage_fake)
add_test(NAME test_gpu_stage_nokernel_fake COMMAND test_gpu_stage_fake)
set_tests_properties(test_gpu_stage_nokernel_fake PROPERTIES TIMEOUT 300 LABELS "unit;snapshot"
                     ENVIRONMENT "CKPT_CUDART=$<TARGET_FILE:fakecudart>;FAKE_CUDART_NO_KERNEL=1")
