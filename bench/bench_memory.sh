#!/usr/bin/env bash
# Each rank's peak resident memory per phase against `vidit plan`, at 1, 4 and 8 MPI ranks with
# FSDP over all of them, for a model whose whole training state (5.6 GB fp32, plus 4.4 GB for a
# checkpoint snapshot set) is more than one of 8 ranks may hold: the 0.28 B config (dim 1024,
# MLP 4096, 16 blocks), with SNAPSHOTS snapshot sets (default 1: with two, 8 ranks on this 24 GB
# machine leave too little for the rest). Per mesh: one run builds the trainer, takes 2 steps and
# saves a checkpoint; a second run (fresh processes) builds it again and resumes from that
# checkpoint. Prints bench_memory's table (rank, phase, measured, planned, ratio) for each.
# Usage: bench/bench_memory.sh [BUILD_DIR] [RANKS...]   (defaults: build, 1 4 8)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${1:-$ROOT/build}
shift || true
RANKS=("$@")
((${#RANKS[@]})) || RANKS=(1 4 8)
BENCH=$BUILD/bench_memory
[[ -x "$BENCH" ]] || { echo "bench_memory.sh: $BENCH not built (cmake --build $BUILD --target bench_memory)"; exit 1; }
SETS=(model.dim=1024 model.ffn_dim=4096 model.heads=16 model.layers=16 model.patch=[1,2,2]
      data.latent_frames=2 data.latent_height=8 data.latent_width=8 train.batch_size=8 train.threads=1
      checkpoint.keep=1 "checkpoint.snapshots=${SNAPSHOTS:-1}")
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
for n in "${RANKS[@]}"; do
  for mode in "" --resume; do
    env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader \
      mpirun --oversubscribe --bind-to none -np "$n" "$BENCH" --out "$TMP/run$n" $mode \
      --set "${SETS[@]}" "parallel.shard=$n" 2>&1 | grep -v '^attention\|^no checkpoint'
  done
done
