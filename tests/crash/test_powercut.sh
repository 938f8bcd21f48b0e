#!/usr/bin/env bash
# test_powercut.sh — the power-cut campaign (CONTRIBUTING.md, "Crash consistency"):
# real power cuts of the file system under a checkpoint root, then the invariant of
# the crash matrix checked on what a remount shows.
#
# The root lives on ext4 on a loop device, mounted with commit=600 so that only
# explicit syncs commit its journal. A cut is EXT4_IOC_SHUTDOWN with
# EXT4_GOING_FLAGS_NOLOGFLUSH: every later I/O fails with EIO and nothing that the
# journal has not committed survives the unmount and mount (journal replay) that
# follow. A crash (exit) keeps the page cache and proves nothing about syncs; a cut
# does: a missing fdatasync loses data here.
#
# Each cut saves step N+1 over a root whose latest committed step is N, cuts, lets
# what is left of the job fail (killing it past a limit), remounts, and checks:
#   - the root opens (ckpt-inspect list: no damaged manifest);
#   - step N verifies bit-exact (ckpt-synth verify);
#   - step N+1 is committed and verifies bit-exact, or is invisible: never half;
#     if the save reported success (every rank exited 0) or told a rank so, it is
#     committed; no rank was told 'aborted' about a committed step;
#   - a clean save of N+2 works, and after it (rank 0's open collects garbage)
#     no file is left but committed steps' (ckpt-inspect list --all: aborted
#     records stay, with their reasons, their files gone); N+2 is then the next
#     cut's N, verified after that cut.
# The invariant is checked through the tools only, never through file names.
#
# The cuts:
#   fault   the fault table's cut action (CKPT_FAULT=<point>:<nth>:cut) at every
#           point of a save and of the commit, for each role that hits it: a
#           participant (rank 1 of 2), the coordinator's rank 0 (of 2), the
#           single-rank path (W = 1), node leaders (W = 4 in nodes of 2);
#   random  ckpt-cut after a delay drawn from the seed, anywhere in a save of
#           W = 1, 2 or 3 ranks, or aimed at the save's I/O and commit (scaled to
#           clean saves timed on this machine as the campaign runs);
#   success ckpt-cut right after the save reported success: it must be committed.
# Then the mutation round: the success cuts again with the shard writer's
# fdatasync removed (CKPT_FAULT=before_fdatasync:skip), which the campaign must
# detect (a step reported saved that is lost or does not verify), and with the
# step directory's fsync removed (before_dir_fsync:skip), reported as found.
#
# Usage: test_powercut.sh CKPT_SYNTH CKPT_INSPECT CKPT_CUT [FILTER-REGEX on the label]
# Labels: fault:<point>:<nth>:<role>, random#<i>:w<W>, success#<i>:w<W>,
# mutation-fdatasync#<i>:w<W>, mutation-dirfsync#<i>:w<W>. A failing cut prints
# the line that replays it alone (the seed, the delay of a random cut, the label).
# Environment: CKPT_TEST_SEED (printed), CKPT_POWERCUT_RANDOM (random cuts, default
# 150), CKPT_POWERCUT_CUT_AT_US (the delay of every random cut, for a replay: the
# delays otherwise follow the machine's speed, measured as the campaign runs).
# Needs root, loop devices, mkfs.ext4 and a kernel with the ext4 shutdown ioctl;
# otherwise it says why and exits 77.
set -u
synth=$1 inspect=$2 cutter=$3 filter=${4:-}
. "$(dirname "$0")/../integration/common.sh"

if [ "$(id -u)" != 0 ]; then
  echo "SKIP: needs root (loop devices, mount, the ext4 shutdown ioctl)"; exit 77
fi
need_tools timeout setsid losetup mkfs.ext4 mount umount mountpoint
for f in "$synth" "$inspect" "$cutter"; do
  [ -x "$f" ] || { echo "FAIL: $f is not an executable"; exit 1; }
done

seed=${CKPT_TEST_SEED:-$(date +%s)}
nrandom=${CKPT_POWERCUT_RANDOM:-150}
echo "power-cut campaign: CKPT_TEST_SEED=$seed"

# Small state: ~100 tensors of a few KiB, so W files of ~100 chunks per step.
size=(--bytes 512K --chunk 64K --pool 1M)
export CKPT_TIMEOUT_MS=${CKPT_TIMEOUT_MS:-2000}   # in-doubt and abort paths end fast
export CKPT_JOB_ID=powercut-$$ CKPT_JOB_SECRET=powercut-secret-$$
unset CKPT_FAULT CKPT_FAULT_RANK CKPT_FAULT_CUT CKPT_COMMIT_TREE CKPT_NODE_SIZE

# ------------------------------------------------------------------ the file system
# The image lives on tmpfs when there is room: the loop device turns every flush
# into an fsync of its backing file, which on tmpfs costs nothing (what survives a
# cut is decided by ext4's journal, not by the backing file). Each run's directory
# holds its pid, so that a run killed with SIGKILL (no trap) is cleaned up by the
# next one: its mount unmounted, its loop device detached.
base=/var/tmp
if [ -d /dev/shm ] && [ -w /dev/shm ] &&
   [ "$(df -Pk /dev/shm | awk 'NR == 2 { print $4 }')" -gt $((1024 * 1024)) ]; then
  base=/dev/shm
fi
release_fs() {  # release_fs DIR: unmount DIR/mnt, detach DIR/fs.img's loop devices
  local d=$1 i l
  for ((i = 0; i < 20 && $(mountpoint -q "$d/mnt"; echo $?) == 0; i++)); do
    umount "$d/mnt" 2>/dev/null || sleep 0.1
  done
  mountpoint -q "$d/mnt" && umount -l "$d/mnt"
  for l in $(losetup -n -O NAME -j "$d/fs.img" 2>/dev/null); do losetup -d "$l"; done
}
for d in /dev/shm/ckpt-powercut-* /var/tmp/ckpt-powercut-*; do
  [ -f "$d/pid" ] || continue
  kill -0 "$(cat "$d/pid")" 2>/dev/null && continue
  echo "note: cleaning up after a killed run: $d"
  release_fs "$d"
  rm -rf "$d"
done

tmp=$(mktemp -d "$base/ckpt-powercut-XXXXXX")
echo $$ >"$tmp/pid"
img=$tmp/fs.img mnt=$tmp/mnt root=$tmp/mnt/r dev= job= cutpid= keep=0
mkdir "$mnt"

cleanup() {
  # Only what is still running (not yet reaped: its number is still its own).
  local running; running=" $(jobs -rp | tr '\n' ' ') "
  [ -n "$job" ] && [[ "$running" == *" $job "* ]] && kill -KILL -- "-$job" 2>/dev/null
  [ -n "$cutpid" ] && [[ "$running" == *" $cutpid "* ]] && kill -KILL "$cutpid" 2>/dev/null
  wait 2>/dev/null
  release_fs "$tmp"
  if [ $keep = 1 ]; then
    rm -f "$img"
    echo "job outputs kept for inspection: $tmp"
  else
    rm -rf "$tmp"
  fi
}
trap cleanup EXIT
trap 'echo "killed: cleaning up"; exit 1' INT TERM HUP

truncate -s 512M "$img"
if ! out=$(mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 "$img" 2>&1); then
  echo "SKIP: mkfs.ext4 failed: $out"; exit 77
fi
if ! dev=$(losetup --find --show "$img" 2>&1); then
  echo "SKIP: no loop device: $dev"; dev=; exit 77
fi
# commit=600: the journal commits only when something syncs (or after 10 minutes).
mount_fs() { mount -t ext4 -o commit=600 "$dev" "$mnt"; }
if ! out=$(mount_fs 2>&1); then
  echo "SKIP: cannot mount ext4 on $dev: $out"; exit 77
fi
remount() {  # unmount (nothing of the cut file system is written) and mount: replay
  local i m sb=/sys/fs/ext4/${dev##*/}
  for ((i = 0; i < 50; i++)); do umount "$mnt" 2>/dev/null && break; sleep 0.1; done
  if mountpoint -q "$mnt"; then
    echo "FAIL: cannot unmount $mnt: $(umount "$mnt" 2>&1)"; keep=1; exit 1
  fi
  # The superblock can outlive its mount for a moment (seen here once, under
  # load); a mount meanwhile would take the cut file system back, unreplayed.
  for ((i = 0; i < 200 && $([ -e "$sb" ]; echo $?) == 0; i++)); do sleep 0.05; done
  if [ -e "$sb" ]; then
    echo "FAIL: the file system of $dev is still alive 10 s after its unmount"; keep=1; exit 1
  fi
  if ! m=$(mount_fs 2>&1); then
    echo "FAIL: the file system does not mount after the cut: $m"
    dmesg 2>/dev/null | tail -5 | sed 's/^/    | /'
    keep=1; exit 1
  fi
  # A file system that is still shut down refuses to open files (EIO).
  if [ -e "$mnt/alive" ] && ! : <"$mnt/alive"; then
    echo "FAIL: the file system is still shut down after unmount and mount"; keep=1; exit 1
  fi
}
# The shutdown ioctl must work here, and a write before a sync must not survive.
mkdir "$root.probe" && echo lost >"$root.probe/f"
if ! out=$("$cutter" "$mnt" 2>&1); then
  echo "SKIP: the kernel refuses the ext4 shutdown ioctl: $out"; exit 77
fi
if touch "$mnt/after-cut" 2>/dev/null; then
  echo "FAIL: the file system still takes writes after ckpt-cut"; exit 1
fi
remount
if [ -e "$root.probe" ]; then
  echo "FAIL: a directory never synced survived the cut (is commit=600 in force?)"; exit 1
fi
echo alive >"$mnt/alive" && sync "$mnt/alive"   # remount's check that the cut is over

# ------------------------------------------------------------------ jobs
fail=0 ncuts=0 nfailed=0 nskipped=0
declare -A nkind=() nout=()

# A TCP port nobody uses now (as free_port, without a python start per job: ~1 ms
# instead of 30 ms or more). The same tiny race until the coordinator binds it.
port_pick() {
  local p hex
  while :; do
    p=$(( 20000 + RANDOM % 12000 ))
    printf -v hex ':%04X ' "$p"
    grep -q "$hex" /proc/net/tcp /proc/net/tcp6 2>/dev/null || { echo "$p"; return; }
  done
}
seed_of() { echo $((seed % 1000000 * 1000 + $1)); }   # the data of step S
# rand_of I MOD: a number in [0, MOD) from the seed and I (bash arithmetic only,
# so that a seed draws the same numbers everywhere).
rand_of() {
  local x=$(( (seed * 2862933555777941757 + $1 * 3037000493 + 1) & 0x7fffffffffffffff ))
  x=$(( x ^ (x >> 29) )); x=$(( (x * 6364136223846793005) & 0x7fffffffffffffff ))
  x=$(( x ^ (x >> 31) ))
  echo $(( x % $2 ))
}
us_now() { local t=${EPOCHREALTIME/./}; echo $((10#$t)); }
t_start=$(us_now)

# start_job OUT STEP WORLD [ENV=V...]: ckpt-synth save in the background, in a
# session of its own (job = its pid = its process group), with a hard limit: past
# it, timeout(1) kills the whole group, ranks included. After a cut, what is left
# of the job fails by itself within seconds (EIO, a lost peer, CKPT_TIMEOUT_MS).
start_job() {
  local out=$1 step=$2 w=$3; shift 3
  setsid env "$@" CKPT_COORD_PORT="$(port_pick)" timeout -k 5 60 \
    "$synth" save --root "$root" --step "$step" --seed "$(seed_of "$step")" --world "$w" \
    "${size[@]}" >"$out" 2>&1 &
  job=$!
}
wait_job() {  # wait_job: the job's exit status (124/137: killed by its limit)
  local rc
  wait "$job"; rc=$?
  job=   # reaped: its number may belong to another process from now on
  return $rc
}
verify() {  # verify STEP WORLD
  CKPT_COORD_PORT=$(port_pick) timeout -k 5 60 \
    "$synth" verify --root "$root" --step "$1" --seed "$(seed_of "$1")" --world "$2" \
    "${size[@]}" 2>&1
}
verified() {  # verified STEP WORLD: verify printed a clean bit-exact result
  local v; v=$(verify "$1" "$2") && grep -q " 0 mismatches (step $1," <<<"$v" && return 0
  tail -2 <<<"$v" | sed 's/^/      | /'
  return 1
}
why_not() {  # why_not STEP WORLD: the first thing verify found wrong
  local v; v=$(verify "$1" "$2")
  grep -m1 'verify failed\|differs\|mismatch' <<<"$v" || tail -1 <<<"$v"
}
# ckpt-inspect with a pool sized for this state (its default, 128 MiB, costs more
# to set up than the whole listing).
inspect() { CKPT_CHUNK_BYTES=64K CKPT_POOL_BYTES=1M "$inspect" "$root" "$@"; }
states() {  # states: "STEP:STATE " for every step ckpt-inspect list --all shows
  local j
  j=$(inspect list --all --json 2>&1) || { echo "ERROR $j"; return 1; }
  grep -o '"step":[0-9]*,"state":"[a-z-]*"' <<<"$j" | sed 's/"step":\([0-9]*\),"state":"\([a-z-]*\)"/\1:\2/' | tr '\n' ' '
}
leftovers() {  # "STEP:STATE:FILES " for every step that garbage collection should have
  # taken: anything but a committed step, or an aborted record whose files are gone
  # (the record stays, with its reason, for list --all)
  local j
  j=$(inspect list --all --json 2>&1) || { echo "ERROR $j"; return 1; }
  /usr/bin/python3 -c '
import json, sys
for s in json.loads(sys.argv[1])["steps"]:
    if s["state"] == "committed" or (s["state"] == "aborted" and s["files"] == 0):
        continue
    print("%d:%s:%d" % (s["step"], s["state"], s["files"]), end=" ")' "$j" 2>&1
}

# The first committed steps, which also time a clean save at W = 1, 2, 3.
# cur: the latest committed step (cur_w its world); hi: the highest step number
# used so far, so that no save ever reuses one, whatever failed before.
cur=0 cur_w=1 hi=0
# job_us[W]: a clean job's wall time (process start included); save_us[W]: the
# save's own time inside it (ckpt-synth's "in X s", begin to committed). Measured
# here, then followed (a moving average) over the clean save that ends each cut, so
# that random cuts keep aiming right when the machine's load changes.
declare -a job_us=() save_us=()
save_seconds_us() {  # the "in X s" of a save's output, in microseconds
  local sec; sec=$(sed -n 's/^saved step .* in \([0-9.]*\) s .*/\1/p' "$1")
  [ -n "$sec" ] && echo $(( 10#${sec/./} * 1000 )) || echo 0
}
calib() {
  local w=$1 i t0 rc jobs=() saves=()
  for ((i = 0; i < 3; i++)); do
    hi=$((hi + 1)) cur=$((hi))
    t0=$(us_now)
    start_job "$tmp/job.out" $cur "$w"; wait_job; rc=$?
    jobs+=($(( $(us_now) - t0 )))
    if [ $rc != 0 ] || ! verified $cur "$w"; then
      echo "FAIL: a clean save of step $cur as $w rank(s) does not work:"; cat "$tmp/job.out"; exit 1
    fi
    saves+=($(save_seconds_us "$tmp/job.out"))
    cur_w=$w
  done
  job_us[$w]=$(printf '%s\n' "${jobs[@]}" | sort -n | sed -n 2p)
  save_us[$w]=$(printf '%s\n' "${saves[@]}" | sort -n | sed -n 2p)
}
for w in 1 2 3; do calib $w; done
for w in 1 2 3; do
  echo "a clean job of $w rank(s) here: ${job_us[w]} us, of which the save ${save_us[w]} us" \
       "(medians of 3; then followed as each cut's clean save runs)"
done
remount

printf '%-44s %-3s %-10s %-5s %s\n' CUT W OUTCOME EXIT NOTES

# cut_case KIND LABEL WORLD HOW [ENV=V...]: one cut and its checks.
#   HOW: fault (the job cuts itself: ENV arms it), after:US (ckpt-cut US
#   microseconds after the job starts), after-create:US (US microseconds after the
#   save creates its step directory), success (ckpt-cut once the save succeeded).
# Returns 0, 1 when a check failed (printed), 2 when the filter left it out.
# Sets 'outcome', and 'nloss': how many of the failures say that the step that was
# cut is lost or half ("LOST: ...", what the mutation round looks for).
outcome= nloss=0
cut_case() {
  local kind=$1 label=$2 w=$3 how=$4; shift 4
  outcome= nloss=0
  [ -n "$filter" ] && ! [[ "$label" =~ $filter ]] && return 2
  ncuts=$((ncuts + 1)); nkind[$kind]=$(( ${nkind[$kind]:-0} + 1 ))
  local N=$cur Nw=$cur_w M=$((hi + 1)) G=$((hi + 2)) errs=() notes="" rc rc2 cut_rc=0
  hi=$G
  local out="$tmp/job.out" st

  # The cut.
  case $how in
    fault)
      start_job "$out" $M "$w" "$@" CKPT_FAULT_CUT="$mnt"; wait_job; rc=$?
      if grep -q "fault injected: cut at .* (file system of" "$out"; then
        grep -q "died without a report (exit status 87)" "$out" ||
          errs+=("no rank reported dead with the cut's exit status 87")
      else
        errs+=("the cut did not happen (the fault did not fire, or the shutdown failed)")
        grep -q "fault injected: cut at .* failed" "$out" && errs+=("$(grep -m1 'failed: shutdown' "$out")")
        "$cutter" "$mnt" 2>/dev/null   # cut anyway, to go on
      fi ;;
    after:*)
      start_job "$out" $M "$w" "$@"
      "$cutter" --after-us "${how#after:}" "$mnt" & cutpid=$!
      wait "$cutpid"; cut_rc=$?; cutpid=
      wait_job; rc=$? ;;
    after-create:*)
      # The watch is set before the job starts: ckpt-cut says "watching" first.
      rm -f "$tmp/watching"; mkfifo "$tmp/watching"
      "$cutter" --after-create "$root" --within-us $(( 2 * job_us[w] + 1000000 )) \
        --after-us "${how#after-create:}" "$mnt" >"$tmp/watching" & cutpid=$!
      local ready=; read -r ready <"$tmp/watching"
      [ "$ready" = watching ] || errs+=("ckpt-cut did not start watching the root")
      start_job "$out" $M "$w" "$@"
      wait "$cutpid"; cut_rc=$?; cutpid=
      [ $cut_rc = 3 ] && cut_rc=0 notes+=" no-anchor"
      wait_job; rc=$? ;;
    success)
      start_job "$out" $M "$w" "$@"; wait_job; rc=$?
      "$cutter" "$mnt"; cut_rc=$?
      [ $rc = 0 ] || errs+=("the save to be cut after its success failed (exit $rc)") ;;
  esac
  [ $cut_rc = 0 ] || errs+=("ckpt-cut failed (exit $cut_rc)")
  if [ $rc = 124 ] || [ $rc = 137 ]; then
    errs+=("the job hung after the cut (killed by its limit)")
  fi
  remount

  # The root opens; step N is intact.
  st=$(states)
  if [[ "$st" == ERROR* ]]; then
    errs+=("the root does not open after the cut: ${st#ERROR }")
  else
    [[ " $st" == *" $N:committed "* ]] || errs+=("step $N (committed before the cut) is not listed committed: $st")
    verified $N "$Nw" >/dev/null || errs+=("step $N (committed before the cut) does not verify bit-exact: $(why_not $N "$Nw")")
    # Step N+1: committed and whole, or invisible.
    if [[ " $st" == *" $M:committed "* ]]; then
      outcome=committed
      if ! verified $M "$w" >/dev/null; then
        outcome=HALF nloss=$((nloss + 1))
        errs+=("LOST: step $M is committed but does not verify bit-exact: $(why_not $M "$w")")
      fi
      grep -q "the step is not visible" "$out" &&
        errs+=("a rank was told step $M aborted, but it is committed: $(grep -m1 'not visible' "$out")")
    else
      outcome=invisible
      if [ $rc = 0 ]; then
        outcome=LOST nloss=$((nloss + 1))
        errs+=("LOST: the save reported success (every rank exited 0) but step $M is not committed after the cut")
      fi
      if grep -q "save succeeded on rank" "$out"; then
        outcome=LOST nloss=$((nloss + 1))
        errs+=("LOST: a rank was told step $M committed, but it is not: $(grep -m1 'save succeeded on rank' "$out")")
      fi
    fi
  fi
  # When a random cut came: after the save succeeded, during it (some rank's
  # failure names the step), or while the job was starting (opening the root).
  if [ $rc = 0 ]; then notes+=" saved-before-cut"
  elif [ $kind = random ]; then
    grep -q "step $M" "$out" && notes+=" during-save" || notes+=" during-start"
  fi
  case $how in
    after:*)        notes+=" cut-at=${how#after:}us" ;;
    after-create:*) notes+=" cut-at=step-dir+${how#after-create:}us" ;;
  esac
  grep -q "in doubt" "$out" && notes+=" in-doubt"

  # A clean save of N+2 works; garbage is collected.
  cp "$out" "$tmp/cut.out"
  local t0; t0=$(us_now)
  start_job "$out" $G "$w"; wait_job; rc2=$?
  if [ $rc2 = 0 ]; then
    job_us[w]=$(( (3 * job_us[w] + $(us_now) - t0) / 4 ))
    save_us[w]=$(( (3 * save_us[w] + $(save_seconds_us "$out")) / 4 ))
  fi
  if [ $rc2 != 0 ]; then
    errs+=("the clean save of step $G after the cut failed: $(tail -2 "$out")")
  else
    st=$(states)
    local s e
    for e in $(leftovers); do
      s=${e%%:*}
      errs+=("after the clean save of step $G (garbage collected), step $s is still there (step:state:files): $e")
    done
    [[ " $st" == *" $G:committed "* ]] || errs+=("step $G is not committed after its save reported success")
    cur=$G cur_w=$w
  fi
  [ $rc2 != 0 ] && [ "$outcome" = committed ] && cur=$M cur_w=$w
  # Keep the file system small: the newest two steps are all a cut needs.
  if (( ncuts % 25 == 0 )); then
    inspect gc --keep-last 2 >/dev/null 2>&1 || errs+=("ckpt-inspect gc --keep-last 2 failed")
  fi

  nout[$kind:$outcome]=$(( ${nout[$kind:$outcome]:-0} + 1 ))
  printf '%-44s %-3s %-10s %-5s%s\n' "$label" "$w" "$outcome" "$rc" "$notes"
  if [ ${#errs[@]} -gt 0 ]; then
    local e2
    for e2 in "${errs[@]}"; do echo "  FAIL: $e2"; done
    local at=; [[ $how == after* ]] && at="CKPT_POWERCUT_CUT_AT_US=${how#*:} "
    echo "  replay alone: CKPT_TEST_SEED=$seed $at$0 $synth $inspect $cutter '^$label\$'"
    echo "  output of the job that was cut ($*):"
    sed 's/^/    | /' "$tmp/cut.out"
    return 1
  fi
  return 0
}

run_cut() {  # run_cut KIND LABEL WORLD HOW [ENV...]: cut_case, counting failures
  cut_case "$@"
  if [ $? = 1 ]; then fail=1; nfailed=$((nfailed + 1)); keep=1; fi
}
skip_cut() {  # skip_cut LABEL WHY
  [ -n "$filter" ] && ! [[ "$1" =~ $filter ]] && return
  nskipped=$((nskipped + 1))
  printf '%-44s %-3s %-10s %-5s %s\n' "$1" - skipped - "$2"
}

# ------------------------------------------------------------------ (a) every fault point
# nth of after_chunk_write: the first chunk, and one in the middle of ~100.
writer_points=(after_chunk_write:1 after_chunk_write:50 after_footer_write:1 before_fdatasync:1
               after_fdatasync:1 before_dir_fsync:1)
coord_points=(coord_before_commit_txn:1 coord_after_commit_txn:1 before_decision_send:1)
for role in participant coordinator single-rank; do
  case $role in
    participant) w=2 rank=1 ;;
    coordinator) w=2 rank=0 ;;
    single-rank) w=1 rank=0 ;;
  esac
  for pn in "${writer_points[@]}" after_prepare_sent:1 "${coord_points[@]}"; do
    label=fault:$pn:$role
    if [ $role = participant ] && [[ " ${coord_points[*]} " == *" $pn "* ]]; then
      skip_cut "$label" "coordinator-only point: rank $rank of $w is a participant"; continue
    fi
    if [ $role = single-rank ] && [[ $pn == after_prepare_sent:* || $pn == before_decision_send:* ]]; then
      skip_cut "$label" "one rank decides its own commit: no vote, no decision is sent"; continue
    fi
    run_cut fault "$label" $w fault CKPT_FAULT="${pn%%:*}:${pn##*:}:cut" CKPT_FAULT_RANK=$rank
  done
done
# Messages. A participant sends BEGIN (1st), then PREPARE (2nd). Rank 0 sends its
# own BEGIN and PREPARE and the coordinator's 2 BEGIN replies in some order, then
# the decisions in rank order: the 6th is the decision to rank 1, sent after the
# commit transaction.
run_cut fault fault:msg_send:1:participant 2 fault CKPT_FAULT=msg_send:1:cut CKPT_FAULT_RANK=1
run_cut fault fault:msg_send:2:participant 2 fault CKPT_FAULT=msg_send:2:cut CKPT_FAULT_RANK=1
run_cut fault fault:msg_send:1:coordinator 2 fault CKPT_FAULT=msg_send:1:cut CKPT_FAULT_RANK=0
run_cut fault fault:msg_send:6:coordinator 2 fault CKPT_FAULT=msg_send:6:cut CKPT_FAULT_RANK=0
# The hierarchical commit (W = 4 in nodes of 2): a leader forwards its node's 2
# BEGINs, then its 2 PREPAREs (the 4th: the node's last vote), and relays one
# decision. Role leader is rank 2 (node 1's leader), leader0 rank 0 (node 0's, in
# the coordinator's process).
for role in leader leader0; do
  rank=$([ $role = leader ] && echo 2 || echo 0)
  for pn in leader_before_forward:1 leader_before_forward:4 leader_before_decision_relay:1; do
    run_cut fault "fault:$pn:$role" 4 fault CKPT_FAULT="${pn%%:*}:${pn##*:}:cut" \
      CKPT_FAULT_RANK=$rank CKPT_COMMIT_TREE=on CKPT_NODE_SIZE=2
  done
done

# ------------------------------------------------------------------ (b) random moments
# Half of the delays from the job's start, anywhere in [0, 1.25 x a clean job of
# that world size): the process start, the root's open and garbage collection, the
# save, the exit. The other half from the moment the save creates its step
# directory (the first entry created in the root during a job), in [0, 1.25 x a
# clean save + 3 ms): its writes, syncs, vote and commit, which are a small part
# of a job this small. (Should the layout ever change so that nothing is created
# in the root, ckpt-cut cuts anyway, noted "no-anchor".)
for ((i = 1; i <= nrandom; i++)); do
  w=$(( 1 + $(rand_of $((3 * i)) 3) ))
  if [ "$(rand_of $((3 * i + 1)) 2)" = 0 ]; then
    mode=after span=$(( job_us[w] * 5 / 4 + 1 ))
  else
    mode=after-create span=$(( save_us[w] * 5 / 4 + 3000 ))
  fi
  d=$(rand_of $((3 * i + 2)) $span)
  [ -n "${CKPT_POWERCUT_CUT_AT_US:-}" ] && d=$CKPT_POWERCUT_CUT_AT_US   # a replay
  run_cut random "random#$i:w$w" $w "$mode:$d"
done

# ------------------------------------------------------------------ (c) right after success
nsuccess=24
for ((i = 1; i <= nsuccess; i++)); do
  w=$(( 1 + i % 3 ))
  run_cut success "success#$i:w$w" $w success
done

# ------------------------------------------------------------------ the mutation round
# The success cuts again, with one sync removed through the fault table's skip
# knob. Detected: the save reported success, and after the cut the step is lost or
# does not verify; cut_case reports that as a failure, which here is the result
# looked for. Sets k (detected) and m (cuts run).
k=0 m=0
mutation() {  # mutation NAME SPEC CUTS
  local name=$1 spec=$2 n=$3 i w r
  k=0 m=0
  for ((i = 1; i <= n; i++)); do
    w=$(( 1 + i % 3 ))
    cut_case mutation "mutation-$name#$i:w$w" $w success CKPT_FAULT="$spec" >"$tmp/mutation.log"
    r=$?
    [ $r = 2 ] && continue
    m=$((m + 1))
    # The case's line, and what gave the mutation away. Any other failure (step N
    # damaged, the root unreadable, the next save refused) is a failure still.
    head -1 "$tmp/mutation.log"
    if [ $r = 1 ] && [ $nloss -gt 0 ]; then
      k=$((k + 1))
      grep '^  FAIL: LOST: ' "$tmp/mutation.log" | sed 's/^  FAIL: LOST: /  detected: /'
    fi
    if [ $r = 1 ] && grep -v '^  FAIL: LOST: ' "$tmp/mutation.log" | grep -q '^  FAIL: '; then
      echo "  the cut also broke what the mutation does not explain:"
      tail -n +2 "$tmp/mutation.log"
      fail=1 nfailed=$((nfailed + 1)) keep=1
    fi
  done
}
nmut=12
mutation fdatasync before_fdatasync:skip $nmut
if [ $m -gt 0 ]; then
  echo "mutation: writer fdatasync removed -> detected in $k of $m cuts"
  if [ $k = 0 ]; then
    echo "FAIL: the campaign does not notice that the shard writer's fdatasync is gone"
    fail=1 keep=1
  fi
fi
mutation dirfsync before_dir_fsync:skip 6
if [ $m -gt 0 ]; then
  echo "mutation: step directory fsync removed -> detected in $k of $m cuts"
  [ $k = 0 ] && echo "  (not exposed by ext4: the file's own fdatasync commits the whole running journal" \
                     "transaction, which holds the creation of the file's directory entry too;" \
                     "a file system that journals less eagerly would lose the entry)"
fi

echo "power cuts: $ncuts run (fault points ${nkind[fault]:-0}, random ${nkind[random]:-0}," \
     "after success ${nkind[success]:-0}, mutation ${nkind[mutation]:-0}), $nfailed failed," \
     "$nskipped skipped (printed above with why); outcomes: committed" \
     "$(( ${nout[fault:committed]:-0} + ${nout[random:committed]:-0} + ${nout[success:committed]:-0} )), invisible" \
     "$(( ${nout[fault:invisible]:-0} + ${nout[random:invisible]:-0} + ${nout[success:invisible]:-0} ))" \
     "(mutation round excluded); $(( ($(us_now) - ${t_start/./}) / 1000000 )) s"
if [ $ncuts = 0 ]; then
  echo "FAIL: no cut ran (filter '$filter' matches nothing?)"; fail=1
fi
exit $fail
