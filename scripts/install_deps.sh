#!/usr/bin/env bash
# Installs what vidit needs on a fresh Debian 12 machine: the system libraries (FFmpeg, OpenMPI,
# gloo headers, SentencePiece, toml++, CLI11, nlohmann-json, zstd, xxHash, libpng, GoogleTest,
# Google Benchmark, ccache, ninja; Slurm and iproute2 for the tests of real clusters and links;
# python3-venv) with apt-get, then the project's Python: a virtual environment (VIDIT_VENV,
# default <checkout>/.venv; see scripts/python_env.sh) holding torch (for LibTorch) and the
# packages the tests use as references (scripts/requirements-test.txt). Nothing goes into the
# system Python.
# Idempotent and quick when everything is already there.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$ROOT/scripts/python_env.sh"
PKGS=(build-essential cmake ninja-build ccache pkg-config git ca-certificates
      python3 python3-venv
      ffmpeg libavformat-dev libavcodec-dev libavutil-dev libswscale-dev
      libsentencepiece-dev
      libtomlplusplus-dev libcli11-dev nlohmann-json3-dev libzstd-dev libxxhash-dev libpng-dev libjpeg-dev
      libgtest-dev libgmock-dev libbenchmark-dev
      openmpi-bin libopenmpi-dev libgloo-dev
      slurmctld slurmd slurm-client munge iproute2)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  echo "[install_deps] apt-get install ${missing[*]}"
  LOG=$(mktemp /tmp/vidit-apt.XXXXXX.log)
  if ! { $SUDO apt-get update -qq &&
         DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"; } >"$LOG" 2>&1; then
    tail -n 40 "$LOG"
    echo "[install_deps] error: apt-get failed (whole log: $LOG)"
    exit 1
  fi
  rm -f "$LOG"
fi

# The virtual environment, from the python3 on PATH (Debian's on a fresh machine).
if [[ "$VIDIT_PYTHON_GIVEN" == 1 ]]; then
  "$PYTHON" -c 'import torch' 2>/dev/null || {
    echo "[install_deps] error: PYTHON=$PYTHON cannot import torch: install torch there, or unset PYTHON to use the project's venv ($VIDIT_VENV)"
    exit 1; }
elif [[ ! -x "$PYTHON" ]]; then
  echo "[install_deps] python3 -m venv $VIDIT_VENV"
  python3 -m venv "$VIDIT_VENV"
fi
if ! "$PYTHON" -c 'import torch' 2>/dev/null; then
  echo "[install_deps] pip install torch==${VIDIT_TORCH_VERSION:-2.13.0} (into $VIDIT_VENV)"
  "$PYTHON" -m pip install -q "torch==${VIDIT_TORCH_VERSION:-2.13.0}"
fi
# The test references, once per version of the requirements file (a stamp beside the
# interpreter's environment); only into a virtual environment.
REQ="$ROOT/scripts/requirements-test.txt"
PREFIX=$("$PYTHON" -c 'import sys; print(sys.prefix if sys.prefix != sys.base_prefix else "")')
if [[ "${VIDIT_SKIP_TEST_PACKAGES:-0}" == 1 ]]; then
  :
elif [[ -z "$PREFIX" ]]; then
  echo "[install_deps] $PYTHON is not a virtual environment: the test references (scripts/requirements-test.txt) are not installed; their tests will say they skip"
elif ! cmp -s "$REQ" "$PREFIX/.vidit-requirements-test"; then
  echo "[install_deps] pip install -r scripts/requirements-test.txt (into $PREFIX)"
  "$PYTHON" -m pip install -q -r "$REQ"
  cp "$REQ" "$PREFIX/.vidit-requirements-test"
fi
