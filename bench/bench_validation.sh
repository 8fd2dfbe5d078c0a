#!/usr/bin/env bash
# What the validation loss costs at its default interval (issue: at most 5% of training time).
# One `vidit train` on the embedded demo data with data.val_fraction = FRACTION and the default
# train.val_every / val_samples / val_sigmas, STEPS steps (the default interval: 500), every step
# logged. From its metrics.jsonl: the seconds of the validation at step STEPS against the summed
# step times of the interval before it (the baseline at step 0 is reported apart). Then the same
# run without validation, for the wall-clock ratio side by side (REPS of each, alternating, medians;
# each run includes rendering the demo data). Prints both ratios.
#   bench/bench_validation.sh [BUILD_DIR]   env: STEPS=500 FRACTION=0.2 THREADS=2 REPS=3
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$ROOT/build}
STEPS=${STEPS:-500} FRACTION=${FRACTION:-0.2} THREADS=${THREADS:-2} REPS=${REPS:-3}
WORK=$(mktemp -d /tmp/vidit_bench_val.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
common="train.steps=$STEPS train.log_every=1 train.threads=$THREADS train.tensorboard=false checkpoint.every=0"
# REPS runs of each, alternating; the first with validation is the one read for the in-run ratio.
with=() without=()
for r in $(seq 1 "$REPS"); do
  t0=$(date +%s.%N)
  "$BUILD/vidit" train --fresh --set $common data.val_fraction=$FRACTION train.out_dir="$WORK/val$r" > "$WORK/val.log"
  t1=$(date +%s.%N)
  "$BUILD/vidit" train --fresh --set $common data.val_fraction=$FRACTION train.val_every=0 train.out_dir="$WORK/none$r" > "$WORK/none.log"
  t2=$(date +%s.%N)
  with+=("$(python3 -c "print($t1 - $t0)")") without+=("$(python3 -c "print($t2 - $t1)")")
done
grep '^validation:' "$WORK/val.log"
python3 - "$WORK/val1/metrics.jsonl" "$STEPS" "${with[*]}" "${without[*]}" <<'PY'
import json, statistics, sys
path, steps = sys.argv[1], int(sys.argv[2])
w, wo = (statistics.median(map(float, a.split())) for a in sys.argv[3:5])
lines = [json.loads(l) for l in open(path) if l.strip()]
val = {l["step"]: l for l in lines if "val_loss" in l}
train = sum(l["step_time_s"] for l in lines if "loss" in l and 0 < l["step"] <= steps)
v = val[steps]["val_seconds"]
print(f"validation at step {steps}: {val[steps]['val_clips']} clips x {len(val[steps]['val_loss_by_sigma'])} noise levels "
      f"in {v:.2f} s; the {steps} steps before it trained in {train:.1f} s")
print(f"baseline at step 0: {val[0]['val_seconds']:.2f} s")
print(f"cost in the run: validation / training = {v / train:.4f} (target <= 0.05)")
print(f"wall clock side by side (median of the runs): with validation {w:.1f} s, without {wo:.1f} s, ratio {w / wo:.4f}")
PY
