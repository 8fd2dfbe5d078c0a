#!/usr/bin/env python3
"""Gradient golden test: vidit's training step against PyTorch autograd on diffusers'
WanTransformer3DModel (tests only, never the product).

    gradient_reference.py --bench build/bench_train_step [--np N --mpirun MPIRUN]
                          [--set k=v ...] [--steps 10] [--tol 1e-5] [--loss-tol 1e-5]

1. Runs `bench_train_step --dump DIR --dump-steps STEPS` (under `MPIRUN -np N` when N > 1) with
   the given config overrides. The dump holds the weights in diffusers' layout
   (DIR/transformer/), and per step the global batch of each micro-batch (x_t, timestep, text,
   target), the micro-batches' and the step's losses and every parameter's whole gradient before
   clipping (see bench/bench_train_step.cpp).
2. Loads DIR/transformer with WanTransformer3DModel.from_pretrained (every key must load), with
   the timestep sinusoid in float64 as vidit and official Wan compute it (diffusers uses float32).
3. Step 1: the loss (mean squared error of the prediction against the target, averaged over the
   micro-batches) and every parameter's gradient by autograd, each compared with vidit's:
   max |ours - torch| / max |torch| <= --tol per tensor.
4. Steps 2..STEPS: PyTorch continues the run itself (global-norm clip, torch.optim.AdamW with
   vidit's hyperparameters and weight-decay split) on the dumped batches, and each step's loss
   must equal vidit's within --loss-tol relative. Needs train.schedule = "constant" and
   train.warmup_steps = 0 (the learning rate is then train.lr at every step).

Prints one line per step and a JSON summary. Exit status: 0 pass, 1 a difference over its
tolerance, 2 the C++ run or its dump could not be used, 77 diffusers missing (the test skips).
"""
import argparse
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path


def die(msg, code=2):
    print(f"gradient_reference: {msg}", file=sys.stderr)
    sys.exit(code)


try:
    import torch
    import torch.nn.functional as F
    from diffusers import WanTransformer3DModel
    from safetensors.torch import load_file
except ImportError as e:
    die(f"skipped: cannot import the reference packages ({e}); run scripts/install_deps.sh", 77)

try:
    import accelerate  # noqa: F401
except ImportError:
    # Only matters when modules are cast down; everything here is fp32.
    WanTransformer3DModel._keep_in_fp32_modules = None

# The timestep sinusoid in float64, as the weight-layout reference patches it (diffusers is
# importable by now, so that module's own import check passes).
sys.path.insert(0, str(Path(__file__).resolve().parent))
from diffusers_wan_reference import float64_sinusoid  # noqa: E402


def run_bench(args, out):
    cmd = [args.bench, "--dump", str(out), "--dump-steps", str(args.steps), "--steps", str(args.steps),
           "--warmup", "0"]
    for s in args.set or []:
        cmd += ["--set", s]
    if args.np > 1:
        cmd = [args.mpirun, "--oversubscribe", "--allow-run-as-root", "-np", str(args.np),
               "-x", "OMP_NUM_THREADS=1"] + cmd
    print("running:", " ".join(cmd), flush=True)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    for line in p.stdout.splitlines():
        if line.startswith("no "):
            print("  [c++]", line)
    if p.returncode != 0:
        sys.stderr.write(p.stdout[-4000:] + p.stderr[-4000:])
        die(f"bench_train_step exited with status {p.returncode}")


def step_loss(model, step, accum):
    """The step's loss as vidit defines it: each micro-batch's mean squared error, averaged."""
    total, parts = 0.0, []
    for m in range(accum):
        pred = model(hidden_states=step[f"micro{m}/x_t"], timestep=step[f"micro{m}/timestep"],
                     encoder_hidden_states=step[f"micro{m}/text"], return_dict=False)[0]
        loss = F.mse_loss(pred.float(), step[f"micro{m}/target"])
        parts.append(loss.item())
        total = total + loss / accum
    return total, parts


def rel(ours, ref):
    scale = ref.abs().max().item()
    err = (ours - ref).abs().max().item()
    return err / scale if scale > 0 else (0.0 if err == 0 else math.inf)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", required=True)
    ap.add_argument("--np", type=int, default=1)
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--set", action="extend", nargs="+", metavar="K=V")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--tol", type=float, default=1e-5)
    ap.add_argument("--loss-tol", type=float, default=1e-5)
    ap.add_argument("--keep", default=None, help="keep the dump in this folder")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(2)

    tmp = None
    if args.keep:
        out = Path(args.keep)
    else:
        tmp = tempfile.TemporaryDirectory(prefix="vidit_grad_ref_")
        out = Path(tmp.name)
    run_bench(args, out)
    cfg = json.loads((out / "config.json").read_text())
    accum = int(cfg["grad_accum"])

    if not (out / "transformer" / "config.json").exists():
        die(f"the dump has no diffusers folder {out}/transformer: see bench_train_step's output above")
    model, info = WanTransformer3DModel.from_pretrained(str(out / "transformer"), output_loading_info=True)
    bad = {k: v for k, v in info.items() if v}
    if bad:
        die(f"{out}/transformer did not load cleanly: {bad}", 1)
    model = model.float().train()
    float64_sinusoid(model)
    params = dict(model.named_parameters())

    failures = []
    steps = [load_file(str(out / f"step_{s:06d}.safetensors")) for s in range(1, args.steps + 1)]

    # Step 1: loss and every gradient.
    loss, parts = step_loss(model, steps[0], accum)
    loss.backward()
    ours_loss = steps[0]["loss"].double().item()
    loss_err = abs(ours_loss - loss.item()) / abs(loss.item())
    print(f"step 1: loss vidit {ours_loss:.9g} torch {loss.item():.9g} (relative {loss_err:.3g})")
    if loss_err > args.tol:
        failures.append(f"step 1 loss differs by {loss_err:.3g} relative")
    for m, part in enumerate(parts):
        e = abs(steps[0][f"micro{m}/loss"].item() - part) / abs(part)
        if e > args.tol:
            failures.append(f"micro-batch {m}'s loss differs by {e:.3g} relative")
    grads = {k[len("grad/"):]: v for k, v in steps[0].items() if k.startswith("grad/")}
    missing = sorted(set(params) - set(grads))
    extra = sorted(set(grads) - set(params))
    if missing or extra:
        die(f"the dump's gradients do not name the model's parameters: missing {missing[:5]}, unknown {extra[:5]}", 1)
    worst = []
    for name, p in params.items():
        if p.grad is None:
            failures.append(f"{name}: autograd gave no gradient")
            continue
        r = rel(grads[name].float(), p.grad.float())
        worst.append((r, name, p.grad.abs().max().item()))
        if r > args.tol or not math.isfinite(r):
            failures.append(f"{name}: gradient differs by {r:.3g} relative (max |grad| {p.grad.abs().max().item():.3g})")
    worst.sort(reverse=True)
    print(f"gradients of {len(worst)} parameters: worst relative {worst[0][0]:.3g} ({worst[0][1]}), "
          f"median {worst[len(worst) // 2][0]:.3g}")
    if any(g == 0 for _, _, g in worst):
        zero = [n for _, n, g in worst if g == 0]
        failures.append(f"{len(zero)} parameters have an all-zero gradient, so the check says nothing of them: {zero[:4]}")

    # Steps 2..: PyTorch trains on, with vidit's clip and AdamW, on the same batches.
    losses = [(1, ours_loss, loss.item())]
    if args.steps > 1:
        if cfg["schedule"] != "constant" or int(cfg["warmup_steps"]) != 0:
            die("the losses after step 1 need train.schedule=\"constant\" and train.warmup_steps=0")
        decay, no_decay = [], []
        for name, p in params.items():
            # vidit's split (train/adamw.cpp) in diffusers' names: no decay on vectors, biases,
            # the modulation tables and norms.
            if p.dim() <= 1 or name.endswith("bias") or "scale_shift_table" in name or "norm" in name:
                no_decay.append(p)
            else:
                decay.append(p)
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg["weight_decay"]},
                                 {"params": no_decay, "weight_decay": 0.0}],
                                lr=cfg["lr"], betas=(cfg["beta1"], cfg["beta2"]), eps=cfg["adam_eps"])
        for s in range(1, args.steps):
            if cfg["grad_clip"] > 0:
                torch.nn.utils.clip_grad_norm_(list(params.values()), cfg["grad_clip"])
            opt.step()
            opt.zero_grad(set_to_none=True)
            loss, _ = step_loss(model, steps[s], accum)
            loss.backward()
            ours = steps[s]["loss"].double().item()
            losses.append((s + 1, ours, loss.item()))
    print("step  vidit loss      torch loss      relative")
    worst_loss = 0.0
    for s, ours, ref in losses:
        e = abs(ours - ref) / abs(ref)
        worst_loss = max(worst_loss, e)
        print(f"{s:4d}  {ours:.9g}  {ref:.9g}  {e:.3g}")
        if s > 1 and e > args.loss_tol:
            failures.append(f"step {s}'s loss differs by {e:.3g} relative")
    print(json.dumps({"world": cfg["world"], "params": len(worst), "worst_grad_rel": worst[0][0],
                      "worst_loss_rel": worst_loss, "steps": args.steps, "pass": not failures}))
    if tmp is not None:
        tmp.cleanup()
    if failures:
        for f in failures:
            print("FAIL:", f, file=sys.stderr)
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
