#!/usr/bin/env bash
# test_kill9.sh — an external kill -9 (not the fault hook) of one random rank
# process at a random moment of a W = 4 save, then the invariant (CONTRIBUTING.md, "Tests"):
#   (a) the previous committed step verifies bit-exact;
#   (b) the killed step is committed and verifies, or invisible - never half;
#   (c) after GC (rank 0's open of the next clean save) nothing of it remains
#       unless it is committed, the root holds only committed steps with all their
#       shards, and the next step verifies.
# The victim rank and the delay come from a seed (printed); a run of a seed is
# repeatable up to the machine's timing. Then the hierarchical commit (W = 8 in
# nodes of 4, CKPT_COMMIT_TREE=on): the victim is node 1's leader (rank 4), and
# besides (a)-(c) each other rank of its node must report the step in doubt or
# aborted (or committed, only if it is).
# Usage: test_kill9.sh CKPT_SYNTH [SEED...]
set -u
synth=$1; shift
. "$(dirname "$0")/common.sh"
need_tools /usr/bin/python3 timeout pgrep
seeds=("$@")
[ ${#seeds[@]} = 0 ] && seeds=(${CKPT_KILL9_SEEDS:-1 2 3 4 5 6 7 8})

W=4
# zstd and a 2-buffer pool make the save take a moment (~0.5 s here), not GiBs.
size=(--bytes 64M --chunk 1M --pool 2M --compress zstd:3)
mode=flat
export CKPT_TIMEOUT_MS=${CKPT_TIMEOUT_MS:-3000}
export CKPT_JOB_ID=kill9-$$ CKPT_JOB_SECRET=kill9-secret-$$
unset CKPT_FAULT CKPT_FAULT_RANK
tmp=$(mktemp -d /var/tmp/ckpt-kill9-XXXXXX)
root=$tmp/r
fail=0 landed=0
committed=()

seed_of() { echo $((9000 + $1)); }
save() { CKPT_COORD_PORT=$(free_port) timeout -k 5 180 "$synth" save --root "$root" --step "$1" \
           --seed "$(seed_of "$1")" --world $W "${size[@]}" 2>&1; }
verify() { CKPT_COORD_PORT=$(free_port) timeout -k 5 180 "$synth" verify --root "$root" --step "$1" \
             --seed "$(seed_of "$1")" --world "${2:-$W}" "${size[@]}" 2>&1; }
ms() { date +%s%3N; }

# start_save STEP LOG: ckpt-synth save in the background (spid: the timeout(1)
# around it; the rank processes are its grandchildren), then wait until all W rank
# processes exist (or the save is over).
start_save() {
  CKPT_COORD_PORT=$(free_port) timeout -k 5 180 "$synth" save --root "$root" --step "$1" \
    --seed "$(seed_of "$1")" --world $W "${size[@]}" >"$2" 2>&1 &
  spid=$!
  local i n s
  for ((i = 0; i < 1000; i++)); do
    n=0; for s in $(pgrep -P "$spid"); do n=$((n + $(pgrep -c -P "$s"))); done
    [ "$n" -ge $W ] && return
    kill -0 $spid 2>/dev/null || return
    sleep 0.005
  done
}
pid_of_rank() {  # pid_of_rank R: ckpt-synth names its rank processes ckpt-rank-R
  local s
  for s in $(pgrep -P "$spid"); do pgrep -P "$s" -x "ckpt-rank-$1"; done
}

clean_save() {  # clean_save: the first steps of a mode, timed: the kill window
  # Two clean saves, each timed from "every rank runs" to its end; the shorter is
  # the kill window (the first may be slowed by a cold start or a busy machine,
  # and a window longer than the saves makes every kill miss).
  local step t0 rc s
  span=
  for step in 1 2; do
    cur=$step
    start_save $cur "$tmp/save-$cur.log"
    t0=$(ms)
    wait $spid; rc=$?
    s=$(( $(ms) - t0 ))
    if [ $rc != 0 ] || ! verify $cur | grep -q " 0 mismatches"; then
      echo "FAIL: a clean save does not work:"; cat "$tmp/save-$cur.log"; exit 1
    fi
    committed+=("$cur:$W")
    [ -z "$span" ] || [ $s -lt $span ] && span=$s
  done
  # Saves vary by ±30 % from one to the next here: the kills come within the first
  # two thirds of the shorter clean save, so that most land on a running save.
  echo "clean saves of $W ranks: the rank processes live ~${span} ms"
  span=$((span * 2 / 3))
  [ $span -lt 50 ] && span=50
  echo "the kill comes within the first ${span} ms"
}

rounds() {  # rounds: one kill per seed, in the current mode and world
  for seed in "${seeds[@]}"; do
    RANDOM=$seed
    victim=$((RANDOM % W)) delay=$(( (RANDOM * 32768 + RANDOM) % span ))
    # A leader is killed within the first half: its node's votes go through it.
    [ $mode = tree ] && victim=4 delay=$((delay / 2))
    N=$cur M=$((cur + 1)) G=$((cur + 2)) errs=()
    log=$tmp/save-$M.log
    start_save $M "$log"
    sleep "$(printf '%d.%03d' $((delay / 1000)) $((delay % 1000)))"
    victim_pid=$(pid_of_rank $victim)
    how="missed (rank $victim already gone: the save was over)"
    if [ -n "$victim_pid" ] && kill -9 "$victim_pid" 2>/dev/null; then
      how="killed rank $victim (pid $victim_pid)"
    fi
    wait $spid; rc=$?
    out=$(cat "$log")
    if grep -q "died without a report (killed by signal 9)" <<<"$out"; then
      landed=$((landed + 1))
    elif [[ "$how" == killed* ]]; then
      how+=" after it had reported"
    fi

    [ $rc = 124 ] || [ $rc = 137 ] && errs+=("the save hung after the kill (killed by timeout)")
    vout=$(verify $N) && grep -q " 0 mismatches" <<<"$vout" || errs+=("(a) step $N no longer verifies: $(tail -2 <<<"$vout")")
    vout=$(verify $M); vrc=$?
    if [ $vrc = 0 ] && grep -q " 0 mismatches (step $M," <<<"$vout"; then
      outcome=committed
    elif [ $vrc != 0 ] && [ "$(grep -c "verify failed on rank .*: step $M is not a committed step" <<<"$vout")" = $W ] &&
         [ "$(grep -c "verify failed on rank" <<<"$vout")" = $W ]; then
      outcome=invisible
      [ $rc = 0 ] && errs+=("(b) the save reported success but step $M is not committed")
      grep -q "save succeeded on rank" <<<"$out" && errs+=("(b) a rank was told step $M committed, but it is not")
    else
      outcome=HALF
      errs+=("(b) step $M is neither committed-and-whole nor invisible: $(tail -3 <<<"$vout")")
    fi
    [ "$outcome" = committed ] && grep -q "the step is not visible" <<<"$out" &&
      errs+=("(b) a rank was told step $M aborted, but it is committed")
    if [ $mode = tree ] && [[ "$how" == killed* ]]; then
      # The killed leader's ranks lost their coordinator: in doubt, or aborted.
      for r in 5 6 7; do
        line=$(grep "save failed on rank $r: " <<<"$out")
        if [ -z "$line" ]; then
          [ "$outcome" = committed ] || [ $rc = 0 ] ||
            errs+=("(b) rank $r of the killed leader's node reported neither a failure nor, with the step committed, success")
        elif ! grep -Eq "in doubt|manifest decides|aborted|before voting|lost the coordinator|coordinator closed|(connect to|join job .* at) the coordinator" <<<"$line"; then
          errs+=("(b) rank $r of the killed leader's node does not say it lost its coordinator: $line")
        fi
      done
    fi
    gout=$(save $G) || errs+=("(c) the clean save of step $G failed: $(tail -3 <<<"$gout")")
    vout=$(verify $G) && grep -q " 0 mismatches" <<<"$vout" || errs+=("(c) step $G does not verify")
    [ "$outcome" = committed ] && committed+=("$M:$W")
    committed+=("$G:$W")
    [ "$outcome" != committed ] && [ -e "$(step_dir "$root" $M)" ] &&
      errs+=("(c) files of the uncommitted step $M survived GC")
    clean=$(check_root_clean "$root" "${committed[@]}") || errs+=("(c) the root after GC:"$'\n'"$clean")
    cur=$G

    printf '%-4s seed %-4s delay %5d ms: %-44s -> %-9s save exit %d%s\n' "$mode" "$seed" "$delay" \
      "$how" "$outcome" "$rc" "$([ $mode = tree ] && echo "; node 1's other ranks: $(grep -Eo "save (failed|succeeded) on rank [567]: .{0,60}" <<<"$out" | sed -E 's/^save (failed|succeeded) on rank ([567]): ?(.*)/\2 \1 \3/' | cut -c1-48 | tr '\n' '|')")"
    if [ ${#errs[@]} -gt 0 ]; then
      fail=1
      for e in "${errs[@]}"; do echo "  FAIL: $e"; done
      sed 's/^/    | /' <<<"$out"
    fi
  done
}

cur=1
clean_save
rounds
landed_flat=$landed
# The hierarchical commit: a fresh root, W = 8 in nodes of 4; the victim is a leader.
mode=tree W=8
size=(--bytes 128M --chunk 1M --pool 2M --compress zstd:3)
export CKPT_COMMIT_TREE=on CKPT_NODE_SIZE=4
root=$tmp/tree
committed=()
cur=1
clean_save
rounds
echo "kill -9: ${#seeds[@]} runs per mode, kills landed on a running rank: $landed_flat flat, $((landed - landed_flat)) on a node leader"
if [ "$landed_flat" = 0 ] || [ "$landed" = "$landed_flat" ]; then
  echo "FAIL: in one of the modes no kill landed on a running rank: that mode tested nothing"; fail=1
fi
[ $fail = 0 ] && rm -rf "$tmp" || echo "root kept for inspection: $root"
exit $fail
