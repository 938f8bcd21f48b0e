#!/usr/bin/env bash
# run_pytest.sh MODULE... — the Python binding's pytest files as one ctest each.
# The package is taken from the source tree (python/), the library from
# LIBCKPT_LIBRARY (the build's libckpt.so, set by tests/python/CMakeLists.txt), the
# tools beside it in the build tree (LIBCKPT_TOOLS_DIR is unset so that the package's
# own search is what runs). CKPT_TEST_SEED is passed through (one is drawn and
# printed when unset).
# Exit 77 (a visible skip) when the interpreter, pytest or numpy cannot be imported,
# and when pytest ran nothing but skips (a file for a newer torch, or for CUDA): the
# reasons are in the -rs summary above it.
set -uo pipefail
[ $# -gt 0 ] || { echo "usage: run_pytest.sh MODULE..." >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
py=${CKPT_TEST_PYTHON:-/usr/bin/python3}

if ! command -v "$py" >/dev/null 2>&1; then
  echo "SKIP: no Python interpreter $py (scripts/deps.sh installs python3)"
  exit 77
fi
for mod in pytest numpy; do
  if ! err=$("$py" -c "import $mod" 2>&1); then
    echo "SKIP: $py cannot import $mod (scripts/deps.sh installs python3-$mod): ${err##*$'\n'}"
    exit 77
  fi
done
if [ -z "${LIBCKPT_LIBRARY:-}" ] || [ ! -e "$LIBCKPT_LIBRARY" ]; then
  echo "FAIL: LIBCKPT_LIBRARY='${LIBCKPT_LIBRARY:-}' is not a built libckpt.so"
  exit 1
fi
export LIBCKPT_LIBRARY
export PYTHONPATH=$src/python${PYTHONPATH:+:$PYTHONPATH}
unset LIBCKPT_TOOLS_DIR
export CKPT_TEST_SEED=${CKPT_TEST_SEED:-$(date +%s)}
echo "CKPT_TEST_SEED=$CKPT_TEST_SEED"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# No cache in the source tree; the junit report counts what ran and what skipped.
"$py" -m pytest -q -rs -p no:cacheprovider --junitxml="$tmp/report.xml" "$@"
rc=$?
# 0: passed (perhaps all skipped); 5: nothing collected (a module skipped whole
# by importorskip is reported so too). Anything else is a failure.
[ $rc -eq 0 ] || [ $rc -eq 5 ] || exit $rc
counts=$("$py" - "$tmp/report.xml" <<'PY'
import sys
import xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
tests = sum(int(s.get("tests", 0)) for s in suites)
skipped = sum(int(s.get("skipped", 0)) for s in suites)
print(tests, skipped)
PY
) || { echo "FAIL: cannot read pytest's report"; exit 1; }
read -r tests skipped <<<"$counts"
if [ "$tests" -gt 0 ] && [ "$tests" -eq "$skipped" ]; then
  echo "SKIP: all $tests tests of $* skipped (the reasons are listed above)"
  exit 77
fi
[ $rc -eq 0 ] || { echo "FAIL: pytest collected no test from $*"; exit 1; }
exit 0
