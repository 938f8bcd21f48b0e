#!/usr/bin/env bash
# run-stage.sh — the device staging pool, incremental saves and byte-grouped
# compression on the benchmark model (16 x [bf16 4096x8192 + three fp32 4096x8192]
# = 7 GiB of GPU state), against the limits measured in the same run, and torch
# DCP's best configuration in the same run. One markdown table (stage_report.py).
#
#   bench/gpu/run-stage.sh [BUILD_DIR]        (default build-gpu; built here if needed)
#
# Env: BENCH_DIR (/var/tmp/ckpt-stage-bench, removed at the end), BENCH_POOL (8G),
#      BENCH_LAYERS (16), BENCH_COMPRESS_THREADS (8: compression workers of the
#      compressed saves), BENCH_BG_RUNS (3), BENCH_SKIP_DCP=1, OUT (results copied
#      there).
# Phases: raw (bench_raw_io: the disk's O_DIRECT write of the state's size), stage
# (bench_gpu_stage: d2d, pinned, staged, incr, incr_host), bytegroup1..N (bench_gpu_stage
# --phases compress --fill model with CKPT_COMPRESS=bytegroup:1, each between two raw
# writes bgraw0..N), zstd (the same with zstd:1), dcp (dcp_bench.py --phases best).
# Each has a time limit; a failing one does not stop the others.
set -uo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build-gpu}
dir=${BENCH_DIR:-/var/tmp/ckpt-stage-bench}
pool=${BENCH_POOL:-8G}
layers=${BENCH_LAYERS:-16}
cthreads=${BENCH_COMPRESS_THREADS:-8}
bg_runs=${BENCH_BG_RUNS:-3}
res=$(mktemp -d "${TMPDIR:-/tmp}/ckpt-stage-res.XXXXXX")
trap 'rm -rf "$dir" "$res"' EXIT
trap 'exit 130' INT TERM
log() { echo "== $(date +%T) $*" >&2; }

if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S . -B "$build" -DCKPT_WITH_CUDA=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
        -DCKPT_BUILD_TESTS="${CKPT_BUILD_TESTS:-OFF}" >"$res/build.log" 2>&1 ||
    { cat "$res/build.log" >&2; log "cmake failed"; exit 1; }
fi
cmake --build "$build" -j"$(nproc)" --target bench_raw_io bench_gpu_stage >>"$res/build.log" 2>&1 ||
  { tail -40 "$res/build.log" >&2; log "build failed"; exit 1; }
B=$build/bench/gpu
rm -rf "$dir" && mkdir -p "$dir" || { log "cannot create $dir"; exit 1; }
mib=$((layers * 4096 * 8192 * (2 + 4 + 4 + 4) / 1048576))

phase() {  # phase NAME TIMEOUT CMD...: stdout -> $res/NAME.json, stderr -> $res/NAME.log
  local name=$1 t=$2; shift 2
  log "$name (limit ${t}s): $*"
  timeout --kill-after=10 "$t" "$@" >"$res/$name.json" 2>"$res/$name.log"
  local rc=$?
  log "$name: exit $rc"
  if [ $rc -ne 0 ]; then
    tail -5 "$res/$name.log" >&2
    echo "{\"error\": \"exit $rc: $(tail -1 "$res/$name.log" | tr -d '"\\' | cut -c1-200)\"}" \
      >"$res/$name.json"
  fi
}

phase raw 100 "$B/bench_raw_io" "$dir/raw.dat" "$mib"
rm -f "$dir/raw.dat"
phase stage 240 "$B/bench_gpu_stage" --root "$dir/s" --pool-bytes "$pool" --layers "$layers"
rm -rf "$dir/s"
compress() {  # compress NAME CODEC
  phase "$1" 120 env CKPT_COMPRESS="$2:1" CKPT_COMPRESS_THREADS="$cthreads" \
    "$B/bench_gpu_stage" --root "$dir/c" --pool-bytes "$pool" --layers "$layers" \
    --phases compress --fill model
  rm -rf "$dir/c"
}
# The disk's speed drifts by 10-20 % from one raw write to the next: each bytegroup
# save is measured against the raw writes right before and after it, BG_RUNS times.
phase bgraw0 100 "$B/bench_raw_io" "$dir/raw.dat" "$mib" write
rm -f "$dir/raw.dat"
for i in $(seq "$bg_runs"); do
  compress "bytegroup$i" bytegroup
  phase "bgraw$i" 100 "$B/bench_raw_io" "$dir/raw.dat" "$mib" write
  rm -f "$dir/raw.dat"
done
compress zstd zstd
if [ "${BENCH_SKIP_DCP:-0}" != 1 ]; then
  phase dcp 200 python3 bench/gpu/dcp_bench.py --dir "$dir/dcp" --layers "$layers" \
    --phases best --budget 170 --json-out "$res/dcp.out.json"
  [ -s "$res/dcp.out.json" ] && cp "$res/dcp.out.json" "$res/dcp.json"
else
  echo '{"error": "skipped (BENCH_SKIP_DCP=1)"}' >"$res/dcp.json"
fi
python3 bench/gpu/stage_report.py "$res" >"$res/stage-bench.md" 2>>"$res/report.log" ||
  echo "stage_report.py failed: $(tail -3 "$res/report.log")" >>"$res/stage-bench.md"
{ echo; echo "Command: bench/gpu/run-stage.sh $build (BENCH_POOL=$pool BENCH_LAYERS=$layers BENCH_COMPRESS_THREADS=$cthreads), $(date -u +%FT%TZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"; } >>"$res/stage-bench.md"
cat "$res/stage-bench.md"
if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT" && cp "$res"/*.md "$res"/*.json "$res"/*.log "$OUT"/ 2>/dev/null
  log "results copied to $OUT"
fi
