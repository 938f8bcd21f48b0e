#!/usr/bin/env bash
# test_rdma_crash.sh — the crash-matrix points of the two-phase commit over the
# rdma transport: ckpt-synth saves as W=2 rank processes with CKPT_TRANSPORT=rdma
# (the coordinator in rank 0, on the RDMA device's address), one process is
# killed at the fault point, and then: the previous step still loads bit-exact,
# and the faulted step is either committed and complete (verifies bit-exact) or
# invisible (not a committed step) — never half. Where the outcome is fixed by
# the protocol (docs/protocol.md §2: the manifest txn decides) it is checked exactly. Then
# the same with the hierarchical commit (node leaders on rdma, a leader killed).
#
#   test_rdma_crash.sh CKPT-SYNTH        (inside the rdma guest; 77 elsewhere)
set -u
synth=$1
addr=${CKPT_TEST_RDMA_ADDR:-10.0.0.1}
if [ -z "$(ls /sys/class/infiniband 2>/dev/null)" ]; then
  echo "SKIP: no RDMA device here (/sys/class/infiniband is empty); this runs inside the rdma guest (tests/rdma/run-rdma-tests.sh)"
  exit 77
fi
root=$(mktemp -d "${TMPDIR:-/tmp}/ckpt-rdma-crash-XXXXXX")
export CKPT_TRANSPORT=rdma CKPT_COORD_ADDR=$addr CKPT_TIMEOUT_MS=20000 CKPT_JOB_SECRET=rdma-crash
unset CKPT_FAULT CKPT_FAULT_RANK
W=2 B=1M
fail=0
say() { echo "$*"; }
bad() { echo "FAIL: $*"; fail=1; }

if out=$("$synth" save --root "$root/r" --step 1 --bytes $B --seed 1 --world $W 2>&1); then
  say "ok: step 1 saved over rdma: $out"
else
  bad "step 1 over rdma"; echo "$out"; exit 1
fi

# point  rank-to-kill  step  expected (committed | invisible | either)
matrix="after_prepare_sent 1 2 either
coord_before_commit_txn 0 3 invisible
before_decision_send 0 4 committed"
while read -r point rank step want; do
  t0=$(date +%s%N)
  out=$(CKPT_FAULT=$point CKPT_FAULT_RANK=$rank "$synth" save --root "$root/r" --step "$step" \
        --bytes $B --seed "$step" --world $W 2>&1)
  rc=$?
  ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  if [ $rc = 0 ]; then bad "$point: the save survived a crash of rank $rank"; echo "$out"; continue; fi
  grep -q "fault injected: crash at $point" <<<"$out" \
    || { bad "$point: the fault point was not reached"; echo "$out"; continue; }
  # The previous committed step is intact.
  if ! v=$("$synth" verify --root "$root/r" --step 1 --bytes $B --seed 1 2>&1) ||
     ! grep -q "0 mismatches" <<<"$v"; then
    bad "$point: step 1 damaged"; echo "$v"
  fi
  # The faulted step: all or nothing.
  v=$("$synth" verify --root "$root/r" --step "$step" --bytes $B --seed "$step" --world $W 2>&1); vrc=$?
  if [ $vrc = 0 ] && grep -q "0 mismatches" <<<"$v"; then got=committed
  elif grep -q "not a committed step" <<<"$v"; then got=invisible
  else got="half: rc $vrc: $v"; fi
  case "$want:$got" in
    either:committed|either:invisible|committed:committed|invisible:invisible)
      say "ok: $point (rank $rank killed, $ms ms): step 1 intact, step $step $got" ;;
    *) bad "$point: step $step is '$got', want $want"; echo "$out" ;;
  esac
done <<<"$matrix"

# The job goes on over rdma after the crashes.
if out=$("$synth" save --root "$root/r" --step 10 --bytes $B --seed 10 --world $W 2>&1); then
  say "ok: step 10 saved after the crashes"
else
  bad "save after the crashes"; echo "$out"
fi
# The hierarchical commit over rdma: W = 4 in nodes of 2, each node's leader on the
# rdma transport to the coordinator, its ranks on a unix socket to the leader. A
# save, read back as 4 and as 3 ranks; then the leader of node 1 (rank 2) killed
# before it forwards a vote: step 20 intact, step 21 invisible; the job goes on.
export CKPT_COMMIT_TREE=on CKPT_NODE_SIZE=2
T=4
if out=$("$synth" save --root "$root/t" --step 20 --bytes $B --seed 20 --world $T 2>&1); then
  say "ok: step 20 saved over rdma by 4 ranks through 2 node leaders"
else
  bad "tree save over rdma"; echo "$out"
fi
for w in 4 3; do
  v=$("$synth" verify --root "$root/t" --step 20 --bytes $B --seed 20 --world $w 2>&1)
  grep -q "0 mismatches" <<<"$v" && say "ok: step 20 reads back as $w ranks" ||
    { bad "step 20 as $w ranks"; echo "$v"; }
done
out=$(CKPT_FAULT=leader_before_forward CKPT_FAULT_RANK=2 "$synth" save --root "$root/t" \
      --step 21 --bytes $B --seed 21 --world $T 2>&1)
rc=$?
if [ $rc = 0 ]; then bad "leader_before_forward: the save survived the crash of node 1's leader"; echo "$out"
elif ! grep -q "fault injected: crash at leader_before_forward" <<<"$out"; then
  bad "leader_before_forward: the fault point was not reached"; echo "$out"
else
  v=$("$synth" verify --root "$root/t" --step 20 --bytes $B --seed 20 --world $T 2>&1)
  grep -q "0 mismatches" <<<"$v" || { bad "leader_before_forward: step 20 damaged"; echo "$v"; }
  v=$("$synth" verify --root "$root/t" --step 21 --bytes $B --seed 21 --world $T 2>&1)
  grep -q "not a committed step" <<<"$v" && say "ok: leader_before_forward (node 1's leader killed): step 20 intact, step 21 invisible" ||
    { bad "leader_before_forward: step 21 is not invisible"; echo "$v"; }
fi
if out=$("$synth" save --root "$root/t" --step 22 --bytes $B --seed 22 --world $T 2>&1); then
  say "ok: step 22 saved through the node leaders after the crash"
else
  bad "tree save after the crash"; echo "$out"
fi
unset CKPT_COMMIT_TREE CKPT_NODE_SIZE

[ $fail = 0 ] && rm -rf "$root"
exit $fail
