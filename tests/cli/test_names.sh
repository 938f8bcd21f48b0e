#!/usr/bin/env bash
# test_names.sh — a root saved by an older version, holding tensor names that are not
# UTF-8 (overlong, surrogate, above U+10FFFF, truncated, lone continuation): every
# --json output of the tools is valid JSON (such bytes become U+FFFD; show adds
# name_hex, the stored bytes), a damaged chunk of such a tensor is named in valid
# JSON, the safetensors export refuses the name (exit 13, nothing written), and a
# reshard cannot write it into a new checkpoint (the save API refuses it).
set -u
mklegacy=$1 synth=$2 inspect=$3 reshard=$4
py=/usr/bin/python3
[ -x "$py" ] || { echo "SKIP: $py is missing (the JSON checks need it)"; exit 77; }
root=$(mktemp -d /var/tmp/ckpt-names-XXXXXX)
r=$root/r
fail=0
ok()  { echo "ok: $1"; }
bad() { echo "FAIL: $1"; [ $# -gt 1 ] && echo "$2"; fail=1; }
# valid_json DESCRIPTION PYTHON-EXPR-OVER-d < output: the whole stdout is one JSON
# document (parsed strictly: json.load of the bytes as UTF-8) and the expression holds.
valid_json() {
  local out; out=$(cat; echo x); out=${out%x}
  if printf '%s' "$out" | "$py" -c '
import json, sys
d = json.loads(sys.stdin.buffer.read().decode("utf-8"))
assert (eval(sys.argv[1])), d' "$2" 2>/tmp/pyerr.$$; then ok "$1"
  else bad "$1" "$(cat /tmp/pyerr.$$) :: $(printf '%s' "${out:0:800}" | od -c | head -20)"; fi
  rm -f /tmp/pyerr.$$
}

"$mklegacy" "$r" 5 || { bad "build the legacy root"; exit 1; }
"$synth" save --root "$r" --step 6 --bytes 1M --seed 3 >/dev/null 2>&1 || bad "save step 6"

"$inspect" "$r" list --json | valid_json "list --json" "[s['step'] for s in d['steps']]==[5,6]"
"$inspect" "$r" list --all --json | valid_json "list --all --json" "len(d['steps'])==2"
"$inspect" "$r" show 5 --json | valid_json "show --json: five names with U+FFFD, name_hex holds the stored bytes" "
(lambda ns, t: len([n for n in ns if '\ufffd' in n])==5
  and 'ok/\u03b1\u03b2/\u65e5/\U0001F600' in ns and 'ok/plain' in ns
  and sorted(bytes.fromhex(x['name_hex']) for x in t if 'name_hex' in x)==sorted([
    b'legacy/overlong-\xc0\xaf', b'legacy/surrogate-\xed\xa0\x80', b'legacy/above-\xf4\x90\x80\x80',
    b'legacy/truncated-\xe2\x82', b'legacy/continuation-\x80'])
  and all('name_hex' not in x for x in t if x['name'].startswith('ok/')))([x['name'] for x in d['tensors']], d['tensors'])"
"$inspect" "$r" show latest --chunks --json | valid_json "show latest --chunks --json" "d['step']==6"
"$inspect" "$r" show 5 --chunks --json | valid_json "show --chunks --json" "all(t['chunk_list'] for t in d['tensors'])"
"$inspect" "$r" diff 5 6 --json | valid_json "diff --json: the legacy names removed" \
  "len([n for n in d['removed'] if n.startswith('legacy/') and '\ufffd' in n])==5 and len(d['added'])>40"
"$inspect" "$r" verify 5 --json --quiet 2>/dev/null | valid_json "verify --json" "d['ok'] and d['steps'][0]['step']==5"
"$inspect" "$r" verify all --json --quiet --no-mark 2>/dev/null | valid_json "verify all --json" "d['ok'] and len(d['steps'])==2"
"$inspect" "$r" gc --dry-run --json | valid_json "gc --dry-run --json" "d['ok']"
out=$("$inspect" "$r" show 5 2>&1) && grep -q "ok/plain" <<<"$out" && ok "show (human) lists the step" || bad "show human" "$out"

# A flipped bit in the chunk of a tensor whose name is not UTF-8: named, in valid JSON.
info=$("$inspect" "$r" show 5 --chunks --json | "$py" -c "
import json,sys; d=json.load(sys.stdin)
t=[t for t in d['tensors'] if t.get('name_hex')==b'legacy/overlong-\xc0\xaf'.hex()][0]; c=t['chunk_list'][0]
print(c['file'], c['offset'])")
read -r file off <<<"$info"
flip() {
  "$py" - "$r/$file" "$((off + 10))" <<'PY'
import sys
with open(sys.argv[1], 'r+b') as f:
    f.seek(int(sys.argv[2])); b = f.read(1); f.seek(int(sys.argv[2])); f.write(bytes([b[0] ^ 0x40]))
PY
}
flip
out=$("$inspect" "$r" verify 5 --json --quiet 2>/dev/null); rc=$?
[ $rc = 1 ] && ok "verify of the damaged legacy tensor exits 1" || bad "verify damaged rc $rc"
printf '%s' "$out" | valid_json "verify --json names the damaged tensor (U+FFFD) in valid JSON" \
  "not d['ok'] and d['steps'][0]['bad']['tensor']=='legacy/overlong-\ufffd\ufffd' and d['code']==-1001 and d['exit']==1 and 'overlong' in d['error']"
flip

# The safetensors export refuses the name, writes nothing, and says which tensor.
out=$("$reshard" "$r" 5 --export-safetensors "$root/m" --kind all --quiet 2>&1); rc=$?
if [ $rc = 13 ] && grep -q 'legacy/' <<<"$out" && grep -q 'UTF-8' <<<"$out" && [ ! -e "$root/m" ]; then
  ok "export refuses a name that is not UTF-8 (exit 13, named, nothing written)"
else bad "export of legacy names (rc $rc)" "$out"; fi
grep -q 'legacy/[a-z]*-\\x' <<<"$out" && ok "the refusal quotes the bad bytes as \\xNN" || bad "refusal quoting" "$out"
"$reshard" "$r" 5 --export-safetensors "$root/m" --kind all --json 2>/dev/null | valid_json \
  "export --json: one error object" "d['op']=='export' and d['ok'] is False and d['exit']==13 and d['code']==-1007 and 'UTF-8' in d['error']"
out=$("$reshard" "$r" 5 --export-safetensors "$root/m" --kind optimizer --json 2>/dev/null)
printf '%s' "$out" | valid_json "export --kind that leaves the names out succeeds" "d['ok'] and d['tensors']==0"
"$py" - "$root/m/model.safetensors" <<'PY' && ok "its header is valid UTF-8 JSON" || bad "export header"
import json, struct, sys
b = open(sys.argv[1], 'rb').read(); n = struct.unpack('<Q', b[:8])[0]
json.loads(b[8:8 + n].decode('utf-8'))
PY

# A reshard would save the names anew: the save API refuses them, the run fails cleanly.
out=$("$reshard" "$r" 5 --world 1 --out "$root/o" --json 2>/dev/null); rc=$?
[ $rc = 1 ] && ok "reshard of legacy names exits 1" || bad "reshard rc $rc" "$out"
printf '%s' "$out" | valid_json "reshard --json: valid, names the refusal" \
  "d['ok'] is False and d['exit']==1 and d['code']==-1007 and '\\\\x' in d['error'] and not d['ranks'][0]['ok']"
out=$("$inspect" "$root/o" list --json 2>/dev/null)
printf '%s' "$out" | valid_json "nothing was committed in the output" "d['steps']==[]"

[ $fail = 0 ] && rm -rf "$root"
exit $fail
