#!/usr/bin/env bash
# test_manifest_dir.sh — the tools over a root whose manifest is kept apart from it
# (docs/operations.md, "Multi-node deployments"): ckpt-synth saves as 3 ranks with
# CKPT_MANIFEST_DIR and verifies bit-exact as 2; ckpt-inspect lists, shows, verifies
# and collects with --manifest-dir and with CKPT_MANIFEST_DIR, refuses a relative
# directory (usage) and a second root on a used one (naming both), and rebuilds a
# lost manifest into a new directory; ckpt-reshard reads with --manifest-dir and
# writes with --out-manifest-dir. No <root>/manifest appears at any point.
set -u
synth=$1 inspect=$2 reshard=$3
tmp=$(mktemp -d /var/tmp/ckpt-mdir-XXXXXX)
r=$tmp/global/root m=$tmp/local/sub/manifest
fail=0
. "$(dirname "$0")/lib.sh"
export CKPT_JOB_ID=mdir-$$ CKPT_JOB_SECRET=manifest-dir-cli-secret-$$
port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
no_own_manifest() {  # no_own_manifest ROOT WHEN
  if [ -e "$1/manifest" ]; then bad "$2: $1/manifest exists" "$(ls -A "$1")"; else ok "$2: no manifest in the root"; fi
}

# ---- saves of 3 ranks through the variable, verified as 2 and 1
expect_rc 0 "saved step 1: 3 rank(s)" "save step 1 as 3 ranks with CKPT_MANIFEST_DIR" \
  env CKPT_MANIFEST_DIR="$m" CKPT_COORD_PORT="$(port)" \
  "$synth" save --root "$r" --step 1 --bytes 3M --seed 11 --world 3 --chunk 256K --pool 2M
expect_rc 0 "saved step 2" "save step 2 as 1 rank" \
  env CKPT_MANIFEST_DIR="$m" "$synth" save --root "$r" --step 2 --bytes 2M --seed 12
[ -f "$m/data.mdb" ] && ok "the manifest is in the manifest directory" || bad "no $m/data.mdb" "$(ls -AR "$tmp")"
no_own_manifest "$r" "after the saves"
for w in 2 1; do
  expect_rc 0 "0 mismatches (step 1, as $w rank(s)" "step 1 verifies bit-exact as $w rank(s)" \
    env CKPT_MANIFEST_DIR="$m" CKPT_COORD_PORT="$(port)" \
    "$synth" verify --root "$r" --step 1 --bytes 3M --seed 11 --world "$w"
done

# ---- ckpt-inspect with the option and with the variable
out=$("$inspect" "$r" list --json --manifest-dir "$m" 2>&1)
pycheck "list --manifest-dir --json: steps 1 (3 ranks) and 2" "$out" \
  "[(s['step'], s['world'], s['state']) for s in d['steps']]==[(1,3,'committed'),(2,1,'committed')]"
out=$(CKPT_MANIFEST_DIR=$m "$inspect" "$r" list --json 2>&1)
pycheck "list --json with CKPT_MANIFEST_DIR: the same steps" "$out" "[s['step'] for s in d['steps']]==[1,2]"
expect_rc 0 "model/" "show latest --manifest-dir" "$inspect" "$r" show latest --manifest-dir "$m"
out=$("$inspect" "$r" verify all --json --manifest-dir "$m" 2>/dev/null)
pycheck "verify all --manifest-dir: both steps ok and marked" "$out" \
  "d['ok'] and [s['step'] for s in d['steps']]==[1,2] and all(s['marked'] for s in d['steps'])"
out=$(CKPT_MANIFEST_DIR=$m "$inspect" "$r" list --json 2>&1)
pycheck "the marks are in the manifest apart" "$out" "all(s['trust']=='verified' for s in d['steps'])"
expect_rc 0 "" "gc --dry-run --manifest-dir" "$inspect" "$r" gc --keep-last 1 --dry-run --manifest-dir "$m"
no_own_manifest "$r" "after the tools"

# ---- what is refused, and how
expect_rc 2 "an absolute path" "a relative --manifest-dir is a usage error" \
  "$inspect" "$r" list --manifest-dir local/manifest
out=$("$inspect" "$r" list --json --manifest-dir rel 2>/dev/null)
pycheck "... reported as JSON under --json" "$out" "not d['ok'] and d['exit']==2 and 'absolute' in d['error']"
expect_rc 1 "absolute" "a relative CKPT_MANIFEST_DIR is refused by the library" \
  env CKPT_MANIFEST_DIR=local/manifest "$inspect" "$r" list
expect_rc 6 "CKPT_MANIFEST_DIR" \
  "without the manifest directory: no manifest, and the message points at CKPT_MANIFEST_DIR" \
  "$inspect" "$r" list
expect_rc 0 "saved step 1" "another root with a manifest directory of its own" \
  env CKPT_MANIFEST_DIR="$tmp/local/other" "$synth" save --root "$tmp/global/other" --step 1 --bytes 1M --seed 3
out=$("$inspect" "$tmp/global/other" list --manifest-dir "$m" 2>&1); rc=$?
if [ $rc = 6 ] && grep -q -- "$r" <<<"$out" && grep -q -- "$tmp/global/other" <<<"$out"; then
  ok "a root opened with another root's manifest directory: exit 6, naming both roots"
else bad "second root on a used manifest directory (rc $rc)" "$out"; fi
expect_rc 1 "of checkpoint root $r, not of" "a save to it is refused too (ckpt-synth: exit 1), naming both" \
  env CKPT_MANIFEST_DIR="$m" "$synth" save --root "$tmp/global/other" --step 2 --bytes 1M --seed 3

# ---- ckpt-reshard: --manifest-dir for ROOT, --out-manifest-dir for ROOT2
expect_rc 0 "resharded step 1" "reshard 3 -> 2 between two manifests apart" \
  "$reshard" "$r" 1 --world 2 --out "$tmp/global/r2" --manifest-dir "$m" \
  --out-manifest-dir "$tmp/local/r2-manifest" --rank-map 0,1 --quiet
no_own_manifest "$tmp/global/r2" "the reshard's output"
expect_rc 0 "0 mismatches" "the output verifies as 3 ranks" \
  env CKPT_MANIFEST_DIR="$tmp/local/r2-manifest" CKPT_COORD_PORT="$(port)" \
  "$synth" verify --root "$tmp/global/r2" --step 1 --bytes 3M --seed 11 --world 3
expect_rc 2 "an absolute path" "a relative --out-manifest-dir is a usage error" \
  "$reshard" "$r" 1 --world 2 --out "$tmp/global/r3" --out-manifest-dir rel --drop-rank-bound
expect_rc 1 "two roots never share one manifest directory" \
  "CKPT_MANIFEST_DIR alone would give both roots one manifest: refused" \
  env CKPT_MANIFEST_DIR="$m" "$reshard" "$r" 1 --world 1 --out "$tmp/global/r4" --drop-rank-bound --quiet

# ---- a lost manifest, rebuilt into a new manifest directory
rm -rf "$m"
expect_rc 6 "does not exist on host" "the lost manifest directory is named" \
  "$inspect" "$r" list --manifest-dir "$m"
expect_rc 0 "2 step(s) committed" "rebuild --manifest-dir into a new directory" \
  "$inspect" "$r" rebuild --manifest-dir "$tmp/local/new/manifest"
no_own_manifest "$r" "after the rebuild"
expect_rc 0 "0 mismatches (step 2" "step 2 verifies through the rebuilt manifest" \
  env CKPT_MANIFEST_DIR="$tmp/local/new/manifest" "$synth" verify --root "$r" --step 2 --bytes 2M --seed 12
expect_rc 0 "0 mismatches (step 1" "step 1 as well, as 3 ranks" \
  env CKPT_MANIFEST_DIR="$tmp/local/new/manifest" CKPT_COORD_PORT="$(port)" \
  "$synth" verify --root "$r" --step 1 --bytes 3M --seed 11 --world 3

if [ $fail = 0 ]; then rm -rf "$tmp"; echo "all ok"; else echo "kept $tmp"; fi
exit $fail
