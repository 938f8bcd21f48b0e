#!/usr/bin/env bash
# deps.sh — install what libckpt builds and tests with, from Debian's archive.
# Idempotent: does nothing when every package is already installed.
set -euo pipefail
pkgs=(build-essential cmake pkg-config liburing-dev liblmdb-dev lmdb-utils libxxhash-dev
      libzstd-dev libjansson-dev check libsubunit-dev libssl-dev libibverbs-dev librdmacm-dev
      fio clang libclang-rt-14-dev python3 python3-numpy util-linux
      # the Python binding's tests (tests/python): pytest, torch (CPU), and its
      # packaging: pip into a venv offline (--no-build-isolation needs setuptools
      # and wheel from the system)
      python3-pytest python3-torch python3-venv python3-pip python3-setuptools python3-wheel
      # the manual pages (tests/man renders them) and the ABI test (nm: binutils)
      groff-base man-db binutils
      # the power-cut campaign (tests/crash): ext4 on a loop device (losetup, mount)
      e2fsprogs mount
      # the rdma guest (tests/rdma/run-rdma-tests.sh, tests/rdma/vm): qemu, soft-RoCE tools
      qemu-system-x86 busybox-static ibverbs-utils rdmacm-utils ibverbs-providers iproute2
      # ckptd's metrics endpoint and systemd notification
      libmicrohttpd-dev libsystemd-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "deps.sh: installing ${missing[*]}" >&2
SUDO=; [ "$(id -u)" -eq 0 ] || SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q >/dev/null
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
