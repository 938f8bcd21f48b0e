#!/usr/bin/env bash
# test_meta.sh — a step's metadata through the tools: ckpt-synth save --meta (two
# ranks: rank 0's is kept), ckpt-inspect show (human: indented; --json: a "meta"
# object) and list --json ("meta" on the steps that have some, none on the others),
# a refused text, and gc --keep-seconds with a unit. Exit codes per
# docs/ckpt-inspect.md and docs/ckpt-synth.md.
set -u
synth=$1 inspect=$2
root=$(mktemp -d /var/tmp/ckpt-meta-XXXXXX)
r=$root/r
fail=0
. "$(dirname "$0")/lib.sh"
[ -x /usr/bin/python3 ] || { echo "SKIP: /usr/bin/python3 is needed to read the JSON"; exit 77; }

seed=${CKPT_TEST_SEED:-$RANDOM}
echo "seed $seed"
loss="$((seed % 1000)).25"
"$synth" save --root "$r" --step 1 --bytes 256K --seed "$seed" --world 2 \
  --meta "{\"loss\": $loss, \"tokens\": $seed, \"note\": \"caf\u00e9\"}" >/dev/null || bad "save 1 with --meta"
"$synth" save --root "$r" --step 2 --bytes 256K --seed "$seed" >/dev/null || bad "save 2"

out=$("$inspect" "$r" show 1)
grep -q "^metadata: {" <<<"$out" && grep -q "^  \"loss\": $loss" <<<"$out" \
  && ok "show 1 (human): the metadata, indented" || bad "show 1 (human)" "$out"
out=$("$inspect" "$r" show 2)
grep -q "metadata" <<<"$out" && bad "show 2: metadata where none was saved" "$out" || ok "show 2: none"
out=$("$inspect" "$r" show 1 --json)
pycheck "show 1 --json: the meta object" "$out" \
  "d['ok'] and d['meta']=={'loss': $loss, 'tokens': $seed, 'note': 'caf\\u00e9'} and len(d['tensors'])>40"
out=$("$inspect" "$r" show latest --json)
pycheck "show latest --json: no meta" "$out" "d['step']==2 and 'meta' not in d"
out=$("$inspect" "$r" list --json)
pycheck "list --json: meta on step 1 only" "$out" \
  "[s['step'] for s in d['steps']]==[1,2] and d['steps'][0]['meta']['tokens']==$seed and 'meta' not in d['steps'][1]"

expect_rc 1 "not an object" "save --meta with a JSON array is refused" \
  "$synth" save --root "$r" --step 3 --bytes 64K --seed 1 --meta '[1, 2]'
expect_rc 1 "not JSON" "save --meta with broken JSON is refused" \
  "$synth" save --root "$r" --step 3 --bytes 64K --seed 1 --meta '{"a": '

# ---- gc --keep-seconds: every step is younger than an hour; keep_last 1 alone would
# remove step 1.
out=$("$inspect" "$r" gc --keep-last 1 --keep-seconds 1h --dry-run --json)
pycheck "gc --keep-seconds 1h keeps the young steps" "$out" \
  "d['ok'] and not [x for x in d['removed'] if x['reason']=='retention'] and d['steps_kept']==2"
sleep 2
out=$("$inspect" "$r" gc --keep-last 1 --keep-seconds 1 --json)
pycheck "gc --keep-seconds 1 after 2 s removes step 1" "$out" \
  "d['ok'] and [x['step'] for x in d['removed'] if x['reason']=='retention']==[1] and d['steps_kept']==1"
expect_rc 2 "keep-seconds" "gc --keep-seconds 2x is a usage error" "$inspect" "$r" gc --keep-seconds 2x
expect_rc 2 "keep-seconds" "gc --keep-seconds 0 is a usage error" "$inspect" "$r" gc --keep-seconds 0

[ $fail -eq 0 ] && rm -rf "$root"
exit $fail
