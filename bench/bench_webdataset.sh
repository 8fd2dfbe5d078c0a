#!/usr/bin/env bash
# `vidit prepare` from WebDataset tar shards against the same videos as loose files, side by side
# in one run (issue: at least 0.95 of the loose files' throughput). N clips of FRAMES frames at
# SIZE are made with the ffmpeg CLI, captioned, packed into SHARDS tar shards by the tar program;
# each form is prepared REPS times into a fresh cache, and the median wall time of each is
# compared (the order alternates). The demo codec and a small bucket (96 x 128, every other frame)
# make decoding the work, the part a tar member could slow down: full-size fp32 clips would make
# the cache's disk writes the work, and their noise the result. Prints videos/s of each and the ratio shards / loose.
#   bench/bench_webdataset.sh [BUILD_DIR]   env: N=48 FRAMES=65 SIZE=640x480 SHARDS=4 REPS=6 KEEP=1 (keep the files)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$ROOT/build}
N=${N:-48} FRAMES=${FRAMES:-65} SIZE=${SIZE:-640x480} SHARDS=${SHARDS:-4} REPS=${REPS:-6}
WORK=$(mktemp -d /tmp/vidit_bench_wds.XXXXXX)
trap '[[ -n "${KEEP:-}" ]] || rm -rf "$WORK"' EXIT
mkdir -p "$WORK/videos" "$WORK/shards"
for i in $(seq -w 0 $((N - 1))); do
  ffmpeg -v error -y -f lavfi -i "testsrc2=size=$SIZE:rate=16" -vf "hue=h=$((10#$i * 7))" -frames:v "$FRAMES" \
    -pix_fmt yuv420p -c:v libx264 -g 16 "$WORK/videos/clip$i.mp4"
  echo "clip number $i, a test pattern" > "$WORK/videos/clip$i.txt"
done
# Shard k holds clips k, k + SHARDS, ...
for k in $(seq 0 $((SHARDS - 1))); do
  members=()
  for i in $(seq -w 0 $((N - 1))); do
    if (( 10#$i % SHARDS == k )); then members+=("clip$i.mp4" "clip$i.txt"); fi
  done
  tar -cf "$WORK/shards/s$k.tar" -C "$WORK/videos" "${members[@]}"
done
cat > "$WORK/prepare.toml" <<TOML
[model]
in_channels = 12
out_channels = 12
patch = [1, 2, 2]
[data]
source = "cache"
codec = "demo"
cache_dtype = "fp32"
decode_threads = 1
[buckets]
resolutions = [96]
aspect_ratios = [1.3333333]
frames = [33]
frame_stride = 2
multiple = 16
TOML
run() {  # manifest, cache: wall seconds of one prepare
  rm -rf "$2"
  local t0 t1
  t0=$(date +%s.%N)
  "$BUILD/vidit" prepare --config "$WORK/prepare.toml" --set "data.manifest=\"$1\"" --set "data.cache_dir=\"$2\"" \
    > "$WORK/last.log" 2>&1 || { cat "$WORK/last.log"; exit 1; }
  t1=$(date +%s.%N)
  python3 -c "print($t1 - $t0)"
}
loose=() packed=()
# Alternating which goes first (ABBA), so that neither always follows the other's writes.
for r in $(seq 1 "$REPS"); do
  if (( r % 2 )); then
    loose+=("$(run "$WORK/videos" "$WORK/cache_loose")")
    packed+=("$(run "$WORK/shards/s{0..$((SHARDS - 1))}.tar" "$WORK/cache_shards")")
  else
    packed+=("$(run "$WORK/shards/s{0..$((SHARDS - 1))}.tar" "$WORK/cache_shards")")
    loose+=("$(run "$WORK/videos" "$WORK/cache_loose")")
  fi
done
python3 - "$N" "${loose[*]}" "${packed[*]}" <<'PY'
import statistics, sys
n = int(sys.argv[1])
loose = statistics.median(float(x) for x in sys.argv[2].split())
packed = statistics.median(float(x) for x in sys.argv[3].split())
print(f"loose files: {n / loose:.2f} videos/s ({loose:.2f} s); tar shards: {n / packed:.2f} videos/s ({packed:.2f} s)")
print(f"throughput shards / loose: {loose / packed:.3f}")
PY
