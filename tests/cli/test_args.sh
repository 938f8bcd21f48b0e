#!/usr/bin/env bash
# test_args.sh — the command lines of ckpt-synth, ckpt-inspect and ckpt-reshard, option
# by option: every numeric, size and enum value must parse whole and in range (no
# sign, no trailing bytes, no overflowing suffix), or the tool exits with the usage
# code and a message naming the option and the value; and under --json every failure
# (usage errors wherever --json stands, open failures, unknown steps, refusals)
# prints exactly one JSON object {"op", "ok": false, "error", "code", "exit"} on
# stdout. Also: verify of a missing step names that step in JSON, and --no-mark on a
# writable root does not call the root read-only. docs/ckpt-*.md hold the rules.
set -u
synth=$1 inspect=$2 reshard=$3
py=/usr/bin/python3
[ -x "$py" ] || { echo "SKIP: $py is missing (the JSON checks need it)"; exit 77; }
root=$(mktemp -d /var/tmp/ckpt-args-XXXXXX)
r=$root/r
fail=0
ok()  { echo "ok: $1"; }
bad() { echo "FAIL: $1"; [ $# -gt 1 ] && echo "$2"; fail=1; }

# check RC PATTERN CMD... — CMD holds the word @J once: run without it (exit RC,
# PATTERN on stderr, nothing on stdout), then with --json in its place (exit RC, and
# stdout exactly one JSON object: ok false, exit RC, a negative code, PATTERN in
# error).
check() {
  local want=$1 pat=$2; shift 2
  local plain=() json=() a
  for a in "$@"; do
    [ "$a" = @J ] && { json+=(--json); continue; }
    plain+=("$a"); json+=("$a")
  done
  local d="${plain[*]:1}"
  local err out rc
  err=$("${plain[@]}" 2>&1 >/dev/null); rc=$?
  out=$("${plain[@]}" 2>/dev/null)
  if [ "$rc" != "$want" ] || ! grep -qF -- "$pat" <<<"$err"; then
    bad "$d: rc $rc (want $want), stderr should hold '$pat'" "$err"
  elif [ "$want" = 2 ] && [ -n "$out" ]; then
    bad "$d: a usage error printed on stdout" "$out"
  else
    ok "$d: exit $want, '$pat'"
  fi
  out=$("${json[@]}" 2>/dev/null); rc=$?
  if [ "$rc" != "$want" ]; then bad "$d --json: rc $rc (want $want)" "$out"; return; fi
  if printf '%s' "$out" | "$py" -c '
import json, sys
d = json.loads(sys.stdin.buffer.read().decode("utf-8"))
want, pat = int(sys.argv[1]), sys.argv[2]
assert isinstance(d, dict), d
assert d["ok"] is False and d["exit"] == want, d
assert isinstance(d["code"], int) and d["code"] < 0, d
assert pat in d["error"], (pat, d)
assert d.get("op", None) is None or isinstance(d["op"], str), d
if want == 2: assert d["code"] == -22, d
' "$want" "$pat" 2>/tmp/pyerr.$$; then ok "$d --json: one error object"
  else bad "$d --json" "$(cat /tmp/pyerr.$$) :: ${out:0:600}"; fi
  rm -f /tmp/pyerr.$$
}

"$synth" save --root "$r" --step 1 --bytes 1M --seed 1 >/dev/null 2>&1 || { bad "save step 1"; exit 1; }
"$synth" save --root "$r" --step 2 --bytes 1M --seed 2 >/dev/null 2>&1 || bad "save step 2"
S=(--root "$root/s" --step 3 --bytes 1M --seed 1)

# ---------------------------------------------------------------- ckpt-synth
for v in 2x 0 4097 -1 " 2" +2 ""; do check 2 "--world '$v'" "$synth" save @J "${S[@]}" --world "$v"; done
for v in abc -1 1x 0x 0xg 18446744073709551616 " 7" 1e3; do
  check 2 "--seed '$v'" "$synth" save @J "${S[@]}" --seed "$v"; done
for v in zstd:abc zstd:-1 zstd:0 zstd:23 zstd: zstd:3x gzip ZSTD ""; do
  check 2 "--compress '$v'" "$synth" save @J "${S[@]}" --compress "$v"; done
for v in -2 2x abc 18446744073709551615 18446744073709551616 " 1" +1 0x10 ""; do
  check 2 "--step '$v'" "$synth" save @J --root "$root/s" --bytes 1M --seed 1 --step "$v"; done
check 2 "--step 'latest2'" "$synth" verify @J --root "$r" --bytes 1M --seed 1 --step latest2
check 2 "not latest" "$synth" save @J "${S[@]}" --step latest
for v in 12Q 0 -1 1.5M 5i 1KiBB 99999999999999999999 16777216T " 1M" 1M2 ""; do
  check 2 "--bytes '$v'" "$synth" save @J --root "$root/s" --step 3 --seed 1 --bytes "$v"; done
# A size that parses but is beyond any model: refused with a reason, not run.
check 2 "--bytes '16000000T'" "$synth" save @J --root "$root/s" --step 3 --seed 1 --bytes 16000000T
for v in 5000 0 2G 1K 4096x -4096; do check 2 "--chunk '$v'" "$synth" save @J "${S[@]}" --chunk "$v"; done
for v in 1 4K 1.5M x; do check 2 "--pool '$v'" "$synth" save @J "${S[@]}" --pool "$v"; done
check 2 "smaller than two chunks" "$synth" save @J "${S[@]}" --chunk 1M --pool 1M
check 2 "unknown option '--wrld'" "$synth" save @J "${S[@]}" --wrld 2
check 2 "'--s' is ambiguous" "$synth" save @J "${S[@]}" --s 1
check 2 "'--world' needs a value" "$synth" save "${S[@]}" @J --world
check 2 "'--json' takes no value" "$synth" save "${S[@]}" --json=yes @J
check 2 "unexpected argument 'extra'" "$synth" save @J "${S[@]}" extra
check 2 "does not take --no-rng" "$synth" save @J "${S[@]}" --no-rng
check 2 "required" "$synth" save @J --root "$root/s"
check 2 "unknown command 'frob'" "$synth" frob @J "${S[@]}"
check 2 "RANK='x'" env RANK=x WORLD_SIZE=2 "$synth" save @J "${S[@]}"
check 2 "RANK='2'" env RANK=2 WORLD_SIZE=2 "$synth" save @J "${S[@]}"
# --json before the bad option and after it: both give the object.
out=$("$synth" save --json "${S[@]}" --world 2x 2>/dev/null)
printf '%s' "$out" | "$py" -c 'import json,sys; d=json.load(sys.stdin); assert d["op"]=="save" and not d["ok"]' \
  && ok "synth: --json before the bad value" || bad "synth --json first" "$out"
[ ! -e "$root/s" ] && ok "synth: no bad value created the root" || bad "a refused command created $root/s"
# A failure that is not a usage error: one object with the library's code.
check 1 "save failed on rank 0" "$synth" save @J --root "$r" --step 1 --bytes 1M --seed 1
check 1 "verify failed on rank 0" "$synth" verify @J --root "$r" --step 77 --bytes 1M --seed 1
out=$("$synth" verify --root "$r" --step 1 --bytes 1M --seed 9 --json 2>/dev/null); rc=$?
printf '%s' "$out" | "$py" -c 'import json,sys; d=json.load(sys.stdin); assert d["ok"] is False and d["mismatches"]>0 and d["code"]==-1001 and d["exit"]==1 and "mismatch" in d["error"], d' \
  && [ $rc = 1 ] && ok "synth verify with another seed: mismatches in one object, exit 1" || bad "synth mismatch json (rc $rc)" "$out"
out=$("$synth" verify --root "$r" --step 1 --bytes 1M --seed 1 --json 2>/dev/null)
printf '%s' "$out" | "$py" -c 'import json,sys; d=json.load(sys.stdin); assert d["ok"] is True and "error" not in d, d' \
  && ok "synth verify: success has no error fields" || bad "synth verify ok json" "$out"

# ---------------------------------------------------------------- ckpt-inspect
for v in 1x abc 18446744073709551615 " 1" +1 0x1 ""; do
  check 2 "'$v' is not a step" "$inspect" "$r" show @J "$v"; done
check 2 "unknown option '-1'" "$inspect" "$r" show @J -1
check 2 "'x' is not a step" "$inspect" "$r" diff @J 1 x
check 2 "'-3' is not a step" "$inspect" "$r" verify @J -- -3
for o in --keep-last --keep-every; do
  for v in 0 -1 1x " 5" 99999999999999999999 ""; do check 2 "$o '$v'" "$inspect" "$r" gc @J --dry-run "$o" "$v"; done
done
for v in -1 1.5 5s ""; do check 2 "--min-age '$v'" "$inspect" "$r" gc @J --dry-run --min-age "$v"; done
check 2 "'--keep-last' needs a value" "$inspect" "$r" gc @J --dry-run --keep-last
check 2 "unknown option '--bogus'" "$inspect" "$r" list @J --bogus
check 2 "ambiguous" "$inspect" "$r" gc @J --keep 1
check 2 "list does not take --dry-run" "$inspect" "$r" list @J --dry-run
check 2 "too many arguments" "$inspect" "$r" diff @J 1 2 3
check 2 "show needs one STEP" "$inspect" "$r" show @J
check 2 "unknown command 'frob'" "$inspect" "$r" frob @J
check 4 "No such file" "$inspect" "$root/missing" list @J
check 4 "not a directory" "$inspect" "$r/manifest/data.mdb" list @J
mkdir -p "$root/other"; echo hi > "$root/other/file"
check 4 "not a checkpoint root" "$inspect" "$root/other" list @J
check 4 "not a checkpoint root" "$inspect" "$root/other" gc @J
check 4 "not a checkpoint root" "$inspect" "$root/other" rebuild @J
check 3 "step 77" "$inspect" "$r" show @J 77
check 3 "step 77" "$inspect" "$r" diff @J 1 77
check 1 "holds" "$inspect" "$r" rebuild @J
[ ! -e "$root/missing" ] && ok "inspect: a missing root is not created" || bad "missing root created"

# verify of a step that does not exist: the JSON names that step.
out=$("$inspect" "$r" verify 999 --json 2>/dev/null); rc=$?
printf '%s' "$out" | "$py" -c 'import json,sys; d=json.load(sys.stdin); s=d["steps"][0]
assert s["step"]==999 and s["ok"] is False and s["code"]==-1004 and "999" in s["error"], d
assert d["ok"] is False and d["exit"]==3 and d["code"]==-1004 and "999" in d["error"], d' \
  && [ $rc = 3 ] && ok "verify 999 --json names step 999 (exit 3)" || bad "verify 999 --json (rc $rc)" "$out"
out=$("$inspect" "$r" verify latest --json --quiet --no-mark 2>/dev/null)
printf '%s' "$out" | "$py" -c 'import json,sys; d=json.load(sys.stdin); assert d["steps"][0]["step"]==2 and d["ok"], d' \
  && ok "verify latest --json names the step it verified" || bad "verify latest json" "$out"
mkdir -p "$root/empty"
"$inspect" "$root/empty" rebuild >/dev/null 2>&1
out=$("$inspect" "$root/empty" verify --json 2>/dev/null); rc=$?
printf '%s' "$out" | "$py" -c 'import json,sys; d=json.load(sys.stdin); assert d["steps"][0]["step"] is None and d["exit"]==3, d' \
  && [ $rc = 3 ] && ok "verify latest of a root without steps: step null, exit 3" || bad "verify empty root (rc $rc)" "$out"
# --no-mark on a writable root: not marked because it was asked, not "read-only".
out=$("$inspect" "$r" verify 1 --no-mark --quiet 2>&1); rc=$?
if [ $rc = 0 ] && grep -q "not marked (--no-mark)" <<<"$out" && ! grep -qi "read-only" <<<"$out"; then
  ok "verify --no-mark on a writable root says --no-mark, not read-only"
else bad "verify --no-mark (rc $rc)" "$out"; fi
out=$("$inspect" "$r" list --json)
printf '%s' "$out" | "$py" -c 'import json,sys; d=json.load(sys.stdin); assert d["ok"] is True and [s["trust"] for s in d["steps"]]==["committed","committed"], d' \
  && ok "--no-mark left the trust as it was" || bad "trust after --no-mark" "$out"

# ---------------------------------------------------------------- ckpt-reshard
R=("$r" 1 --out "$root/o" --drop-rank-bound)
for v in 2x 0 65537 -1 ""; do check 2 "--world '$v'" "$reshard" @J "${R[@]}" --world "$v"; done
for v in -1 x 18446744073709551615; do check 2 "--step '$v'" "$reshard" @J "${R[@]}" --world 1 --step "$v"; done
for v in 5000 0 2G -4K 1.5M; do check 2 "--chunk '$v'" "$reshard" @J "${R[@]}" --world 1 --chunk "$v"; done
for v in 1 x 99999999999999999999; do check 2 "--pool '$v'" "$reshard" @J "${R[@]}" --world 1 --pool "$v"; done
check 2 "smaller than two chunks" "$reshard" @J "${R[@]}" --world 1 --chunk 1M --pool 1M
for v in zstd:abc zstd:0 zstd:-1 zstd:23 lz4; do check 2 "--compress '$v'" "$reshard" @J "${R[@]}" --world 1 --compress "$v"; done
for v in 0 65536 80x -1; do check 2 "--port '$v'" "$reshard" @J "${R[@]}" --world 1 --port "$v"; done
for v in "0,,1" "0,x" "-1,0" "0," "0,1,2" " 0,1" "2147483648,0"; do
  check 2 "--rank-map '$v'" "$reshard" @J "$r" 1 --out "$root/o" --world 2 --rank-map "$v"; done
check 2 "saved rank 5 does not exist" "$reshard" @J "$r" 1 --out "$root/o" --world 2 --rank-map 5,-
for v in 0 1x -1; do check 2 "--buffer '$v'" "$reshard" @J "$r" 1 --export-safetensors "$root/x" --buffer "$v"; done
check 2 "--kind 'weights'" "$reshard" @J "$r" 1 --export-safetensors "$root/x" --kind weights
check 2 "--kind applies to --export-safetensors only" "$reshard" @J "${R[@]}" --world 1 --kind model
check 2 "--buffer applies to --export-safetensors only" "$reshard" @J "${R[@]}" --world 1 --buffer 1M
check 2 "does not combine" "$reshard" @J "$r" 1 --export-safetensors "$root/x" --compress zstd
check 2 "exclude each other" "$reshard" @J "$r" 1 --out "$root/o" --world 1 --drop-rank-bound --rank-map 0
for v in abc +1 18446744073709551615; do check 2 "'$v' is not a step" "$reshard" @J "$r" "$v" --world 1 --out "$root/o"; done
check 2 "unknown option '-1'" "$reshard" @J "$r" -1 --world 1 --out "$root/o"
check 2 "'-1' is not a step" "$reshard" @J --world 1 --out "$root/o" -- "$r" -1
check 2 "ROOT and STEP are required" "$reshard" @J "$r" --world 1 --out "$root/o"
check 2 "required" "$reshard" @J "$r" 1
check 2 "unknown option '--wrold'" "$reshard" @J "${R[@]}" --wrold 1
check 2 "'--out' needs a value" "$reshard" "$r" 1 --world 1 @J --out
check 2 "the source root" "$reshard" @J "$r" 1 --world 1 --out "$r" --drop-rank-bound
check 4 "No such file" "$reshard" @J "$root/missing" 1 --world 1 --out "$root/o"
check 3 "step 77" "$reshard" @J "$r" 77 --world 1 --out "$root/o"
check 3 "step 77" "$reshard" @J "$r" 77 --export-safetensors "$root/x"
check 7 "rank-bound" "$reshard" @J "$r" 1 --world 1 --out "$root/o"
check 6 "cannot be split" "$reshard" @J "${R[@]}" --world 65536
check 4 "not empty and not a checkpoint root" "$reshard" @J "$r" 1 --world 1 --out "$root/other" --drop-rank-bound
[ ! -e "$root/o" ] && [ ! -e "$root/x" ] && ok "reshard: no refused command wrote anything" || bad "a refused reshard wrote output"
out=$("$reshard" "$r" 1 --export-safetensors "$root/x" --json --quiet 2>/dev/null)
printf '%s' "$out" | "$py" -c 'import json,sys; d=json.load(sys.stdin); assert d["op"]=="export" and d["ok"] is True, d' \
  && ok "export --json succeeds with valid values" || bad "export ok" "$out"
"$reshard" "$r" 1 --world 1 --out "$root/o3" --drop-rank-bound --quiet >/dev/null 2>&1 || bad "reshard into o3"
check 5 "already holds step 1" "$reshard" @J "$r" 1 --world 1 --out "$root/o3" --drop-rank-bound

[ $fail = 0 ] && rm -rf "$root"
exit $fail
