#!/usr/bin/env bash
# run-rdma-tests.sh — boot the rdma guest (tests/rdma/vm: qemu, soft-RoCE rxe0 on
# 10.0.0.1) once and run every test labelled `rdma-guest` inside it: the lib/net
# conformance suite over rdma, lib/commit over rdma, and the crash matrix over rdma.
# The host's ctest runs this as `rdma_suite` (label rdma); the inner tests skip
# (77) wherever there is no RDMA device, so nothing else needs the guest.
#
#   run-rdma-tests.sh BUILD_DIR
# Exit: ctest's status in the guest; 77 (with the reason) when the guest cannot
# start here; 1 when it timed out.
# Env: RDMA_VM (path of run-in-vm.sh), VM_TIMEOUT (900), VM_MEM (2560 when the
# host has room, for the 300 MiB message test; else the guest's 1024).
set -u
[ $# -eq 1 ] || { sed -n '2,13p' "$0" >&2; exit 2; }
build=$(realpath "$1")
here=$(cd "$(dirname "$0")" && pwd)
top=$(git -C "$here" rev-parse --show-toplevel 2>/dev/null) || top=$(cd "$here/../.." && pwd)

# The guest's harness lives beside this script; RDMA_VM may name another one.
vm=${RDMA_VM:-$here/vm/run-in-vm.sh}
if [ ! -f "$vm" ]; then
  echo "SKIP: the rdma guest's harness $vm is not here"
  exit 77
fi
if ! command -v qemu-system-x86_64 >/dev/null && [ "$(id -u)" != 0 ]; then
  echo "SKIP: qemu-system-x86_64 is missing and only root can install it (scripts/deps.sh installs it)"
  exit 77
fi
if [ ! -x "$build/tests/net/test_rdma_commit" ]; then
  echo "SKIP: $build was built without the rdma transport (libibverbs-dev, librdmacm-dev missing?)"
  exit 77
fi

# The guest shares one directory read-write (ctest writes into the build dir):
# the repository when the build is inside it, else the build dir itself.
case "$build/" in "$top"/*) dir=$top ;; *) dir=$build ;; esac
case "$dir" in *[\ ,]*) echo "SKIP: $dir contains a space or a comma, which the guest's 9p share cannot take"; exit 77 ;; esac

: "${VM_TIMEOUT:=900}"
if [ -z "${VM_MEM:-}" ]; then
  avail=$(awk '/MemAvailable/ {print int($2/1024)}' /proc/meminfo)
  [ "${avail:-0}" -ge 4096 ] && VM_MEM=2560
fi
export VM_TIMEOUT VM_MEM

env="CKPT_TEST_SEED=${CKPT_TEST_SEED:-$(date +%s)}"
echo "rdma_suite: booting the rdma guest ($vm) over $dir; ${VM_MEM:-1024} MiB, timeout ${VM_TIMEOUT} s"
t0=$(date +%s)
# The inner ctest keeps its Testing/ logs on a tmpfs of the guest: the build dir is
# shared, and the host's ctest is writing its own logs there at the same time.
"$vm" "$dir" "rdma link show; cd '$build' && mkdir -p Testing && mount -t tmpfs guest-ctest Testing && $env ctest -L rdma-guest --output-on-failure --timeout 600"
rc=$?
echo "rdma_suite: guest finished with status $rc after $(( $(date +%s) - t0 )) s"
if [ "$rc" != 0 ] && ! command -v qemu-system-x86_64 >/dev/null; then
  echo "SKIP: qemu-system-x86_64 could not be installed here (run-in-vm.sh exit $rc; its output is above)"
  exit 77
fi
case $rc in
  125) echo "SKIP: the rdma guest could not start here (run-in-vm.sh exit 125; its output is above)"; exit 77 ;;
  124) echo "FAIL: the rdma guest timed out after ${VM_TIMEOUT} s"; exit 1 ;;
esac
exit "$rc"
