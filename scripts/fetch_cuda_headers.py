#!/usr/bin/env python3
"""Fetches the C++ headers a CUDA build of torch needs, without downloading whole wheels.

The CPU torch wheel lacks a few generated headers of the CUDA build (c10/cuda/impl/
cuda_cmake_macros.h, and some differ in content), and the CUDA libraries' headers (nccl.h,
cublas_v2.h, cusparse.h, ...) ship in the nvidia-* wheels torch depends on. Those wheels are
hundreds of MB each; a wheel is a zip whose central directory lists every member with its
offset, so this script reads the directory and then only the wanted members through HTTP Range
requests (a few MB in all). It lets a CPU-only machine compile-check vidit's NCCL and CUDA host
code (scripts/check_nccl.sh) against the same headers a CUDA install has.

Output (DEST, default ~/.cache/vidit/cuda-headers/<torch version>):
  DEST/torch/   the members of torch/include whose bytes differ from the installed torch's
                (put it before the installed torch's include folder)
  DEST/nvidia/  the include/ folders of the nvidia-* wheels the torch wheel requires
  DEST/DONE     written last; a rerun with DONE present does nothing.
Usage: fetch_cuda_headers.py [--dest DIR] [--index https://pypi.org]
"""
import argparse
import io
import json
import os
import re
import sys
import time
import urllib.request
import zipfile
import zlib


class RangeFile(io.RawIOBase):
    """A read-only, seekable file over an HTTP URL; each read is one Range request."""

    def __init__(self, url):
        self.url, self.pos, self.fetched = url, 0, 0
        req = urllib.request.Request(url, method="HEAD")
        with self._open(req) as r:
            self.size = int(r.headers["Content-Length"])

    def _open(self, req):
        for attempt in range(5):
            try:
                return urllib.request.urlopen(req, timeout=60)
            except OSError as e:
                if attempt == 4:
                    raise RuntimeError(f"{self.url}: {e}") from e
                time.sleep(2 ** attempt)

    def readable(self):
        return True

    def seekable(self):
        return True

    def tell(self):
        return self.pos

    def seek(self, off, whence=0):
        self.pos = {0: off, 1: self.pos + off, 2: self.size + off}[whence]
        return self.pos

    def read(self, n=-1):
        if n is None or n < 0:
            n = self.size - self.pos
        n = min(n, self.size - self.pos)
        if n <= 0:
            return b""
        req = urllib.request.Request(self.url, headers={"Range": f"bytes={self.pos}-{self.pos + n - 1}"})
        with self._open(req) as r:
            if r.status != 206:
                raise RuntimeError(f"{self.url}: the server ignored the Range request (HTTP {r.status})")
            data = r.read()
        self.pos += len(data)
        self.fetched += len(data)
        return data

    def readinto(self, b):
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)


def same_version(a, b):
    """PEP 440 equality for plain release numbers: 13.0.3 == 13.0.3.0."""
    def norm(v):
        nums = v.split(".")
        while len(nums) > 1 and nums[-1] == "0":
            nums.pop()
        return nums
    if b.endswith(".*"):  # a prefix match
        return norm(a)[: len(norm(b[:-2]))] == norm(b[:-2])
    return norm(a) == norm(b)


def wheel_url(index, name, version, py_tag, platform):
    """The URL of NAME's wheel for VERSION (the newest if None) on this python and platform,
    from the index's simple API (PEP 691 JSON)."""
    req = urllib.request.Request(f"{index}/simple/{name}/",
                                 headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        files = json.load(r)["files"]
    stem = re.sub(r"[-_.]+", "_", name).lower()
    ok = []
    for f in files:
        fn = f["filename"]
        parts = fn[:-4].split("-") if fn.endswith(".whl") else []
        if len(parts) < 5 or parts[0].lower() != stem or (version and not same_version(parts[1], version)):
            continue
        if parts[-3] not in (py_tag, "py3", "py2.py3"):
            continue
        if not (parts[-1] == "any" or ("linux" in parts[-1] and platform in parts[-1])):
            continue
        ok.append(f)
    if not ok:
        raise RuntimeError(f"no {name} {version or ''} wheel for {py_tag} / {platform} at {index}")
    return ok[-1]["url"], ok[-1]["filename"]  # the newest: the simple API lists oldest first


# The cuda-toolkit extras whose headers torch's CUDA headers include.
TOOLKIT_PARTS = {"cudart", "crt", "cccl", "cublas", "cusparse", "cusolver", "curand", "cufft", "nvtx"}


def requires(zf, dist):
    """The Requires-Dist lines of the wheel ZF of distribution DIST."""
    meta = next(i.filename for i in zf.infolist()
                if re.match(rf"{dist}-[^/]*\.dist-info/METADATA$", i.filename))
    return [line.split(":", 1)[1].strip() for line in zf.read(meta).decode().splitlines()
            if line.startswith("Requires-Dist:")]


def extract(zf, members, strip, dest):
    """Writes the MEMBERS of zip ZF under DEST with the prefix STRIP removed."""
    for info in members:
        out = os.path.join(dest, info.filename[len(strip):])
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with open(out, "wb") as f:
            f.write(zf.read(info))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dest")
    ap.add_argument("--index", default=os.environ.get("VIDIT_PYPI", "https://pypi.org"))
    args = ap.parse_args()

    import torch  # the installed (CPU) torch: its version and headers are the reference
    version = torch.__version__.split("+")[0]
    local_inc = os.path.join(os.path.dirname(torch.__file__), "include")
    dest = args.dest or os.path.expanduser(f"~/.cache/vidit/cuda-headers/{version}")
    if os.path.exists(os.path.join(dest, "DONE")):
        print(f"[fetch_cuda_headers] {dest} is complete")
        return 0
    py_tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    platform = "x86_64"

    url, fname = wheel_url(args.index, "torch", version, py_tag, platform)
    print(f"[fetch_cuda_headers] {fname}: reading its zip directory")
    rf = RangeFile(url)
    zf = zipfile.ZipFile(io.BufferedReader(rf, buffer_size=1 << 20))
    prefix = "torch/include/"
    differ = []
    for info in zf.infolist():
        if not info.filename.startswith(prefix) or info.is_dir():
            continue
        local = os.path.join(local_inc, info.filename[len(prefix):])
        if not os.path.exists(local):
            differ.append(info)
            continue
        with open(local, "rb") as f:
            if zlib.crc32(f.read()) != info.CRC:
                differ.append(info)
    extract(zf, differ, prefix, os.path.join(dest, "torch"))
    print(f"[fetch_cuda_headers] torch: {len(differ)} headers differ from the installed {torch.__version__}")

    # The CUDA libraries torch was built against, from the wheels' metadata: the nccl wheel
    # torch pins, and the header-bearing parts of the cuda-toolkit meta-package it pins.
    fetched = rf.fetched
    wheels = []  # (name, version spec)
    toolkit = None
    for req in requires(zf, "torch"):
        m = re.match(r"(cuda-toolkit)\[[^\]]*\]==([\w.]+)|(nvidia-nccl-cu\d+)==([\w.]+)", req)
        if m and m.group(1):
            toolkit = m.group(2)
        elif m:
            wheels.append((m.group(3), m.group(4)))
    if toolkit is None or not wheels:
        raise RuntimeError(f"{fname}: no cuda-toolkit / nvidia-nccl requirement in its metadata")
    url, tname = wheel_url(args.index, "cuda-toolkit", toolkit, py_tag, platform)
    tzf = zipfile.ZipFile(io.BufferedReader(RangeFile(url), buffer_size=1 << 20))
    for req in requires(tzf, "cuda_toolkit"):
        m = re.match(r"([\w-]+)==([\w.*]+);.*extra == '(\w+)'", req)
        if m and m.group(3) in TOOLKIT_PARTS and (m.group(1), m.group(2)) not in wheels:
            wheels.append((m.group(1), m.group(2)))
    for name, spec in wheels:
        url, wname = wheel_url(args.index, name, spec, py_tag, platform)
        rf = RangeFile(url)
        # A large buffer: members are read in offset order, so neighbouring headers come from
        # one request.
        zf = zipfile.ZipFile(io.BufferedReader(rf, buffer_size=8 << 20))
        members = sorted((i for i in zf.infolist() if "/include/" in i.filename and not i.is_dir()),
                         key=lambda i: i.header_offset)
        for info in members:
            out = os.path.join(dest, "nvidia", "include", info.filename.split("/include/", 1)[1])
            os.makedirs(os.path.dirname(out), exist_ok=True)
            with open(out, "wb") as f:
                f.write(zf.read(info))
        fetched += rf.fetched
        print(f"[fetch_cuda_headers] {wname}: {len(members)} headers")
    with open(os.path.join(dest, "DONE"), "w") as f:
        f.write(f"torch {version}\n")
    print(f"[fetch_cuda_headers] done: {dest} ({fetched / 1e6:.1f} MB read)")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # one line, not a traceback, for the network errors users will meet
        print(f"fetch_cuda_headers: {e}", file=sys.stderr)
        sys.exit(1)
