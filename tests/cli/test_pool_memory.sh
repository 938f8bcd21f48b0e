#!/usr/bin/env bash
# test_pool_memory.sh — a buffer pool larger than the memory the process may use is
# refused when it is made, with a message naming the figure, instead of being faulted
# in until the OOM killer picks a process: a rank's pool (ckpt-synth --pool) and
# ckptd's (--pool), each started in a memory cgroup of its own limited to 96 MiB (v2,
# or v1's memory controller). Where no such cgroup can be made here the test says
# why and exits 77. Without the check each would be killed inside its cgroup (exit
# 137), which the test reports.
# usage: test_pool_memory.sh SYNTH CKPTD
set -u
synth=$1 ckptd=${2:-}
limit=$((96 << 20))
# The cgroup: a child of this process's own, for v2 or for v1's memory controller.
rel2=$(sed -n 's/^0::\(\/.*\)$/\1/p' /proc/self/cgroup)
rel1=$(sed -n 's/^[0-9]*:\([^:]*,\)\{0,1\}memory\(,[^:]*\)\{0,1\}:\(\/.*\)$/\3/p' /proc/self/cgroup)
cg= limit_file=
if [ -n "$rel2" ] && [ -f "/sys/fs/cgroup${rel2%/}/memory.max" ] &&
   grep -qw memory "/sys/fs/cgroup${rel2%/}/cgroup.subtree_control" 2>/dev/null; then
  cg=/sys/fs/cgroup${rel2%/}/ckpt-pool-test-$$ limit_file=memory.max
elif [ -n "$rel1" ] && [ -d "/sys/fs/cgroup/memory${rel1%/}" ]; then
  cg=/sys/fs/cgroup/memory${rel1%/}/ckpt-pool-test-$$ limit_file=memory.limit_in_bytes
fi
if [ -z "$cg" ] || ! mkdir "$cg" 2>/dev/null; then
  echo "SKIP: no memory cgroup can be made here (not root, or no memory controller" \
       "delegated to this process's cgroup)"; exit 77
fi
t=$(mktemp -d /tmp/ckpt-poolmem-XXXXXX)
trap 'rmdir "$cg" 2>/dev/null; rm -rf "$t"' EXIT
if ! echo "$limit" > "$cg/$limit_file" 2>/dev/null; then
  echo "SKIP: cannot set $cg/$limit_file"; exit 77
fi
in_cg() { sh -c 'echo $$ > "$0/cgroup.procs" && exec "$@"' "$cg" "$@"; }
fail=0
check() {  # check WHAT RC OUT
  if [ "$2" = 137 ]; then
    echo "FAIL: $1: killed (exit 137): the pool was faulted in past the cgroup's limit"; fail=1
  elif [ "$2" = 0 ] || ! grep -q "more than this process may still use" <<<"$3" ||
       ! grep -q "$limit_file" <<<"$3"; then
    echo "FAIL: $1: exit $2, without the message naming $limit_file:"; echo "$3"; fail=1
  else
    echo "ok: $1 refused: $(grep -o 'io pool of.*' <<<"$3" | head -1 | cut -c1-200)"
  fi
}
out=$(in_cg "$synth" save --root "$t/root" --step 1 --bytes 4M --seed 1 --pool 256M 2>&1)
check "a rank's pool of 256 MiB in a cgroup of 96 MiB" $? "$out"
# Within the limit the same save works: the check does not refuse what fits.
out=$(in_cg "$synth" save --root "$t/root" --step 1 --bytes 4M --seed 1 --pool 16M --chunk 1M 2>&1) &&
  echo "ok: a pool of 16 MiB in the same cgroup saves" ||
  { echo "FAIL: a pool that fits was refused: $out"; fail=1; }
if [ -x "$ckptd" ]; then
  mkdir -m 700 "$t/data"
  printf 'secret-of-the-pool-test-0123456789' > "$t/secret"
  chmod 600 "$t/secret"
  echo "one secret-file=$t/secret" > "$t/jobs"
  chmod 600 "$t/jobs"
  out=$(in_cg timeout 60 "$ckptd" --listen 127.0.0.1:0 --data "$t/data" --jobs "$t/jobs" \
        --pool 512M 2>&1)
  check "ckptd --pool 512M in a cgroup of 96 MiB" $? "$out"
fi
exit $fail
