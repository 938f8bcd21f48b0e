#!/usr/bin/env bash
# test_install.sh — the Python package as its users get it.
#  1. pip: `pip install --no-build-isolation --no-index` of python/ into a venv with
#     the system's site packages (Debian's python is externally managed), offline;
#     then, from another directory, `import libckpt` with LIBCKPT_LIBRARY, with the
#     library found through LD_LIBRARY_PATH only, and with neither: an ImportError
#     that lists the places looked at. The console script finds the tools.
#  2. cmake --install: the package installed under the prefix finds the prefix's
#     libckpt.so.0 by itself (PYTHONPATH to the package only), and the tools in bin/.
# Usage: test_install.sh BUILD_DIR LIBRARY PYTHON INSTALL_PYTHON(0|1)
set -uo pipefail
build=$1 library=$2 py=$3 install_py=${4:-1}
src=$(cd "$(dirname "$0")/../.." && pwd)
fail() { echo "FAIL: $*"; exit 1; }
command -v "$py" >/dev/null || { echo "SKIP: no Python interpreter $py (scripts/deps.sh)"; exit 77; }
for mod in venv ensurepip numpy; do
  "$py" -c "import $mod" 2>/dev/null ||
    { echo "SKIP: $py cannot import $mod (scripts/deps.sh installs python3-venv, python3-numpy)"; exit 77; }
done
"$py" -c "import setuptools, sys; sys.exit(int(setuptools.__version__.split('.')[0]) < 61)" 2>/dev/null ||
  { echo "SKIP: $py has no setuptools >= 61 (scripts/deps.sh installs python3-setuptools)"; exit 77; }
[ -e "$library" ] || fail "no built library $library"
library=$(realpath "$library") build=$(realpath "$build")
libdir=$(dirname "$library")

# Nothing from the caller's environment decides where the library is found.
unset LIBCKPT_LIBRARY LIBCKPT_TOOLS_DIR PYTHONPATH PYTHONHOME
ld=
IFS=: read -ra dirs <<<"${LD_LIBRARY_PATH:-}"
for d in "${dirs[@]}"; do
  [ -n "$d" ] && ! compgen -G "$d/libckpt.so*" >/dev/null && ld=${ld:+$ld:}$d
done
if [ -n "$ld" ]; then export LD_LIBRARY_PATH=$ld; else unset LD_LIBRARY_PATH; fi
export PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
elsewhere=$tmp/elsewhere
mkdir -p "$elsewhere"
seed=${CKPT_TEST_SEED:-$(date +%s)}
echo "CKPT_TEST_SEED=$seed"

# A save and a load through the imported package; prints where it came from.
probe='
import os, sys, numpy as np, libckpt
rng = np.random.default_rng(int(sys.argv[2]))
a = rng.standard_normal((33, 17)).astype(np.float32)
with libckpt.Checkpointer(sys.argv[1]) as ck:
    ck.save(1, {"w": a}, wait=True)
    with ck.load() as ld:
        assert ld.read("w").tobytes() == a.tobytes()
print("package", os.path.dirname(libckpt.__file__))
print("library", os.path.realpath(libckpt.library_path))
'
# check_probe OUT PKG_UNDER LIB_DIR: the package came from under PKG_UNDER and the
# library from LIB_DIR.
check_probe() {
  local out=$1 pkg lib
  pkg=$(sed -n 's/^package //p' <<<"$out"); lib=$(sed -n 's/^library //p' <<<"$out")
  [[ $pkg == "$2"/* ]] || fail "libckpt imported from $pkg, not from under $2"
  [ "$(dirname "$lib")" = "$(realpath "$3")" ] || fail "library $lib, not from $3"
}

# ---- 1. pip into a venv. A copy of python/ is installed: an in-tree build would
# leave build/ and *.egg-info in the source tree.
venv=$tmp/venv
"$py" -m venv --system-site-packages "$venv" > "$tmp/venv.log" 2>&1 ||
  { cat "$tmp/venv.log"; fail "$py -m venv --system-site-packages"; }
cp -r "$src/python" "$tmp/pkgsrc"
"$venv/bin/pip" install --no-build-isolation --no-index "$tmp/pkgsrc" > "$tmp/pip.log" 2>&1 ||
  { cat "$tmp/pip.log"; fail "pip install --no-build-isolation --no-index python/"; }
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
[ -f "$site/libckpt/core.py" ] || fail "pip did not install libckpt into $site"
echo "ok: pip install into a venv ($site)"
cd "$elsewhere"
out=$(LIBCKPT_LIBRARY=$library "$venv/bin/python" -c "$probe" "$tmp/r1" "$seed") ||
  fail "import with LIBCKPT_LIBRARY: $out"
check_probe "$out" "$site" "$libdir"
echo "ok: pip-installed, LIBCKPT_LIBRARY"
out=$(LD_LIBRARY_PATH=$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} "$venv/bin/python" -c "$probe" "$tmp/r2" "$seed") ||
  fail "import with LD_LIBRARY_PATH only: $out"
check_probe "$out" "$site" "$libdir"
echo "ok: pip-installed, LD_LIBRARY_PATH only"
# The console script finds the tools beside the library (the build tree's tools/).
help=$(LD_LIBRARY_PATH=$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} "$venv/bin/libckpt" --help) ||
  fail "libckpt --help exited $?"
grep -qF "($build/tools/ckpt-inspect/ckpt-inspect)" <<<"$help" ||
  fail "libckpt --help does not find $build/tools/ckpt-inspect/ckpt-inspect:
$help"
echo "ok: the libckpt script finds the tools"
if ldconfig -p 2>/dev/null | grep -q 'libckpt\.so\.0'; then
  echo "note: libckpt.so.0 is in the loader's cache here; the not-found message is not tried"
else
  if err=$("$venv/bin/python" -c "import libckpt" 2>&1); then
    fail "import libckpt succeeded with no library to find"
  fi
  for want in "LibraryNotFoundError" "LIBCKPT_LIBRARY" "Looked for:" \
              "$(dirname "$(dirname "$site")")" "libckpt.so.0 through the dynamic loader"; do
    grep -qF "$want" <<<"$err" || fail "the ImportError does not say '$want':
$err"
  done
  echo "ok: without a library, the ImportError lists where it looked"
fi

# ---- 2. cmake --install: the package under the prefix finds the prefix's library.
if [ "$install_py" != 1 ]; then
  echo "SKIP: the build does not install the package (CKPT_INSTALL_PYTHON=OFF); pip checked"
  exit 0
fi
prefix=$tmp/prefix
cmake --install "$build" --prefix "$prefix" > "$tmp/install.log" 2>&1 ||
  { cat "$tmp/install.log"; fail "cmake --install $build --prefix $prefix"; }
init=$(find "$prefix" -path '*/libckpt/__init__.py' | head -n1)
[ -n "$init" ] || fail "cmake --install put no libckpt package under $prefix"
pkgsite=$(dirname "$(dirname "$init")")
so=$(find "$prefix" -name libckpt.so.0 | head -n1)
[ -n "$so" ] || fail "no libckpt.so.0 under $prefix"
echo "installed the package into ${pkgsite#"$prefix"/}, the library into $(dirname "${so#"$prefix"/}")"
out=$(PYTHONPATH=$pkgsite "$py" -c "$probe" "$tmp/r3" "$seed") ||
  fail "PYTHONPATH=$pkgsite: import libckpt: $out"
check_probe "$out" "$pkgsite" "$(dirname "$so")"
echo "ok: the installed package finds the prefix's library by itself"
help=$(PYTHONPATH=$pkgsite "$py" -m libckpt --help) || fail "python -m libckpt --help exited $?"
grep -qF "($prefix/bin/ckpt-inspect)" <<<"$help" ||
  fail "python -m libckpt --help does not find $prefix/bin/ckpt-inspect:
$help"
list=$(PYTHONPATH=$pkgsite "$py" -m libckpt inspect "$tmp/r3" list) ||
  fail "python -m libckpt inspect ROOT list: $list"
grep -q '^1 ' <<<"$list" || fail "ckpt-inspect list does not show step 1:
$list"
echo "ok: python -m libckpt runs the prefix's tools"
echo "OK: pip install, cmake --install"
