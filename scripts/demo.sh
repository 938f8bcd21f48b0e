#!/usr/bin/env bash
# demo.sh — the main job: a synthetic training job saves a checkpoint, the checkpoint
# is inspected, and it is restored onto a different number of ranks, bit for bit.
# Embedded default: rank 0 coordinates, no service to start.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)" >/dev/null
bin=build/tools
root=${CKPT_DEMO_ROOT:-/var/tmp/libckpt-demo}
bytes=${CKPT_DEMO_BYTES:-256M}
rm -rf "$root"
save_world=${CKPT_DEMO_WORLD:-1}
say() { printf '\n\033[1m%s\033[0m\n' "$*"; }

say "1. A synthetic job of $save_world rank(s) saves $bytes of model and optimizer state as step 100, then step 200"
"$bin/ckpt-synth/ckpt-synth" save --root "$root" --step 100 --bytes "$bytes" --seed 7 --world "$save_world"
"$bin/ckpt-synth/ckpt-synth" save --root "$root" --step 200 --bytes "$bytes" --seed 8 --world "$save_world"

if [ -x "$bin/ckpt-inspect/ckpt-inspect" ]; then
  say "2. What the checkpoint root holds"
  "$bin/ckpt-inspect/ckpt-inspect" "$root" list
  "$bin/ckpt-inspect/ckpt-inspect" "$root" show latest | head -15
  "$bin/ckpt-inspect/ckpt-inspect" "$root" verify latest --quiet
else
  say "2. What the checkpoint root holds"
  ls -l "$root" "$root"/step-*
fi

say "3. Restore the latest step onto 3 ranks (a different world size) and compare every byte"
"$bin/ckpt-synth/ckpt-synth" verify --root "$root" --step latest --bytes "$bytes" --seed 8 --world 3

say "4. The older step is still there, intact: restore it onto 2 ranks"
"$bin/ckpt-synth/ckpt-synth" verify --root "$root" --step 100 --bytes "$bytes" --seed 7 --world 2

say "Done. The checkpoint root is $root (remove it with: rm -rf $root)"
