# lib.sh — what the command-line tests share, sourced by them: ok and bad keep the
# count of failures in $fail (set it to 0 first); expect_rc runs a command and checks
# its exit code and output; pycheck asserts a Python expression over a JSON text.
ok()   { echo "ok: $1"; }
bad()  { echo "FAIL: $1"; [ $# -gt 1 ] && echo "$2"; fail=1; }
expect_rc() {  # expect_rc RC PATTERN DESCRIPTION COMMAND...
  local want=$1 pat=$2 d=$3; shift 3
  out=$("$@" 2>&1); rc=$?
  if [ "$rc" != "$want" ] || ! grep -q -- "$pat" <<<"$out"; then
    bad "$d (rc $rc, want $want, pattern '$pat')" "$out"
  else ok "$d"; fi
}
pycheck() {  # pycheck DESCRIPTION JSON PYTHON-EXPR-OVER-d
  if /usr/bin/python3 -c "import json,sys; d=json.loads(sys.argv[1]); assert ($3), d" "$2" 2>/tmp/pyerr.$$; then ok "$1"
  else bad "$1" "$(cat /tmp/pyerr.$$) :: ${2:0:600}"; fi
  rm -f /tmp/pyerr.$$
}
