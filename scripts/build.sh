#!/usr/bin/env bash
# Installs the dependencies (scripts/install_deps.sh), configures with CMake + Ninja against the
# torch of the project's virtual environment (scripts/python_env.sh) and builds. Every run
# configures again, so a tool or header installed since the last run (mpiexec, sbatch, gloo,
# SentencePiece, a Python package) is found and its tests registered; the configure step lists the
# optional tests that are off and why. Re-runs are incremental (ccache + Ninja).
# Environment: BUILD_DIR (default build), BUILD_TYPE (Release), JOBS (nproc), TARGETS (all),
# VIDIT_CONFIGURE_ONLY=1 (install and configure, no build).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
bash scripts/install_deps.sh
source scripts/python_env.sh
BUILD_DIR=${BUILD_DIR:-build}
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/ccache}
# Paths below the checkout are hashed relative to it, so a fresh clone elsewhere (CI) hits the cache.
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$ROOT}
# The precompiled header must not defeat ccache (its mtime changes on every configure).
export CCACHE_SLOPPINESS=${CCACHE_SLOPPINESS:-pch_defines,time_macros,include_file_mtime,include_file_ctime}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-Release}" \
      -DPython3_EXECUTABLE="$PYTHON" ${CMAKE_ARGS:-}
[[ "${VIDIT_CONFIGURE_ONLY:-0}" == 1 ]] && exit 0
cmake --build "$BUILD_DIR" -j "${JOBS:-$(nproc)}" ${TARGETS:+--target $TARGETS}
