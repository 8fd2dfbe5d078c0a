#!/usr/bin/env bash
# The README's test command: install, build, compile-check the CUDA sources with nvcc (when
# present) and the NCCL engine against the CUDA torch headers (scripts/check_nccl.sh), and run
# the whole GoogleTest suite through CTest. Prints CTest's summary line.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
bash scripts/build.sh
source scripts/python_env.sh
bash scripts/check_cuda.sh
bash scripts/check_nccl.sh
ctest --test-dir "${BUILD_DIR:-build}" -j "${JOBS:-$(nproc)}" --output-on-failure --timeout 900
