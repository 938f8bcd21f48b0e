#!/usr/bin/env bash
# test_cudart_on_demand.sh — a libckpt built with CUDA does not need the CUDA runtime
# until device memory is used: libckpt.so names no libcudart among what it needs, a
# save and a load run host memory only when the runtime cannot be loaded (CKPT_CUDART
# naming a file that is not there), and say so; and with the runtime there the same
# context finds the device (the other gpu tests use it).
# Usage: test_cudart_on_demand.sh LIBCKPT_SO CKPT_SYNTH
set -uo pipefail
lib=$1 synth=$2
command -v readelf >/dev/null || { echo "SKIP: readelf not found (binutils)"; exit 77; }
fail=0
ok()  { echo "ok: $1"; }
bad() { echo "FAIL: $1"; [ $# -gt 1 ] && echo "$2"; fail=1; }

needed=$(readelf -d "$lib" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
grep -q cudart <<<"$needed" && bad "libckpt.so needs the CUDA runtime at load" "$needed" ||
  ok "libckpt.so does not need libcudart: $(tr '\n' ' ' <<<"$needed")"

root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
out=$(CKPT_CUDART=/nonexistent/libcudart.so.0 CKPT_LOG=info \
      "$synth" save --root "$root/r" --step 1 --bytes 4M --seed 3 2>&1); rc=$?
[ $rc -eq 0 ] && ok "save without a loadable runtime" || bad "save without a loadable runtime: exit $rc" "$out"
grep -q "CUDA runtime not loaded (.*nonexistent" <<<"$out" && ok "the log names the runtime not loaded" ||
  bad "no log line about the runtime" "$out"
out=$(CKPT_CUDART=/nonexistent/libcudart.so.0 "$synth" verify --root "$root/r" --step 1 --bytes 4M --seed 3 2>&1); rc=$?
[ $rc -eq 0 ] && grep -q "0 mismatches" <<<"$out" && ok "load without a loadable runtime, bit-exact" ||
  bad "verify without a loadable runtime: exit $rc" "$out"
out=$(CKPT_LOG=info "$synth" verify --root "$root/r" --step 1 --bytes 4M --seed 3 2>&1); rc=$?
[ $rc -eq 0 ] && ! grep -q "CUDA runtime not loaded" <<<"$out" && ok "with the runtime: loaded, no such line" ||
  bad "with the runtime: exit $rc" "$out"
exit $fail
