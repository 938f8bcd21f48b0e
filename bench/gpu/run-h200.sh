#!/usr/bin/env bash
# run-h200.sh — the GPU benchmark, in one run on the GPU machine: pinned D2H
# bandwidth, raw O_DIRECT write/read of the same disk, libckpt on 7 GiB of GPU state
# (16 x [bf16 4096x8192 + three fp32 4096x8192]) and torch DCP on the same state,
# then one markdown table with the ratios against the issue's targets.
#
#   bench/gpu/run-h200.sh [BUILD_DIR]        (default build-gpu; built here if needed)
#
# Env: BENCH_DIR   scratch directory on the disk under test (/var/tmp/ckpt-gpu-bench);
#                  removed at the end, whatever happens
#      BENCH_POOL  libckpt pool (8G: the state fits, which is what the targets assume)
#      BENCH_LAYERS (16)  BENCH_SKIP_DCP=1 (libckpt only)
#      BENCH_SKIP_GDS=1   skip the second libckpt run with CKPT_GDS=1 (GPUDirect Storage)
#      OUT         if set, table, JSON and each phase's log are copied there
# Needs: a CUDA device, cmake and a C compiler, python3 with torch for the DCP part,
# and libckpt's build dependencies (on the H200: the unpacked .debs, see
# docs/gpu.md). Every phase has a time limit and a failing phase does not stop the
# others: its rows say "n/a" and the reason is printed under the table. Typical
# total ~3 minutes; worst case bounded at ~9.5 minutes plus the build.
set -uo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build-gpu}
dir=${BENCH_DIR:-/var/tmp/ckpt-gpu-bench}
pool=${BENCH_POOL:-8G}
layers=${BENCH_LAYERS:-16}
res=$(mktemp -d "${TMPDIR:-/tmp}/ckpt-gpu-res.XXXXXX")
cleanup() { rm -rf "$dir" "$res"; }
trap cleanup EXIT
trap 'exit 130' INT TERM
log() { echo "== $(date +%T) $*" >&2; }

bins="bench_raw_io bench_d2h bench_gpu_ckpt"
# Configure once if needed, then always bring the three programs up to date.
if [ ! -f "$build/CMakeCache.txt" ]; then
  log "configuring $build (CKPT_WITH_CUDA=ON, tests ${CKPT_BUILD_TESTS:-OFF})"
  cmake -S . -B "$build" -DCKPT_WITH_CUDA=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
        -DCKPT_BUILD_TESTS="${CKPT_BUILD_TESTS:-OFF}" >"$res/build.log" 2>&1 ||
    { cat "$res/build.log" >&2; log "cmake failed"; exit 1; }
fi
log "building $bins in $build"
cmake --build "$build" -j"$(nproc)" --target $bins >>"$res/build.log" 2>&1 ||
  { tail -40 "$res/build.log" >&2; log "build failed"; exit 1; }
B=$build/bench/gpu

rm -rf "$dir" && mkdir -p "$dir" || { log "cannot create $dir"; exit 1; }
# State bytes for the raw pass: the same size as the checkpoint.
mib=$((layers * 4096 * 8192 * (2 + 4 + 4 + 4) / 1048576))
avail=$(df --output=avail -B1 "$dir" | tail -1)
need=$(( (mib * 2 + 2048) * 1048576 ))
if [ "${avail:-0}" -lt "$need" ]; then
  log "warning: $((avail >> 30)) GiB free under $dir, the run needs about $((need >> 30)) GiB"
fi
log "device: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"
log "disk: $(df -h --output=source,fstype,size,avail "$dir" | tail -1)"

phase() {  # phase NAME TIMEOUT CMD... : stdout -> $res/NAME.json, stderr -> $res/NAME.log
  local name=$1 t=$2; shift 2
  log "$name (limit ${t}s): $*"
  local t0=$SECONDS
  timeout --kill-after=10 "$t" "$@" >"$res/$name.json" 2>"$res/$name.log"
  local rc=$?
  log "$name: exit $rc after $((SECONDS - t0))s"
  if [ $rc -ne 0 ]; then
    tail -5 "$res/$name.log" >&2
    local why; why=$(grep -v '^[[:space:]]*$' "$res/$name.log" | tail -1 | tr -d '"\\' | cut -c1-200)
    echo "{\"error\": \"exit $rc: $why\"}" >>"$res/$name.json"
  fi
}

phase d2h 45 "$B/bench_d2h" 1024 16 5
phase raw 100 "$B/bench_raw_io" "$dir/raw.dat" "$mib"
rm -f "$dir/raw.dat"
phase ckpt 150 "$B/bench_gpu_ckpt" --root "$dir/ckpt" --pool-bytes "$pool" --layers "$layers"
rm -rf "$dir/ckpt"
# The same with GPUDirect Storage asked for (loads and synchronous saves by cuFile).
if [ "${BENCH_SKIP_GDS:-0}" != 1 ]; then
  phase ckpt_gds 150 env CKPT_GDS=1 CUFILE_EXPERIMENTAL_FS=true CUFILE_SKIP_TOPOLOGY_DETECTION=true "$B/bench_gpu_ckpt" --root "$dir/ckpt" --pool-bytes "$pool" \
        --layers "$layers"
  rm -rf "$dir/ckpt"
fi
if [ "${BENCH_SKIP_DCP:-0}" != 1 ]; then
  phase dcp 270 python3 bench/gpu/dcp_bench.py --dir "$dir/dcp" --layers "$layers" --budget 220 \
        --json-out "$res/dcp.out.json"
  [ -s "$res/dcp.out.json" ] && cp "$res/dcp.out.json" "$res/dcp.json"
else
  echo '{"error": "skipped (BENCH_SKIP_DCP=1)"}' >"$res/dcp.json"
fi
rm -rf "$dir"

python3 bench/gpu/report.py "$res" >"$res/gpu-bench.md" 2>>"$res/report.log" ||
  echo "report.py failed: $(tail -3 "$res/report.log")" >>"$res/gpu-bench.md"
{ echo; echo "Command: bench/gpu/run-h200.sh $build (BENCH_POOL=$pool BENCH_LAYERS=$layers), $(date -u +%FT%TZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"; } >>"$res/gpu-bench.md"
cat "$res/gpu-bench.md"
echo
echo '```json'
cat "$res/gpu-bench.json" 2>/dev/null
echo
echo '```'
if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT" && cp "$res"/*.md "$res"/*.json "$res"/*.log "$OUT"/ 2>/dev/null
  log "results copied to $OUT"
fi
