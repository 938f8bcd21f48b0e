#!/usr/bin/env bash
# test_install.sh — libckpt as its users get it: the build installed into a fresh
# prefix, then a small program (consumer/consumer.c: the version, a save and a load
# of one rank) built against that prefix four ways and run: pkg-config (shared),
# pkg-config --static (libckpt.a and what ckpt.pc says it needs), find_package(ckpt)
# with ckpt::ckpt, and with ckpt::ckpt_static. The installed tools must then run from
# the prefix with no LD_LIBRARY_PATH to it (their RPATH finds the library beside them) and
# answer --version and --help; the man pages must be there.
# Usage: test_install.sh BUILD_DIR CONSUMER_DIR CC [EXTRA_FLAGS]
#   EXTRA_FLAGS: compile and link flags the library was built with that a program
#   linking it needs too (the sanitizers).
set -euo pipefail
build=$1 consumer=$2 cc=$3 extra=${4:-}
for t in cmake pkg-config readelf ldd; do
  command -v "$t" >/dev/null || { echo "SKIP: $t not found (scripts/deps.sh installs it)"; exit 77; }
done
seed=${CKPT_TEST_SEED:-$(date +%s)}
echo "CKPT_TEST_SEED=$seed"
# Search paths the caller set for the dependencies (a machine with them in a private
# prefix) stay; only directories that hold a libckpt are taken out of the library
# path, so that what runs below can find libckpt only where the prefix put it.
deps_pc=${PKG_CONFIG_PATH:-}
ld=
IFS=: read -ra dirs <<<"${LD_LIBRARY_PATH:-}"
for d in "${dirs[@]}"; do
  [ -n "$d" ] && ! compgen -G "$d/libckpt.so*" >/dev/null && ld=${ld:+$ld:}$d
done
if [ -n "$ld" ]; then export LD_LIBRARY_PATH=$ld; else unset LD_LIBRARY_PATH; fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix
fail() { echo "FAIL: $*"; exit 1; }

cmake --install "$build" --prefix "$prefix" > "$tmp/install.log" ||
  { cat "$tmp/install.log"; fail "cmake --install $build --prefix $prefix"; }
pc=$(find "$prefix" -name ckpt.pc -path '*/pkgconfig/*' | head -n1)
[ -n "$pc" ] || fail "no ckpt.pc installed"
libdir=$(dirname "$(dirname "$pc")")
version=$(PKG_CONFIG_PATH=$(dirname "$pc")${deps_pc:+:$deps_pc} pkg-config --modversion ckpt)
echo "installed libckpt $version into $prefix (libdir ${libdir#"$prefix"/})"
for f in "$libdir/libckpt.so" "$libdir/libckpt.a" "$libdir/cmake/ckpt/ckptConfig.cmake" \
         "$prefix/include/ckpt/ckpt.h"; do
  [ -e "$f" ] || fail "not installed: ${f#"$prefix"/}"
done
[ -L "$libdir/libckpt.so" ] && [ -e "$libdir/libckpt.so.${version%%.*}" ] ||
  fail "libckpt.so is not a link to libckpt.so.${version%%.*}"

# Whether the libckpt that EXE loads is the prefix's.
from_prefix() {
  local deps path
  deps=$(ldd "$1") || return 1
  path=$(sed -n 's/^[[:space:]]*libckpt\.so[^ ]* => \([^ ]*\) .*/\1/p' <<<"$deps")
  [ -n "$path" ] && [ "$(dirname "$(realpath "$path")")" = "$(realpath "$libdir")" ]
}

# run NAME EXE SHARED(yes|no): the program's libckpt is the prefix's or none, and it works.
run() {
  local name=$1 exe=$2 shared=$3 needed root
  needed=$(readelf -d "$exe" | sed -n 's/.*(NEEDED).*\[\(libckpt[^]]*\)\].*/\1/p')
  if [ "$shared" = yes ]; then
    [ "$needed" = "libckpt.so.${version%%.*}" ] || fail "$name: needs '$needed', not libckpt.so.${version%%.*}"
    from_prefix "$exe" || fail "$name: libckpt is not resolved from the prefix: $(ldd "$exe" | grep libckpt)"
  else
    [ -z "$needed" ] || fail "$name: linked statically but needs $needed"
  fi
  root=$tmp/root-$name
  "$exe" "$root" "$seed" || fail "$name: the consumer failed"
  echo "ok: $name"
}

export PKG_CONFIG_PATH=$(dirname "$pc")${deps_pc:+:$deps_pc}
# shellcheck disable=SC2046,SC2086
$cc $extra -o "$tmp/pc-shared" "$consumer/consumer.c" $(pkg-config --cflags --libs ckpt) \
    -Wl,-rpath,"$(pkg-config --variable=libdir ckpt)" || fail "pkg-config: link failed"
run pkg-config "$tmp/pc-shared" yes
# The static link takes libckpt.a (-l:libckpt.a) and exactly what ckpt.pc adds for it.
static_libs=$(pkg-config --static --libs ckpt)
echo "pkg-config --static --libs ckpt: $static_libs"
# shellcheck disable=SC2046,SC2086
$cc $extra -o "$tmp/pc-static" "$consumer/consumer.c" $(pkg-config --cflags ckpt) \
    $(sed 's/-lckpt\b/-l:libckpt.a/' <<<"$static_libs") || fail "pkg-config --static: link failed"
run pkg-config-static "$tmp/pc-static" no
export PKG_CONFIG_PATH=$deps_pc

for target in ckpt::ckpt ckpt::ckpt_static; do
  name=cmake-${target#ckpt::}
  b=$tmp/$name
  cmake -S "$consumer" -B "$b" -DCMAKE_PREFIX_PATH="$prefix" -DCKPT_TARGET="$target" \
        -DCMAKE_C_COMPILER="$cc" -DCMAKE_C_FLAGS="$extra" -DCMAKE_EXE_LINKER_FLAGS="$extra" \
        -DCMAKE_BUILD_TYPE=Release > "$b.log" 2>&1 &&
    cmake --build "$b" >> "$b.log" 2>&1 || { cat "$b.log"; fail "find_package(ckpt) with $target"; }
  [ "$target" = ckpt::ckpt ] && shared=yes || shared=no
  run "$name" "$b/consumer" $shared
done

# The tools, from the prefix, as a user runs them: no LD_LIBRARY_PATH to libckpt.
for tool in ckpt-inspect ckpt-reshard ckpt-synth; do
  exe=$prefix/bin/$tool
  [ -x "$exe" ] || fail "$tool is not installed in bin/"
  from_prefix "$exe" ||
    fail "$tool: libckpt is not found from the prefix: $(ldd "$exe" | grep libckpt || true)"
  out=$("$exe" --version) || fail "$tool --version exited $?"
  [ "$out" = "$tool $version" ] || fail "$tool --version printed '$out', not '$tool $version'"
  "$exe" --help > "$tmp/help" || fail "$tool --help exited $?"
  grep -q "usage" "$tmp/help" || fail "$tool --help printed no usage"
  echo "ok: $tool --version, --help"
done

for page in man1/ckpt-inspect.1 man1/ckpt-reshard.1 man1/ckpt-synth.1 man3/libckpt.3; do
  [ -s "$prefix/share/man/$page" ] || fail "man page not installed: share/man/$page"
done
# ckptd, where it was built (on the library's static modules, so no libckpt.so to
# find): it runs from the prefix, with its page and its unit naming the page.
if [ -x "$prefix/sbin/ckptd" ]; then
  out=$("$prefix/sbin/ckptd" --version) || fail "ckptd --version exited $?"
  [ "$out" = "ckptd $version" ] || fail "ckptd --version printed '$out', not 'ckptd $version'"
  [ -s "$prefix/share/man/man8/ckptd.8" ] || fail "man page not installed: share/man/man8/ckptd.8"
  grep -q "^Documentation=man:ckptd(8)" "$prefix/lib/systemd/system/ckptd.service" ||
    fail "the unit does not name ckptd(8)"
  echo "ok: ckptd --version, its page and unit"
fi
echo "OK: installed tree, four consumers, three tools"
