#!/usr/bin/env bash
# The README's demo command: install, build, then `vidit demo` (makes shape videos with FFmpeg,
# trains a tiny DiT on the CPU, samples held-out prompts, checks prompt adherence).
# Extra arguments go to `vidit demo`, e.g. scripts/demo.sh --set train.steps=500
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
TARGETS=vidit bash scripts/build.sh
exec "${BUILD_DIR:-build}/vidit" demo "$@"
