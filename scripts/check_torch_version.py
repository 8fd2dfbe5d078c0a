#!/usr/bin/env python3
"""Compile-checks vidit against another torch release's C++ headers, without installing it.

The GPU machines vidit runs on often carry an older torch than the one the test command installs
(the CUDA image this project's GPU checks use had torch 2.11). An API that changed between the
two (an overload added, a c10d option renamed) is then a compile error found only on the GPU
machine. This reads torch/include of the CUDA wheel of VERSION from PyPI through HTTP Range
requests (about 18 MB, scripts/fetch_cuda_headers.py's reader) and compiles every translation unit
of build/compile_commands.json with -fsyntax-only against it, as the CUDA build would
(VIDIT_HAVE_CUDA, the NCCL engine, and the CUDA host code src/kernels/*_cuda.cpp). Nothing is linked.

Needs: a finished build (scripts/build.sh) and the CUDA library headers that
scripts/check_nccl.sh fetches (~/.cache/vidit/cuda-headers/<installed>/nvidia).
Usage: scripts/check_torch_version.py VERSION [-j N] [FILE_SUBSTRING ...]
Takes about 13 minutes on 2 cores for every file. Exits non-zero if one fails.
"""
import argparse
import concurrent.futures as cf
import glob
import io
import json
import os
import shlex
import shutil
import subprocess
import sys
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import fetch_cuda_headers as fch  # noqa: E402


def fetch_includes(version, dest):
    """DEST/include: torch/include of the cp312 x86_64 wheel of VERSION (once)."""
    if os.path.exists(os.path.join(dest, "DONE")):
        return
    url, fname = fch.wheel_url("https://pypi.org", "torch", version, "cp312", "x86_64")
    rf = fch.RangeFile(url)
    zf = zipfile.ZipFile(io.BufferedReader(rf, buffer_size=8 << 20))
    members = sorted((i for i in zf.infolist() if i.filename.startswith("torch/include/") and not i.is_dir()),
                     key=lambda i: i.header_offset)
    fch.extract(zf, members, "torch/", dest)
    open(os.path.join(dest, "DONE"), "w").write(fname + "\n")
    print(f"[check_torch_version] {fname}: {len(members)} headers ({rf.fetched / 1e6:.1f} MB read)")


def commands(build, installed_inc, other_inc, nvidia_inc, pch_dir, only):
    """(file, argv) per translation unit, rewritten for OTHER_INC and the CUDA build's defines."""
    out = []
    for e in json.load(open(os.path.join(build, "compile_commands.json"))):
        f = e["file"]
        if f.endswith(".hxx.cxx") or f.endswith(".cu"):
            continue
        args, argv, skip = shlex.split(e["command"]) if "command" in e else e["arguments"], [], None
        for a in args:
            if skip == "-o":
                skip = None
            elif skip == "-include":
                skip = None
                if a.endswith("cmake_pch.hxx"):  # the header list, not the .gch built for another torch
                    copy = os.path.join(pch_dir, a.strip("/").replace("/", "_"))
                    shutil.copy(a, copy)
                    argv += ["-include", copy]
            elif a in ("-o", "-include"):
                skip = a
            elif a not in ("-Winvalid-pch", "-c"):
                argv.append(a.replace(installed_inc, other_inc))
        argv[1:1] = ["-fsyntax-only"]
        argv += ["-DVIDIT_HAVE_CUDA=1", "-DVIDIT_HAVE_NCCL=1", "-DUSE_C10D_NCCL", "-isystem", nvidia_inc]
        if f.endswith("src/parallel/comm_c10d.cpp"):  # the CUDA host code takes the same flags
            for k in sorted(glob.glob(os.path.join(ROOT, "src/kernels/*_cuda.cpp"))):
                out.append((k, [k if a == f else a for a in argv], e["directory"]))
        out.append((f, argv, e["directory"]))
    return [c for c in out if not only or any(s in c[0] for s in only)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("version")
    ap.add_argument("-j", type=int, default=os.cpu_count())
    ap.add_argument("only", nargs="*", help="check only files whose path contains one of these")
    args = ap.parse_intermixed_args()
    build = os.environ.get("BUILD_DIR", os.path.join(ROOT, "build"))
    import torch
    installed = torch.__version__.split("+")[0]
    installed_inc = os.path.join(os.path.dirname(torch.__file__), "include")
    cache = os.path.expanduser(f"~/.cache/vidit/torch-include/{args.version}")
    fetch_includes(args.version, cache)
    nvidia = glob.glob(os.path.expanduser(f"~/.cache/vidit/cuda-headers/{installed}/nvidia/include"))
    if not nvidia:
        sys.exit("check_torch_version: run scripts/check_nccl.sh first (it fetches the CUDA library headers)")
    pch_dir = os.path.join(cache, "pch")
    os.makedirs(pch_dir, exist_ok=True)
    cmds = commands(build, installed_inc, os.path.join(cache, "include"), nvidia[0], pch_dir, args.only)

    def run(c):
        r = subprocess.run(c[1], cwd=c[2], capture_output=True, text=True)
        return c[0], r.returncode, r.stderr

    failed = 0
    with cf.ThreadPoolExecutor(args.j) as ex:
        for f, rc, err in ex.map(run, cmds):
            rel = os.path.relpath(f, ROOT)
            if rc:
                failed += 1
                print(f"FAIL  {rel}")
                print("\n".join("      " + l for l in err.splitlines() if "error" in l)[:4000])
            else:
                print(f"OK    {rel}")
    print(f"check_torch_version: {len(cmds) - failed} of {len(cmds)} files compile against torch "
          f"{args.version}'s headers (installed: {installed})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
