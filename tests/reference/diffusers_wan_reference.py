#!/usr/bin/env python3
"""diffusers' own WanTransformer3DModel as the reference for vidit's weight layouts
(src/model/weight_layout_test.cpp runs it; tests only, never the product).

    diffusers_wan_reference.py make OUT [i2v|flf2v]
        Builds a small WanTransformer3DModel (2 layers, 3 heads of 32, ffn 128, text_dim 32, 4 -> 8
        channels, patch (1,2,2), freq_dim 64, eps 1e-5), adds noise to every parameter (so no zero-
        or one-initialised tensor hides a wrong mapping), and writes
          OUT/unsharded/   save_pretrained: config.json + diffusion_pytorch_model.safetensors
          OUT/sharded/     save_pretrained(max_shard_size="200KB"): shards + index json
          OUT/io.safetensors  x [2,4,3,6,8], t [2] (sigma*1000), text [2,7,32] (sample 1 has 4 real
                              tokens, the rest zero), out: the model's fp32 forward with the text
                              zero-padded to 512 tokens, as WanPipeline feeds it; out_f64_sinusoid:
                              the same with the timestep sinusoid computed in float64 (as official
                              Wan and vidit do; diffusers computes it in float32), to show what the
                              remaining difference comes from.
        With i2v: the model is image-to-video (image_dim 48, added_kv_proj_dim 96, in_channels 9)
        and io also holds image [2, 5, 48], the CLIP-like features it attends to; with flf2v also a
        position embedding over 10 image tokens and image [2, 10, 48] (each sample's first and last
        frames' 5 tokens, one after the other; diffusers takes them as [4, 5, 48]).
    diffusers_wan_reference.py forward MODEL_DIR IN OUT [LORA]
        WanTransformer3DModel.from_pretrained(MODEL_DIR) (every key must load: no missing,
        unexpected or mis-shaped ones), its forward on IN's x, t, text (used as given), written to
        OUT as {"out": ...}. With LORA (a .safetensors adapter file), the adapters are first read by
        diffusers' own WanLoraLoaderMixin.lora_state_dict, the reader behind
        WanPipeline.load_lora_weights (its key conversion and alpha / rank scaling), and fused into
        the weights as fuse_lora does: W += B @ A for every transformer.<module>.lora_A / lora_B
        pair. Every pair must name a Linear of the model (exit 1 otherwise).

Exit status: 0 done, 1 the model folder did not load cleanly, 2 bad usage, 3 diffusers missing.
"""
import sys
from pathlib import Path


def die(msg, code):
    print(f"diffusers_wan_reference: {msg}", file=sys.stderr)
    sys.exit(code)


try:
    import torch
    from diffusers import WanTransformer3DModel
    from safetensors.torch import load_file, save_file
except ImportError as e:  # the C++ test skips on this status
    die(f"cannot import the reference packages: {e}", 3)

try:
    import accelerate  # noqa: F401
except ImportError:
    # from_pretrained refuses to run without accelerate while _keep_in_fp32_modules is set; that
    # list only keeps some modules in fp32 when the rest is cast down. Everything here is fp32,
    # so clearing it changes nothing loaded.
    WanTransformer3DModel._keep_in_fp32_modules = None

TEXT_LEN = 512  # WanPipeline's max_sequence_length: prompts are zero-padded to it


def forward(model, x, t, text, image=None):
    if image is not None and model.config.pos_embed_seq_len:
        image = image.reshape(-1, image.shape[1] // 2, image.shape[2])  # [B, 2n, D] -> [2B, n, D]
    with torch.no_grad():
        return model(hidden_states=x, timestep=t, encoder_hidden_states=text, encoder_hidden_states_image=image,
                     return_dict=False)[0].contiguous()


def float64_sinusoid(model):
    """Replaces the model's timestep sinusoid (float32 in diffusers) by the same in float64."""
    proj = model.condition_embedder.timesteps_proj
    half = proj.num_channels // 2

    def forward(t):
        freqs = torch.pow(10000.0, -torch.arange(half, dtype=torch.float64) / half)
        args = t.double()[:, None] * freqs[None, :]
        return torch.cat([torch.cos(args), torch.sin(args)], dim=-1).float()  # flip_sin_to_cos: cos first

    proj.forward = forward


def make(out, kind="t2v"):
    out = Path(out)
    torch.manual_seed(0)
    image_kw = {}
    if kind in ("i2v", "flf2v"):
        image_kw = dict(image_dim=48, added_kv_proj_dim=96, in_channels=9)
    if kind == "flf2v":
        image_kw["pos_embed_seq_len"] = 10
    model = WanTransformer3DModel(**{**dict(patch_size=(1, 2, 2), num_attention_heads=3, attention_head_dim=32,
                                            in_channels=4, out_channels=8, text_dim=32, freq_dim=64, ffn_dim=128,
                                            num_layers=2, eps=1e-5), **image_kw}).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(out / "unsharded")
    model.save_pretrained(out / "sharded", max_shard_size="200KB")

    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, model.config.in_channels, 3, 6, 8, generator=g)
    t = torch.tensor([999.0, 412.5])
    text = torch.randn(2, 7, 32, generator=g)
    text[1, 4:] = 0
    padded = torch.zeros(2, TEXT_LEN, 32)
    padded[:, :7] = text
    image = None
    if image_kw:
        image = torch.randn(2, 10 if kind == "flf2v" else 5, 48, generator=g)
    y = forward(model, x, t, padded, image)
    float64_sinusoid(model)
    y64 = forward(model, x, t, padded, image)
    io = {"x": x, "t": t, "text": text, "out": y, "out_f64_sinusoid": y64}
    if image is not None:
        io["image"] = image
    save_file(io, str(out / "io.safetensors"))
    shards = sorted(p.name for p in (out / "sharded").iterdir())
    print(f"made {out}: out {tuple(y.shape)}, max |out| {y.abs().max().item():.4g}, sharded files {shards}")


def fuse_lora(model, lora_file):
    from diffusers.loaders.lora_pipeline import WanLoraLoaderMixin
    sd = WanLoraLoaderMixin.lora_state_dict(lora_file)
    downs = [k for k in sd if k.endswith(".lora_A.weight")]
    if not downs or len(downs) * 2 != len(sd):
        die(f"{lora_file}: diffusers read {len(sd)} tensors, {len(downs)} of them lora_A: {sorted(sd)[:6]}", 1)
    with torch.no_grad():
        for k in downs:
            name = k[len("transformer."):-len(".lora_A.weight")]
            try:
                linear = model.get_submodule(name)
            except AttributeError:
                die(f"{lora_file}: diffusers names the module {name}, which the model lacks", 1)
            up = sd[k.replace(".lora_A.", ".lora_B.")]
            linear.weight += up.float() @ sd[k].float()
    print(f"fused {len(downs)} LoRA adapters from {lora_file} (diffusers' lora_state_dict)")


def forward_cmd(model_dir, inp, outp, lora=None):
    model, info = WanTransformer3DModel.from_pretrained(model_dir, output_loading_info=True)
    bad = {k: v for k, v in info.items() if v}
    if bad:
        die(f"{model_dir} did not load cleanly: {bad}", 1)
    model = model.float().eval()
    if lora:
        fuse_lora(model, lora)
    io = load_file(inp)
    image = io["image"].float() if "image" in io else None
    y = forward(model, io["x"].float(), io["t"].float(), io["text"].float(), image)
    save_file({"out": y}, outp)
    print(f"forward {model_dir}: out {tuple(y.shape)}, max |out| {y.abs().max().item():.4g}")


def main(argv):
    if len(argv) in (2, 3) and argv[0] == "make" and (len(argv) == 2 or argv[2] in ("i2v", "flf2v")):
        make(*argv[1:])
    elif len(argv) in (4, 5) and argv[0] == "forward":
        forward_cmd(*argv[1:])
    else:
        die(__doc__, 2)


if __name__ == "__main__":
    main(sys.argv[1:])
