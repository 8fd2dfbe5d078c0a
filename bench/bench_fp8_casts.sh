#!/usr/bin/env bash
# What reusing FP8 casts (train.fp8_reuse_casts, model/fp8.h) saves: the same FP8 training steps
# with each weight cast to e4m3 once a step and q, k, v's input once, and with every cast made at
# every use, side by side in one run, alternating so that drift in the machine's speed hits both.
# Every block is recomputed (train.recompute_blocks = -1), so unreused, a weight is cast three
# times a step: forward, recomputed forward, backward. Prints each run's step time and the ratio.
# On the CPU FP8 is emulated (ATen's CPU _scaled_mm), so the ratio here is the CPU's, not a GPU's.
# Usage: bench/bench_fp8_casts.sh [BUILD_DIR] [REPEATS] [STEPS]   (defaults: build, 2, 3)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${1:-$ROOT/build}
REPEATS=${2:-2}
STEPS=${3:-3}
BENCH=$BUILD/bench_train_step
[[ -x "$BENCH" ]] || { echo "bench_fp8_casts: $BENCH not built (cmake --build $BUILD)"; exit 1; }
SETS=(model.dim=256 model.ffn_dim=1024 model.heads=4 model.layers=4 model.patch=[1,2,2]
      data.latent_frames=4 data.latent_height=32 data.latent_width=32 train.batch_size=1
      train.recompute_blocks=-1)
run() { "$BENCH" --steps "$STEPS" --warmup 2 --set "${SETS[@]}" "train.precision=$1" "train.fp8_reuse_casts=$2" |
          grep '^{' | tail -n 1; }
OUT=$(mktemp)
trap 'rm -f "$OUT"' EXIT
for precision in fp8 fp8_rowwise; do
  for ((i = 0; i < REPEATS; ++i)); do
    for reuse in true false; do
      line="$precision $reuse $(run "$precision" "$reuse")"
      echo "$line" | tee -a "$OUT"
    done
  done
done
python3 - "$OUT" <<'PY'
import json, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    precision, reuse, js = line.split(" ", 2)
    rows.setdefault((precision, reuse), []).append(json.loads(js))
print(f"{'precision':<12} {'casts':<14} {'step (s), each run':<26} {'median':>8} {'mean loss':>12}")
for (precision, reuse), runs in rows.items():
    times = [r["step_time_s"] for r in runs]
    each = " ".join(f"{t:.3f}" for t in times)
    name = "reused" if reuse == "true" else "at every use"
    print(f"{precision:<12} {name:<14} {each:<26} {statistics.median(times):8.3f} {runs[0].get('mean_loss', 0):12.7f}")
for precision in sorted({p for p, _ in rows}):
    a = statistics.median(r["step_time_s"] for r in rows[(precision, "true")])
    b = statistics.median(r["step_time_s"] for r in rows[(precision, "false")])
    print(f"{precision}: step with reused casts / at every use = {a / b:.3f}")
PY
