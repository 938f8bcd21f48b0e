#!/usr/bin/env bash
# bench-rdma.sh — rdma vs tcp inside the same rdma guest (tests/rdma/vm: qemu,
# soft-RoCE rxe0 on dummy0 at 10.0.0.1; both transports use that address), and
# print the table of docs/perf-rdma.md.
#
#   bench/rdma/bench-rdma.sh [BUILD_DIR]      (default: build)
# Env: RTT (ping-pongs, 1000), BYTES (bulk message, 256M), WS ("4 16"),
#      VM_MEM (3072: two copies of the bulk message), VM_TIMEOUT (900).
set -eu
top=$(cd "$(dirname "$0")/../.." && pwd)
build=$(realpath "${1:-$top/build}")
vm=${RDMA_VM:-$top/tests/rdma/vm/run-in-vm.sh}
[ -x "$build/bench/rdma/bench_rdma" ] || { echo "no $build/bench/rdma/bench_rdma (built with rdma?)" >&2; exit 1; }
: "${RTT:=1000}" "${BYTES:=256M}" "${WS:=4 16}" "${VM_MEM:=3072}" "${VM_TIMEOUT:=900}"
export VM_MEM VM_TIMEOUT
case "$build/" in "$top"/*) dir=$top ;; *) dir=$build ;; esac
b=$build/bench/rdma/bench_rdma
# The manifests go to the guest's tmpfs: the figure is the network's, not 9p's.
cmd="cpu=\$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2); echo \"guest: \$(nproc) vCPU (\$cpu), \$(free -m | awk '/Mem:/{print \$2}') MiB, kernel \$(uname -r), \$(rdma link show | head -1)\";
mkdir -p /run/bench;
echo '| transport | 64 B control RTT, median (us) | RTT p99 (us) |$(for w in $WS; do printf ' commit W=%s, median (us) |' "$w"; done) $BYTES message (MiB/s) |';
echo '| --- | --- | --- |$(for w in $WS; do printf ' --- |'; done) --- |';
for t in tcp rdma; do '$b' \$t 10.0.0.1 /run/bench --rtt $RTT --bytes $BYTES $WS; done"
"$vm" "$dir" "$cmd"
