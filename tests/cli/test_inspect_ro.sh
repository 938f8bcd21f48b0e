#!/usr/bin/env bash
# test_inspect_ro.sh — gc on a read-only checkpoint root must fail with its own exit
# code (5) and remove nothing; verify still works there, without marking the step.
# The root is made read-only with a read-only bind mount in a private mount
# namespace (chmod does not stop root). Skips (77) where unshare/mount are refused.
set -u
synth=$1 inspect=$2
root=$(mktemp -d /var/tmp/ckpt-inspect-ro-XXXXXX)
r=$root/r
"$synth" save --root "$r" --step 1 --bytes 1M --seed 1 >/dev/null || { echo "FAIL: save"; exit 1; }
CKPT_FAULT=after_chunk_write:2:crash "$synth" save --root "$r" --step 2 --bytes 1M --seed 2 >/dev/null 2>&1
if ! unshare -m --propagation private true 2>/dev/null; then
  echo "SKIP: unshare -m is not permitted here (needs CAP_SYS_ADMIN); the read-only root case runs where it is"
  rm -rf "$root"; exit 77
fi
out=$(unshare -m --propagation private bash -c '
  set -u
  mount --bind "$1" "$1" && mount -o remount,ro,bind "$1" || { echo MOUNT-REFUSED; exit 0; }
  "$2" "$1" gc; echo "gc-rc=$?"
  "$2" "$1" verify 1 --quiet; echo "verify-rc=$?"
' _ "$r" "$inspect" 2>&1)
if grep -q MOUNT-REFUSED <<<"$out"; then
  echo "SKIP: a read-only bind mount is refused here: $out"; rm -rf "$root"; exit 77
fi
fail=0
grep -q "gc-rc=5" <<<"$out" && grep -q "not writable" <<<"$out" && grep -q -i "read-only" <<<"$out" \
  && echo "ok: gc on a read-only root exits 5 and says why" || { echo "FAIL: gc on read-only root"; fail=1; }
grep -q "verify-rc=0" <<<"$out" && grep -q "not marked" <<<"$out" \
  && echo "ok: verify on a read-only root works without marking" || { echo "FAIL: verify read-only"; fail=1; }
[ -d "$r/step-00000000000000000002" ] && echo "ok: nothing was removed" || { echo "FAIL: orphan removed"; fail=1; }
[ $fail = 0 ] || echo "$out"
[ $fail = 0 ] && rm -rf "$root"
exit $fail
