#!/usr/bin/env bash
# test_synth.sh — ckpt-synth as a user runs it: save, verify as other world sizes,
# JSON output, a wrong seed caught, usage errors, bad roots.
set -u
synth=$1
root=$(mktemp -d /var/tmp/ckpt-cli-XXXXXX)
fail=0
check() {  # check DESCRIPTION COMMAND...: the command must succeed
  local d=$1; shift
  if ! out=$("$@" 2>&1); then echo "FAIL: $d"; echo "$out"; fail=1; else echo "ok: $d"; fi
}
expect_rc() {  # expect_rc RC PATTERN DESCRIPTION COMMAND...
  local want=$1 pat=$2 d=$3; shift 3
  out=$("$@" 2>&1); rc=$?
  if [ "$rc" != "$want" ] || ! grep -q -- "$pat" <<<"$out"; then
    echo "FAIL: $d (rc $rc, want $want, pattern '$pat')"; echo "$out"; fail=1
  else echo "ok: $d"; fi
}
W=${CKPT_SYNTH_WORLD:-1}
check "save step 1" "$synth" save --root "$root/r" --step 1 --bytes 3M --seed 11 --world "$W"
out=$("$synth" save --root "$root/r" --step 2 --bytes 3M --seed 12 --world "$W" --json --compress zstd:1)
/usr/bin/python3 -c "import json,sys; d=json.loads(sys.argv[1]); assert d['ok'] and d['bytes']>2_000_000 and d['seconds']>0 and d['stall_seconds']>0 and d['stall_seconds']<=d['seconds'] and d['compression_ratio']>1.0, d" "$out" \
  && echo "ok: save --json fields" || { echo "FAIL: save --json: $out"; fail=1; }
for w in 1 2 3 5; do
  expect_rc 0 "0 mismatches" "verify step 1 as $w rank(s)" \
    "$synth" verify --root "$root/r" --step 1 --bytes 3M --seed 11 --world "$w"
done
# Tensors of several 256 KiB blocks, saved by one rank and loaded as 3 and 7: each
# rank reads only the blocks of its rows (the loads' debug line counts partial reads)
# and must still get every byte right.
check "save a 48M step as one rank" "$synth" save --root "$root/b" --step 1 --bytes 48M --seed 21 --world 1
for w in 3 7; do
  out=$(CKPT_LOG=debug "$synth" verify --root "$root/b" --step 1 --bytes 48M --seed 21 --world "$w" 2>&1); rc=$?
  if [ $rc = 0 ] && grep -q " 0 mismatches" <<<"$out" && grep -Eq "\([1-9][0-9]* partial, [1-9][0-9]* blocks checked\)" <<<"$out"; then
    echo "ok: 1 -> $w ranks bit-exact, reading blocks"
  else
    echo "FAIL: 1 -> $w ranks (rc $rc)"; grep -v ' info: ' <<<"$out" | tail -20; fail=1
  fi
done
expect_rc 0 "0 mismatches" "verify latest" "$synth" verify --root "$root/r" --step latest --bytes 3M --seed 12
out=$("$synth" verify --root "$root/r" --step 2 --bytes 3M --seed 12 --world 2 --json)
/usr/bin/python3 -c "import json,sys; d=json.loads(sys.argv[1]); assert d['ok'] and d['mismatches']==0 and d['tensors']>40, d" "$out" \
  && echo "ok: verify --json" || { echo "FAIL: verify --json: $out"; fail=1; }
expect_rc 1 "should be absent" "--no-rng refuses a step that has its RNG state" \
  "$synth" verify --root "$root/r" --step 1 --bytes 3M --seed 11 --no-rng
expect_rc 1 "mismatches" "wrong seed is caught" "$synth" verify --root "$root/r" --step 1 --bytes 3M --seed 99
expect_rc 1 "already committed" "saving a committed step again fails" \
  "$synth" save --root "$root/r" --step 1 --bytes 3M --seed 11
expect_rc 0 "0 mismatches" "the committed step is intact after that" \
  "$synth" verify --root "$root/r" --step 1 --bytes 3M --seed 11
expect_rc 1 "not a committed step" "unknown step" "$synth" verify --root "$root/r" --step 77 --bytes 3M --seed 1
mkdir -p "$root/other"; echo hi > "$root/other/file"
expect_rc 1 "not a checkpoint root" "foreign directory refused" \
  "$synth" save --root "$root/other" --step 1 --bytes 1M --seed 1
expect_rc 1 "not a checkpoint root" "verify of a foreign directory" \
  "$synth" verify --root "$root/other" --step 1 --bytes 1M --seed 1
expect_rc 2 "required" "missing options" "$synth" save --root "$root/r"
expect_rc 2 "not a size" "bad size" "$synth" save --root "$root/r" --step 3 --bytes 12Q --seed 1
expect_rc 2 "unknown command" "unknown command" "$synth" frobnicate --root x --step 1 --bytes 1M
expect_rc 0 "usage" "--help" "$synth" --help
[ $fail = 0 ] && rm -rf "$root"
exit $fail
