#!/usr/bin/env bash
# Installs what vidit needs on a fresh Debian 12 machine: the system libraries
# (FFmpeg, OpenMPI, gloo headers, toml++, CLI11, nlohmann-json, zstd, xxHash, libpng, GoogleTest, Google Benchmark,
# ccache, ninja; Slurm and iproute2 for the tests of real clusters and links) with apt-get, and torch (for LibTorch)
# with pip.
# Idempotent and quick when everything is already there.
set -euo pipefail
PKGS=(build-essential cmake ninja-build ccache pkg-config git
      ffmpeg libavformat-dev libavcodec-dev libavutil-dev libswscale-dev
      libtomlplusplus-dev libcli11-dev nlohmann-json3-dev libzstd-dev libxxhash-dev libpng-dev
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
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
PY=${PYTHON:-python3}
if ! $PY -c 'import torch' 2>/dev/null; then
  echo "[install_deps] pip install torch==${VIDIT_TORCH_VERSION:-2.13.0}"
  $PY -m pip install -q "torch==${VIDIT_TORCH_VERSION:-2.13.0}"
fi
