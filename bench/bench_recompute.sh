#!/usr/bin/env bash
# What activation checkpointing (train.recompute_blocks) costs and saves: the same training
# steps with every block's activations kept and with every block recomputed in backward, in one
# run, as two processes (so each peak resident memory is its own). Prints step time and peak
# memory for both and the ratios recompute / keep. The model is sized so that activations
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
run() { "$BENCH" --steps "$STEPS" --warmup 2 --set "${SETS[@]}" "train.recompute_blocks=$1" | grep '^{' | tail -n 1; }
keep=$(run 0)
recompute=$(run -1)
python3 - "$keep" "$recompute" <<'PY'
import json, sys
keep, rec = json.loads(sys.argv[1]), json.loads(sys.argv[2])
print(f"{'blocks recomputed':<18} {'step (s)':>9} {'peak RSS (MB)':>14}")
for name, r in (("none", keep), ("all", rec)):
    print(f"{name:<18} {r['step_time_s']:9.3f} {r['peak_rss_mb']:14.1f}")
print(f"recompute / keep: step {rec['step_time_s'] / keep['step_time_s']:.3f}, "
      f"peak memory {rec['peak_rss_mb'] / keep['peak_rss_mb']:.3f}")
PY
