#!/usr/bin/env bash
# Compile-checks every CUDA source (src/kernels/*.cu) with nvcc for sm_80 and sm_90, without
# torch and without a GPU: the kernels include no torch headers, so this runs on any machine
# with a CUDA toolkit. Prints one line per file; exits non-zero if any file fails.
# Without nvcc it says so and exits 0 (CPU-only machines).
# Usage: scripts/check_cuda.sh [NVCC_EXTRA_FLAGS...]
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
NVCC=${NVCC:-$(command -v nvcc || true)}
if [[ -z "$NVCC" && -x /usr/local/cuda/bin/nvcc ]]; then NVCC=/usr/local/cuda/bin/nvcc; fi
if [[ -z "$NVCC" ]]; then
  echo "nvcc not found: CUDA compile check skipped"
  exit 0
fi

shopt -s nullglob
files=("$ROOT"/src/kernels/*.cu)
if ((${#files[@]} == 0)); then
  echo "no src/kernels/*.cu files: nothing to check"
  exit 0
fi

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
echo "nvcc: $("$NVCC" --version | tail -n 2 | head -n 1)"
failed=0
for f in "${files[@]}"; do
  rel=${f#"$ROOT"/}
  obj="$TMP/$(basename "$f").o"
  start=$SECONDS
  if "$NVCC" -std=c++17 -I"$ROOT/src" \
      -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
      -Xcompiler -Wall -c "$f" -o "$obj" "$@" >"$TMP/log" 2>&1; then
    nwarn=$(grep -c -i "warning" "$TMP/log" || true)
    printf 'OK    %s (%ds%s)\n' "$rel" $((SECONDS - start)) \
      "$([[ $nwarn -gt 0 ]] && echo ", $nwarn warning lines")"
    if [[ $nwarn -gt 0 ]]; then sed 's/^/      /' "$TMP/log" | head -n 20; fi
  else
    printf 'FAIL  %s\n' "$rel"
    sed 's/^/      /' "$TMP/log" | head -n 40
    failed=$((failed + 1))
  fi
done
if ((failed)); then
  echo "check_cuda: $failed of ${#files[@]} CUDA source(s) failed to compile"
  exit 1
fi
echo "check_cuda: all ${#files[@]} CUDA source(s) compile (sm_80, sm_90)"
