#!/usr/bin/env bash
# test_reshard.sh — ckpt-reshard as a user runs it, for what this build can save
# (one rank): 1 -> 1 with the same chunk hashes for the same bytes, the result read
# back as 1..6 ranks by ckpt-synth verify; rank-bound state refused unless mapped
# or dropped; the safetensors export parsed with Python's standard library and its
# bytes compared with the stored chunks (which ckpt-synth verify has compared with
# the regenerated model); bad input. Multi-rank output: test_reshard_multi.sh.
set -u
synth=$1 inspect=$2 reshard=$3
root=$(mktemp -d /var/tmp/ckpt-reshard-XXXXXX)
src=$root/src
fail=0
ok()   { echo "ok: $1"; }
bad()  { echo "FAIL: $1"; [ $# -gt 1 ] && echo "$2"; fail=1; }
expect_rc() {
  local want=$1 pat=$2 d=$3; shift 3
  out=$("$@" 2>&1); rc=$?
  if [ "$rc" != "$want" ] || ! grep -q -- "$pat" <<<"$out"; then
    bad "$d (rc $rc, want $want, pattern '$pat')" "$out"
  else ok "$d"; fi
}
"$synth" save --root "$src" --step 5 --bytes 3M --seed 9 --chunk 64K >/dev/null || bad "save source"

# ---- rank-bound state: refused, then mapped explicitly or dropped
expect_rc 7 "rng" "rank-bound items refused without a map" \
  "$reshard" "$src" 5 --world 1 --out "$root/o1"
expect_rc 0 "resharded step 5" "1 -> 1 with --rank-map 0" \
  "$reshard" "$src" 5 --world 1 --out "$root/o1" --rank-map 0
for w in 1 2 3 5 6; do
  expect_rc 0 "0 mismatches" "the 1 -> 1 output reads back as $w rank(s)" \
    "$synth" verify --root "$root/o1" --step 5 --bytes 3M --seed 9 --world "$w"
done
a=$("$inspect" "$src" show 5 --chunks --json) b=$("$inspect" "$root/o1" show 5 --chunks --json)
/usr/bin/python3 - "$a" "$b" <<'PY' && ok "same bytes keep the same chunk hashes" || bad "chunk hashes differ after 1 -> 1"
import json, sys
a, b = (json.loads(x) for x in sys.argv[1:])
h = lambda d: {t['name']: [c['hash'] for c in t['chunk_list']] for t in d['tensors']}
assert h(a) == h(b) and len(h(a)) > 40, (len(h(a)), len(h(b)))
PY
out=$("$reshard" "$src" 5 --world 1 --out "$root/o2" --step 6 --drop-rank-bound --json --compress zstd 2>/dev/null)
/usr/bin/python3 -c "import json,sys; d=json.loads(sys.argv[1]); assert d['ok'] and d['to_step']==6 and d['world']==1 and d['ranks'][0]['ok'], d" "$out" \
  && ok "--drop-rank-bound --step 6 --json" || bad "--drop-rank-bound --json" "$out"
out=$("$inspect" "$root/o2" show 6 --json)
/usr/bin/python3 -c "import json,sys; d=json.loads(sys.argv[1]); n=[t['name'] for t in d['tensors']]; assert 'rng' not in n and 'scheduler' in n and d['stored_bytes']<d['logical_bytes'], n" "$out" \
  && ok "dropped rank-bound item absent, replicated item present, output compressed" || bad "o2 contents" "$out"
expect_rc 1 "'rng' is not in step" "a dropped RNG blob is missing on verify" \
  "$synth" verify --root "$root/o2" --step 6 --bytes 3M --seed 9

# ---- 1 -> N (N > 1): writes N shard files, which needs multi-rank saves
out=$("$reshard" "$src" 5 --world 3 --out "$root/o3" --rank-map 0,-,- 2>&1); rc=$?
if [ $rc = 8 ]; then
  grep -q "distributed commit" <<<"$out" && ok "1 -> 3 reports that multi-rank saves are not in this build (exit 8)" \
    || bad "exit 8 without the reason" "$out"
elif [ $rc = 0 ]; then
  expect_rc 0 "0 mismatches" "1 -> 3 output verifies as 2 ranks" \
    "$synth" verify --root "$root/o3" --step 5 --bytes 3M --seed 9 --world 2
else bad "1 -> 3 (rc $rc)" "$out"; fi

# ---- safetensors export (the Hugging Face side: test_safetensors.sh); here with
# the checkpoint's own names kept through --name-map, every kind
"$inspect" "$src" show 5 --json | /usr/bin/python3 -c '
import json, sys
json.dump({t["name"]: t["name"] for t in json.load(sys.stdin)["tensors"]}, open(sys.argv[1], "w"))' "$root/ident.json"
expect_rc 0 "exported step 5" "export to safetensors (streamed in 4 KiB slabs)" \
  "$reshard" "$src" latest --export-safetensors "$root/m" --buffer 4K --kind all --name-map "$root/ident.json"
expect_rc 0 "exported" "export --kind model" \
  "$reshard" "$src" 5 --export-safetensors "$root/mm" --kind model --name-map "$root/ident.json" --quiet
mode=$(stat -c %a "$root/m/model.safetensors")
[ "$mode" = 600 ] && ok "the exported weights are private (0600)" || bad "exported file mode $mode, want 600"
"$inspect" "$src" show 5 --chunks --json > "$root/show.json"
/usr/bin/python3 - "$root/m/model.safetensors" "$root/mm/model.safetensors" "$root/show.json" "$src" <<'PY' \
  && ok "safetensors header parses, offsets tile the data, bytes equal the stored chunks" \
  || bad "safetensors content"
import json, struct, sys, os
path, mpath, showp, src = sys.argv[1:]
show = json.load(open(showp))
names = {'f64':'F64','f32':'F32','f16':'F16','bf16':'BF16','f8_e4m3':'F8_E4M3','f8_e5m2':'F8_E5M2',
         'i64':'I64','i32':'I32','i16':'I16','i8':'I8','u8':'U8','bool':'BOOL'}
def load(p):
    raw = open(p, 'rb').read()
    n = struct.unpack('<Q', raw[:8])[0]
    assert (8 + n) % 8 == 0, n
    hdr = json.loads(raw[8:8 + n])
    return hdr, raw[8 + n:]
hdr, data = load(path)
meta = hdr.pop('__metadata__')
assert meta['libckpt_step'] == '5', meta
tensors = {t['name']: t for t in show['tensors']}
expect = {n for n, t in tensors.items() if t['policy'] != 'rank-bound' and n not in ('rng', 'scheduler')}
assert set(hdr) == expect, set(hdr) ^ expect
spans = sorted(v['data_offsets'] for v in hdr.values())
pos = 0
for b, e in spans:
    assert b == pos, (b, pos); pos = e
assert pos == len(data), (pos, len(data))
for name, v in hdr.items():
    t = tensors[name]
    assert v['dtype'] == names[t['dtype']] and v['shape'] == t['shape'], (name, v, t)
    b, e = v['data_offsets']
    got = data[b:e]
    # The stored bytes: one rank, uncompressed; chunks cover the box in order.
    want = bytearray()
    for c in sorted(t['chunk_list'], key=lambda c: c['raw_offset']):
        assert c['codec'] == 'raw'
        with open(os.path.join(src, c['file']), 'rb') as f:
            f.seek(c['offset']); want += f.read(c['raw_len'])
    assert bytes(want) == got, name
mhdr, mdata = load(mpath)
mhdr.pop('__metadata__')
assert mhdr and all(tensors[n]['kind'] == 'model' for n in mhdr), list(mhdr)[:3]
assert len(mhdr) < len(hdr)
PY
expect_rc 0 "0 mismatches" "the source is what the model regenerates (so the export is too)" \
  "$synth" verify --root "$src" --step 5 --bytes 3M --seed 9

# ---- a flipped bit in the source: the reshard fails naming it, the output has no step
cp -r "$src" "$root/bent"
info=$("$inspect" "$root/bent" show 5 --chunks --json | /usr/bin/python3 -c "
import json,sys; d=json.load(sys.stdin)
t=[t for t in d['tensors'] if t['name']=='model/layers.1/mlp.up.weight'][0]; c=t['chunk_list'][-1]
print(c['file'], c['offset'])")
read -r file off <<<"$info"
/usr/bin/python3 - "$root/bent/$file" "$((off + 7))" <<'PY'
import sys
with open(sys.argv[1], 'r+b') as f:
    f.seek(int(sys.argv[2])); b = f.read(1); f.seek(int(sys.argv[2])); f.write(bytes([b[0] ^ 0x01]))
PY
expect_rc 1 "read the source: .*tensor .model/layers.1/mlp.up.weight. chunk .*$file, offset .*hash mismatch" \
  "a corrupt source chunk fails the reshard, naming the tensor" \
  "$reshard" "$root/bent" 5 --world 1 --out "$root/o5" --rank-map 0
out=$("$inspect" "$root/o5" list --all --json 2>&1)
/usr/bin/python3 -c "import json,sys; d=json.loads(sys.argv[1]); assert not [s for s in d['steps'] if s['state']=='committed'], d" "$out" \
  && ok "...and the output root holds no committed step" || bad "output after a failed reshard" "$out"

# ---- memory follows --pool, not the state: 256 MiB resharded with --pool 32M
"$synth" save --root "$root/big" --step 1 --bytes 256M --seed 4 >/dev/null || bad "save 256M"
out=$(/usr/bin/python3 - "$reshard" "$root/big" "$root/big-out" <<'PY'
import resource, subprocess, sys
r = subprocess.run([sys.argv[1], sys.argv[2], "1", "--world", "1", "--out", sys.argv[3],
                    "--rank-map", "0", "--pool", "32M", "--quiet"], capture_output=True, text=True)
print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024, r.stderr.strip())
PY
)
read -r rc rss _ <<<"$out"
# Two pools of 32 MiB, two read-ahead windows of 16 MiB, a chunk of scratch, the
# process itself: well under the 256 MiB of state. A sanitizer's shadow memory and
# quarantine are not the tool's: there only the reshard itself is checked.
if ldd "$reshard" 2>/dev/null | grep -Eq 'lib(a|t)san'; then
  [ "$rc" = 0 ] && ok "--pool 32M reshard (peak RSS not checked: sanitizer build, $rss MiB)" \
    || bad "--pool 32M reshard (rc $rc)" "$out"
elif [ "$rc" = 0 ] && [ "$rss" -lt 200 ]; then ok "--pool 32M: peak RSS $rss MiB for 256 MiB of state"
else bad "--pool 32M reshard (rc $rc, peak RSS $rss MiB)" "$out"; fi
expect_rc 0 "0 mismatches" "...and its output verifies" \
  "$synth" verify --root "$root/big-out" --step 1 --bytes 256M --seed 4 --world 3
rm -rf "$root/big" "$root/big-out"

# ---- bad input
expect_rc 2 "from 1 to" "N = 0" "$reshard" "$src" 5 --world 0 --out "$root/x"
expect_rc 6 "cannot be split" "N larger than a first dimension" \
  "$reshard" "$src" 5 --world 1000 --out "$root/x" --drop-rank-bound
[ ! -e "$root/x" ] && ok "nothing written for a refused N" || bad "output written for a refused N"
expect_rc 5 "already holds step 5" "output root that already holds the step" \
  "$reshard" "$src" 5 --world 1 --out "$root/o1" --rank-map 0
expect_rc 0 "0 mismatches" "...and the step there is intact" \
  "$synth" verify --root "$root/o1" --step 5 --bytes 3M --seed 9
expect_rc 3 "not a committed step" "unknown step" "$reshard" "$src" 77 --world 1 --out "$root/x"
mkdir -p "$root/other"; echo hi > "$root/other/file"
expect_rc 4 "not a checkpoint root" "source that is not a root" "$reshard" "$root/other" 1 --world 1 --out "$root/x"
expect_rc 4 "not a checkpoint root" "output that is somebody's directory" \
  "$reshard" "$src" 5 --world 1 --out "$root/other" --drop-rank-bound
expect_rc 2 "source root" "output = source" "$reshard" "$src" 5 --world 1 --out "$src" --drop-rank-bound
expect_rc 2 "rank-map" "rank map of the wrong length" "$reshard" "$src" 5 --world 2 --out "$root/x" --rank-map 0
expect_rc 2 "does not exist" "rank map naming a rank that was never saved" \
  "$reshard" "$src" 5 --world 1 --out "$root/x" --rank-map 3
expect_rc 2 "required" "missing --out" "$reshard" "$src" 5 --world 2
expect_rc 2 "does not combine" "export with --world" "$reshard" "$src" 5 --world 2 --export-safetensors "$root/y"
expect_rc 2 "kind" "bad --kind" "$reshard" "$src" 5 --export-safetensors "$root/y" --kind weights
expect_rc 0 "export-safetensors" "--help" "$reshard" --help
[ $fail = 0 ] && rm -rf "$root"
exit $fail
