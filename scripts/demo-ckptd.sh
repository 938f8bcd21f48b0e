#!/usr/bin/env bash
# demo-ckptd.sh — the second demo: the same synthetic job saves through ckptd, the
# snapshot service of storage nodes (docs/ckptd.md). Two ckptd instances on loopback
# stand for two storage nodes; the ranks stream their shards to them (rank r to
# instance r mod 2), the first hosts the manifest and the commit coordinator. The
# checkpoint is inspected remotely, restored onto a different number of ranks, and
# the instances' metrics are shown. Everything lives in a temporary directory that
# is removed at the end, and both instances are stopped, whatever happens.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)" >/dev/null
bin=build/tools ckptd=build/ckptd/ckptd
bytes=${CKPT_DEMO_BYTES:-256M}
save_world=${CKPT_DEMO_WORLD:-4}
say() { printf '\n\033[1m%s\033[0m\n' "$*"; }

dir=$(mktemp -d "${TMPDIR:-/var/tmp}/libckpt-demo-ckptd.XXXXXX")
pids=()
stop() {  # SIGTERM: ckptd finishes the streams in flight, then exits 0
  local p
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  pids=()
}
trap 'stop; rm -rf "$dir"' EXIT
# ckptd keeps its files 0600 and its directories 0700; so does this demo.
umask 077
mkdir "$dir/node-a" "$dir/node-b"
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$dir/demo.secret"
cat > "$dir/jobs" <<JOBS
# one job per line: its id, the file that holds its secret, an optional quota
demo secret-file=$dir/demo.secret
JOBS

start() {  # start NAME: a ckptd on ephemeral ports; sets port and mport
  "$ckptd" --listen 127.0.0.1:0 --data "$dir/node-$1" --jobs "$dir/jobs" \
    --metrics 127.0.0.1:0 --pool 256M > "$dir/$1.out" 2> "$dir/$1.log" &
  pids+=($!)
  local i
  for i in $(seq 300); do
    grep -q "listening on port" "$dir/$1.out" 2>/dev/null && break
    kill -0 "${pids[-1]}" 2>/dev/null || break
    sleep 0.1
  done
  grep -q "listening on port" "$dir/$1.out" 2>/dev/null ||
    { cat "$dir/$1.log" >&2; echo "ckptd $1 did not start" >&2; exit 1; }
  port=$(sed -n 's/.*listening on port \([0-9]*\).*/\1/p' "$dir/$1.out")
  mport=$(sed -n 's/.*metrics on port \([0-9]*\).*/\1/p' "$dir/$1.out")
}
metrics() {  # metrics PORT: GET /metrics with bash alone (curl may be missing)
  local body
  exec 3<>"/dev/tcp/127.0.0.1/$1"
  printf 'GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3
  body=$(cat <&3)
  exec 3<&-
  sed -n 's/\r$//; /^ckptd_/p' <<<"$body"
}

say "1. Two ckptd instances on loopback, each with its own data directory"
echo "   (the jobs file names the job 'demo' and a file holding its secret, mode 0600)"
start a; port_a=$port metrics_a=$mport
start b; port_b=$port metrics_b=$mport
target="ckptd://127.0.0.1:$port_a,127.0.0.1:$port_b"
echo "   instance A: 127.0.0.1:$port_a (data $dir/node-a, metrics on port $metrics_a)"
echo "   instance B: 127.0.0.1:$port_b (data $dir/node-b, metrics on port $metrics_b)"
export CKPT_TARGET=$target CKPT_JOB_ID=demo CKPT_JOB_SECRET_FILE=$dir/demo.secret

say "2. A synthetic job of $save_world rank processes saves $bytes as step 100, then step 200, through ckptd"
echo "   CKPT_TARGET=$target"
echo "   (each rank streams its shard to instance rank mod 2 and goes back to training at"
echo "   the snapshot point; instance A hosts the manifest and the two-phase commit)"
"$bin/ckpt-synth/ckpt-synth" save --root "$dir/unused" --step 100 --bytes "$bytes" --seed 7 --world "$save_world"
"$bin/ckpt-synth/ckpt-synth" save --root "$dir/unused" --step 200 --bytes "$bytes" --seed 8 --world "$save_world"
echo "   shard files on A: $(find "$dir/node-a/jobs/demo" -name '*.shard' | wc -l)," \
     "on B: $(find "$dir/node-b/jobs/demo" -name '*.shard' | wc -l); the manifest is on A only"

say "3. What the job holds, read through ckptd, and a full verification of the latest step"
"$bin/ckpt-inspect/ckpt-inspect" "$target" list
"$bin/ckpt-inspect/ckpt-inspect" "$target" verify latest --quiet

say "4. Restore the latest step onto 3 ranks (a different world size) and compare every byte"
"$bin/ckpt-synth/ckpt-synth" verify --root "$dir/unused" --step latest --bytes "$bytes" --seed 8 --world 3

say "5. What each instance counted (Prometheus text on /metrics)"
for n in "A $metrics_a" "B $metrics_b"; do
  echo "   instance ${n% *}:"
  metrics "${n#* }" | sed 's/^/     /'
done

say "6. Stop both instances with SIGTERM (streams in flight would get --grace-ms to finish)"
for i in "${!pids[@]}"; do
  kill -TERM "${pids[$i]}"
  rc=0; wait "${pids[$i]}" || rc=$?
  echo "   ckptd pid ${pids[$i]} exited with status $rc"
done
pids=()
grep -h "ckptd: stopped" "$dir/a.log" "$dir/b.log" | sed 's/^/   /'

say "Done. The temporary directory $dir is removed on exit."
