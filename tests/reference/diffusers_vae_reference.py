#!/usr/bin/env python3
"""diffusers' own AutoencoderKLWan (the VAE of a Wan 2.1 diffusers pipeline, vae/) as the reference
for vidit's reading of that layout (src/vae/vae_layout_test.cpp runs it; tests only, never the
product).

    diffusers_vae_reference.py make OUT
        Builds a small AutoencoderKLWan of Wan 2.1's structure (4 stages of 2 residual blocks, time
        halved in the last two downsamplings, z_dim 16, Wan 2.1's latent statistics) at base_dim 8,
        with random weights everywhere (norm gammas ~ N(1, 0.2), weights ~ N(0, 1/fan_in), biases
        ~ N(0, 0.1): no zero- or one-initialised tensor hides a wrong mapping), and writes
          OUT/vae/            save_pretrained: config.json + diffusion_pytorch_model.safetensors
          OUT/io.safetensors  video [1,3,5,32,32] in [-1,1]; mean, logvar: encode(video)'s
                              posterior; z [1,16,2,4,4]; decoded: decode(z) (clamped to [-1,1], as
                              diffusers returns it); decoded_raw: the decoder's own output before
                              that clamp (captured by a forward hook, chunk by chunk).
    diffusers_vae_reference.py run MODEL_DIR IN OUT
        AutoencoderKLWan.from_pretrained(MODEL_DIR) (every key must load: no missing, unexpected or
        mis-shaped ones); encode IN's video and decode IN's z as above, written to OUT.

Exit status: 0 done, 1 the model folder did not load cleanly, 2 bad usage, 3 diffusers missing.
"""
import sys
from pathlib import Path


def die(msg, code):
    print(f"diffusers_vae_reference: {msg}", file=sys.stderr)
    sys.exit(code)


try:
    import torch
    from diffusers import AutoencoderKLWan
    from small_wan_parts import small_vae
    from safetensors.torch import load_file, save_file
except ImportError as e:  # the C++ test skips on this status
    die(f"cannot import the reference packages: {e}", 3)


def encode_decode(vae, video, z):
    """The raw VAE, no pipeline: posterior of `video`, decode of `z` (clamped and not)."""
    raw = []
    hook = vae.decoder.register_forward_hook(lambda module, args, out: raw.append(out.detach().clone()))
    with torch.no_grad():
        posterior = vae.encode(video).latent_dist
        decoded = vae.decode(z).sample
    hook.remove()
    return {"mean": posterior.mean.contiguous(), "logvar": posterior.logvar.contiguous(),
            "decoded": decoded.contiguous(), "decoded_raw": torch.cat(raw, 2).contiguous()}


def make(out):
    out = Path(out)
    vae = small_vae()
    vae.save_pretrained(out / "vae")

    g = torch.Generator().manual_seed(1)
    video = torch.rand(1, 3, 5, 32, 32, generator=g) * 2 - 1
    z = torch.randn(1, 16, 2, 4, 4, generator=g)
    res = encode_decode(vae, video, z)
    save_file({"video": video, "z": z, **res}, str(out / "io.safetensors"))
    print(f"made {out}: mean {tuple(res['mean'].shape)}, decoded {tuple(res['decoded'].shape)}, "
          f"max |decoded_raw| {res['decoded_raw'].abs().max().item():.4g}")


def run(model_dir, inp, outp):
    vae, info = AutoencoderKLWan.from_pretrained(model_dir, output_loading_info=True)
    bad = {k: v for k, v in info.items() if v}
    if bad:
        die(f"{model_dir} did not load cleanly: {bad}", 1)
    vae = vae.float().eval()
    io = load_file(inp)
    res = encode_decode(vae, io["video"].float(), io["z"].float())
    save_file(res, outp)
    print(f"ran {model_dir}: mean {tuple(res['mean'].shape)}, decoded {tuple(res['decoded'].shape)}")


def main(argv):
    if len(argv) == 2 and argv[0] == "make":
        make(argv[1])
    elif len(argv) == 4 and argv[0] == "run":
        run(*argv[1:])
    else:
        die(__doc__, 2)


if __name__ == "__main__":
    main(sys.argv[1:])
