#!/usr/bin/env bash
# test_safetensors.sh — ckpt-reshard's Hugging Face export and import as a user runs
# them: checkpoint -> model directory -> checkpoint keeps every model tensor bit for
# bit (chunk hashes equal to the source's, and a second export equal to the first);
# a split by --max-shard-size as huggingface_hub makes it, with its index; every file
# checked by st_check.py against the format's rules (and by the safetensors library
# where it is importable: the output says which ran); --dtype bf16/fp16 rounded to
# nearest even; --name-map both ways; and hostile inputs to the import, each with its
# documented exit code, its message naming file and tensor, and nothing committed.
set -u
synth=$1 inspect=$2 reshard=$3
here=$(cd "$(dirname "$0")" && pwd)
# CKPT_PYTHON: an interpreter with numpy (and, where installed, torch and safetensors).
py=${CKPT_PYTHON:-/usr/bin/python3} chk=$here/st_check.py
"$py" -c 'import numpy' 2>/dev/null || { echo "SKIP: numpy is missing for $py (scripts/deps.sh installs python3-numpy)"; exit 77; }
seed=${CKPT_TEST_SEED:-$RANDOM}
echo "CKPT_TEST_SEED=$seed"
root=$(mktemp -d /var/tmp/ckpt-st-XXXXXX)
fail=0
ok()  { echo "ok: $1"; }
bad() { echo "FAIL: $1"; [ $# -gt 1 ] && echo "$2"; fail=1; }
expect_rc() {
  local want=$1 pat=$2 d=$3; shift 3
  out=$("$@" 2>&1); rc=$?
  if [ "$rc" != "$want" ] || ! grep -q -- "$pat" <<<"$out"; then
    bad "$d (rc $rc, want $want, pattern '$pat')" "$out"
  else ok "$d"; fi
}
src=$root/src
"$synth" save --root "$src" --step 5 --bytes 1M --seed "$seed" --chunk 64K >/dev/null || bad "save source"

# ---- export: model tensors only, Hugging Face names, one file
expect_rc 0 "1 file" "export to one model.safetensors" \
  "$reshard" "$src" 5 --export-safetensors "$root/d1" --quiet --buffer 4K
"$py" "$chk" validate "$root/d1" && ok "d1 follows the format rules" || bad "d1 invalid"
"$py" - "$root/d1" "$("$inspect" "$src" show 5 --json)" <<'PY' && ok "names: model tensors only, 'model/' dropped, '/' -> '.'" || bad "export names"
import json, sys
wm = json.load(open(sys.argv[1] + "/model.safetensors.index.json"))["weight_map"]
src = json.loads(sys.argv[2])["tensors"]
want = {t["name"][len("model/"):].replace("/", ".") for t in src if t["kind"] == "model"}
assert set(wm) == want and "layers.0.attn.qkv.weight" in wm, sorted(set(wm) ^ want)
PY
expect_rc 5 "already holds model.safetensors" "an existing export is not overwritten" \
  "$reshard" "$src" 5 --export-safetensors "$root/d1" --quiet

# ---- a name map that restores the checkpoint's names on import, and renames one
"$inspect" "$src" show 5 --json | "$py" -c '
import json, sys
m = {t["name"]: t["name"][len("model/"):].replace("/", ".") for t in json.load(sys.stdin)["tensors"] if t["kind"] == "model"}
m["model/embed.weight"] = "lm_head.weight"
json.dump(m, open(sys.argv[1], "w"))' "$root/map.json"
expect_rc 0 "3 file" "export split by --max-shard-size 100KB, with --name-map" \
  "$reshard" "$src" latest --export-safetensors "$root/d2" --max-shard-size 100KB --name-map "$root/map.json" --quiet
"$py" "$chk" validate "$root/d2" 100000 && ok "d2: shards and index as huggingface_hub makes them" || bad "d2 invalid"
grep -q '"lm_head.weight"' "$root/d2/model.safetensors.index.json" && ! grep -q '"embed.weight"' "$root/d2/model.safetensors.index.json" \
  && ok "--name-map wins over the rule" || bad "--name-map not applied"

# ---- import: the model comes back bit for bit
expect_rc 0 "from 3 file(s)" "import the sharded directory with the map reversed" \
  "$reshard" "$root/r2" --import-safetensors "$root/d2" --step 5 --name-map "$root/map.json" --chunk 64K
a=$("$inspect" "$src" show 5 --chunks --json) b=$("$inspect" "$root/r2" show 5 --chunks --json)
"$py" - "$a" "$b" <<'PY' && ok "imported model tensors: the source's names, shapes, dtypes and chunk hashes" || bad "import differs from the source"
import json, sys
a, b = (json.loads(x) for x in sys.argv[1:])
h = lambda d, kind=None: {t["name"]: (t["dtype"], t["shape"], [c["hash"] for c in t["chunk_list"]])
                          for t in d["tensors"] if kind is None or t["kind"] == kind}
assert h(a, "model") == h(b) and len(h(b)) > 30, sorted(set(h(a, "model")) ^ set(h(b)))
PY
expect_rc 0 "exported" "export the imported step again" \
  "$reshard" "$root/r2" 5 --export-safetensors "$root/d3" --max-shard-size 100KB --name-map "$root/map.json" --quiet
cmp -s "$root/d2/model-00002-of-00003.safetensors" "$root/d3/model-00002-of-00003.safetensors" && "$py" "$chk" same "$root/d2" "$root/d3" \
  && ok "checkpoint -> safetensors -> checkpoint -> safetensors: identical files" || bad "round trip differs"
expect_rc 0 "imported 40 tensors" "import one file, the built-in names" \
  "$reshard" "$root/r2" --import-safetensors "$root/d1/model.safetensors" --step 6
out=$("$inspect" "$root/r2" show 6 --json)
"$py" -c 'import json,sys; n=[t["name"] for t in json.loads(sys.argv[1])["tensors"]]; assert "model/layers.0.attn.qkv.weight" in n and all(x.startswith("model/") for x in n), n' "$out" \
  && ok "built-in import names: model/ + the Hugging Face name" || bad "import names" "$out"
expect_rc 5 "" "importing a step the root holds is refused" \
  "$reshard" "$root/r2" --import-safetensors "$root/d1" --step 6 --quiet

# ---- --dtype: nearest, ties to even
"$reshard" "$src" 5 --export-safetensors "$root/b16" --dtype bf16 --quiet >/dev/null || bad "export bf16"
"$reshard" "$src" 5 --export-safetensors "$root/f16" --dtype fp16 --quiet >/dev/null || bad "export fp16"
"$py" "$chk" validate "$root/b16" >/dev/null && "$py" "$chk" cast "$root/d1" "$root/b16" bf16 && ok "--dtype bf16" || bad "--dtype bf16"
"$py" "$chk" cast "$root/d1" "$root/f16" fp16 && ok "--dtype fp16" || bad "--dtype fp16"

# ---- names: two tensors for one name, and --kind
printf '{"model/layers.0/norm.weight": "x", "model/layers.1/norm.weight": "x"}' >"$root/dup.json"
expect_rc 13 "layers.1/norm.weight" "two tensors mapped to one name: exit 13, both named" \
  "$reshard" "$src" 5 --export-safetensors "$root/d5" --name-map "$root/dup.json" --quiet
[ ! -e "$root/d5/model.safetensors" ] && ok "nothing written" || bad "a refused export wrote files"
expect_rc 13 "both map to" "the same map read backwards on import: exit 13" \
  "$reshard" "$root/r3" --import-safetensors "$root/d1" --step 1 --name-map "$root/dup.json"
expect_rc 0 "exported" "--kind model,optimizer" \
  "$reshard" "$src" 5 --export-safetensors "$root/d6" --kind model,optimizer --quiet
grep -q '"optim.exp_avg.model.layers.0.attn.qkv.weight"' "$root/d6/model.safetensors.index.json" \
  && ok "other kinds keep their folder" || bad "optimizer names"
expect_rc 2 "--max-shard-size" "bad --max-shard-size" "$reshard" "$src" 5 --export-safetensors "$root/x" --max-shard-size 5XB
expect_rc 2 "--dtype" "bad --dtype" "$reshard" "$src" 5 --export-safetensors "$root/x" --dtype fp8
expect_rc 2 "needs --step" "import without --step" "$reshard" "$root/r3" --import-safetensors "$root/d1"

# ---- hostile inputs: the documented exit code, the file and tensor named, no crash,
# nothing committed
"$py" "$chk" hostile "$root/h" >"$root/cases" || bad "hostile inputs"
n=0
while IFS=$'\t' read -r case path code text; do
  out=$("$reshard" "$root/rh" --import-safetensors "$path" --step $((n + 10)) --quiet 2>&1); rc=$?
  if [ "$rc" != "$code" ] || ! grep -qF -- "$text" <<<"$out"; then
    bad "hostile $case: rc $rc, want $code and '$text'" "$out"
  elif [ "$code" != 0 ] && "$inspect" "$root/rh" show $((n + 10)) >/dev/null 2>&1; then
    bad "hostile $case: the step was committed"
  else ok "hostile $case: exit $rc"; fi
  n=$((n + 1))
done <"$root/cases"
[ "$n" -gt 20 ] || bad "only $n hostile cases ran"
out=$("$reshard" "$root/rh" --import-safetensors "$root/h/overlap.safetensors" --step 99 --json 2>/dev/null)
"$py" -c 'import json,sys; d=json.loads(sys.argv[1]); assert d["op"]=="import" and d["ok"] is False and d["exit"]==11 and "overlap" in d["error"], d' "$out" \
  && ok "--json: one error object" || bad "import --json" "$out"

[ $fail = 0 ] && rm -rf "$root"
exit $fail
