#!/usr/bin/env python3
"""Reference trajectories of diffusers' flow-matching schedulers, for src/diffusion/unipc_test.cpp.

For each case named on the command line this writes OUT_DIR/<case>.safetensors holding what
diffusers computes, so the C++ solvers can be held to it:
  sigmas         [steps+1] float32   the scheduler's sigma grid, final sigma included
  timesteps      [steps]             the timesteps a pipeline feeds the model (int64 for UniPC,
                                     float32 for the flow Euler scheduler)
  sample0        [B, C, T, H, W]     the starting sample (random, seeded)
  model_outputs  [steps, B, C, T, H, W]  the "model" output given at each step (random, seeded)
  outputs        [steps, B, C, T, H, W]  the sample after each scheduler.step

Cases:
  unipc:<order>:<steps>:<shift>   UniPCMultistepScheduler as Wan 2.1's diffusers pipelines build it
                                  (flow_prediction, use_flow_sigmas, flow_shift, bh2, predict_x0,
                                  lower_order_final, 1000 training timesteps), solver_order <order>
  euler:<steps>:<shift>           FlowMatchEulerDiscreteScheduler(shift=<shift>)

Usage: scheduler_reference.py OUT_DIR CASE [CASE ...]
Needs torch, diffusers and safetensors. Exit status 3 when one is missing (the test skips).
"""
import os
import sys

try:
    import torch
    import diffusers
    from diffusers import FlowMatchEulerDiscreteScheduler, UniPCMultistepScheduler
    from safetensors.torch import save_file
except ImportError as e:  # the C++ test turns this into a skip with the reason
    print(f"missing python package: {e}", file=sys.stderr)
    sys.exit(3)

SHAPE = (2, 4, 3, 5, 6)  # [B, C, T, H, W]; UniPC's einsum wants at least [B, C, ...]


def make_scheduler(kind, args):
    if kind == "unipc":
        order, steps, shift = int(args[0]), int(args[1]), float(args[2])
        sched = UniPCMultistepScheduler(
            num_train_timesteps=1000,
            solver_order=order,
            prediction_type="flow_prediction",
            use_flow_sigmas=True,
            flow_shift=shift,
            solver_type="bh2",
            predict_x0=True,
            lower_order_final=True,
        )
    elif kind == "euler":
        steps, shift = int(args[0]), float(args[1])
        sched = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=shift)
    else:
        raise SystemExit(f"unknown case kind '{kind}'")
    sched.set_timesteps(steps)
    return sched, steps


def run_case(spec, seed):
    kind, *args = spec.split(":")
    sched, steps = make_scheduler(kind, args)
    gen = torch.Generator().manual_seed(seed)
    sample = torch.randn(SHAPE, generator=gen, dtype=torch.float32)
    model_outputs = torch.randn((steps,) + SHAPE, generator=gen, dtype=torch.float32)
    # The pipelines set the begin index so the scheduler does not look the timestep up.
    sched.set_begin_index(0)
    x = sample
    outputs = []
    for i, t in enumerate(sched.timesteps):
        x = sched.step(model_outputs[i], t, x, return_dict=False)[0]
        outputs.append(x)
    return {
        "sigmas": sched.sigmas.to(torch.float32).contiguous(),
        "timesteps": sched.timesteps.contiguous(),
        "sample0": sample.contiguous(),
        "model_outputs": model_outputs.contiguous(),
        "outputs": torch.stack(outputs).contiguous(),
    }


def main():
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    for n, spec in enumerate(sys.argv[2:]):
        tensors = run_case(spec, seed=1234 + n)
        name = spec.replace(":", "_")
        save_file(tensors, os.path.join(out_dir, name + ".safetensors"),
                  metadata={"case": spec, "diffusers": diffusers.__version__, "torch": torch.__version__})


if __name__ == "__main__":
    main()
