#!/usr/bin/env bash
# test_multirank.sh — real multi-process saves through the embedded coordinator:
# W = 1, 2, 4, 7 rank processes save and verify bit-exact as W and as other world
# sizes; W = 64 ranks with small state save, commit and verify; the root holds
# exactly the committed steps afterwards. Usage: test_multirank.sh CKPT_SYNTH
set -u
synth=$1
. "$(dirname "$0")/common.sh"
need_tools /usr/bin/python3 timeout
export CKPT_JOB_ID=multirank-$$ CKPT_JOB_SECRET=multirank-secret-$$
tmp=$(mktemp -d /var/tmp/ckpt-multirank-XXXXXX)
root=$tmp/r
fail=0
committed=()
small=(--chunk 256K --pool 2M)

expect_ok() {  # expect_ok PATTERN DESCRIPTION ARGS...: ckpt-synth must succeed and print PATTERN
  local pat=$1 d=$2; shift 2
  local out rc
  out=$(synth_run 300 "$@" 2>&1); rc=$?
  if [ $rc != 0 ] || ! grep -q -- "$pat" <<<"$out"; then
    echo "FAIL: $d (exit $rc, want 0 and '$pat')"; echo "$out" | sed 's/^/    /'; fail=1
  else
    echo "ok: $d: $(head -1 <<<"$out")"
  fi
}

for w in 1 2 4 7; do
  step=$((100 + w)); seed=$((7000 + w))
  expect_ok "saved step $step: $w rank(s)" "save as $w rank(s)" \
    save --root "$root" --step $step --bytes 6M --seed $seed --world $w "${small[@]}"
  committed+=($step)
  vs=$w; for v in 1 3 5; do [ $v != $w ] && vs+=" $v"; done
  for v in $vs; do
    expect_ok "0 mismatches (step $step, as $v rank(s)" "verify step $step (saved by $w) as $v rank(s)" \
      verify --root "$root" --step $step --bytes 6M --seed $seed --world $v
  done
done
# Every step saved above still verifies after the later saves (nothing was
# garbage-collected or overwritten by the later jobs' opens).
for w in 1 2 4 7; do
  expect_ok "0 mismatches" "step $((100 + w)) intact after all saves" \
    verify --root "$root" --step $((100 + w)) --bytes 6M --seed $((7000 + w)) --world 2
done

# 64 ranks on this small machine: small state, small pools (64 processes).
t0=$(date +%s)
expect_ok "saved step 164: 64 rank(s)" "save as 64 ranks" \
  save --root "$root" --step 164 --bytes 8M --seed 7064 --world 64 --chunk 64K --pool 512K
committed+=(164)
expect_ok "0 mismatches (step 164, as 64 rank(s))" "verify the 64-rank step as 64 ranks" \
  verify --root "$root" --step 164 --bytes 8M --seed 7064 --world 64
expect_ok "0 mismatches (step 164, as 3 rank(s)" "verify the 64-rank step as 3 ranks" \
  verify --root "$root" --step 164 --bytes 8M --seed 7064 --world 3
echo "    (64 ranks: save and two verifies in $(( $(date +%s) - t0 )) s)"
expect_ok "0 mismatches (step 164" "verify latest is the 64-rank step" \
  verify --root "$root" --step latest --bytes 8M --seed 7064 --world 1
# A wrong seed must be caught: the comparison is real.
out=$(synth_run 120 verify --root "$root" --step 164 --bytes 8M --seed 1 --world 2 2>&1); rc=$?
if [ $rc = 1 ] && grep -q "mismatches" <<<"$out" && ! grep -q " 0 mismatches" <<<"$out"; then
  echo "ok: a wrong seed is caught as mismatches"
else
  echo "FAIL: verify with a wrong seed (exit $rc)"; echo "$out"; fail=1
fi

# One more save, so that rank 0's open runs GC over this root: it must leave every
# committed step alone and the root must hold nothing else.
expect_ok "saved step 200" "save as 3 ranks (GC at open)" \
  save --root "$root" --step 200 --bytes 2M --seed 7200 --world 3 "${small[@]}"
committed+=(200)
pairs=()
for s in "${committed[@]}"; do
  pairs+=("$s:$(( s == 164 ? 64 : s == 200 ? 3 : s - 100 ))")
done
if out=$(check_root_clean "$root" "${pairs[@]}"); then
  echo "ok: after GC the root holds the manifest and the ${#committed[@]} committed steps, each with all its shards"
else
  echo "FAIL: the root after GC:"; echo "$out"; fail=1
fi

[ $fail = 0 ] && rm -rf "$tmp" || echo "root kept for inspection: $root"
exit $fail
