#!/usr/bin/env bash
# Sampling's denoise phase: 2 ranks of 1 thread (guidance on two halves, and the tokens split
# with Ulysses instead) against one process of 2 threads, same model and request, alternated
# ROUNDS times so the machine's noise falls on both. Prints each run and the ratios of the medians.
#   bash bench/bench_sample_ranks.sh [BUILD_DIR] [ROUNDS] [extra bench_sample_ranks args...]
set -euo pipefail
build=${1:-build}
rounds=${2:-3}
shift $(( $# > 2 ? 2 : $# )) || true
bin="$build/bench_sample_ranks"
mpi="mpirun --oversubscribe --bind-to none --allow-run-as-root -x OMP_NUM_THREADS=1 -x OMPI_MCA_btl=self,vader"
one=() halves=() uly=()
secs() { sed -n 's/.*: \([0-9.]*\) s;.*/\1/p'; }
for r in $(seq "$rounds"); do
  a=$(OMP_NUM_THREADS=2 "$bin" --threads 2 "$@" | tail -1); echo "$a"; one+=("$(echo "$a" | secs)")
  b=$($mpi -np 2 "$bin" --threads 1 "$@" | tail -1); echo "$b"; halves+=("$(echo "$b" | secs)")
  c=$($mpi -np 2 "$bin" --threads 1 --set sample.cfg_parallel=false "$@" | tail -1); echo "$c"; uly+=("$(echo "$c" | secs)")
done
median() { printf '%s\n' "$@" | sort -g | awk '{v[NR]=$1} END {print (NR%2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }
m1=$(median "${one[@]}") m2=$(median "${halves[@]}") m3=$(median "${uly[@]}")
awk -v a="$m1" -v b="$m2" -v c="$m3" 'BEGIN {
  printf "median denoise: 1 process x 2 threads %.2f s; 2 ranks x 1 thread, guidance halves %.2f s (ratio %.2f); Ulysses 2 %.2f s (ratio %.2f)\n", a, b, b / a, c, c / a }'
