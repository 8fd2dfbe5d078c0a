#!/usr/bin/env bash
# What activation checkpointing (train.recompute_blocks) costs and saves: the same training
# steps with every block's activations kept, with every block recomputed in backward, and with
# every block recomputed selectively (train.recompute_policy = "selective": attention kept), and
# with blocks chosen to fit a memory budget halfway between the first and the third
# (train.memory_budget_gb), in one run, as four processes (so each peak resident memory is its own). Prints step time, peak
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
# The plan's total per rank in GiB for the given --set items.
total_gib() {
  "$BUILD/vidit" plan --set data.source=synthetic "${SETS[@]}" "$@" | sed -n 's/.*total ~\([0-9.]*\) \([KMG]*i*B\).*/\1 \2/p' |
    head -n 1 | awk '{ f = $2 == "GiB" ? 1 : $2 == "MiB" ? 1 / 1024 : $2 == "KiB" ? 1 / 1048576 : 1 / 1073741824; printf "%.6f", $1 * f }'
}
# A memory budget halfway between keeping everything and recomputing every block selectively:
# train.memory_budget_gb then recomputes some blocks selectively and lets the others keep theirs.
BUDGET=$(awk -v a="$(total_gib train.recompute_blocks=0)" -v b="$(total_gib train.recompute_blocks=-1 train.recompute_policy=selective)" 'BEGIN { printf "%.4f", (a + b) / 2 }')
run_budget() { "$BENCH" --steps "$STEPS" --warmup 2 --set "${SETS[@]}" "train.memory_budget_gb=$BUDGET" | grep '^{' | tail -n 1; }
keep=$(run 0 block) recompute=$(run -1 block) selective=$(run -1 selective) budget=$(run_budget)
chosen=$("$BUILD/vidit" plan --set data.source=synthetic "${SETS[@]}" "train.memory_budget_gb=$BUDGET" | sed -n 's/^recompute *//p')
budget_plan="$("$BUILD/vidit" plan --set data.source=synthetic "${SETS[@]}" "train.memory_budget_gb=$BUDGET" | grep -o 'activations ~[0-9.]* [KMG]*i*B' | head -n 1); $chosen"
python3 - "$keep" "$recompute" "$selective" "$budget" "$(planned 0 block)" "$(planned -1 block)" "$(planned -1 selective)" "$budget_plan" "$BUDGET" <<'PY'
import json, sys
runs = [json.loads(a) for a in sys.argv[1:5]]
plans = sys.argv[5:9]
print(f"{'policy':<22} {'step (s)':>9} {'peak RSS (MB)':>14}  plan")
for name, r, p in zip(("keep all", "recompute blocks", "recompute selective", f"budget {float(sys.argv[9]):.3f} GiB"), runs, plans):
    print(f"{name:<22} {r['step_time_s']:9.3f} {r['peak_rss_mb']:14.1f}  {p}")
keep = runs[0]
for name, r in zip(("blocks", "selective", "budget"), runs[1:]):
    print(f"{name} / keep: step {r['step_time_s'] / keep['step_time_s']:.3f}, "
          f"peak memory {r['peak_rss_mb'] / keep['peak_rss_mb']:.3f}")
PY
