#!/usr/bin/env python3
"""PyTorch-eager reference for vidit's DiT: forward check and train-step timing, side by side.

1. Runs `build/bench_train_step --dump DIR` (our C++ trainer) into a temp dir and keeps its median
   step time (the {"step_time_s": ...} JSON line it prints last).
2. Builds the same Wan 2.1-layout DiT as a plain nn.Module written from the spec (DESIGN.md,
   "Model and objective"), loads DIR/weights.safetensors with strict=True, runs one fp32 forward
   on DIR/forward.safetensors' x, t, text and checks max|ours - torch| / max|torch| <= --tol.
3. Times the same training step in PyTorch eager (synthetic latents and text, flow-matching
   noising, forward, MSE, backward, global-norm clip 1.0, torch.optim.AdamW) with the C++ run's
   batch size and thread count.
4. Prints a short table and a final JSON line.

Usage (from the repository root):
    python3 bench/torch_reference.py [--bench build/bench_train_step] [--config F] [--set k=v ...]
                                     [--steps 20] [--warmup 3] [--device cpu|cuda]
                                     [--dump-dir DIR] [--tol 1e-5] [--no-timing]
Exit status: 0 pass, 1 forward check failed, 2 the C++ benchmark or its dump could not be used.
Needs only Python 3 and torch (safetensors is parsed here).
"""
import argparse
import json
import math
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

REPO = Path(__file__).resolve().parent.parent


def die(msg, code=2):
    print(f"torch_reference: error: {msg}", file=sys.stderr)
    sys.exit(code)


# ---------------------------------------------------------------------------------------------
# safetensors: 8-byte little-endian header length, JSON header, raw little-endian bytes.
_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U8": torch.uint8, "BOOL": torch.bool,
}


def read_safetensors(path):
    data = Path(path).read_bytes()
    if len(data) < 8:
        die(f"{path}: too short for a safetensors file")
    (n,) = struct.unpack("<Q", data[:8])
    if 8 + n > len(data):
        die(f"{path}: header length {n} runs past the end of the file ({len(data)} bytes)")
    header = json.loads(data[8:8 + n].decode("utf-8"))
    body = memoryview(data)[8 + n:]
    out = {}
    for key, entry in header.items():
        if key == "__metadata__":
            continue
        dtype = _DTYPES.get(entry["dtype"])
        if dtype is None:
            die(f"{path}: tensor '{key}' has unsupported dtype {entry['dtype']}")
        shape = list(entry["shape"])
        begin, end = entry["data_offsets"]
        numel = math.prod(shape)
        itemsize = torch.empty((), dtype=dtype).element_size()
        if not (0 <= begin <= end <= len(body)) or end - begin != numel * itemsize:
            die(f"{path}: tensor '{key}' has bad data_offsets {begin}..{end} for {entry['dtype']} {shape}")
        if numel == 0:
            out[key] = torch.empty(shape, dtype=dtype)
        else:
            # bytearray copy: a writable, owned buffer (frombuffer shares memory with it)
            buf = bytearray(body[begin:end])
            out[key] = torch.frombuffer(buf, dtype=dtype).reshape(shape)
    return out


# ---------------------------------------------------------------------------------------------
# The model, Wan 2.1 layout, parameter names = official Wan keys.
def sinusoidal(dim, t):
    """[B] -> [B, dim]: cat(cos, sin) of t * 10000^(-j/half), computed in float64, returned fp32."""
    half = dim // 2
    pos = t.to(torch.float64)
    freqs = torch.pow(10000.0, -torch.arange(half, dtype=torch.float64, device=t.device) / half)
    args = pos[:, None] * freqs[None, :]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=1).float()


def rope_angles(f, h, w, head_dim, theta, device):
    """Angles [f*h*w, head_dim/2] for tokens in (t, h, w) raster order (float64)."""
    c = head_dim // 2
    n_t, n_h, n_w = c - 2 * (c // 3), c // 3, c // 3

    def axis(size, n):
        inv = theta ** (-torch.arange(n, dtype=torch.float64) / n)
        return torch.arange(size, dtype=torch.float64)[:, None] * inv[None, :]  # [size, n]

    a_t = axis(f, n_t)[:, None, None, :].expand(f, h, w, n_t)
    a_h = axis(h, n_h)[None, :, None, :].expand(f, h, w, n_h)
    a_w = axis(w, n_w)[None, None, :, :].expand(f, h, w, n_w)
    return torch.cat([a_t, a_h, a_w], dim=-1).reshape(f * h * w, c).to(device)


def rope_rotate(x, cos2, sin2):
    """x [B, L, H, D]; cos2/sin2 [L, D] (each angle repeated for its channel pair (2j, 2j+1)).
    Pair (a, b) -> (a cos - b sin, a sin + b cos)."""
    x = x.float()
    rot = torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)
    return x * cos2[:, None, :] + rot * sin2[:, None, :]


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        x = x.float()
        return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + self.eps) * self.weight


class Attention(nn.Module):
    """q from x, k/v from kv (x itself for self-attention); RMSNorm over the full dim on q, k."""

    def __init__(self, dim, heads, eps):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim) for _ in range(4))
        self.norm_q, self.norm_k = RMSNorm(dim, eps), RMSNorm(dim, eps)

    def forward(self, x, kv, rope=None):
        B, Lq, D = x.shape
        Lk, H = kv.shape[1], self.heads
        q = self.norm_q(self.q(x)).view(B, Lq, H, D // H)
        k = self.norm_k(self.k(kv)).view(B, Lk, H, D // H)
        v = self.v(kv).view(B, Lk, H, D // H)
        if rope is not None:
            q, k = rope_rotate(q, *rope), rope_rotate(k, *rope)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return self.o(o.transpose(1, 2).reshape(B, Lq, D))


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        dim, eps = c["dim"], c["eps"]
        self.norm1 = nn.LayerNorm(dim, eps=eps, elementwise_affine=False)
        self.self_attn = Attention(dim, c["heads"], eps)
        self.norm3 = nn.LayerNorm(dim, eps=eps, elementwise_affine=True)
        self.cross_attn = Attention(dim, c["heads"], eps)
        self.norm2 = nn.LayerNorm(dim, eps=eps, elementwise_affine=False)
        self.ffn = nn.Sequential(nn.Linear(dim, c["ffn_dim"]), nn.GELU(approximate="tanh"),
                                 nn.Linear(c["ffn_dim"], dim))
        self.modulation = nn.Parameter(torch.zeros(1, 6, dim))

    def forward(self, x, e0, context, rope):
        shift1, scale1, gate1, shift2, scale2, gate2 = (self.modulation + e0).chunk(6, dim=1)
        y = self.norm1(x) * (1 + scale1) + shift1
        x = x + self.self_attn(y, y, rope) * gate1
        x = x + self.cross_attn(self.norm3(x), context)
        x = x + self.ffn(self.norm2(x) * (1 + scale2) + shift2) * gate2
        return x


class Head(nn.Module):
    def __init__(self, c):
        super().__init__()
        pt, ph, pw = c["patch"]
        self.norm = nn.LayerNorm(c["dim"], eps=c["eps"], elementwise_affine=False)
        self.head = nn.Linear(c["dim"], c["out_channels"] * pt * ph * pw)
        self.modulation = nn.Parameter(torch.zeros(1, 2, c["dim"]))

    def forward(self, x, e):
        shift, scale = (self.modulation + e.unsqueeze(1)).chunk(2, dim=1)
        return self.head(self.norm(x) * (1 + scale) + shift)


class WanDiT(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        dim = c["dim"]
        self.patch_embedding = nn.Conv3d(c["in_channels"], dim, kernel_size=tuple(c["patch"]),
                                         stride=tuple(c["patch"]))
        self.text_embedding = nn.Sequential(nn.Linear(c["text_dim"], dim), nn.GELU(approximate="tanh"),
                                            nn.Linear(dim, dim))
        self.time_embedding = nn.Sequential(nn.Linear(c["freq_dim"], dim), nn.SiLU(), nn.Linear(dim, dim))
        self.time_projection = nn.Sequential(nn.SiLU(), nn.Linear(dim, 6 * dim))
        self.blocks = nn.ModuleList(Block(c) for _ in range(c["layers"]))
        self.head = Head(c)
        self._rope_cache = {}

    def rope(self, f, h, w, device):
        key = (f, h, w, str(device))
        if key not in self._rope_cache:
            ang = rope_angles(f, h, w, self.c["dim"] // self.c["heads"], self.c["rope_theta"], device)
            ang2 = ang.repeat_interleave(2, dim=-1)
            self._rope_cache[key] = (torch.cos(ang2).float(), torch.sin(ang2).float())
        return self._rope_cache[key]

    def forward(self, x, t, text):
        c = self.c
        B, C = x.shape[:2]
        pt, ph, pw = c["patch"]
        f, h, w = x.shape[2] // pt, x.shape[3] // ph, x.shape[4] // pw
        tokens = self.patch_embedding(x).flatten(2).transpose(1, 2)  # [B, f*h*w, dim]
        e = self.time_embedding(sinusoidal(c["freq_dim"], t).to(x.device))
        e0 = self.time_projection(e).unflatten(1, (6, c["dim"]))
        text = F.pad(text, (0, 0, 0, c["text_len"] - text.shape[1]))
        context = self.text_embedding(text)
        rope = self.rope(f, h, w, x.device)
        for blk in self.blocks:
            tokens = blk(tokens, e0, context, rope)
        out = self.head(tokens, e)  # [B, L, pt*ph*pw*C_out]
        out = out.view(B, f, h, w, pt, ph, pw, c["out_channels"])
        out = torch.einsum("bfhwpqrc->bcfphqwr", out)
        return out.reshape(B, c["out_channels"], f * pt, h * ph, w * pw)


def rope_self_test():
    """rope_rotate equals multiplying each adjacent pair, as a complex number, by e^(i angle)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 2 * 3 * 4, 3, 16, generator=g, dtype=torch.float64)
    ang = rope_angles(2, 3, 4, 16, 10000.0, "cpu")
    want = torch.view_as_real(torch.view_as_complex(x.reshape(2, 24, 3, 8, 2)) *
                              torch.polar(torch.ones_like(ang), ang)[None, :, None, :]).flatten(-2)
    ang2 = ang.repeat_interleave(2, dim=-1)
    got = rope_rotate(x, torch.cos(ang2).float(), torch.sin(ang2).float())
    err = (got.double() - want).abs().max().item()
    if err > 1e-5:  # rope_rotate works in fp32
        die(f"internal: rope self-test failed ({err:.3g})")


# ---------------------------------------------------------------------------------------------
def run_cpp(args, dump_dir):
    bench = Path(args.bench)
    if not bench.is_absolute():
        bench = REPO / bench
    if not bench.exists():
        die(f"{bench} does not exist: build it first (cmake --build build --target bench_train_step)")
    cmd = [str(bench), "--dump", str(dump_dir), "--steps", str(args.steps), "--warmup", str(args.warmup),
           "--device", args.device]
    if args.config:
        cmd += ["--config", args.config]
    for s in args.set or []:
        cmd += ["--set", s]
    print("running:", " ".join(cmd), flush=True)
    p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if p.returncode != 0:
        sys.stderr.write(p.stdout + p.stderr)
        die(f"bench_train_step exited with status {p.returncode}")
    step_time = None
    for line in reversed(p.stdout.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                step_time = float(json.loads(line)["step_time_s"])
                break
            except (ValueError, KeyError):
                continue
    if step_time is None:
        sys.stderr.write(p.stdout)
        die("bench_train_step printed no JSON line with step_time_s")
    for line in p.stdout.strip().splitlines()[:-1]:
        print("  [c++]", line)
    return step_time


def forward_check(cfg, dump_dir, tol):
    weights = read_safetensors(dump_dir / "weights.safetensors")
    fwd = read_safetensors(dump_dir / "forward.safetensors")
    for k in ("x", "t", "text", "out"):
        if k not in fwd:
            die(f"{dump_dir}/forward.safetensors lacks '{k}'")
    model = WanDiT(cfg)
    try:
        model.load_state_dict(weights, strict=True)
    except RuntimeError as e:
        die(f"weights.safetensors does not match the reference model built from config.json:\n{e}")
    model.eval()
    with torch.no_grad():
        ref = model(fwd["x"].float(), fwd["t"].float(), fwd["text"].float())
    ours = fwd["out"].float()
    if ours.shape != ref.shape:
        die(f"C++ output has shape {list(ours.shape)}, the reference {list(ref.shape)}", code=1)
    if not torch.isfinite(ours).all():
        return float("inf"), False, "C++ output has non-finite values"
    abs_err = (ours - ref).abs().max().item()
    scale = ref.abs().max().item()
    rel = abs_err / scale if scale > 0 else (0.0 if abs_err == 0 else float("inf"))
    # Degenerate: the output does not vary over tokens (e.g. the zero-initialised head.head.weight
    # makes it the head bias everywhere), so the check says nothing about the trunk.
    spread = ref.flatten(2).std(dim=-1).max().item()
    degenerate = scale == 0 or spread <= 1e-6 * max(scale, 1e-30)
    note = ""
    if degenerate:
        note = (f"output is degenerate (max|out| = {scale:.3g}, max per-channel std over tokens = "
                f"{spread:.3g}): head.head.weight is probably still zero, so this check does not "
                "exercise the blocks; make the --dump perturb the head")
    return rel, degenerate, note


def time_torch(cfg, steps, warmup, device, weights_path):
    torch.set_num_threads(int(cfg["threads"]))
    torch.manual_seed(0)
    dev = torch.device(device)
    model = WanDiT(cfg)
    model.load_state_dict(read_safetensors(weights_path), strict=True)
    model.to(dev).train()
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        # same split as the C++ AdamW: no decay on vectors, biases, modulation and norms
        if p.dim() <= 1 or name.endswith("bias") or name.endswith("modulation") or "norm" in name:
            no_decay.append(p)
        else:
            decay.append(p)
    params = decay + no_decay
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=cfg["lr"], betas=(0.9, 0.99), eps=1e-8)
    B = int(cfg["batch_size"])
    T, H, W = cfg["latent"]
    x_shape = (B, cfg["in_channels"], T, H, W)
    text_shape = (B, cfg["text_len"], cfg["text_dim"])

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    def step():
        x0 = torch.randn(x_shape, device=dev)
        text = torch.randn(text_shape, device=dev)
        sigma = torch.rand(B, device=dev)
        noise = torch.randn(x_shape, device=dev)
        s = sigma.view(B, 1, 1, 1, 1)
        x_t = (1 - s) * x0 + s * noise
        target = noise - x0
        opt.zero_grad(set_to_none=True)
        pred = model(x_t, sigma * 1000.0, text)
        loss = F.mse_loss(pred.float(), target)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        return loss.item()

    times = []
    for i in range(warmup + steps):
        sync()
        t0 = time.perf_counter()
        loss = step()
        sync()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
        if not math.isfinite(loss):
            die(f"PyTorch training step {i} gave a non-finite loss ({loss})", code=1)
    return statistics.median(times), min(times), max(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", default="build/bench_train_step", help="C++ benchmark binary")
    ap.add_argument("--config", default=None, help="TOML config for the C++ side (default: built-in demo)")
    ap.add_argument("--set", action="extend", nargs="+", metavar="K=V",
                    help="config override(s) passed to the C++ side (repeatable)")
    ap.add_argument("--steps", type=int, default=20, help="timed steps (both sides)")
    ap.add_argument("--warmup", type=int, default=3, help="warm-up steps (both sides)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                    help="device of both timings (the forward reference always runs on CPU in fp32)")
    ap.add_argument("--dump-dir", default=None, help="keep the C++ dump here instead of a temp dir")
    ap.add_argument("--tol", type=float, default=1e-5, help="max relative error of the forward check")
    ap.add_argument("--no-timing", action="store_true", help="only the forward check")
    ap.add_argument("--strict", action="store_true",
                    help="also fail when the compared output is degenerate (flat): used by the tests")
    args = ap.parse_args()
    if args.steps < 1 or args.warmup < 0:
        die("--steps must be >= 1 and --warmup >= 0")

    rope_self_test()
    tmp = None
    if args.dump_dir:
        dump_dir = Path(args.dump_dir).resolve()
    else:
        tmp = tempfile.TemporaryDirectory(prefix="vidit_torch_ref_")
        dump_dir = Path(tmp.name)
    try:
        cpp_time = run_cpp(args, dump_dir)
        cfg = json.loads((dump_dir / "config.json").read_text())

        rel, degenerate, note = forward_check(cfg, dump_dir, args.tol)
        passed = rel <= args.tol and not (args.strict and degenerate)
        if degenerate:
            print(f"WARNING: {note}", file=sys.stderr)
        torch_time = None
        if not args.no_timing:
            torch_time, tmin, tmax = time_torch(cfg, args.steps, args.warmup, args.device,
                                                dump_dir / "weights.safetensors")
    finally:
        if tmp is not None:
            tmp.cleanup()

    ratio = cpp_time / torch_time if torch_time else None
    print()
    print(f"model dim {cfg['dim']}, {cfg['layers']} layers, {cfg['heads']} heads, batch {cfg['batch_size']}, "
          f"latent {cfg['latent']}, threads {cfg['threads']}, device {args.device}")
    print(f"{'C++ median step time':34s} {cpp_time:10.4f} s")
    if torch_time is not None:
        print(f"{'PyTorch eager median step time':34s} {torch_time:10.4f} s  (min {tmin:.4f}, max {tmax:.4f})")
        print(f"{'ratio C++ / PyTorch (goal <= 0.9)':34s} {ratio:10.3f}")
    status = "PASS" if passed else "FAIL"
    print(f"{'forward relative error':34s} {rel:10.3g}    {status} (tol {args.tol:g})"
          + ("  [degenerate output]" if degenerate else ""))
    print(json.dumps({"cpp_step_time_s": cpp_time, "torch_step_time_s": torch_time,
                      "ratio_cpp_over_torch": ratio, "forward_rel_err": rel,
                      "forward_ok": passed, "forward_degenerate": degenerate}))
    if not passed:
        print(f"torch_reference: FAILED: forward relative error {rel:.3g} > tol {args.tol:g} "
              "(C++ DiT output differs from the PyTorch reference)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
