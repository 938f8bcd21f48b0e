#!/bin/bash
# fetch-debs.sh DIR — download (not install) the Debian packages that libckpt builds against,
# so they can travel to the GPU machine, which reaches no package registry.
# On the GPU machine, unpack them with scripts/unpack-debs.sh (docs/gpu.md, "Build").
set -euo pipefail
dir=$(realpath -m "${1:?usage: fetch-debs.sh DIR}")
mkdir -p "$dir"
pkgs="liburing-dev liburing2 liblmdb-dev liblmdb0 libxxhash-dev libxxhash0 check libsubunit-dev libsubunit0
      libibverbs-dev libibverbs1 librdmacm-dev librdmacm1 ibverbs-providers libnl-3-200 libnl-route-3-200
      libzstd-dev libssl-dev libjansson-dev libjansson4
      libmicrohttpd-dev libmicrohttpd12 libsystemd-dev libsystemd0"
[ -n "$(find /var/lib/apt/lists -maxdepth 1 -name '*Packages*' -print -quit 2>/dev/null)" ] || apt-get update -q
cd "$dir" && apt-get -o APT::Sandbox::User=root download -q $pkgs
# iproute2's tc and ip, for bench/ckptd's BENCH_NET_RATE, with the libraries they need
# that the GPU machine lacks: apart, so that they join no build's library path.
mkdir -p "$dir/iproute2"
cd "$dir/iproute2" && apt-get -o APT::Sandbox::User=root download -q \
  iproute2 libbpf1 libmnl0 libelf1 libcap2 libxtables12 libbsd0 libmd0 libtirpc3 libdb5.3
ls -1 "$dir"/*.deb "$dir"/iproute2/*.deb | wc -l
