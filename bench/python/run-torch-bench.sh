#!/usr/bin/env bash
# run-torch-bench.sh — the Python path against the raw limits and DCP's best, in one run
# on the GPU machine: pinned D2H bandwidth and raw O_DIRECT write of the disk
# (bench/gpu), the C figure (bench_gpu_ckpt), then bench_torch.py (libckpt.torch,
# dcp.save and dcp.async_save with libckpt.dcp.Writer) and DCP's best configuration
# (bench/gpu/dcp_bench.py --phases best), and the table of targets.
#
#   bench/python/run-torch-bench.sh [BUILD_DIR]     (default build-gpu)
# Env: BENCH_DIR (scratch on the disk under test, /var/tmp/ckpt-torch-bench), BENCH_POOL
#      (8G), BENCH_LAYERS (16), PYTHON (python3), OUT (copy the results there)
set -uo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build-gpu}
dir=${BENCH_DIR:-/var/tmp/ckpt-torch-bench}
pool=${BENCH_POOL:-8G}
layers=${BENCH_LAYERS:-16}
py=${PYTHON:-python3}
res=$(mktemp -d "${TMPDIR:-/tmp}/ckpt-torch-res.XXXXXX")
trap 'rm -rf "$dir" "$res"' EXIT
log() { echo "== $(date +%T) $*" >&2; }
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S . -B "$build" -DCKPT_WITH_CUDA=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
        -DCKPT_BUILD_TESTS=OFF >"$res/build.log" 2>&1 || { cat "$res/build.log"; exit 1; }
fi
cmake --build "$build" -j"$(nproc)" --target ckpt bench_raw_io bench_d2h bench_gpu_ckpt \
  >>"$res/build.log" 2>&1 || { tail -40 "$res/build.log"; exit 1; }
B=$build/bench/gpu
rm -rf "$dir" && mkdir -p "$dir"
mib=$((layers * 4096 * 8192 * (2 + 4 + 4 + 4) / 1048576))
pool_bytes=$(numfmt --from=iec "$pool")
phase() { local name=$1 t=$2; shift 2; log "$name: $*"
  timeout --kill-after=10 "$t" "$@" >"$res/$name.json" 2>"$res/$name.log" ||
    { log "$name failed"; tail -5 "$res/$name.log" >&2; }; }
phase d2h 45 "$B/bench_d2h" 1024 16 5
phase raw 100 "$B/bench_raw_io" "$dir/raw.dat" "$mib"; rm -f "$dir/raw.dat"
phase ckpt 150 "$B/bench_gpu_ckpt" --root "$dir/ckpt" --pool-bytes "$pool" --layers "$layers"
rm -rf "$dir/ckpt"
phase dcp 200 "$py" bench/gpu/dcp_bench.py --dir "$dir/dcp" --layers "$layers" \
  --phases best --budget 150
rm -rf "$dir/dcp"
export LIBCKPT_LIBRARY=${LIBCKPT_LIBRARY:-$PWD/$build/libckpt.so.0}
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
phase torch 240 "$py" bench/python/bench_torch.py --dir "$dir/torch" --layers "$layers" \
  --pool-bytes "$pool_bytes" --raw "$res/raw.json" --d2h "$res/d2h.json" \
  --ckpt "$res/ckpt.json" --dcp "$res/dcp.json"
grep -v '^{' "$res/torch.json"
echo
echo "Command: bench/python/run-torch-bench.sh $build (BENCH_POOL=$pool BENCH_LAYERS=$layers), $(date -u +%FT%TZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
if [ -n "${OUT:-}" ]; then mkdir -p "$OUT" && cp "$res"/torch.json "$res"/torch.log "$res"/ckpt.json "$res"/dcp.json "$OUT"/ 2>/dev/null; fi
