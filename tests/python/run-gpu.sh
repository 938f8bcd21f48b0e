#!/usr/bin/env bash
# run-gpu.sh — the Python suites on the GPU machine (torch >= 2.4 and a CUDA device):
# builds libckpt with CUDA in BUILD_DIR (default build-gpu) when needed, then runs
# every file of tests/python with that library, the ones that skip here included.
#   tests/python/run-gpu.sh [BUILD_DIR]      Env: PYTHON (python3), OUT (copy the log)
set -uo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build-gpu}
py=${PYTHON:-python3}
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S . -B "$build" -DCKPT_WITH_CUDA=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCKPT_BUILD_CKPTD=OFF \
        -DCKPT_BUILD_TESTS=OFF >/dev/null || exit 1
fi
cmake --build "$build" -j"$(nproc)" --target ckpt ckpt-inspect ckpt-reshard ckpt-synth \
  >/dev/null || exit 1
export LIBCKPT_LIBRARY=$PWD/$build/libckpt.so.0 PYTHONPATH=$PWD/python
export CKPT_TEST_SEED=${CKPT_TEST_SEED:-$(date +%s)}
echo "== $("$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available())'), CKPT_TEST_SEED=$CKPT_TEST_SEED"
log=$(mktemp)
"$py" -m pytest -q -rs -p no:cacheprovider tests/python 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
[ -n "${OUT:-}" ] && mkdir -p "$OUT" && cp "$log" "$OUT/python-gpu.log"
rm -f "$log"
exit "$rc"
