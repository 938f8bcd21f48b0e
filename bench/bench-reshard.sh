#!/usr/bin/env bash
# bench-reshard.sh — resharded load, verify and reshard against the raw read limit of
# the same file system, measured in the same run.
#
#   bench/bench-reshard.sh [BUILD_DIR]   env: BENCH_DIR (/var/tmp/ckpt-bench-reshard),
#                                        BENCH_BYTES (4G), BENCH_WORLD (1),
#                                        BENCH_LOAD_WORLDS ("3 7"), BENCH_RUNS (3)
#
# Raw limit: fio, io_uring, O_DIRECT, queue depth 8, the better of 1 MiB and 16 MiB
# blocks: a sequential read of the checkpoint's first shard file, once in every run
# (best taken), and a write of a file as large as the checkpoint. Measured (best of
# BENCH_RUNS, and the median of the per-run ratios; page cache dropped before each
# read when permitted):
#   - resharded load: ckpt-synth verify --world W' of a checkpoint saved by
#     BENCH_WORLD ranks (bytes / time inside ckpt_load_tensor, slowest rank);
#   - verify: ckpt-inspect verify --json (every chunk read and hashed);
#   - reshard BENCH_WORLD -> 1 (load + save + commit), with the peak RSS of the
#     rank process (GNU time), against the sum of raw read and write time, and
#     against fio reading and writing as many bytes at once (its slower job).
# Targets: resharded load >= 0.8 x raw read, verify >= 0.9 x raw read.
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
json() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }
best() { python3 -c "import sys; print(max(float(x) for x in sys.argv[1:]))" "$@"; }
drop() { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true; }

. bench/thp.sh
trap 'thp_off; rm -rf "$dir"' EXIT
fio_bw() {  # file rw bs [extra] -> bytes/s
  thp_on
  fio --name=raw --filename="$1" --rw="$2" --bs="$3" --iodepth=8 --ioengine=io_uring \
      --direct=1 ${4:-} --output-format=json 2>/dev/null |
    json "d['jobs'][0]['$2']['bw_bytes']"
  thp_off
}
echo "raw O_DIRECT write (fio, $bytes, 1 MiB and 16 MiB, qd 8)..." >&2
raw_w=$(best "$(fio_bw "$dir/fio.dat" write 1M "--size=$bytes --end_fsync=1")" \
              "$(fio_bw "$dir/fio.dat" write 16M "--size=$bytes --end_fsync=1")")
rm -f "$dir/fio.dat"

echo "saving $bytes as $world rank(s)..." >&2
"$synth" save --root "$dir/src" --step 1 --bytes "$bytes" --seed 1 --world "$world" --json >/dev/null
shard=$(ls "$dir"/src/step-*/rank-000000.shard)

# Every run measures the raw read of the checkpoint's own first shard file (1 MiB and
# 16 MiB blocks) next to libckpt's reads, so that the disk's drift between runs shows
# in both; the table compares best with best and gives the median of the per-run ratios.
declare -A got
raw_runs=()
for i in $(seq 1 "$runs"); do
  drop; a=$(fio_bw "$shard" read 1M --readonly)
  drop; b=$(fio_bw "$shard" read 16M --readonly)
  raw_runs+=("$(best "$a" "$b")")
  for w in $loads; do
    drop
    out=$("$synth" verify --root "$dir/src" --step 1 --bytes "$bytes" --seed 1 --world "$w" --json)
    got["load $world -> $w ranks"]+=" $(echo "$out" | json "d['bytes']/d['load_seconds']")"
  done
  drop
  out=$("$inspect" "$dir/src" verify 1 --json --no-mark --quiet)
  got["ckpt-inspect verify"]+=" $(echo "$out" | json "d['steps'][0]['bytes']/d['steps'][0]['seconds']")"
done
raw_r=$(best "${raw_runs[@]}")
ratios() {  # values... -> "best median" of value/raw of the same run
  python3 -c "
import sys, statistics
v = [float(x) for x in sys.argv[1].split()]; r = [float(x) for x in sys.argv[2].split()]
print(max(v), statistics.median(a / b for a, b in zip(v, r)))" "$1" "${raw_runs[*]}"
}
rows=()
for w in $loads; do
  rows+=("load $world -> $w ranks|$(ratios "${got["load $world -> $w ranks"]}")|$raw_r|0.80")
done
rows+=("ckpt-inspect verify|$(ratios "${got["ckpt-inspect verify"]}")|$raw_r|0.90")

# A reshard reads the source while it writes the output: the device's limit for that
# is fio reading the shard file while a second job writes as many bytes, at once
# (the slower of the two jobs' bandwidths).
copy_bw() {
  thp_on
  fio --name=r --filename="$shard" --rw=read --bs=16M --iodepth=8 --ioengine=io_uring \
      --direct=1 --name=w --filename="$dir/fio.w" --rw=write --bs=16M --iodepth=8 \
      --ioengine=io_uring --direct=1 --size="$(stat -c %s "$shard")" --end_fsync=1 \
      --output-format=json 2>/dev/null | sed -n '/^{/,$p' |
    json "min(d['jobs'][0]['read']['bw_bytes'], d['jobs'][1]['write']['bw_bytes'])"
  thp_off
  rm -f "$dir/fio.w"
}
rss=0; r=(); copy=()
for i in $(seq 1 "$runs"); do
  drop; copy+=("$(copy_bw)")
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
rows+=("reshard $world -> 1 (load+save+commit), against read then write|$(best "${r[@]}") 0|$rw_limit|(printed)")
rows+=("reshard $world -> 1, against read and write at once (fio)|$(best "${r[@]}") 0|$(best "${copy[@]}")|(printed)")

python3 - "$bytes" "$rss" "$runs" "$(thp_note)" "${rows[@]}" <<'PY'
import sys
size, rss, runs, thp, rows = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5:]
G = 1e9
print(f"libckpt resharded load / verify / reshard, {size} checkpoint, best of {runs} runs "
      f"(raw read: fio on the shard file, {thp})")
print("| measure | value | raw limit | ratio (best/best) | median ratio (same run) | target |")
print("| --- | --- | --- | --- | --- | --- |")
for r in rows:
    name, vm, lim, tgt = r.split("|")
    v, med = map(float, vm.split())
    lim = float(lim)
    print(f"| {name} | {v/G:.2f} GB/s | {lim/G:.2f} GB/s | {v/lim:.2f} | "
          f"{f'{med:.2f}' if med else ''} | {'>= ' + tgt if tgt[0].isdigit() else tgt} |")
if rss:
    print(f"| reshard peak RSS (the largest process, GNU time) | {rss/1024:.0f} MiB | two pools (output, source reads) + read-ahead ring (2 x 128 MiB) | | bounded by the pools, not by the state |")
PY
