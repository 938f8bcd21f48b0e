# common.sh — helpers shared by the multi-process integration scripts (sourced, not
# run): a free TCP port on 127.0.0.1 per job, a job id of our own so that a test
# never joins another test's coordinator, ckpt-synth wrapped in a hard timeout, and
# the invariant checks of CONTRIBUTING.md (Tests) on a checkpoint root.

# A port nobody listens on now. The kernel picks it; the tiny race until the
# coordinator binds it is acceptable (a collision shows as a failed connect, not as
# a wrong result, because every job has its own job id).
free_port() {
  /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

need_tools() {  # need_tools CMD...: exit 77 (a visible skip) when one is missing
  local t
  for t in "$@"; do
    if ! command -v "$t" >/dev/null 2>&1; then
      echo "SKIP: '$t' is not installed; this test needs it"
      exit 77
    fi
  done
}

# synth_run STEP_TIMEOUT_S ARGS...: ckpt-synth with its own port and a hard limit.
# timeout(1) signals the whole process group, so hung rank processes go too.
synth_run() {
  local limit=$1; shift
  CKPT_COORD_PORT=$(free_port) timeout -k 5 "$limit" "$synth" "$@"
}

step_dir() {  # step_dir ROOT STEP
  printf '%s/step-%020d' "$1" "$2"
}

# check_root_clean ROOT STEP:W...: the root holds the manifest, the coordinator's
# lock file and the directories of the given (committed) steps, each with exactly its W shard files, non-empty, and
# nothing else: no orphan step, no stray file. Prints what is wrong; 1 if anything.
check_root_clean() {
  local root=$1; shift
  local want=" manifest coordinator.lock " p s w bad=0 e r d n f
  for p in "$@"; do want+="$(basename "$(step_dir "$root" "${p%%:*}")") "; done
  for e in "$root"/*; do
    e=$(basename "$e")
    if [[ "$want" != *" $e "* ]]; then
      echo "    orphan in the root: $e ($(ls -A "$root/$e" 2>/dev/null | tr '\n' ' '))"
      bad=1
    fi
  done
  for p in "$@"; do
    s=${p%%:*} w=${p##*:}
    d=$(step_dir "$root" "$s")
    if [ ! -d "$d" ]; then echo "    committed step $s has no directory"; bad=1; continue; fi
    n=$(ls -A "$d" | wc -l)
    if [ "$n" != "$w" ]; then echo "    step $s: $n files, want $w: $(ls -A "$d" | tr '\n' ' ')"; bad=1; fi
    for ((r = 0; r < w; r++)); do
      # The name carries the attempt's save id: exactly one file of the rank.
      f=$(compgen -G "$(printf '%s/rank-%06d-*.shard' "$d" "$r")")
      if [ "$(wc -w <<<"$f")" != 1 ] || [ ! -s "$f" ]; then
        echo "    step $s: shard of rank $r missing, empty or more than one: $f"; bad=1
      fi
    done
  done
  return $bad
}
