#!/usr/bin/env bash
# test_rdma_ckptd.sh — saving through ckptd over the rdma transport: two ckptd
# instances with --transport rdma on the RDMA device's address, a job of 4 ranks
# (CKPT_TRANSPORT=rdma) streams its shards to both by the direct path (each chunk
# RDMA-written into a pool buffer ckptd granted, docs/ckptd.md: ckptd's metric
# ckptd_bytes_received_rdma_write_total must count every chunk byte), the home
# instance checks the votes of the other's shards over rdma, the step restores onto
# 3 ranks bit for bit, and ckpt-inspect verifies it through ckptd. Then the same
# with CKPT_RDMA_DIRECT=0 (DATA messages through the transport's ring: the metric
# stays put), and a ckptd whose pool is a quarter of the job's state, so that the
# ranks wait for grants while its disk catches up (backpressure through grants).
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
start() {  # NAME POOL: a ckptd on rdma; its ports in p_NAME and m_NAME (metrics)
  mkdir -p "$t/$1"
  "$ckptd" --listen "$addr:0" --transport rdma --data "$t/$1" --jobs "$t/jobs" --pool "$2" \
    --chunk-max 4M --metrics 127.0.0.1:0 --log info > "$t/$1.out" 2> "$t/$1.log" &
  pids+=($!)
  for _ in $(seq 100); do grep -q "listening on port" "$t/$1.out" 2>/dev/null && break; sleep 0.1; done
  eval "p_$1=$(sed -n 's/.*listening on port \([0-9]*\).*/\1/p' "$t/$1.out")"
  eval "m_$1=$(sed -n 's/.*metrics on port \([0-9]*\).*/\1/p' "$t/$1.out")"
}
metric() {  # NAME FAMILY: the value of one of ckptd NAME's counters
  local port
  eval "port=\$m_$1"
  curl -s "http://127.0.0.1:$port/metrics" | sed -n "s/^$2 \([0-9]*\)\$/\1/p"
}
start a 64M
start b 64M
pa=$p_a pb=$p_b
[ -n "$pa" ] && [ -n "$pb" ] && [ -n "$m_a" ] || { cat "$t"/*.log; echo "FAIL: ckptd did not start on rdma"; exit 1; }
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
# The direct path carried the chunks: on both instances, every chunk byte received
# came by RDMA WRITE into a granted buffer.
for n in a b; do
  rx=$(metric $n ckptd_bytes_received_total) rd=$(metric $n ckptd_bytes_received_rdma_write_total)
  if [ -n "$rx" ] && [ "$rx" -gt 0 ] && [ "$rx" = "$rd" ]; then
    echo "ok: ckptd $n received $rx chunk bytes, all by RDMA WRITE into granted buffers"
  else
    bad "ckptd $n: $rd of $rx chunk bytes by RDMA WRITE"
  fi
done

# CKPT_RDMA_DIRECT=0: the chunks go as DATA through the ring, and restore as well.
rd0=$(metric a ckptd_bytes_received_rdma_write_total) rx0=$(metric a ckptd_bytes_received_total)
if out=$(CKPT_RDMA_DIRECT=0 "$synth" save --root "$t/unused" --step 6 --bytes 16M --seed 6 \
         --world 4 2>&1) &&
   out2=$("$synth" verify --root "$t/unused" --step 6 --bytes 16M --seed 6 --world 4 2>&1) &&
   grep -q "0 mismatches" <<<"$out2"; then
  rd1=$(metric a ckptd_bytes_received_rdma_write_total) rx1=$(metric a ckptd_bytes_received_total)
  if [ "$rd1" = "$rd0" ] && [ "$rx1" -gt "$rx0" ]; then
    echo "ok: CKPT_RDMA_DIRECT=0 saves by DATA messages ($((rx1 - rx0)) bytes, none by RDMA WRITE), bit-exact"
  else
    bad "CKPT_RDMA_DIRECT=0: RDMA WRITE bytes went $rd0 -> $rd1, received $rx0 -> $rx1"
  fi
else
  bad "save with CKPT_RDMA_DIRECT=0"; echo "$out"; echo "${out2:-}"
fi

# Backpressure through grants: one ckptd with a pool of 8 MiB (two 4 MiB buffers,
# one grant per stream) takes 2 ranks' 32 MiB: the ranks wait for grants while its
# disk writes, and the step still restores bit-exact, all of it by RDMA WRITE.
start c 8M
if [ -n "$p_c" ] &&
   out=$(CKPT_TARGET="ckptd://$addr:$p_c" "$synth" save --root "$t/unused" --step 7 \
         --bytes 32M --seed 7 --world 2 2>&1) &&
   out2=$(CKPT_TARGET="ckptd://$addr:$p_c" "$synth" verify --root "$t/unused" --step 7 \
          --bytes 32M --seed 7 --world 2 2>&1) && grep -q "0 mismatches" <<<"$out2"; then
  rx=$(metric c ckptd_bytes_received_total) rd=$(metric c ckptd_bytes_received_rdma_write_total)
  if [ "$rx" -ge $((30 << 20)) ] && [ "$rx" = "$rd" ]; then
    echo "ok: a ckptd pool of a quarter of the state paced 2 ranks by grants; $rd bytes by RDMA WRITE, bit-exact"
  else
    bad "small pool: $rd of $rx bytes by RDMA WRITE"
  fi
else
  bad "save through a ckptd with a small pool"; echo "${out:-}"; echo "${out2:-}"
fi
[ "$(metric c ckptd_pool_used_bytes)" = 0 ] && echo "ok: every pool buffer back after the saves" \
  || bad "ckptd c holds $(metric c ckptd_pool_used_bytes) bytes of its pool with no stream"

[ $fail = 0 ] || tail -n 20 "$t/a.log" "$t/b.log" "$t/c.log"
exit $fail
