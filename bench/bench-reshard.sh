#!/usr/bin/env bash
# bench-reshard.sh — resharded load, verify and reshard against the raw read limit of
# the same file system, measured in the same run (issue 4, "Speed").
#
#   bench/bench-reshard.sh [BUILD_DIR]   env: BENCH_DIR (/var/tmp/ckpt-bench-reshard),
#                                        BENCH_BYTES (4G), BENCH_WORLD (1),
#                                        BENCH_LOAD_WORLDS ("3 7"), BENCH_RUNS (3)
#
# Raw limit: fio, io_uring, O_DIRECT, 1 MiB blocks, queue depth 8, sequential read of a
# file as large as the checkpoint. Measured (best of BENCH_RUNS, page cache dropped
# before each read when permitted):
#   - resharded load: ckpt-synth verify --world W' of a checkpoint saved by
#     BENCH_WORLD ranks (bytes / time inside ckpt_load_tensor, slowest rank);
#   - verify: ckpt-inspect verify --json (every chunk read and hashed);
#   - reshard BENCH_WORLD -> 1 (load + save + commit), with the peak RSS of the
#     rank process (GNU time), against the sum of raw read and write time.
# Targets (issue 4): resharded load >= 0.8 x raw read, verify >= 0.9 x raw read.
# Prints a table; record figures in docs/perf.md. Never a timed test.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
tools=$build/tools
synth=$tools/ckpt-synth/ckpt-synth inspect=$tools/ckpt-inspect/ckpt-inspect
reshard=$tools/ckpt-reshard/ckpt-reshard
dir=${BENCH_DIR:-/var/tmp/ckpt-bench-reshard}
bytes=${BENCH_BYTES:-4G}
world=${BENCH_WORLD:-1}
loads=${BENCH_LOAD_WORLDS:-3 7}
runs=${BENCH_RUNS:-3}
for t in "$synth" "$inspect" "$reshard"; do [ -x "$t" ] || { echo "build first: $t missing" >&2; exit 1; }; done
command -v fio >/dev/null || { echo "fio missing: scripts/deps.sh installs it" >&2; exit 1; }
rm -rf "$dir"; mkdir -p "$dir"
trap 'rm -rf "$dir"' EXIT
json() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }
best() { python3 -c "import sys; print(max(float(x) for x in sys.argv[1:]))" "$@"; }
drop() { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true; }

fio_bw() {  # rw -> bytes/s
  fio --name=raw --filename="$dir/fio.dat" --rw="$1" --bs=1M --iodepth=8 --ioengine=io_uring \
      --direct=1 --size="$bytes" --end_fsync=1 --output-format=json 2>/dev/null |
    json "d['jobs'][0]['$2']['bw_bytes']"
}
echo "raw O_DIRECT bandwidth (fio, $bytes, 1 MiB, qd 8)..." >&2
raw_w=$(fio_bw write write); raw_r=$(fio_bw read read); rm -f "$dir/fio.dat"

echo "saving $bytes as $world rank(s)..." >&2
"$synth" save --root "$dir/src" --step 1 --bytes "$bytes" --seed 1 --world "$world" --json >/dev/null

rows=()
for w in $loads; do
  r=()
  for i in $(seq 1 "$runs"); do
    drop
    out=$("$synth" verify --root "$dir/src" --step 1 --bytes "$bytes" --seed 1 --world "$w" --json)
    r+=("$(echo "$out" | json "d['bytes']/d['load_seconds']")")
  done
  rows+=("load $world -> $w ranks|$(best "${r[@]}")|$raw_r|0.80")
done
r=()
for i in $(seq 1 "$runs"); do
  drop
  out=$("$inspect" "$dir/src" verify 1 --json --no-mark --quiet)
  r+=("$(echo "$out" | json "d['steps'][0]['bytes']/d['steps'][0]['seconds']")")
done
rows+=("ckpt-inspect verify|$(best "${r[@]}")|$raw_r|0.90")

rss=0; r=()
for i in $(seq 1 "$runs"); do
  rm -rf "$dir/out"; drop
  if command -v /usr/bin/time >/dev/null; then
    out=$(/usr/bin/time -f "%M" -o "$dir/rss" "$reshard" "$dir/src" 1 --world 1 --out "$dir/out" \
          --rank-map 0 --json --quiet)
    rss=$(cat "$dir/rss")
  else
    out=$("$reshard" "$dir/src" 1 --world 1 --out "$dir/out" --rank-map 0 --json --quiet)
  fi
  r+=("$(echo "$out" | json "d['bytes']/d['seconds']")")
done
# read + write of the same bytes, one after the other: the serial limit of a reshard.
rw_limit=$(python3 -c "import sys; r,w=map(float,sys.argv[1:]); print(1/(1/r+1/w))" "$raw_r" "$raw_w")
rows+=("reshard $world -> 1 (load+save+commit)|$(best "${r[@]}")|$rw_limit|(printed)")

python3 - "$bytes" "$rss" "${rows[@]}" <<'PY'
import sys
size, rss, rows = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
G = 1e9
print(f"libckpt resharded load / verify / reshard, {size} checkpoint")
print("| measure | value | raw limit | ratio | target |")
print("| --- | --- | --- | --- | --- |")
for r in rows:
    name, v, lim, tgt = r.split("|")
    v, lim = float(v), float(lim)
    print(f"| {name} | {v/G:.2f} GB/s | {lim/G:.2f} GB/s | {v/lim:.2f} | {'>= ' + tgt if tgt[0].isdigit() else tgt} |")
if rss:
    print(f"| reshard peak RSS (the largest process, GNU time) | {rss/1024:.0f} MiB | two pools (output, source reads) + one chunk of scratch | | bounded by the pools, not by the state |")
PY
