#!/bin/bash
# run-in-vm.sh — the rdma tests' guest (tests/rdma, bench/rdma): run a command inside
# a throw-away qemu VM (Debian kernel) that has a soft-RoCE (rdma_rxe) device "rxe0"
# on dummy0 (10.0.0.1/24), so that real verbs run without RDMA hardware.
# The guest sees the host's / read-only through 9p with a tmpfs overlay on top
# (so it is writable, changes discarded); DIR is shared read-write at the same path.
#
#   usage: run-in-vm.sh DIR COMMAND...        (COMMAND runs via sh -c, cwd=DIR)
#   env:   VM_TIMEOUT=300 VM_MEM=1024 VM_SMP=2 VM_ACCEL=auto|tcg|kvm
#          VM_RDMA=rxe|none VM_NETDEV=dummy0|lo VM_MTU=(9000) VM_VERBOSE=1 (console->stderr)
#          VM_CACHE=/var/tmp/rdma-vm-cache
# exit status = COMMAND's status; 124 = timeout; 125 = VM/setup failure.
set -euo pipefail
[ $# -ge 2 ] || { sed -n '2,13p' "$0" >&2; exit 2; }
DIR=$(realpath "$1"); shift; CMD="$*"
: "${VM_TIMEOUT:=300}" "${VM_MEM:=1024}" "${VM_SMP:=2}" "${VM_ACCEL:=auto}"
: "${VM_RDMA:=rxe}" "${VM_NETDEV:=dummy0}" "${VM_MTU:=}" "${VM_VERBOSE:=0}" "${VM_CACHE:=/var/tmp/rdma-vm-cache}"

# ---- one-time host setup (cached, serialized with flock) ---------------------
mkdir -p "$VM_CACHE"; exec 9>"$VM_CACHE/.lock"; flock 9
PKGS="qemu-system-x86 busybox-static ibverbs-utils rdmacm-utils ibverbs-providers iproute2"
missing=$(for p in $PKGS; do dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed' || echo "$p"; done)
if [ -n "$missing" ]; then
  echo "run-in-vm: installing:" $missing >&2
  apt-get update -q >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $missing >&2
fi
KPKG=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-/{print $2; exit}')
KVER=${KPKG#linux-image-}; [ -n "$KVER" ] || { echo "run-in-vm: no linux-image-amd64 (apt-get update?)" >&2; exit 125; }
KDIR=$VM_CACHE/$KVER
if [ ! -e "$KDIR/.ok" ]; then
  rm -rf "$KDIR"; mkdir -p "$KDIR"
  (cd "$KDIR" && apt-get -q -o APT::Sandbox::User=root download "$KPKG" >&2 && dpkg -x "$KPKG"_*.deb root && rm -f ./*.deb)
  busybox depmod -b "$KDIR/root" "$KVER"
  # initramfs: static busybox + just the modules needed to mount 9p/overlay
  I=$KDIR/initramfs; M=lib/modules/$KVER
  mkdir -p "$I"/{bin,sbin,dev,proc,sys,lower,rw,newroot,vmout,$M}
  cp /bin/busybox "$I/bin/busybox"; ln -s ../bin/busybox "$I/sbin/modprobe"
  for m in virtio_pci 9pnet_virtio 9p overlay; do
    for f in $(grep -E "^[^:]*/$m\.ko:" "$KDIR/root/$M/modules.dep" | tr -d :); do
      install -D -m644 "$KDIR/root/$M/$f" "$I/$M/$f"; done; done
  busybox depmod -b "$I" "$KVER"
  cat > "$I/init" <<'EOF'
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
modprobe -a virtio_pci 9pnet_virtio 9p overlay || echo "VMINIT: modprobe failed"
O=trans=virtio,version=9p2000.L,msize=262144
mount -t 9p -o $O vmout /vmout && . /vmout/vm.conf
mount -t 9p -o $O,ro,cache=loose hostroot /lower
mount -t tmpfs -o mode=755 rw /rw && mkdir -p /rw/u /rw/w
mount -t overlay -o lowerdir=/lower,upperdir=/rw/u,workdir=/rw/w ovl /newroot
R=/newroot
mount --bind /lower$MODDIR /lib/modules      # kernel's request_module -> /sbin/modprobe
mount -t tmpfs run $R/run    # /tmp stays on the overlay: host files visible, writes discarded
mkdir -p $R/lib/modules $R/vmout "$R$DIR"
mount --bind /lower$MODDIR $R/lib/modules
mount -t proc proc $R/proc; mount -t sysfs sys $R/sys; mount -t devtmpfs dev $R/dev
mkdir -p $R/dev/pts $R/dev/shm; mount -t devpts devpts $R/dev/pts; mount -t tmpfs shm $R/dev/shm
mount --bind /vmout $R/vmout
mount -t 9p -o $O testdir "$R$DIR"
echo "VMINIT: up at $(cut -d' ' -f1 /proc/uptime)s"
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root
chroot $R /bin/sh -ec '
  ip link set lo up
  if [ "$VM_RDMA" = rxe ]; then
    busybox modprobe -a crc32_generic rdma_rxe ib_uverbs rdma_ucm
    if [ "$VM_NETDEV" != lo ]; then   # loading dummy.ko already creates dummy0
      ip link add "$VM_NETDEV" type dummy 2>/dev/null || ip link show "$VM_NETDEV" >/dev/null
      ip addr add 10.0.0.1/24 dev "$VM_NETDEV"
    fi
    [ -z "$VM_MTU" ] || ip link set "$VM_NETDEV" mtu "$VM_MTU"  # 9000 => rxe active_mtu 4096
    ip link set "$VM_NETDEV" up
    rdma link add rxe0 type rxe netdev "$VM_NETDEV"
  fi' > /vmout/setup.log 2>&1 || { echo 125 > /vmout/rc; echo "VMINIT: rdma setup failed"; cat /vmout/setup.log; }
echo "VMINIT: setup done at $(cut -d' ' -f1 /proc/uptime)s"
if [ ! -e /vmout/rc ]; then
  chroot $R /bin/sh -c 'cd "$DIR" && exec /bin/sh /vmout/cmd' > /vmout/output 2>&1 < /dev/null
  echo $? > /vmout/rc
fi
echo "VMINIT: done at $(cut -d' ' -f1 /proc/uptime)s rc=$(cat /vmout/rc)"
sync; umount "$R$DIR" 2>/dev/null; umount /vmout 2>/dev/null
reboot -f
EOF
  chmod 755 "$I/init"
  (cd "$I" && find . | busybox cpio -o -H newc 2>/dev/null | gzip -1 > "$KDIR/initramfs.cpio.gz")
  # uncompressed ELF vmlinux => qemu boots it via PVH entry (skips BIOS decompression)
  K=$KDIR/root/boot/vmlinuz-$KVER; off=$(LC_ALL=C grep -abo $'\xfd7zXZ\x00' "$K" | head -1 | cut -d: -f1)
  tail -c +$((off+1)) "$K" | xz -dc > "$KDIR/vmlinux" 2>/dev/null || true
  head -c4 "$KDIR/vmlinux" | grep -q ELF || rm -f "$KDIR/vmlinux"
  touch "$KDIR/.ok"
fi
flock -u 9

# ---- run ----------------------------------------------------------------------
RUN=$(mktemp -d "$VM_CACHE/run.XXXXXX")
trap 'rm -rf "$RUN"' EXIT
printf '%s\n' "$CMD" > "$RUN/cmd"
printf 'DIR=%q\nMODDIR=%q\nVM_RDMA=%q\nVM_NETDEV=%q\nVM_MTU=%q\nexport DIR VM_RDMA VM_NETDEV VM_MTU\n' \
  "$DIR" "$KDIR/root/lib/modules" "$VM_RDMA" "$VM_NETDEV" "$VM_MTU" > "$RUN/vm.conf"
if [ "$VM_ACCEL" = auto ]; then   # /dev/kvm alone is not enough (e.g. PVM hosts)
  if [ -w /dev/kvm ] && grep -qwE 'vmx|svm' /proc/cpuinfo; then VM_ACCEL=kvm; else VM_ACCEL=tcg; fi
fi
if [ "$VM_ACCEL" = kvm ]; then CPU=host; else CPU=max; fi
KERNEL=$KDIR/vmlinux; [ -s "$KERNEL" ] || KERNEL=$KDIR/root/boot/vmlinuz-$KVER
fs() { echo "-fsdev local,id=$1,path=$2,security_model=none,multidevs=remap$3 -device virtio-9p-pci,fsdev=$1,mount_tag=$1"; }
SERIAL=file:$RUN/console.log; QLOG=$RUN/qemu.log
[ "$VM_VERBOSE" = 1 ] && { SERIAL=stdio; QLOG=/dev/stderr; }
set +e
# shellcheck disable=SC2046
timeout "$VM_TIMEOUT" qemu-system-x86_64 -accel "$VM_ACCEL" -cpu "$CPU" -m "$VM_MEM" -smp "$VM_SMP" \
  -nodefaults -no-user-config -display none -no-reboot -serial "$SERIAL" \
  -kernel "$KERNEL" -initrd "$KDIR/initramfs.cpio.gz" \
  -append "console=ttyS0 quiet loglevel=4 panic=-1 mitigations=off" \
  $(fs hostroot / ,readonly=on) $(fs vmout "$RUN" "") $(fs testdir "$DIR" "") \
  </dev/null >>"$QLOG" 2>&1
qrc=$?
set -e
[ -s "$RUN/output" ] && cat "$RUN/output"
if [ -s "$RUN/rc" ]; then rc=$(cat "$RUN/rc"); else
  rc=125; [ "$qrc" = 124 ] && rc=124
  echo "run-in-vm: no exit status from guest (qemu rc=$qrc)" >&2
  cat "$RUN/qemu.log" >&2 2>/dev/null; [ -f "$RUN/console.log" ] && tail -n 40 "$RUN/console.log" >&2
fi
[ "$rc" = 125 ] && [ -f "$RUN/setup.log" ] && cat "$RUN/setup.log" >&2
exit "$rc"
