#!/usr/bin/env python3
"""diffusers' own two-expert Wan pipelines (Wan 2.2 A14B's layout: transformer/ for the high-noise
expert, transformer_2/ for the low-noise one, boundary_ratio in model_index.json) as the
reference for vidit's two-expert sampling (src/pipeline/experts_test.cpp runs it; tests only).

    diffusers_experts_reference.py OUT [IMAGE]
        Builds, with random weights (seeded), a small pipeline and saves it with save_pretrained
        (no text encoder: prompt embeddings are given):
          OUT/vae/            AutoencoderKLWan of Wan 2.1's structure at base_dim 8 (z_dim 16)
          OUT/transformer/    the high-noise expert, OUT/transformer_2/ the low-noise one: two
                              WanTransformer3DModel of one shape (2 layers, 2 heads of 16, ffn 64,
                              text_dim 64, patch (1, 2, 2)), different weights; 16 -> 16 channels,
                              or with IMAGE 36 -> 16 (image-to-video A14B: no CLIP)
          OUT/scheduler/      UniPCMultistepScheduler (flow prediction, flow_shift 3)
          model_index.json    WanPipeline (WanImageToVideoPipeline with IMAGE), boundary_ratio
                              0.875 (0.9 with IMAGE)
        and runs it: 6 UniPC steps (timesteps 999, 937 at or above the boundary, the rest below),
        guidance_scale 4 (high-noise expert), guidance_scale_2 3 (low-noise), 9 frames of 48 x 32,
        given prompt_embeds / negative_prompt_embeds [1, 512, 64] (7 and 3 real tokens, zero-padded)
        and noise latents [1, 16, 3, 4, 6]; with IMAGE (loaded with diffusers.utils.load_image)
        the first frame conditions it. Writes OUT/io.safetensors: prompt, negative, noise, and
        latents (output_type="latent").

Exit status: 0 done, 2 bad usage, 3 diffusers missing.
"""
import sys
from pathlib import Path


def die(msg, code):
    print(f"diffusers_experts_reference: {msg}", file=sys.stderr)
    sys.exit(code)


try:
    import torch
    from diffusers import UniPCMultistepScheduler, WanImageToVideoPipeline, WanPipeline, WanTransformer3DModel
    from diffusers.utils import load_image
    from safetensors.torch import save_file
    from small_wan_parts import prompt_pair, small_vae
except ImportError as e:  # the C++ test skips on this status
    die(f"cannot import the reference packages: {e}", 3)

FRAMES, HEIGHT, WIDTH, STEPS, SHIFT = 9, 32, 48, 6, 3.0
TEXT_LEN, TEXT_DIM = 512, 64


def expert(in_channels, seed):
    torch.manual_seed(seed)
    t = WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16,
                              in_channels=in_channels, out_channels=16, text_dim=TEXT_DIM, freq_dim=32, ffn_dim=64,
                              num_layers=2, eps=1e-6).eval()
    with torch.no_grad():  # no zero- or one-initialised tensor may hide a wrong input
        for p in t.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return t


def main(argv):
    if len(argv) not in (1, 2):
        die(__doc__, 2)
    out = Path(argv[0])
    image_path = argv[1] if len(argv) == 2 else None
    vae = small_vae()
    channels = 36 if image_path else 16
    high, low = expert(channels, 1), expert(channels, 2)
    scheduler = UniPCMultistepScheduler(num_train_timesteps=1000, solver_order=2, prediction_type="flow_prediction",
                                        use_flow_sigmas=True, flow_shift=SHIFT, solver_type="bh2", predict_x0=True,
                                        lower_order_final=True)
    if image_path:
        pipe = WanImageToVideoPipeline(tokenizer=None, text_encoder=None, vae=vae, scheduler=scheduler,
                                       image_processor=None, image_encoder=None, transformer=high, transformer_2=low,
                                       boundary_ratio=0.9)
    else:
        pipe = WanPipeline(tokenizer=None, text_encoder=None, vae=vae, scheduler=scheduler, transformer=high,
                           transformer_2=low, boundary_ratio=0.875)
    pipe.save_pretrained(out)

    g = torch.Generator().manual_seed(1)
    prompt, negative = prompt_pair(g, TEXT_LEN, TEXT_DIM)
    noise = torch.randn(1, 16, (FRAMES - 1) // 4 + 1, HEIGHT // 8, WIDTH // 8, generator=g)
    args = dict(prompt_embeds=prompt, negative_prompt_embeds=negative, latents=noise.clone(), height=HEIGHT,
                width=WIDTH, num_frames=FRAMES, num_inference_steps=STEPS, guidance_scale=4.0, guidance_scale_2=3.0,
                output_type="latent")
    if image_path:
        args["image"] = load_image(image_path)
    with torch.no_grad():
        latents = pipe(**args).frames
    save_file({"prompt": prompt, "negative": negative, "noise": noise, "latents": latents.float().contiguous()},
              str(out / "io.safetensors"))
    print(f"made {out}: timesteps {pipe.scheduler.timesteps.tolist()}, latents {tuple(latents.shape)}")


if __name__ == "__main__":
    main(sys.argv[1:])
