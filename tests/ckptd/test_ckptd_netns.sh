#!/usr/bin/env bash
# test_ckptd_netns.sh — a job saving through two ckptd instances on separate hosts:
# three network namespaces on one link (a bridge in the ranks' namespace), ckptd A
# on 10.77.0.1 and ckptd B on 10.77.0.2, each with its own data directory, and the
# job's ranks on 10.77.0.3. Four ranks save through both (ranks 0 and 2 stream to
# A, 1 and 3 to B); A is the job's home: its coordinator holds each vote to the
# file it names, and the files of ranks 1 and 3 are on B, so A asks B (CHECK)
# across the link. With A unable to reach B the save is refused, naming B and the
# rank; with the link back it commits, each instance holding its own ranks' shards
# and A's manifest naming B as their holder; the job restores onto 3 ranks bit for
# bit.
# usage: test_ckptd_netns.sh BUILD_DIR   (root; exit 77 where it cannot run)
set -u
build=$1
ckptd=$build/ckptd/ckptd synth=$build/tools/ckpt-synth/ckpt-synth
source "$(dirname "$0")/../cli/lib.sh"
[ -x "$ckptd" ] && [ -x "$synth" ] || { echo "no ckptd or ckpt-synth in $build: skipped"; exit 77; }
[ "$(id -u)" = 0 ] || { echo "network namespaces need root: skipped"; exit 77; }
command -v ip >/dev/null || { echo "no ip (iproute2): skipped"; exit 77; }
tag=$$
na=ckptd-a-$tag nb=ckptd-b-$tag nr=ckptd-r-$tag
t=$(mktemp -d /tmp/ckptd-netns.XXXXXX)
pids=()
cleanup() {
  # SIGTERM is ckptd's clean stop (a second of grace, --grace-ms); SIGKILL if it hangs.
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for _ in $(seq 50); do
    alive=0
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ $alive = 0 ] && break
    sleep 0.1
  done
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  wait 2>/dev/null
  # Whatever still runs in the namespaces goes with them.
  for n in "$na" "$nb" "$nr"; do
    ip netns pids "$n" 2>/dev/null | xargs -r kill -9 2>/dev/null
    ip netns del "$n" 2>/dev/null
  done
  rm -rf "$t"
}
trap cleanup EXIT
if ! ip netns add "$na" 2>"$t/err"; then
  echo "ip netns unavailable here ($(cat "$t/err")): skipped"; exit 77
fi
ip netns add "$nb" && ip netns add "$nr" || { echo "FAIL: ip netns add"; exit 1; }
nsx() { local n=$1; shift; ip netns exec "$n" "$@"; }
# The link: a bridge in the ranks' namespace, a veth pair to each storage host.
setup_net() {
  nsx "$nr" ip link add br0 type bridge || return 1
  local i=1
  for n in "$na" "$nb"; do
    ip link add "ck$i-$tag" type veth peer name "cb$i-$tag" || return 1
    ip link set "ck$i-$tag" netns "$n" && ip link set "cb$i-$tag" netns "$nr" || return 1
    nsx "$n" ip link set "ck$i-$tag" name eth0 || return 1
    nsx "$n" ip addr add "10.77.0.$i/24" dev eth0 && nsx "$n" ip link set eth0 up || return 1
    nsx "$n" ip link set lo up || return 1
    nsx "$nr" ip link set "cb$i-$tag" master br0 && nsx "$nr" ip link set "cb$i-$tag" up || return 1
    i=$((i + 1))
  done
  nsx "$nr" ip addr add 10.77.0.3/24 dev br0 && nsx "$nr" ip link set br0 up && nsx "$nr" ip link set lo up
}
if ! setup_net 2>"$t/err"; then
  echo "cannot build the namespaces' link ($(cat "$t/err")): skipped"; exit 77
fi
fail=0
umask 077
mkdir -p "$t/a" "$t/b"
printf 'secret-of-the-netns-job-0123456789' > "$t/job.secret"
echo "job secret-file=$t/job.secret" > "$t/jobs"
start() {  # start NAME NAMESPACE ADDRESS: sets port_NAME
  # Not through the function nsx: $! must be ckptd itself (ip netns exec execs it),
  # not a subshell that the clean-up would kill in its place.
  ip netns exec "$2" "$ckptd" --listen "$3:0" --data "$t/$1" --jobs "$t/jobs" --log info \
    --grace-ms 1000 > "$t/$1.out" 2> "$t/$1.log" &
  pids+=($!)
  for _ in $(seq 100); do grep -q "listening on port" "$t/$1.out" 2>/dev/null && break; sleep 0.1; done
  eval "port_$1=$(sed -n 's/.*listening on port \([0-9]*\).*/\1/p' "$t/$1.out")"
}
start a "$na" 10.77.0.1
start b "$nb" 10.77.0.2
[ -n "$port_a" ] && [ -n "$port_b" ] || { cat "$t"/*.log; echo "FAIL: ckptd did not start"; exit 1; }
reach() {  # reach NAMESPACE HOST PORT: a TCP connection from there gets through
  nsx "$1" timeout 10 bash -c "exec 3<>/dev/tcp/$2/$3" 2>/dev/null
}
reach "$nr" 10.77.0.1 "$port_a" && reach "$nr" 10.77.0.2 "$port_b" && reach "$na" 10.77.0.2 "$port_b" \
  && ok "three hosts on one link" || { echo "FAIL: the namespaces do not reach each other"; exit 1; }
export CKPT_JOB_ID=job CKPT_JOB_SECRET=secret-of-the-netns-job-0123456789 CKPT_TIMEOUT_MS=60000
target="ckptd://10.77.0.1:$port_a,10.77.0.2:$port_b"
rank() { nsx "$nr" env CKPT_TARGET="$target" "$synth" "$@" --root "$t/unused"; }

# A cannot reach B: the votes of ranks 1 and 3 name files on B that A cannot check.
nsx "$na" ip route add unreachable 10.77.0.2/32
expect_rc 1 "could not be checked on 10.77.0.2:$port_b, which holds it: ckptd 10.77.0.2:$port_b" \
  "A refuses votes for B's shards it cannot check" \
  rank save --step 5 --bytes 8M --seed 2 --world 4
nsx "$na" ip route del unreachable 10.77.0.2/32
grep -q "rank [13]" <<<"$out" && ok "the refusal names the rank" || bad "no rank in the refusal" "$out"

expect_rc 0 "saved step 10: 4 rank" "4 ranks save through two hosts" \
  rank save --step 10 --bytes 24M --seed 3 --world 4
step=step-00000000000000000010
ls_ranks() { ls "$t/$1/jobs/job/$step" 2>/dev/null | sed -n 's/^rank-0*\([0-9][0-9]*\)-.*\.shard$/\1/p' | sort | tr '\n' ' '; }
[ "$(ls_ranks a)" = "0 2 " ] && [ "$(ls_ranks b)" = "1 3 " ] \
  && ok "A holds ranks 0 and 2, B ranks 1 and 3" || bad "placement: A '$(ls_ranks a)', B '$(ls_ranks b)'"
[ -d "$t/a/jobs/job/manifest" ] && [ ! -e "$t/b/jobs/job/manifest" ] \
  && ok "the manifest is on A only" || bad "manifest placement"
strings "$t/a/jobs/job/manifest/data.mdb" | grep -q "@10.77.0.2:$port_b/$step/" \
  && ok "A's records name B as the holder of its shards" || bad "no holder 10.77.0.2 in A's records"
grep -q "job job.*step 10 committed" "$t/a.log" && ok "A's coordinator committed step 10" \
  || bad "no commit in A's log" "$(tail "$t/a.log")"
expect_rc 0 "0 mismatches" "restore onto 3 ranks, bit-exact, from both hosts" \
  rank verify --step latest --bytes 24M --seed 3 --world 3
expect_rc 1 "" "step 5 was never committed" rank verify --step 5 --bytes 8M --seed 2 --world 1
[ $fail = 0 ] || { echo "--- logs"; tail -n 20 "$t/a.log" "$t/b.log"; }
exit $fail
