#!/usr/bin/env bash
# What reusing FP8 casts (train.fp8_reuse_casts, model/fp8.h) saves: the same FP8 training steps
# with each weight cast to e4m3 once a step and q, k, v's input once, and with every cast made at
# every use, side by side in one run, alternating so that drift in the machine's speed hits both.
# Every block is recomputed (train.recompute_blocks = -1), so unreused, a weight is cast three
# times a step: forward, recomputed forward, backward. Prints each run's step time and the ratio.
# On the CPU FP8 is emulated (ATen's CPU _scaled_mm), so the ratio here is the CPU's, not a GPU's.
# Usage: bench/bench_fp8_casts.sh [BUILD_DIR] [REPEATS] [STEPS]   (defaults: build, 3, 4)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${1:-$ROOT/build}
REPEATS=${2:-3}
STEPS=${3:-4}
BENCH=$BUILD/bench_train_step
[[ -x "$BENCH" ]] || { echo "bench_fp8_casts: $BENCH not built (cmake --build $BUILD)"; exit 1; }
SETS=(model.dim=256 model.ffn_dim=1024 model.heads=4 model.layers=4 model.patch=[1,2,2]
      data.latent_frames=4 data.latent_height=32 data.latent_width=32 train.batch_size=1
      train.recompute_blocks=-1)
run() { "$BENCH" --steps "$STEPS" --warmup 2 --set "${SETS[@]}" "train.precision=$1" "train.fp8_reuse_casts=$2" |
          grep '^{' | tail -n 1; }
results=()
for precision in fp8 fp8_rowwise; do
  for ((i = 0; i < REPEATS; ++i)); do
    results+=("$precision true $(run "$precision" true)")
    results+=("$precision false $(run "$precision" false)")
  done
done
printf '%s\n' "${results[@]}" | python3 -c '
import json, sys, statistics
rows = {}
for line in sys.stdin:
    precision, reuse, js = line.split(" ", 2)
    rows.setdefault((precision, reuse), []).append(json.loads(js))
print(f"{\"precision\":<12} {\"casts\":<16} {\"step (s), each run\":<28} {\"median\":>8} {\"mean loss\":>10}")
for (precision, reuse), runs in rows.items():
    times = [r["step_time_s"] for r in runs]
    print(f"{precision:<12} {\"reused\" if reuse == \"true\" else \"at every use\":<16} "
          f"{\" \".join(f\"{t:.3f}\" for t in times):<28} {statistics.median(times):8.3f} {runs[0].get(\"mean_loss\", 0):10.5f}")
for precision in ("fp8", "fp8_rowwise"):
    a = statistics.median(r["step_time_s"] for r in rows[(precision, "true")])
    b = statistics.median(r["step_time_s"] for r in rows[(precision, "false")])
    print(f"{precision}: step with reused casts / at every use = {a / b:.3f}")
'
