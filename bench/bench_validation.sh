#!/usr/bin/env bash
# What the validation loss costs at its default interval (issue: at most 5% of training time).
# One `vidit train` on the embedded demo data with data.val_fraction = FRACTION and the default
# train.val_every / val_samples / val_sigmas, STEPS steps (the default interval: 500), every step
# logged. From its metrics.jsonl: the seconds of the validation at step STEPS against the summed
# step times of the interval before it (the baseline at step 0 is reported apart). Then the same
# run without validation, for the wall-clock ratio side by side. Prints both ratios.
#   bench/bench_validation.sh [BUILD_DIR]   env: STEPS=500 FRACTION=0.2 THREADS=2
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$ROOT/build}
STEPS=${STEPS:-500} FRACTION=${FRACTION:-0.2} THREADS=${THREADS:-2}
WORK=$(mktemp -d /tmp/vidit_bench_val.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
common="train.steps=$STEPS train.log_every=1 train.threads=$THREADS train.tensorboard=false checkpoint.every=0"
t0=$(date +%s.%N)
"$BUILD/vidit" train --fresh --set $common data.val_fraction=$FRACTION train.out_dir="$WORK/val" > "$WORK/val.log"
t1=$(date +%s.%N)
"$BUILD/vidit" train --fresh --set $common data.val_fraction=$FRACTION train.val_every=0 train.out_dir="$WORK/none" > "$WORK/none.log"
t2=$(date +%s.%N)
grep '^validation:' "$WORK/val.log"
python3 - "$WORK/val/metrics.jsonl" "$STEPS" "$t0" "$t1" "$t2" <<'PY'
import json, sys
path, steps, t0, t1, t2 = sys.argv[1], int(sys.argv[2]), *map(float, sys.argv[3:])
lines = [json.loads(l) for l in open(path) if l.strip()]
val = {l["step"]: l for l in lines if "val_loss" in l}
train = sum(l["step_time_s"] for l in lines if "loss" in l and 0 < l["step"] <= steps)
v = val[steps]["val_seconds"]
print(f"validation at step {steps}: {val[steps]['val_clips']} clips x {len(val[steps]['val_loss_by_sigma'])} noise levels "
      f"in {v:.2f} s; the {steps} steps before it trained in {train:.1f} s")
print(f"baseline at step 0: {val[0]['val_seconds']:.2f} s")
print(f"cost in the run: validation / training = {v / train:.4f} (target <= 0.05)")
print(f"wall clock side by side: with validation {t1 - t0:.1f} s, without {t2 - t1:.1f} s, ratio {(t1 - t0) / (t2 - t1):.4f}")
PY
