#!/usr/bin/env bash
# Unpacks the Debian packages of vidit's small build dependencies (toml++, CLI11, nlohmann-json,
# GoogleTest, Google Benchmark, plus the shared libraries toml++ / benchmark link to and libpng /
# zlib headers) into third_party/debs, so a machine with no package registry (the GPU test
# machine) can build: bench/gpu/run.sh adds third_party/debs/usr and its cmake folders to
# CMAKE_PREFIX_PATH when find_package would otherwise fail.
# Run on a Debian 12 (bookworm, x86_64) machine with network; needs apt-get and dpkg, not root.
# Symlinks are replaced by copies of their targets so the tree survives copies that drop links.
# Usage: scripts/fetch_header_deps.sh [DEST]   (default: <repo>/third_party/debs)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEST=${1:-${VIDIT_DEBS_DIR:-$ROOT/third_party/debs}}

# The five named packages, then what they need at link / run time, then optional extras.
PKGS=(libtomlplusplus-dev libcli11-dev nlohmann-json3-dev libxxhash-dev libgtest-dev libbenchmark-dev
      libtomlplusplus3 libbenchmark1debian)
OPTIONAL=(libpng-dev libpng16-16 zlib1g-dev libgmock-dev libgloo-dev)

command -v apt-get >/dev/null || { echo "fetch_header_deps: apt-get not found (Debian/Ubuntu only)"; exit 1; }
command -v dpkg >/dev/null || { echo "fetch_header_deps: dpkg not found"; exit 1; }

DL=$(mktemp -d)
trap 'rm -rf "$DL"' EXIT
cd "$DL"
echo "[fetch_header_deps] apt-get download ${PKGS[*]}"
if ! apt-get download "${PKGS[@]}"; then
  echo "fetch_header_deps: apt-get download failed; try 'apt-get update' first (it needs network)"
  exit 1
fi
for p in "${OPTIONAL[@]}"; do
  apt-get download "$p" >/dev/null 2>&1 || echo "[fetch_header_deps] optional $p not downloaded"
done

mkdir -p "$DEST"
for deb in "$DL"/*.deb; do
  echo "[fetch_header_deps] dpkg -x $(basename "$deb")"
  dpkg -x "$deb" "$DEST"
done

# Replace symlinks (libfoo.so -> libfoo.so.3 ...) by copies; drop dangling ones.
while IFS= read -r -d '' link; do
  target=$(readlink -f "$link" || true)
  rm -f "$link"
  if [[ -n "$target" && -f "$target" ]]; then cp "$target" "$link"; fi
done < <(find "$DEST" -type l -print0)
rm -rf "$DEST/usr/share/doc" "$DEST/usr/share/man"

du -sh "$DEST" | sed 's/^/[fetch_header_deps] size: /'
echo "[fetch_header_deps] done: use -DCMAKE_PREFIX_PATH='$DEST/usr;$DEST/usr/lib/x86_64-linux-gnu/cmake;$DEST/usr/share/cmake'"
