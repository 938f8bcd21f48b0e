#!/usr/bin/env bash
# test.sh — the whole test suite, as CI runs it: installs dependencies, then builds
# and runs every test three times: a release build (all tests), ASan+UBSan (all
# tests), and TSan (the threaded tests, label 'tsan').
# Usage: scripts/test.sh [--quick]   (--quick: the release build only)
# The rdma suite boots a qemu guest (tests/rdma; a visible skip where it cannot).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
jobs=$(nproc)
build() {  # build DIR CMAKE_ARGS...
  local dir=$1; shift
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
  cmake --build "$dir" -j"$jobs" >/dev/null
}
export CKPT_TEST_SEED=${CKPT_TEST_SEED:-$(date +%s)}
echo "== test seed: CKPT_TEST_SEED=$CKPT_TEST_SEED"

echo "== release build"
build build
if [ "${1:-}" != "--quick" ]; then
  echo "== ASan+UBSan build"
  # The CUDA runtime and the sanitizers do not mix (shadow memory): under ASan the
  # real runtime is never loaded (CKPT_CUDART names no file, the tests linked
  # against it, label gpu, do not run), and libckpt's CUDA code runs against the
  # stand-in runtime on host memory (tests/gpu/fake_cudart.c, the *_fake tests),
  # where the toolkit's headers are there to build it.
  build build-asan -DCKPT_SANITIZE=address -DCKPT_BUILD_BENCH=OFF
  (cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
     CKPT_CUDART=/nonexistent/libcudart.so ctest --output-on-failure -j2 -LE 'slow|rdma|gpu' )
  echo "== TSan build (threaded tests)"
  build build-tsan -DCKPT_SANITIZE=thread -DCKPT_BUILD_BENCH=OFF -DCKPT_WITH_CUDA=OFF
  (cd build-tsan && TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
     ctest --output-on-failure -j2 -L tsan)
fi
echo "== release tests"
cd build && ctest --output-on-failure -j2
