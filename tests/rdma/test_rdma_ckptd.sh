#!/usr/bin/env bash
# test_rdma_ckptd.sh — saving through ckptd over the rdma transport: two ckptd
# instances with --transport rdma on the RDMA device's address, a job of 4 ranks
# (CKPT_TRANSPORT=rdma) streams its shards to both (the chunks go through the rdma
# transport's RDMA WRITE ring, docs/protocol-rdma.md), the home instance checks the
# votes of the other's shards over rdma, the step restores onto 3 ranks bit for
# bit, and ckpt-inspect verifies it through ckptd.
#
#   test_rdma_ckptd.sh BUILD_DIR        (inside the rdma guest; 77 elsewhere)
set -u
build=$1
addr=${CKPT_TEST_RDMA_ADDR:-10.0.0.1}
ckptd=$build/ckptd/ckptd synth=$build/tools/ckpt-synth/ckpt-synth
inspect=$build/tools/ckpt-inspect/ckpt-inspect
if [ -z "$(ls /sys/class/infiniband 2>/dev/null)" ]; then
  echo "SKIP: no RDMA device here (/sys/class/infiniband is empty); this runs inside the rdma guest (tests/rdma/run-rdma-tests.sh)"
  exit 77
fi
[ -x "$ckptd" ] || { echo "SKIP: no ckptd in $build"; exit 77; }
t=$(mktemp -d "${TMPDIR:-/tmp}/ckpt-rdma-ckptd-XXXXXX")
pids=()
trap 'for p in "${pids[@]}"; do kill -9 $p 2>/dev/null; done; rm -rf "$t"' EXIT
umask 077
mkdir -p "$t/a" "$t/b"
printf 'rdma-ckptd-secret-0123456789' > "$t/secret"
printf 'job secret-file=%s/secret\n' "$t" > "$t/jobs"
fail=0
bad() { echo "FAIL: $*"; fail=1; }
for n in a b; do
  "$ckptd" --listen "$addr:0" --transport rdma --data "$t/$n" --jobs "$t/jobs" --pool 64M \
    --chunk-max 4M --log info > "$t/$n.out" 2> "$t/$n.log" &
  pids+=($!)
  for _ in $(seq 100); do grep -q "listening on port" "$t/$n.out" 2>/dev/null && break; sleep 0.1; done
done
pa=$(sed -n 's/.*listening on port \([0-9]*\).*/\1/p' "$t/a.out")
pb=$(sed -n 's/.*listening on port \([0-9]*\).*/\1/p' "$t/b.out")
[ -n "$pa" ] && [ -n "$pb" ] || { cat "$t"/*.log; echo "FAIL: ckptd did not start on rdma"; exit 1; }
export CKPT_TRANSPORT=rdma CKPT_JOB_ID=job CKPT_JOB_SECRET=rdma-ckptd-secret-0123456789
export CKPT_TARGET="ckptd://$addr:$pa,$addr:$pb" CKPT_CHUNK_BYTES=4M CKPT_TIMEOUT_MS=30000
# The guest has 1 GiB: small pools (four ranks and two instances share it).
export CKPT_POOL_BYTES=32M
if out=$("$synth" save --root "$t/unused" --step 5 --bytes 16M --seed 5 --world 4 2>&1); then
  echo "ok: 4 ranks saved through two ckptd over rdma: $(tail -1 <<<"$out")"
else
  bad "save over rdma"; echo "$out"
fi
[ "$(ls "$t/b/jobs/job/step-00000000000000000005" 2>/dev/null | wc -l)" = 2 ] \
  && echo "ok: the second instance holds ranks 1 and 3" || bad "placement on the second instance"
if out=$("$synth" verify --root "$t/unused" --step 5 --bytes 16M --seed 5 --world 3 2>&1) &&
   grep -q "0 mismatches" <<<"$out"; then
  echo "ok: restored onto 3 ranks over rdma, bit-exact"
else
  bad "restore over rdma"; echo "$out"
fi
if out=$("$inspect" "$CKPT_TARGET" verify latest 2>&1) && grep -q "step 5: ok" <<<"$out"; then
  echo "ok: ckpt-inspect verifies through ckptd over rdma"
else
  bad "ckpt-inspect over rdma"; echo "$out"
fi
[ $fail = 0 ] || tail -n 20 "$t/a.log" "$t/b.log"
exit $fail
