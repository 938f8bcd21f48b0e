#!/usr/bin/env bash
# test_enospc.sh — a real ENOSPC half-way through a save (not an injected one): a
# checkpoint root on a 24 MiB tmpfs in a private mount namespace. The save that does
# not fit fails with a message that says so, leaves nothing behind, and the committed
# step before it still verifies bit-exact; space comes back for the next save.
set -u
synth=$1
if [ "${CKPT_IN_NS:-}" != 1 ]; then
  if ! command -v unshare >/dev/null || ! unshare -m true 2>/dev/null; then
    echo "SKIP: cannot create a private mount namespace here (unshare -m), so no tmpfs"; exit 77
  fi
  exec env CKPT_IN_NS=1 unshare -m bash "$0" "$@"
fi
mnt=$(mktemp -d /tmp/ckpt-enospc-XXXXXX)
if ! mount -t tmpfs -o size=24m tmpfs "$mnt" 2>/dev/null; then
  echo "SKIP: cannot mount a tmpfs (not root, or no CAP_SYS_ADMIN)"; rmdir "$mnt"; exit 77
fi
trap 'umount "$mnt"; rmdir "$mnt"' EXIT
fail=0
root=$mnt/root
"$synth" save --root "$root" --step 1 --bytes 6M --seed 1 --chunk 1M --pool 4M >/dev/null ||
  { echo "FAIL: the first save should fit"; fail=1; }
out=$("$synth" save --root "$root" --step 2 --bytes 40M --seed 2 --chunk 1M --pool 4M 2>&1); rc=$?
if [ $rc = 0 ] || ! grep -q "No space left on device" <<<"$out" || ! grep -q "step 2" <<<"$out"; then
  echo "FAIL: a save larger than the file system: rc $rc"; echo "$out"; fail=1
else echo "ok: ENOSPC reported: $(grep -m1 -o 'save of step 2.*' <<<"$out" | cut -c1-160)"; fi
if [ -e "$root/step-00000000000000000002" ] && [ -n "$(ls -A "$root/step-00000000000000000002")" ]; then
  echo "FAIL: files of the failed step left behind:"; ls -l "$root/step-00000000000000000002"; fail=1
else echo "ok: nothing of step 2 left behind"; fi
out=$("$synth" verify --root "$root" --step 1 --bytes 6M --seed 1 2>&1) &&
  grep -q " 0 mismatches" <<<"$out" && echo "ok: step 1 intact" || { echo "FAIL: step 1: $out"; fail=1; }
out=$("$synth" verify --root "$root" --step 2 --bytes 40M --seed 2 2>&1)
grep -q "not a committed step" <<<"$out" && echo "ok: step 2 invisible" || { echo "FAIL: step 2: $out"; fail=1; }
"$synth" save --root "$root" --step 3 --bytes 6M --seed 3 --chunk 1M --pool 4M >/dev/null &&
  "$synth" verify --root "$root" --step 3 --bytes 6M --seed 3 >/dev/null &&
  echo "ok: space reclaimed, step 3 saved" || { echo "FAIL: step 3 after the failure"; fail=1; }
exit $fail
