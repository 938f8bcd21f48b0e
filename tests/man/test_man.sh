#!/usr/bin/env bash
# test_man.sh — every manual page in docs/man renders without a warning: groff with
# all warnings on (-ww), and man -l as a reader opens it; and the pages cover the
# library, each tool and ckptd (a tool folder without its page fails).
# Usage: test_man.sh DOCS_MAN_DIR TOOLS_DIR
set -euo pipefail
shopt -s nullglob
mandir=$1 tools=$2
for t in groff man; do
  command -v "$t" >/dev/null || { echo "SKIP: $t not found (scripts/deps.sh installs groff-base, man-db)"; exit 77; }
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
expect=(libckpt.3)
for d in "$tools"/ckpt-*/; do
  expect+=("$(basename "$d").1")
done
[ -d "$tools/../ckptd" ] && expect+=(ckptd.8)   # the service beside the tools
for page in "${expect[@]}"; do
  [ -f "$mandir/$page" ] || { echo "FAIL: no manual page $page"; fail=1; }
done
for f in "$mandir"/*.[1-8]; do
  page=$(basename "$f")
  if LC_ALL=C grep -nP '[^\x00-\x7f]' "$f"; then
    echo "FAIL: $page: bytes outside ASCII (write them as troff escapes)"; fail=1
  fi
  groff -man -Tutf8 -ww -z "$f" 2> "$tmp/groff" || { echo "FAIL: $page: groff exited $?"; fail=1; }
  LC_ALL=C.UTF-8 MANWIDTH=80 man -l "$f" > "$tmp/out" 2> "$tmp/man" ||
    { echo "FAIL: $page: man -l exited $?"; fail=1; }
  if [ -s "$tmp/groff" ] || [ -s "$tmp/man" ]; then
    echo "FAIL: $page: warnings:"; cat "$tmp/groff" "$tmp/man"; fail=1
  fi
  name=${page%.*}
  grep -q "^NAME" "$tmp/out" && grep -q "^ *$name " "$tmp/out" ||
    { echo "FAIL: $page: no NAME section naming $name"; fail=1; }
  echo "rendered $page: $(wc -l < "$tmp/out") lines"
done
[ $fail -eq 0 ] && echo "OK: ${#expect[@]} pages"
exit $fail
