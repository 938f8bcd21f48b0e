#!/usr/bin/env bash
# test_tree.sh — the hierarchical commit with real rank processes (docs/protocol.md
# §2.8): ckpt-synth saves as W = 16 in nodes of 4 (CKPT_COMMIT_TREE=on) and as
# W = 64 in nodes of 8 (the default, auto, picks node leaders at this size), each
# verified bit-exact as the saving world and as another; the log must show that
# every node's leader relayed, and the root must hold exactly the committed steps.
# Then the same W = 16 job with CKPT_COMMIT_TREE=off commits flat.
# Usage: test_tree.sh CKPT_SYNTH
set -u
synth=$1
. "$(dirname "$0")/common.sh"
need_tools /usr/bin/python3 timeout
export CKPT_JOB_ID=tree-$$ CKPT_JOB_SECRET=tree-secret-$$
unset CKPT_FAULT CKPT_FAULT_RANK CKPT_COMMIT_TREE CKPT_NODE_SIZE
tmp=$(mktemp -d /var/tmp/ckpt-tree-XXXXXX)
root=$tmp/r
fail=0
committed=()
small=(--bytes 4M --chunk 256K --pool 1M)

# save STEP W NODE_SIZE TREE: a save whose log names every leader that relayed.
save() {
  local step=$1 w=$2 ns=$3 tree=$4 out rc nodes k want=0
  out=$(export CKPT_NODE_SIZE="$ns" CKPT_LOG=info; [ -n "$tree" ] && export CKPT_COMMIT_TREE=$tree
        synth_run 600 save --root "$root" --step "$step" --seed $((3000 + step)) --world "$w" \
        "${small[@]}" 2>&1); rc=$?
  nodes=$(( (w + ns - 1) / ns ))
  if [ "$tree" != off ]; then want=$nodes; fi
  k=$(grep -c "node leader of node [0-9]* (ranks [0-9]*\.\.[0-9]*): relaying" <<<"$out")
  if [ $rc != 0 ] || ! grep -q "saved step $step: $w rank(s)" <<<"$out"; then
    echo "FAIL: save of step $step as $w ranks in nodes of $ns (tree ${tree:-auto}): exit $rc"
    grep -v " info: " <<<"$out" | sed 's/^/    /' | tail -40; fail=1; return
  fi
  if [ "$k" != "$want" ]; then
    echo "FAIL: step $step: $k node leaders relayed, want $want (W $w, nodes of $ns, tree ${tree:-auto})"
    grep "node leader" <<<"$out" | head -5 | sed 's/^/    /'; fail=1; return
  fi
  committed+=("$step:$w")
  echo "ok: step $step saved as $w ranks in nodes of $ns (tree ${tree:-auto}): $k node leaders relayed"
}

verify() {  # verify STEP SEED-STEP WORLD
  local out rc
  out=$(synth_run 600 verify --root "$root" --step "$1" --seed $((3000 + $1)) --world "$2" \
        "${small[@]}" 2>&1); rc=$?
  if [ $rc != 0 ] || ! grep -q " 0 mismatches (step $1, as $2 rank(s)" <<<"$out"; then
    echo "FAIL: verify of step $1 as $2 ranks: exit $rc"; tail -5 <<<"$out" | sed 's/^/    /'; fail=1
  else
    echo "ok: step $1 verifies as $2 ranks"
  fi
}

save 1 16 4 on;   verify 1 16; verify 1 3
save 2 16 4 on;   verify 2 5
save 3 64 8 "";   verify 3 64; verify 3 7
save 4 16 4 off;  verify 4 16
clean=$(check_root_clean "$root" "${committed[@]}") || { echo "FAIL: the root:"; echo "$clean"; fail=1; }
[ $fail = 0 ] && rm -rf "$tmp" && echo "tree: all ok" || echo "root kept for inspection: $root"
exit $fail
