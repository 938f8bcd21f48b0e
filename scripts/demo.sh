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
rm -rf "$root" "$root-2"
save_world=${CKPT_DEMO_WORLD:-4}
say() { printf '\n\033[1m%s\033[0m\n' "$*"; }

say "1. A synthetic job of $save_world rank processes saves $bytes of model and optimizer state as step 100, then step 200"
echo "   (each rank writes its own shard; rank 0 coordinates the two-phase commit: no service to start)"
"$bin/ckpt-synth/ckpt-synth" save --root "$root" --step 100 --bytes "$bytes" --seed 7 --world "$save_world"
"$bin/ckpt-synth/ckpt-synth" save --root "$root" --step 200 --bytes "$bytes" --seed 8 --world "$save_world"

say "2. What the checkpoint root holds, and a full verification of the latest step"
"$bin/ckpt-inspect/ckpt-inspect" "$root" list
show=$("$bin/ckpt-inspect/ckpt-inspect" "$root" show latest)
head -12 <<<"$show"
echo "   ... ($(($(wc -l <<<"$show") - 12)) more lines)"
"$bin/ckpt-inspect/ckpt-inspect" "$root" verify latest

say "3. Restore the latest step onto 3 ranks (a different world size) and compare every byte"
"$bin/ckpt-synth/ckpt-synth" verify --root "$root" --step latest --bytes "$bytes" --seed 8 --world 3

say "4. The older step is still there, intact: restore it onto 2 ranks"
"$bin/ckpt-synth/ckpt-synth" verify --root "$root" --step 100 --bytes "$bytes" --seed 7 --world 2

say "5. Rewrite the latest step for 2 ranks (ckpt-reshard), then restore that onto 5"
"$bin/ckpt-reshard/ckpt-reshard" "$root" latest --world 2 --out "$root-2" --drop-rank-bound --quiet
"$bin/ckpt-inspect/ckpt-inspect" "$root-2" list
"$bin/ckpt-synth/ckpt-synth" verify --root "$root-2" --step latest --bytes "$bytes" --seed 8 --world 5 --no-rng

say "Done. The checkpoint roots are $root and $root-2 (remove them with: rm -rf $root $root-2)"
