#!/usr/bin/env bash
# What FSDP sends when it gathers weights: the same model, parameters sharded over 2 MPI
# processes, trained with the weights all-gathered in fp32, in bf16 (parallel.gather_dtype), and
# with FP8 training, the blocks' FP8 projection weights in e4m3 (parallel.fp8_all_gather), in
# one run. Prints per case the MB one rank puts into the all-gathers per step (FSDP's own count),
# the median step time and time rank 0 was blocked in collectives (bench_train_step), and each
# case's bytes as a fraction of the first's.
# The model is bench/sharded_model.sh, as bench_overlap.sh.
# Usage: bench/bench_fsdp_gather.sh [BUILD_DIR] [STEPS]   (defaults: build, 8)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${1:-$ROOT/build}
STEPS=${2:-8}
NAME=bench_fsdp_gather
# shellcheck source=bench/sharded_model.sh
source "$ROOT/bench/sharded_model.sh"

run() {  # extra sets...
  env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader \
    mpirun --oversubscribe --bind-to none -np 2 "$BENCH" --steps "$STEPS" --warmup 2 --set "${SETS[@]}" "$@" \
    >"$TMP/out" 2>&1 || { cat "$TMP/out"; exit 1; }
  grep '^{' "$TMP/out" | tail -n 1
}

rows=()
case_() {  # precision "gathered as" extra sets...
  local p=$1 g=$2 r
  shift 2
  r=$(run "train.precision=\"$p\"" "$@") || { echo "$r"; exit 1; }
  rows+=("$p $g $r")
}
case_ fp32 fp32 'parallel.gather_dtype="fp32"'
case_ bf16 fp32 'parallel.gather_dtype="fp32"'
case_ bf16 bf16 'parallel.gather_dtype="bf16"'
case_ fp8 bf16 'parallel.gather_dtype="bf16"' parallel.fp8_all_gather=false
case_ fp8 bf16+e4m3 'parallel.gather_dtype="bf16"' parallel.fp8_all_gather=true
"$PY" - "${rows[@]}" <<'PYEOF'
import json, sys
rows = [a.split(" ", 2) for a in sys.argv[1:]]
print("%-10s %-13s %13s %8s %9s %12s %10s" % ("precision", "gathered as", "MB sent/step", "of fp32", "step (s)",
                                             "blocked (s)", "mean loss"))
base = json.loads(rows[0][2])["gather_mb_per_step"]
for p, g, j in rows:
    r = json.loads(j)
    print("%-10s %-13s %13.2f %8.3f %9.3f %12.3f %10.4f" % (p, g, r["gather_mb_per_step"], r["gather_mb_per_step"] / base,
                                                         r["step_time_s"], r["comm_wait_s"], r["mean_loss"]))
PYEOF
