#!/usr/bin/env bash
# Compile-checks the code that only a CUDA build of torch compiles: the NCCL engine
# (src/parallel/comm_c10d.cpp with USE_C10D_NCCL) and the CUDA host code (src/kernels/*_cuda.cpp),
# on a machine with the CPU torch and no GPU. scripts/fetch_cuda_headers.py fetches the
# headers of the CUDA torch wheel of the same version that differ from the installed ones, and
# the nccl / cudart / cublas / ... headers, from PyPI (about 70 MB read, cached under
# ~/.cache/vidit/cuda-headers); each file is then compiled with the flags CMake gave
# comm_c10d.cpp (build/compile_commands.json), plus -DVIDIT_HAVE_CUDA -DVIDIT_HAVE_NCCL.
# Nothing is linked: this proves the code compiles against the real headers, not that it runs.
# Prints one line per file; exits non-zero if one fails or the headers cannot be fetched.
# With a CUDA torch installed the regular build compiles these files, and this says so.
# Environment: BUILD_DIR (build), VIDIT_SKIP_NCCL_CHECK=1 (machines with no network).
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
BUILD_DIR=${BUILD_DIR:-build}
source scripts/python_env.sh
PY=$PYTHON
if [[ "${VIDIT_SKIP_NCCL_CHECK:-0}" == 1 ]]; then
  echo "check_nccl: skipped (VIDIT_SKIP_NCCL_CHECK=1)"
  exit 0
fi
if "$PY" -c "import sys, torch; sys.exit(0 if torch.version.cuda else 1)" 2>/dev/null; then
  echo "check_nccl: the installed torch is a CUDA build, so the regular build compiled the NCCL engine"
  exit 0
fi
DB="$BUILD_DIR/compile_commands.json"
if [[ ! -f "$DB" ]]; then
  echo "check_nccl: $DB not found: build first (scripts/build.sh)"
  exit 1
fi
VERSION=$("$PY" -c "import torch; print(torch.__version__.split('+')[0])")
HDR=${VIDIT_CUDA_HEADERS:-$HOME/.cache/vidit/cuda-headers/$VERSION}
if ! "$PY" scripts/fetch_cuda_headers.py --dest "$HDR"; then
  echo "check_nccl: could not fetch the CUDA torch headers (needs PyPI); set VIDIT_SKIP_NCCL_CHECK=1 to skip"
  exit 1
fi

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
# One compile command per file, from comm_c10d.cpp's entry: launcher, -o and -c dropped.
"$PY" - "$DB" "$HDR" "$TMP/cmds" src/parallel/comm_c10d.cpp src/kernels/*_cuda.cpp <<'EOF'
import json, os, shlex, sys
db, hdr, out, files = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
entry = next((e for e in json.load(open(db)) if e["file"].endswith("src/parallel/comm_c10d.cpp")), None)
if entry is None:
    sys.exit("check_nccl: src/parallel/comm_c10d.cpp is not in " + db)
args = shlex.split(entry["command"]) if "command" in entry else entry["arguments"]
if os.path.basename(args[0]).startswith("ccache"):
    args = args[1:]
flags, skip = [], False
for a in args[1:]:
    if skip:
        skip = False
    elif a in ("-o", "-c"):
        skip = a == "-o"
    elif not a.endswith("comm_c10d.cpp"):
        flags.append(a)
extra = ["-I" + os.path.join(hdr, "torch"), "-isystem", os.path.join(hdr, "nvidia", "include"),
         "-DVIDIT_HAVE_CUDA=1", "-DUSE_C10D_NCCL", "-DVIDIT_HAVE_NCCL=1", "-fsyntax-only"]
with open(out, "w") as f:
    for path in files:
        f.write(shlex.join([args[0]] + extra + flags + [os.path.abspath(path)]) + "\n")
EOF
[[ -s "$TMP/cmds" ]] || exit 1

failed=0
n=0
while IFS= read -r cmd; do
  n=$((n + 1))
  file=${cmd##* }
  rel=${file#"$ROOT"/}
  start=$SECONDS
  if (cd "$BUILD_DIR" && eval "$cmd") >"$TMP/log" 2>&1; then
    printf 'OK    %s with NCCL + CUDA torch %s headers (%ds)\n' "$rel" "$VERSION" $((SECONDS - start))
  else
    printf 'FAIL  %s\n' "$rel"
    sed 's/^/      /' "$TMP/log" | head -n 40
    failed=$((failed + 1))
  fi
done <"$TMP/cmds"
if ((failed)); then
  echo "check_nccl: $failed of $n file(s) failed to compile against the CUDA torch headers"
  exit 1
fi
echo "check_nccl: all $n file(s) compile against the CUDA torch $VERSION headers (NCCL engine included)"
