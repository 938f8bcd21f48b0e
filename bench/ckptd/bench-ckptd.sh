#!/usr/bin/env bash
# bench-ckptd.sh — ckptd against the limits of the same machine, measured in the same
# run: W rank processes (ckpt-synth) save through one ckptd on loopback.
#
#   bench/ckptd/bench-ckptd.sh [BUILD_DIR] [WORLD] [SIZE]
#       env: BENCH_DIR (/var/tmp/ckptd-bench: ckptd's data disk), BENCH_RUNS (2),
#            BENCH_POOL (ckptd's --pool, 1G), BENCH_RANK_POOL (each rank's pool, 64M),
#            BENCH_CHUNK (the ranks' chunk size and ckptd's --chunk-max; default 16M),
#            BENCH_CGROUP (a cgroup directory: ckptd and the raw writes run in it, e.g.
#            one whose blkio/io limits make the disk slower than the network),
#            BENCH_THREADS (1: the scheduler's time of the ranks' threads and ckptd's
#            until the snapshot point, on a CPU and waiting for one, in a table of its
#            own; polling /proc costs CPU of its own, so off by default),
#            BENCH_SPLIT (1: the ranks, and the TCP limits' senders, on the first half
#            of the CPUs; ckptd, the raw writes and the TCP limits' receivers on the
#            other half, as where ckptd has a storage node's CPUs to itself),
#            BENCH_NET_RATE (a tc rate, e.g. 40gbit: the whole bench runs in a network
#            namespace of its own whose loopback a token bucket (tc tbf) holds to that
#            rate, the limits and the saves alike: a network narrower than the CPUs,
#            as between compute and storage nodes; needs root),
#            BENCH_TRANSPORT (tcp; rdma: ckptd and the ranks on the rdma transport at
#            BENCH_ADDR, e.g. 10.0.0.1 in the rdma guest, tests/rdma), and the ranks'
#            CKPT_RDMA_DIRECT as it is set (unset: the direct path)
#
# Limits: the raw write of ckptd's data disk (bench_raw_io: O_DIRECT writes from
# registered buffers through lib/io's engine into a file sized up front, with the
# final fdatasync — the shard writer's pattern without its format; before and after
# the saves), and loopback TCP from W sender to W receiver processes
# (ckptd_bench.py tcp), alone and while the disk takes a raw write (where ranks,
# ckptd and the disk share a few CPUs, that is what a save can get), each sender
# going round one 16 MiB message into one 16 MiB buffer; and again beside a raw
# write with each sender sending its share of distinct bytes, from memory allocated
# as the ranks' tensors are, and each receiver keeping all it receives (--keep), as
# ckptd's pool holds a save's bytes until its disk has them: the network's limit for
# a save's bytes, which the snapshot point's target is on (the bare figure, whose
# buffers the CPUs' caches hold, is printed beside it); measured before the
# saves and again after them, the better of the two being the limit.
# Over rdma the
# network's limit is instead the rdma transport's own throughput: one SIZE-byte
# message through lib/net (bench_rdma: its RDMA WRITE ring, which DATA messages
# take), alone and beside a raw write. Measured:
# ckptd's write throughput (shard bytes written over the time from the first chunk
# to the last shard durable, from its metrics polled every 10 ms), the ranks'
# snapshot point with a rank pool smaller than their state (ckpt-synth's stall: the
# slowest rank), ckptd's peak RSS (VmHWM); on stderr, ckptd's line per shard stream
# saying where its time went (and the ranks' own with CKPT_LOG=debug). Targets: ckptd writes at >= 0.9 x the raw
# write; the snapshot point comes at the network's pace (>= 0.9 x (state - the ranks'
# pools) / TCP of distinct bytes kept, beside a raw write; over rdma the transport's
# figure), sooner than the disk could take the state where the disk is the
# slower; VmHWM <= --pool + 64 MiB. Prints a table with PASS or MISS for each; the
# figures go to $BENCH_DIR.json.
set -euo pipefail
self=$(readlink -f "$0")
cd "$(dirname "$0")/../.."
build=${1:-build}
world=${2:-4}
size=${3:-1G}
dir=${BENCH_DIR:-/var/tmp/ckptd-bench}
runs=${BENCH_RUNS:-2}
pool=${BENCH_POOL:-1G}
rank_pool=${BENCH_RANK_POOL:-64M}
chunk=${BENCH_CHUNK:-16M}
ckptd=$build/ckptd/ckptd synth=$build/tools/ckpt-synth/ckpt-synth
raw_io=$build/bench/gpu/bench_raw_io
cgroup=${BENCH_CGROUP:-}
transport=${BENCH_TRANSPORT:-tcp}
addr=${BENCH_ADDR:-127.0.0.1}
bench_rdma=$build/bench/rdma/bench_rdma
helper=bench/ckptd/ckptd_bench.py
threads=
[ "${BENCH_THREADS:-0}" = 1 ] && threads=1
for x in "$ckptd" "$synth" "$raw_io"; do
  [ -x "$x" ] || { echo "build first: $x missing" >&2; exit 1; }
done
net_rate=${BENCH_NET_RATE:-}
if [ -n "$net_rate" ] && [ "${BENCH_NETNS:-}" != "$net_rate" ]; then
  # Again, in a network namespace of its own: loopback at net_rate, nothing else on it.
  [ "$transport" = tcp ] || { echo "BENCH_NET_RATE is for the tcp transport" >&2; exit 1; }
  [ "$(id -u)" = 0 ] || { echo "BENCH_NET_RATE needs root (a network namespace, tc)" >&2; exit 1; }
  for x in unshare ip tc; do
    command -v "$x" > /dev/null || { echo "BENCH_NET_RATE needs $x: scripts/deps.sh installs" \
      "it; on the GPU machine, scripts/unpack-debs.sh puts iproute2's on PATH" >&2; exit 1; }
  done
  # shellcheck disable=SC2016  # the inner shell's
  exec unshare --net -- env BENCH_NETNS="$net_rate" bash -c 'set -e
    ip link set lo up
    tc qdisc add dev lo root tbf rate "$BENCH_NETNS" burst 1mb latency 20ms
    exec "$0" "$@"' "$self" "$@"
fi
to_bytes() { numfmt --from=iec "${1%B}"; }
size_b=$(to_bytes "$size") pool_b=$(to_bytes "$pool") rank_pool_b=$(to_bytes "$rank_pool")

rm -rf "$dir"
mkdir -p "$dir"
chmod 700 "$dir"
pid=
stop_ckptd() { [ -z "$pid" ] || { kill -TERM "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; }; }
trap 'stop_ckptd; rm -rf "$dir"' EXIT
log() { echo "bench-ckptd: $*" >&2; }

in_cg=()   # the prefix that runs ckptd and the raw writes: in BENCH_CGROUP, if any,
on_ranks=() # and with BENCH_SPLIT on their half of the CPUs (the ranks on the other)
# shellcheck disable=SC2016  # $$ and $@ are the inner shell's
[ -z "$cgroup" ] || in_cg=(sh -c 'echo $$ > "$0/cgroup.procs" && exec "$@"' "$cgroup")
split=
if [ "${BENCH_SPLIT:-0}" = 1 ]; then
  read -r rank_cpus node_cpus < <(python3 -c 'import os
c = sorted(os.sched_getaffinity(0)); h = len(c) // 2
print(",".join(map(str, c[:h])) or "-", ",".join(map(str, c[h:])))')
  [ "$rank_cpus" != - ] || { log "BENCH_SPLIT needs 2 CPUs or more"; exit 1; }
  in_cg=(taskset -c "$node_cpus" "${in_cg[@]}")
  on_ranks=(taskset -c "$rank_cpus")
  export BENCH_RANK_CPUS=$rank_cpus BENCH_NODE_CPUS=$node_cpus
  split="ranks on CPUs $rank_cpus, ckptd on $node_cpus"
fi
raw_once() {  # bench_raw_io's JSON; on a file system without O_DIRECT (the rdma guest's
  # tmpfs) a buffered write with fdatasync instead, {"write_Bps": ..., "buffered": true}
  if "${in_cg[@]}" "$raw_io" "$dir/raw.dat" $((size_b >> 20)) write 2> "$dir/raw.err"; then
    return 0
  fi
  grep -q O_DIRECT "$dir/raw.err" || { cat "$dir/raw.err" >&2; return 1; }
  local t0 t1
  t0=$(date +%s.%N)
  "${in_cg[@]}" dd if=/dev/zero of="$dir/raw.dat" bs=4M count=$((size_b >> 22)) conv=fdatasync \
    status=none
  t1=$(date +%s.%N)
  rm -f "$dir/raw.dat"
  python3 -c 'import json,sys; print(json.dumps({"write_Bps": int(sys.argv[1]) / (float(sys.argv[3]) - float(sys.argv[2])), "buffered": True}))' \
    $(((size_b >> 22) << 22)) "$t0" "$t1"
}
raw_write() {  # bytes/s of the better of bench_raw_io's two shapes, writes only
  raw_once | python3 -c 'import json,sys; print(json.load(sys.stdin)["write_Bps"])'
}

log "raw write of $dir ($size, bench_raw_io)..."
raw1=$(raw_write)
rdma_net() {  # [beside]: bench_rdma's bulk throughput as ckptd_bench.py tcp's JSON
  local beside=null t0 out mib
  mkdir -p "$dir/rdma-net"
  if [ "${1:-}" = beside ]; then
    raw_once > "$dir/beside.json" &
    local bpid=$!
  fi
  out=$("$bench_rdma" rdma "$addr" "$dir/rdma-net" --rtt 10 --bytes "$size_b" 1)
  mib=$(awk -F'|' '{print $(NF-1)}' <<<"$out" | tr -d ' ')
  if [ "${1:-}" = beside ]; then
    wait "$bpid"
    beside=$(tail -1 "$dir/beside.json")
  fi
  rm -rf "$dir/rdma-net"
  python3 -c 'import json,sys; b=float(sys.argv[1])*1048576; print(json.dumps({"bytes": int(sys.argv[2]), "world": 1, "seconds": int(sys.argv[2])/b, "Bps": b, "beside": json.loads(sys.argv[3])}))' "$mib" "$size_b" "$beside"
}
if [ "$transport" = rdma ]; then
  [ -x "$bench_rdma" ] || { echo "build first: $bench_rdma missing" >&2; exit 1; }
  log "lib/net over rdma at $addr: one $size message (bench_rdma), alone and beside a raw write..."
  tcp=$(rdma_net)
  tcp_busy=$(rdma_net beside)
else
  log "loopback TCP, $world senders to $world receivers ($size), alone and beside a raw write..."
  tcp=$(python3 "$helper" tcp "$world" "$size_b")
  tcp_busy=$(python3 "$helper" tcp "$world" "$size_b" "${in_cg[@]}" "$raw_io" "$dir/raw.dat" \
             $((size_b >> 20)) write)
  log "loopback TCP again, each sender sending its share of distinct bytes and each receiver keeping them..."
  tcp_keep=$(python3 "$helper" tcp "$world" "$size_b" --keep "${in_cg[@]}" "$raw_io" \
             "$dir/raw.dat" $((size_b >> 20)) write)
fi

# ckptd: its own data directory on the disk just measured, a jobs file with a
# generated secret (0600), ephemeral ports read from its first line.
mkdir -m 700 "$dir/data"
(umask 077; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$dir/secret"
 echo "bench secret-file=$dir/secret" > "$dir/jobs")
"${in_cg[@]}" "$ckptd" --listen "$addr:0" --transport "$transport" --data "$dir/data" \
  --jobs "$dir/jobs" --metrics 127.0.0.1:0 --pool "$pool" --chunk-max "$chunk" --log info \
  > "$dir/ckptd.out" 2> "$dir/ckptd.log" &
pid=$!
for _ in $(seq 600); do
  grep -q "listening on port" "$dir/ckptd.out" 2>/dev/null && break
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.1
done
port=$(sed -n 's/.*listening on port \([0-9]*\).*/\1/p' "$dir/ckptd.out")
mport=$(sed -n 's/.*metrics on port \([0-9]*\).*/\1/p' "$dir/ckptd.out")
if [ -z "$port" ] || [ -z "$mport" ]; then
  cat "$dir/ckptd.log" >&2
  log "ckptd did not start"
  exit 1
fi
export CKPT_TARGET=ckptd://$addr:$port CKPT_JOB_ID=bench CKPT_JOB_SECRET_FILE=$dir/secret
export CKPT_TRANSPORT=$transport

saves=()
for i in $(seq "$runs"); do
  log "save $i of $runs: $world ranks, $size, rank pool $rank_pool..."
  python3 "$helper" watch "$mport" "$world" 600 ${threads:+--threads} > "$dir/watch.json" \
    2> "$dir/watch.err" &
  wpid=$!
  for _ in $(seq 100); do grep -q ready "$dir/watch.err" && break; sleep 0.05; done
  "${on_ranks[@]}" "$synth" save --root "$dir/unused" --step "$i" --bytes "$size" --seed "$i" \
    --world "$world" --pool "$rank_pool" --chunk "$chunk" --json > "$dir/synth.json"
  wait "$wpid" || { cat "$dir/watch.err" >&2; exit 1; }
  saves+=("{\"synth\": $(cat "$dir/synth.json"), \"watch\": $(cat "$dir/watch.json")}")
  # Each save writes new files: keep one step's on the disk at a time.
  rm -rf "$dir/data/jobs/bench/step-"*
done
hwm_kb=$(sed -n 's/^VmHWM:[[:space:]]*\([0-9]*\) kB/\1/p' "/proc/$pid/status")
# How the chunks came: by RDMA WRITE into granted buffers (the direct path), or not.
m=$(python3 -c 'import sys,urllib.request; print(urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics").read().decode())' "$mport")
rx_all=$(sed -n 's/^ckptd_bytes_received_total \([0-9]*\)$/\1/p' <<<"$m")
rx_rdma=$(sed -n 's/^ckptd_bytes_received_rdma_write_total \([0-9]*\)$/\1/p' <<<"$m")
kill -TERM "$pid"
wait "$pid" || { cat "$dir/ckptd.log" >&2; log "ckptd did not stop cleanly"; exit 1; }
pid=
# Where each stream's time went on ckptd's side (one line per shard); the ranks' side
# is in their own lines with CKPT_LOG=debug.
grep -h "durable, " "$dir/ckptd.log" | sed 's/^/bench-ckptd: ckptd: /' >&2 || true
rm -rf "$dir/data"
if [ "$transport" != rdma ]; then
  log "loopback TCP of distinct bytes kept again, after the saves..."
  tcp_keep2=$(python3 "$helper" tcp "$world" "$size_b" --keep "${in_cg[@]}" "$raw_io" \
              "$dir/raw.dat" $((size_b >> 20)) write)
fi
log "raw write again..."
raw2=$(raw_write)

IFS=,
cat > "$dir.json" <<JSON
{"world": $world, "cpus": $(nproc), "cgroup": "$cgroup", "split": "$split", "chunk": $(to_bytes "$chunk"),
 "net_rate": "$net_rate",
 "transport": "$transport", "addr": "$addr", "rdma_direct": "${CKPT_RDMA_DIRECT:-}",
 "bytes_received": ${rx_all:-0}, "bytes_received_rdma_write": ${rx_rdma:-0},
 "rank_pool": $rank_pool_b, "ckptd_pool_bytes": $pool_b,
 "raw_write_Bps": [$raw1, $raw2], "tcp": $tcp, "tcp_beside_raw_write": $tcp_busy,
 "tcp_keep_beside_raw_write": ${tcp_keep:-null}, "tcp_keep_after": ${tcp_keep2:-null},
 "ckptd_vmhwm_bytes": $((hwm_kb * 1024)),
 "saves": [${saves[*]}]}
JSON
unset IFS
python3 "$helper" table "$dir.json"
