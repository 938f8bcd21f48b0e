#!/usr/bin/env bash
# test_incarnations.sh — two incarnations of one job on one root (a stale copy still
# running after its restart was launched), as an operator's mistake makes them:
#   A. the stale job's coordinator is gone but one of its ranks still writes step N;
#      the restarted job saves and commits step N; the stale rank then fails and
#      cleans up after itself. Step N must stay the new job's, bit-exact: no rank may
#      write over, truncate or remove another attempt's file.
#   B. the stale job's coordinator is about to commit step M; the restarted job
#      opens the root. It must be refused (one coordinator per root, naming the
#      holder) instead of collecting the stale job's voted files, and the stale job's
#      step M must commit whole.
# Then the root holds only committed steps, each with all its shards.
# Usage: test_incarnations.sh CKPT_SYNTH
set -u
synth=$1
. "$(dirname "$0")/common.sh"
need_tools /usr/bin/python3 timeout pgrep
W=2
size=(--bytes 4M --chunk 256K --pool 1M)
export CKPT_TIMEOUT_MS=${CKPT_TIMEOUT_MS:-4000}
export CKPT_JOB_ID=incarnations-$$ CKPT_JOB_SECRET=incarnations-secret-$$
unset CKPT_FAULT CKPT_FAULT_RANK
tmp=$(mktemp -d /var/tmp/ckpt-incarnations-XXXXXX)
root=$tmp/r
fail=0
bad() { echo "FAIL: $1"; [ $# -gt 1 ] && sed 's/^/    | /' <<<"$2"; fail=1; }
ok() { echo "ok: $1"; }

save() {  # save STEP SEED [ENV=V...]: the whole job, its ranks forked by ckpt-synth
  local step=$1 seed=$2; shift 2
  env "$@" CKPT_COORD_PORT="$(free_port)" timeout -k 5 120 "$synth" save --root "$root" \
    --step "$step" --seed "$seed" --world $W "${size[@]}" 2>&1
}
verify() {  # verify STEP SEED
  CKPT_COORD_PORT=$(free_port) timeout -k 5 120 "$synth" verify --root "$root" --step "$1" \
    --seed "$2" --world $W "${size[@]}" 2>&1
}
# rank R of a job launched rank by rank (as torchrun does), in the background
launch_rank() {  # launch_rank R PORT STEP SEED LOG [ENV=V...]
  local r=$1 port=$2 step=$3 seed=$4 log=$5; shift 5
  : >"$log"
  env "$@" RANK="$r" WORLD_SIZE=$W LOCAL_RANK="$r" LOCAL_WORLD_SIZE=$W MASTER_ADDR=127.0.0.1 \
    CKPT_COORD_PORT="$port" timeout -k 5 120 "$synth" save --root "$root" --step "$step" \
    --seed "$seed" --world $W "${size[@]}" >"$log" 2>&1 &
}
wait_for() {  # wait_for SECONDS CMD...: until CMD succeeds
  local i n=$(( $1 * 50 )); shift
  for ((i = 0; i < n; i++)); do "$@" && return 0; sleep 0.02; done
  return 1
}
has_rank_file() { compgen -G "$root/step-$(printf %020d "$1")/rank-$(printf %06d "$2")-*.shard" >/dev/null; }

out=$(save 4 40) || { bad "the first save" "$out"; exit 1; }

# ---- A: a stale rank of a dead coordinator, and the restarted job, on step 5
p1=$(free_port)
launch_rank 1 "$p1" 5 51 "$tmp/stale1.log" CKPT_FAULT=after_chunk_write:1:delay:5000
stale1=$!
launch_rank 0 "$p1" 5 51 "$tmp/stale0.log"
stale0=$!
wait_for 20 has_rank_file 5 1 || bad "the stale rank 1 never created its file" "$(cat "$tmp/stale1.log")"
wait_for 20 grep -q "fault injected: delay" "$tmp/stale1.log" || bad "rank 1 never reached its delay"
# The stale job's coordinator dies (its node lost); rank 1 still writes.
kill -9 $(pgrep -P $stale0) $stale0 2>/dev/null
wait $stale0 2>/dev/null
out=$(save 5 52)
[ $? = 0 ] && ok "the restarted job saves step 5 while a stale rank still writes it" \
  || bad "the restarted job's save of step 5" "$out"
wait $stale1; rc=$?
[ $rc != 0 ] && ok "the stale rank's save fails (exit $rc): $(grep -m1 'save failed' "$tmp/stale1.log" | cut -c1-160)" \
  || bad "the stale rank reported success" "$(cat "$tmp/stale1.log")"
out=$(verify 5 52)
grep -q " 0 mismatches" <<<"$out" && ok "step 5 is the restarted job's, bit-exact, after the stale rank cleaned up" \
  || bad "step 5 lost or damaged by the stale rank" "$out"
out=$(verify 4 40)
grep -q " 0 mismatches" <<<"$out" && ok "step 4 intact" || bad "step 4" "$out"

# ---- B: a second coordinator while the first is about to commit step 7
log7=$tmp/save7.log
: >"$log7"
CKPT_COORD_PORT=$(free_port) CKPT_FAULT=coord_before_commit_txn:1:delay:4000 CKPT_FAULT_RANK=0 \
  timeout -k 5 120 "$synth" save --root "$root" --step 7 --seed 70 --world $W "${size[@]}" \
  >"$log7" 2>&1 &
old=$!
wait_for 30 grep -q "fault injected: delay" "$log7" || bad "the coordinator never reached its delay" "$(cat "$log7")"
out=$(save 8 80)
rc=$?
if [ $rc != 0 ] && grep -q "in use by the coordinator of job '$CKPT_JOB_ID'" <<<"$out"; then
  ok "a second coordinator on the root is refused, naming the holder"
else
  bad "a second coordinator was not refused (exit $rc)" "$out"
fi
wait $old; rc=$?
[ $rc = 0 ] && ok "the first job's step 7 commits" || bad "the first job's save of step 7 (exit $rc)" "$(cat "$log7")"
out=$(verify 7 70)
grep -q " 0 mismatches" <<<"$out" && ok "step 7 verifies bit-exact" || bad "step 7 lost files" "$out"

# ---- what is left: only committed steps, each with all its shards
out=$(save 9 90) || bad "a clean save after both" "$out"
clean=$(check_root_clean "$root" 4:$W 5:$W 7:$W 9:$W) && ok "the root holds only committed steps" \
  || bad "the root after GC" "$clean"

[ $fail = 0 ] && rm -rf "$tmp" || echo "root kept for inspection: $root"
exit $fail
