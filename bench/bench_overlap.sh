#!/usr/bin/env bash
# Does FSDP's prefetch hide the all-gathers? Trains the same model with parameters sharded over 2
# processes, with parallel.prefetch on and off, on both CPU engines (MPI under mpirun, gloo under
# torchrun), in one run, and prints per engine the median step time and the median time rank 0
# was blocked in collectives per step (bench_train_step; parallel/timed_comm.h), with the ratios
# prefetch-on / prefetch-off.
# The model (bench/sharded_model.sh) is sized so that a block's all-gather (about 17 MB) is comparable to its compute
# (64 tokens per sample, one thread per rank).
# Usage: bench/bench_overlap.sh [BUILD_DIR] [STEPS]   (defaults: build, 12)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${1:-$ROOT/build}
STEPS=${2:-12}
NAME=bench_overlap
# shellcheck source=bench/sharded_model.sh
source "$ROOT/bench/sharded_model.sh"

run() {  # engine prefetch
  local launch
  if [[ $1 == mpi ]]; then
    launch=(env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader
            mpirun --oversubscribe --bind-to none -np 2)
  else
    launch=(env VIDIT_COMM=gloo "$PY" -m torch.distributed.run --standalone --nproc-per-node=2 --no-python)
  fi
  "${launch[@]}" "$BENCH" --steps "$STEPS" --warmup 3 --set "${SETS[@]}" "parallel.prefetch=$2" \
    >"$TMP/out" 2>&1 || { cat "$TMP/out"; exit 1; }
  grep '^{' "$TMP/out" | tail -n 1
}

printf '%-6s %-9s %14s %18s %10s\n' engine prefetch "step (s)" "blocked (s/step)" "blocked %"
for engine in mpi gloo; do
  on=$(run "$engine" true)
  off=$(run "$engine" false)
  "$PY" - "$engine" "$on" "$off" <<'EOF'
import json, sys
engine, on, off = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
for name, r in (("on", on), ("off", off)):
    print(f"{engine:<6} {name:<9} {r['step_time_s']:14.4f} {r['comm_wait_s']:18.4f} "
          f"{100 * r['comm_wait_s'] / r['step_time_s']:9.1f}%")
w_off = off['comm_wait_s']
print(f"{engine:<6} on / off  step {on['step_time_s'] / off['step_time_s']:.3f}, blocked "
      f"{on['comm_wait_s'] / w_off if w_off > 0 else float('nan'):.3f}")
EOF
done
