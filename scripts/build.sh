#!/usr/bin/env bash
# Installs the dependencies (scripts/install_deps.sh), configures with CMake + Ninja against the
# installed torch and builds. Re-runs are incremental (ccache + Ninja).
# Environment: BUILD_DIR (default build), BUILD_TYPE (Release), JOBS (nproc), TARGETS (all).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
bash scripts/install_deps.sh
BUILD_DIR=${BUILD_DIR:-build}
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/ccache}
# Paths below the checkout are hashed relative to it, so a fresh clone elsewhere (CI) hits the cache.
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$ROOT}
# The precompiled header must not defeat ccache (its mtime changes on every configure).
export CCACHE_SLOPPINESS=${CCACHE_SLOPPINESS:-pch_defines,time_macros,include_file_mtime,include_file_ctime}
if [[ ! -f "$BUILD_DIR/build.ninja" ]]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-Release}" ${CMAKE_ARGS:-}
fi
cmake --build "$BUILD_DIR" -j "${JOBS:-$(nproc)}" ${TARGETS:+--target $TARGETS}
