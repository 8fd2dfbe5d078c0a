#!/usr/bin/env bash
# What activation checkpointing (train.recompute_blocks) costs and saves: the same training
# steps with every block's activations kept, with every block recomputed in backward, and with
# every block recomputed selectively (train.recompute_policy = "selective": attention kept), in
# one run, as three processes (so each peak resident memory is its own). Prints step time, peak
# memory and `vidit plan`'s activation estimate for each, and the ratios to keeping everything. The model is sized so that activations
# dominate memory: 2048 tokens per sample, 6 blocks at dim 128.
# Usage: bench/bench_recompute.sh [BUILD_DIR] [STEPS]   (defaults: build, 5)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${1:-$ROOT/build}
STEPS=${2:-5}
BENCH=$BUILD/bench_train_step
[[ -x "$BENCH" ]] || { echo "bench_recompute: $BENCH not built (cmake --build $BUILD)"; exit 1; }
SETS=(model.dim=128 model.ffn_dim=512 model.heads=4 model.layers=6 model.patch=[1,2,2]
      data.latent_frames=8 data.latent_height=32 data.latent_width=32 train.batch_size=1)
run() { "$BENCH" --steps "$STEPS" --warmup 2 --set "${SETS[@]}" "train.recompute_blocks=$1" "train.recompute_policy=$2" | grep '^{' | tail -n 1; }
planned() { "$BUILD/vidit" plan --set data.source=synthetic "${SETS[@]}" "train.recompute_blocks=$1" "train.recompute_policy=$2" | grep -o 'activations ~[0-9.]* [KMG]*i*B' | head -n 1; }
keep=$(run 0 block) recompute=$(run -1 block) selective=$(run -1 selective)
python3 - "$keep" "$recompute" "$selective" "$(planned 0 block)" "$(planned -1 block)" "$(planned -1 selective)" <<'PY'
import json, sys
runs = [json.loads(a) for a in sys.argv[1:4]]
plans = sys.argv[4:7]
print(f"{'policy':<22} {'step (s)':>9} {'peak RSS (MB)':>14}  plan")
for name, r, p in zip(("keep all", "recompute blocks", "recompute selective"), runs, plans):
    print(f"{name:<22} {r['step_time_s']:9.3f} {r['peak_rss_mb']:14.1f}  {p}")
keep = runs[0]
for name, r in zip(("blocks", "selective"), runs[1:]):
    print(f"{name} / keep: step {r['step_time_s'] / keep['step_time_s']:.3f}, "
          f"peak memory {r['peak_rss_mb'] / keep['peak_rss_mb']:.3f}")
PY
