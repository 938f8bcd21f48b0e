#!/usr/bin/env bash
# test_reshard_multi.sh — resharding between world sizes: 4 -> 3, 4 -> 1, 3 -> 8, each
# result checked by ckpt-synth verify as several world sizes. Needs multi-rank saves
# (the distributed commit); until they are in the build this exits 77 and
# says so, and it starts running on its own once they land.
set -u
synth=$1 inspect=$2 reshard=$3
root=$(mktemp -d /var/tmp/ckpt-reshard-multi-XXXXXX)
out=$("$synth" save --root "$root/w4" --step 1 --bytes 4M --seed 3 --world 4 2>&1)
if [ $? != 0 ]; then
  if grep -q "distributed commit" <<<"$out"; then
    echo "SKIP: saving with world > 1 is not in this build yet: $out"
    rm -rf "$root"; exit 77
  fi
  echo "FAIL: save as 4 ranks: $out"; exit 1
fi
fail=0
check() { local d=$1; shift; if o=$("$@" 2>&1); then echo "ok: $d"; else echo "FAIL: $d"; echo "$o"; fail=1; fi; }
"$synth" save --root "$root/w3" --step 1 --bytes 4M --seed 3 --world 3 >/dev/null || { echo "FAIL: save w3"; fail=1; }
# New rank i takes saved rank map[i]'s RNG state: ckpt-synth expects rank i's own, so
# an identity prefix verifies fully; ranks mapped to another saved rank report only
# "blob 'rng' differs", which is the one mismatch allowed below.
check "4 -> 3" "$reshard" "$root/w4" 1 --world 3 --out "$root/r43" --rank-map 0,1,2
check "4 -> 1" "$reshard" "$root/w4" 1 --world 1 --out "$root/r41" --rank-map 0
check "3 -> 8" "$reshard" "$root/w3" 1 --world 8 --out "$root/r38" --rank-map 0,1,2,0,1,2,0,1
for w in 1 2 3 7 8; do
  for r in r43 r41 r38; do
    o=$("$synth" verify --root "$root/$r" --step 1 --bytes 4M --seed 3 --world "$w" --json 2>"$root/err")
    if /usr/bin/python3 - "$o" "$root/err" <<'PY'
import json, sys
d = json.loads(sys.argv[1]); err = open(sys.argv[2]).read()
rng = err.count("blob 'rng' differs")
assert "verify failed" not in err and "differs at byte" not in err, err
assert d['mismatches'] == rng and d['tensors'] > 40, (d, err)
PY
    then echo "ok: $r verified as $w rank(s)"; else echo "FAIL: $r as $w"; cat "$root/err"; fail=1; fi
  done
done
o=$("$inspect" "$root/r38" list --json)
/usr/bin/python3 -c "import json,sys; d=json.loads(sys.argv[1]); assert d['steps'][0]['world']==8" "$o" \
  && echo "ok: 3 -> 8 wrote 8 shards" || { echo "FAIL: world of r38: $o"; fail=1; }
o=$("$inspect" "$root/r43" verify 1 --quiet 2>&1) && echo "ok: ckpt-inspect verify of 4 -> 3" || { echo "FAIL: $o"; fail=1; }
[ $fail = 0 ] && rm -rf "$root"
exit $fail
