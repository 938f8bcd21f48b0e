#!/usr/bin/env bash
# test_ckptd_job.sh — jobs saving through ckptd on loopback: two instances, a job
# of 4 ranks spread over them (rank mod 2), restored onto 3 and 1 ranks and
# verified bit for bit; ckpt-inspect against the job remotely and on the storage
# node; a world of 7 through one instance; refusals: a wrong secret, an unknown
# and a path-like job id, a quota exceeded — each with its specific error, nothing
# written outside the job's directory, and the honest job unaffected.
# usage: test_ckptd_job.sh BUILD_DIR
set -u
build=$1
ckptd=$build/ckptd/ckptd synth=$build/tools/ckpt-synth/ckpt-synth
inspect=$build/tools/ckpt-inspect/ckpt-inspect
source "$(dirname "$0")/../cli/lib.sh"
[ -x "$ckptd" ] || { echo "no ckptd in $build: skipped"; exit 77; }
fail=0
t=$(mktemp -d /tmp/ckptd-test.XXXXXX)
pids=()
trap 'for p in "${pids[@]}"; do kill -9 $p 2>/dev/null; done; rm -rf "$t"' EXIT
umask 077
mkdir -p "$t/a" "$t/b"
printf 'secret-of-job-one-0123456789' > "$t/one.secret"
printf 'secret-of-job-two-0123456789' > "$t/two.secret"
printf 'secret-of-job-four-0123456789' > "$t/four.secret"
cat > "$t/jobs" <<JOBS
# the jobs of this test
one secret-file=$t/one.secret
two secret-file=$t/two.secret quota=6M
four secret-file=$t/four.secret quota=8M
JOBS
# The second instance gives job two less room: a save of two fails on rank 1 only.
# The first has room for job two's manifest (3 MiB and 4 KiB) and rank 0's shard of a
# small save, not for a shard of 4 MiB.
sed 's/quota=6M/quota=256K/' "$t/jobs" > "$t/jobs_b"
start() {  # start NAME DATA [JOBS]: a ckptd on an ephemeral port; sets port_NAME
  "$ckptd" --listen 127.0.0.1:0 --data "$2" --jobs "${3:-$t/jobs}" --metrics 127.0.0.1:0 \
    --log info > "$t/$1.out" 2> "$t/$1.log" &
  pids+=($!)
  for _ in $(seq 100); do grep -q "listening on port" "$t/$1.out" 2>/dev/null && break; sleep 0.1; done
  eval "port_$1=$(sed -n 's/.*listening on port \([0-9]*\).*/\1/p' "$t/$1.out")"
  eval "mport_$1=$(sed -n 's/.*metrics on port \([0-9]*\).*/\1/p' "$t/$1.out")"
}
start a "$t/a"
start b "$t/b" "$t/jobs_b"
[ -n "$port_a" ] && [ -n "$port_b" ] || { cat "$t"/*.log; echo "FAIL: ckptd did not start"; exit 1; }
if [ "$(id -u)" = 0 ]; then
  grep -q "warn: running as root, which ckptd does not need" "$t/a.log" \
    && ok "started as root: the log says it needs no privilege" || bad "no line about root"
else
  ! grep -q "running as root" "$t/a.log" && ok "not root: no line about it" || bad "root line"
fi
export CKPT_JOB_ID=one CKPT_JOB_SECRET=secret-of-job-one-0123456789
two="ckptd://127.0.0.1:$port_a,127.0.0.1:$port_b"
one="ckptd://127.0.0.1:$port_a"

expect_rc 0 "saved step 10: 4 rank" "4 ranks save through two instances" \
  env CKPT_TARGET="$two" "$synth" save --root "$t/unused" --step 10 --bytes 24M --seed 3 --world 4
[ -e "$t/unused" ] && bad "the root option was used with a target"
n_a=$(ls "$t/a/jobs/one/step-00000000000000000010" | wc -l)
n_b=$(ls "$t/b/jobs/one/step-00000000000000000010" | wc -l)
[ "$n_a" = 2 ] && [ "$n_b" = 2 ] && ok "ranks spread 2 and 2 over the instances" \
  || bad "ranks spread $n_a and $n_b"
[ -d "$t/a/jobs/one/manifest" ] && [ ! -e "$t/b/jobs/one/manifest" ] \
  && ok "the manifest is the first instance's" || bad "manifest placement"
expect_rc 0 "0 mismatches" "restore onto 3 ranks, bit-exact" \
  env CKPT_TARGET="$two" "$synth" verify --root "$t/unused" --step latest --bytes 24M --seed 3 --world 3
expect_rc 0 "0 mismatches" "restore onto 1 rank" \
  env CKPT_TARGET="$two" "$synth" verify --root "$t/unused" --step 10 --bytes 24M --seed 3 --world 1
expect_rc 0 "committed" "ckpt-inspect list through ckptd" "$inspect" "$two" list
expect_rc 0 "step 10: ok" "ckpt-inspect verify through ckptd" "$inspect" "$two" verify latest
shard=$(ls "$t/b/jobs/one/step-00000000000000000010" | head -1)
strings "$t/a/jobs/one/manifest/data.mdb" | grep -q "@127.0.0.1:$port_b/step-00000000000000000010/" \
  && ok "shard records name the instance that holds them ($shard)" || bad "holder in records"
expect_rc 0 "committed" "ckpt-inspect lists the job on the home storage node" \
  "$inspect" "$t/a/jobs/one" list
expect_rc 0 "saved step 11: 7 rank" "7 ranks through two instances" \
  env CKPT_TARGET="$two" "$synth" save --root "$t/unused" --step 11 --bytes 16M --seed 4 --world 7
expect_rc 0 "0 mismatches" "7 ranks restored onto 5" \
  env CKPT_TARGET="$two" "$synth" verify --root "$t/unused" --step 11 --bytes 16M --seed 4 --world 5
# Compressed by the rank before the wire, bytegroup, and stored so by ckptd.
expect_rc 0 "saved step 12: 1 rank" "a world of 1 through two instances, bytegroup" \
  env CKPT_TARGET="$two" "$synth" save --root "$t/unused" --step 12 --compress bytegroup \
  --bytes 8M --seed 2 --world 1
expect_rc 0 "0 mismatches" "restored onto 2" \
  env CKPT_TARGET="$two" "$synth" verify --root "$t/unused" --step 12 --bytes 8M --seed 2 --world 2
out=$("$inspect" "$two" show 12 --chunks --json)
pycheck "step 12 through ckptd: bytegroup chunks, stored < raw" "$out" \
  "any(c['codec']=='bytegroup' and c['stored_len']<c['raw_len'] for t in d['tensors'] for c in t['chunk_list'])"
reshard=$build/tools/ckpt-reshard/ckpt-reshard
expect_rc 0 "" "ckpt-reshard reads a job held by ckptd (4 -> 2 ranks into a local root)" \
  "$reshard" "$two" 10 --world 2 --out "$t/resharded" --drop-rank-bound --quiet
expect_rc 0 "0 mismatches" "the resharded copy restores onto 3" \
  "$synth" verify --root "$t/resharded" --step 10 --bytes 24M --seed 3 --world 3 --no-rng
expect_rc 0 "saved step 20: 7 rank" "7 ranks through one instance" \
  env CKPT_TARGET="$one" "$synth" save --root "$t/unused" --step 20 --bytes 16M --seed 5 --world 7
expect_rc 0 "0 mismatches" "7 ranks restored onto 4" \
  env CKPT_TARGET="$one" "$synth" verify --root "$t/unused" --step 20 --bytes 16M --seed 5 --world 4
expect_rc 0 "saved step 30: 1 rank" "a world of 1" \
  env CKPT_TARGET="$one" "$synth" save --root "$t/unused" --step 30 --bytes 8M --seed 6 --world 1
# A state larger than the ranks' pools goes from where it lies: every chunk but the
# pool's tail is sent from the tensors, and it restores bit for bit.
out=$(CKPT_TARGET="$two" CKPT_LOG=debug "$synth" save --root "$t/unused" --step 31 --bytes 48M \
      --seed 7 --world 2 --pool 4M --chunk 1M 2>&1)
src=$(sed -n "s/.*chunk(s) (\([0-9]*\) sent from the caller's memory).*/\1/p" <<<"$out" \
      | sort -n | head -1)
[ "${src:-0}" -gt 8 ] && ok "chunks sent from the tensors where they lie (at least $src a rank)" \
  || bad "no chunks sent from the caller's memory" "$(grep 'stream of' <<<"$out")"
expect_rc 0 "0 mismatches" "that step restored onto 3 ranks" \
  env CKPT_TARGET="$two" "$synth" verify --root "$t/unused" --step 31 --bytes 48M --seed 7 --world 3

# Refusals: each specific, nothing outside the job's directory, the job unaffected.
expect_rc 1 "server failed to prove the job secret" "a wrong secret is refused" \
  env CKPT_TARGET="$one" CKPT_JOB_SECRET=not-the-secret-0123456789 "$synth" save --root "$t/u" \
  --step 40 --bytes 1M --seed 1 --world 1
expect_rc 1 "not registered with this ckptd" "an unknown job is refused" \
  env CKPT_TARGET="$one" CKPT_JOB_ID=three "$synth" save --root "$t/u" --step 40 --bytes 1M \
  --seed 1 --world 1
expect_rc 1 "not registered with this ckptd" "a path-like job id is refused" \
  env CKPT_TARGET="$one" CKPT_JOB_ID=../one "$synth" save --root "$t/u" --step 40 --bytes 1M \
  --seed 1 --world 1
expect_rc 1 "quota of 6291456 bytes exceeded" "a quota exceeded says so" \
  env CKPT_TARGET="$one" CKPT_JOB_ID=two CKPT_JOB_SECRET=secret-of-job-two-0123456789 \
  "$synth" save --root "$t/u" --step 1 --bytes 8M --seed 1 --world 2
extra=$(find "$t/a" "$t/b" -mindepth 1 -not -path "$t/a/jobs*" -not -path "$t/b/jobs*" \
        -not -name ckptd.lock)
others=$(ls "$t/a/jobs" "$t/b/jobs" | grep -v -e '^one$' -e '^two$' -e ':$' -e '^$')
[ -z "$extra$others" ] && ok "nothing outside the jobs' directories" || bad "stray files" "$extra $others"
expect_rc 0 "0 mismatches" "the honest job still restores" \
  env CKPT_TARGET="$two" "$synth" verify --root "$t/unused" --step 10 --bytes 24M --seed 3 --world 2
mode=$(stat -c %a "$t/a/jobs/one" "$t/a/jobs/one/step-00000000000000000010"/* | sort -u | tr '\n' ' ')
[ "$mode" = "600 700 " ] && ok "directories 0700, files 0600" || bad "modes: $mode"
# A save that fits its quota is taken, however its ranks' OPENs interleave: job four
# holds its manifest (3 MiB and 64 KiB here) and its 4 ranks announce about 1.03 MiB
# each, 7.3 MiB of 8. ckptd allocates a shard file whole at OPEN; counting a stream
# in flight by its file and by its reservation both refused this save (checked).
expect_rc 0 "saved step 1: 4 rank" "a 4-rank save within its job's quota is taken" \
  env CKPT_TARGET="$one" CKPT_JOB_ID=four CKPT_JOB_SECRET=secret-of-job-four-0123456789 \
  "$synth" save --root "$t/u" --step 1 --bytes 1200K --seed 1 --world 4

# Metrics: the endpoint counts what happened.
if exec 3<>"/dev/tcp/127.0.0.1/$mport_a"; then
  printf 'GET /metrics HTTP/1.0\r\n\r\n' >&3
  m=$(cat <&3); exec 3<&-
  grep -q '^ckptd_saves_committed_total [1-9]' <<<"$m" && grep -q 'ckptd_quota_refusals_total [1-9]' <<<"$m" \
    && grep -q 'ckptd_job_used_bytes{job="one"} [1-9]' <<<"$m" \
    && ok "metrics: commits, refusals, per-job usage" || bad "metrics" "$m"
  # Every buffer of every size is back once the streams have ended.
  grep -q '^ckptd_pool_used_bytes 0$' <<<"$m" && ok "metrics: the pool is all back" \
    || bad "pool buffers still out after the saves" "$(grep pool <<<"$m")"
fi
# The default pool (1 GiB, chunks of 16 MiB): three quarters in chunk-size buffers, the
# rest in sizes halving down to 64 KiB, the same number of each.
grep -q "pool: 48 buffers of 16384 KiB, and 16 each of 8192 down to 64 KiB" "$t/a.log" \
  && ok "the pool's buffer sizes" || bad "pool layout" "$(grep 'pool:' "$t/a.log")"
# A save that fails on one rank is aborted, and the home instance removes the files
# that the other ranks made durable, on every instance.
expect_rc 1 "quota of 262144 bytes exceeded" "rank 1 of job two over its quota on the second instance" \
  env CKPT_TARGET="$two" CKPT_JOB_ID=two CKPT_JOB_SECRET=secret-of-job-two-0123456789 \
  "$synth" save --root "$t/u" --step 7 --bytes 1M --seed 1 --world 2
# Rank 0 fits on the home instance: were it refused too, the coordinator could abort
# rank 1 before it began, and nothing would be left to remove.
! grep -q "quota of 6291456" <<<"$out" && ok "... and rank 0 is not refused on the first" \
  || bad "rank 0 refused too" "$out"
# Rank 0 says why, whether it voted first, began after the decision, or had its stream
# refused by the instance that removed the attempt's files: rank 1's failure.
grep -Eq "save failed on rank 0: .*aborted by the coordinator( before this rank began)?: rank 1 failed: .*quota of 262144" <<<"$out" \
  && ok "... and rank 0 names the coordinator's reason" || bad "rank 0's reason" "$out"
left=
for _ in $(seq 300); do
  left=$(find "$t/a/jobs/two" "$t/b/jobs/two" -name '*.shard' 2>/dev/null)
  [ -z "$left" ] && break; sleep 0.1
done
[ -z "$left" ] && ok "the aborted attempt's durable shards are removed" || bad "left: $left"
# Retention through ckptd: the job's rules go to the home instance with its COORD.
for st in 50 51 52; do
  expect_rc 0 "saved step $st" "step $st with CKPT_KEEP_LAST=2" \
    env CKPT_TARGET="$two" CKPT_KEEP_LAST=2 "$synth" save --root "$t/unused" --step $st \
    --bytes 4M --seed $st --world 2
done
steps=
for _ in $(seq 300); do
  steps=$("$inspect" "$two" list 2>/dev/null | awk 'NR > 1 {print $1}' | tr '\n' ' ')
  [ "$steps" = "51 52 " ] && break; sleep 0.1
done
[ "$steps" = "51 52 " ] && ok "retention kept the newest two committed steps" || bad "steps: $steps"
gone=$(ls -d "$t/a/jobs/one/step-00000000000000000010" "$t/b/jobs/one/step-00000000000000000010" \
       "$t/b/jobs/one/step-00000000000000000050" 2>/dev/null)
[ -z "$gone" ] && ok "their files are gone from both instances" || bad "still there: $gone"
expect_rc 0 "0 mismatches" "a kept step restores" \
  env CKPT_TARGET="$two" "$synth" verify --root "$t/unused" --step 52 --bytes 4M --seed 52 --world 3

# SIGHUP reloads the jobs file: a job added is served at once (a short secret is
# warned about); a broken file is refused, logged, and the jobs in use stay.
wait_log() {  # wait_log PATTERN: up to 5 s for a line of a.log
  for _ in $(seq 50); do grep -q -- "$1" "$t/a.log" && return 0; sleep 0.1; done; return 1
}
cp "$t/jobs" "$t/jobs.kept"
echo "three secret=short3" >> "$t/jobs"
kill -HUP "${pids[0]}"
wait_log "SIGHUP: 4 jobs" && ok "SIGHUP: the reload is logged" || bad "no reload line" "$(tail -5 "$t/a.log")"
grep -q "job 'three': the secret is 6 bytes; use at least 16" "$t/a.log" \
  && ok "a short secret is warned about" || bad "no short-secret warning" "$(tail -5 "$t/a.log")"
expect_rc 0 "saved step 1: 1 rank" "a job added by SIGHUP saves" \
  env CKPT_TARGET="$one" CKPT_JOB_ID=three CKPT_JOB_SECRET=short3 "$synth" save \
  --root "$t/unused" --step 1 --bytes 1M --seed 1 --world 1
echo "three secret=short3 quota=lots" >> "$t/jobs"
kill -HUP "${pids[0]}"
wait_log "SIGHUP: the jobs file was not reloaded" && ok "a broken jobs file is refused, logged" \
  || bad "no refusal line" "$(tail -5 "$t/a.log")"
expect_rc 0 "saved step 2: 1 rank" "the jobs in use stay after a refused reload" \
  env CKPT_TARGET="$one" CKPT_JOB_ID=three CKPT_JOB_SECRET=short3 "$synth" save \
  --root "$t/unused" --step 2 --bytes 1M --seed 1 --world 1
cp "$t/jobs.kept" "$t/jobs"

# Connections that never prove a job: from one address at most --max-handshakes
# are in their handshake at once (more are closed as they come), each for at most
# --handshake-ms; the jobs' ranks are served meanwhile. A job's own burst past the
# bound connects again. (Before: 50 idle connections held every thread for the
# 120 s of --timeout-ms, and the job's save waited in the backlog.)
mkdir -p "$t/d"
"$ckptd" --listen 127.0.0.1:0 --data "$t/d" --jobs "$t/jobs" --metrics 127.0.0.1:0 \
  --max-conns 16 --max-handshakes 3 --handshake-ms 1500 --log info > "$t/d.out" 2> "$t/d.log" &
pid_d=$!
pids+=($pid_d)
for _ in $(seq 100); do grep -q "listening on port" "$t/d.out" 2>/dev/null && break; sleep 0.1; done
port_d=$(sed -n 's/.*listening on port \([0-9]*\).*/\1/p' "$t/d.out")
mport_d=$(sed -n 's/.*metrics on port \([0-9]*\).*/\1/p' "$t/d.out")
/usr/bin/python3 - "$port_d" > "$t/idle.out" 2>&1 <<'PY' &
import socket, sys, time
held = []
for _ in range(50):                      # from another address of the loopback
    s = socket.socket()
    s.bind(("127.0.0.2", 0))
    s.connect(("127.0.0.1", int(sys.argv[1])))
    held.append(s)
print("holding", len(held), flush=True)
time.sleep(25)
PY
idle=$!
pids+=($idle)
for _ in $(seq 50); do grep -q holding "$t/idle.out" && break; sleep 0.1; done
t0=$(date +%s%N)
expect_rc 0 "saved step 60: 7 rank" "a job saves beside 50 connections that never prove one" \
  env CKPT_TARGET="ckptd://127.0.0.1:$port_d" timeout 60 "$synth" save --root "$t/unused" \
  --step 60 --bytes 4M --seed 60 --world 7
ms=$(( ($(date +%s%N) - t0) / 1000000 ))
[ "$ms" -lt 15000 ] && ok "... in $ms ms, not after the idle ones' timeout" \
  || bad "the save took $ms ms beside idle connections"
grep -q "connections from 127.0.0.2 are in their handshake already (--max-handshakes)" "$t/d.log" \
  && ok "the address past its bound is logged" || bad "no line about 127.0.0.2" "$(tail -5 "$t/d.log")"
rej=
if exec 3<>"/dev/tcp/127.0.0.1/$mport_d"; then
  printf 'GET /metrics HTTP/1.0\r\n\r\n' >&3
  rej=$(sed -n 's/^ckptd_rejected_total \([0-9]*\).*/\1/p' <&3); exec 3<&-
fi
[ "${rej:-0}" -ge 40 ] && ok "ckptd_rejected_total counts them ($rej)" || bad "rejected: ${rej:-none}"
kill "$idle" 2>/dev/null
kill -TERM "$pid_d"; wait "$pid_d" 2>/dev/null
# A rank closed so connects again: with one handshake per address, a silent
# connection from the rank's own address holds it; the rank's first connections are
# closed as they come, and it gets through once the silent one's time is up.
"$ckptd" --listen 127.0.0.1:0 --data "$t/d" --jobs "$t/jobs" --max-handshakes 1 \
  --handshake-ms 1500 --log info > "$t/e.out" 2> "$t/e.log" &
pid_e=$!
pids+=($pid_e)
for _ in $(seq 100); do grep -q "listening on port" "$t/e.out" 2>/dev/null && break; sleep 0.1; done
port_e=$(sed -n 's/.*listening on port \([0-9]*\).*/\1/p' "$t/e.out")
exec 4<>"/dev/tcp/127.0.0.1/$port_e"
t0=$(date +%s%N)
expect_rc 0 "saved step 61: 1 rank" "a rank whose connection was closed in the handshake connects again" \
  env CKPT_TARGET="ckptd://127.0.0.1:$port_e" timeout 60 "$synth" save --root "$t/unused" \
  --step 61 --bytes 1M --seed 61 --world 1
ms=$(( ($(date +%s%N) - t0) / 1000000 ))
exec 4<&-
grep -q "connections from 127.0.0.1 are in their handshake already" "$t/e.log" && [ "$ms" -ge 1000 ] \
  && ok "... after its first tries were closed ($ms ms)" || bad "no refusal seen ($ms ms)" "$(cat "$t/e.log")"
kill -TERM "$pid_e"; wait "$pid_e" 2>/dev/null

# Options that cannot work: refused with the option named, an address before the
# pool is mapped (exit 2 from the command line), a pool no halving layout takes.
expect_rc 2 "--metrics '127.0.0.1:99999': expected ADDR:PORT" "a bad --metrics address" \
  "$ckptd" --listen 127.0.0.1:0 --data "$t/a" --jobs "$t/jobs" --metrics 127.0.0.1:99999
mkdir -p "$t/c"
expect_rc 1 "--pool 109950063265972224 with --chunk-max 16777216" "a --pool past any layout" \
  "$ckptd" --listen 127.0.0.1:0 --data "$t/c" --jobs "$t/jobs" --pool 99999T

# SIGTERM: a clean stop.
kill -TERM "${pids[0]}"; wait "${pids[0]}"; rc=$?
[ $rc = 0 ] && ok "SIGTERM stops ckptd cleanly" || bad "ckptd exit $rc after SIGTERM" "$(tail "$t/a.log")"
[ $fail = 0 ] || { echo "--- logs"; tail -n 20 "$t/a.log" "$t/b.log"; }
exit $fail
