#!/usr/bin/env python3
"""diffusers' own WanPipeline in Wan 2.2 TI2V-5B's form (expand_timesteps: a timestep per token; the
Wan 2.2 VAE: 16x16 pixels per latent cell) as the reference for vidit's text-to-video sampling of
such a release (src/pipeline/ti2v_test.cpp runs it; tests only, never the product).

    diffusers_ti2v_reference.py OUT [IMAGE]
        Builds, with random weights (seeded), a small pipeline and saves it with save_pretrained
        (no text encoder: prompt embeddings are given):
          OUT/vae/            the small Wan 2.2 VAE of diffusers_vae22_reference.py (z_dim 8)
          OUT/transformer/    WanTransformer3DModel 8 -> 8 channels (2 layers, 2 heads of 16, ffn 64,
                              text_dim 64, patch (1, 2, 2))
          OUT/scheduler/      UniPCMultistepScheduler (flow prediction, flow_shift 5, TI2V-5B's)
          model_index.json    WanPipeline with expand_timesteps true (with IMAGE:
                              WanImageToVideoPipeline, no image encoder, as TI2V-5B's image mode)
        and runs it: 6 UniPC steps, guidance 5, 9 frames of 64 x 96 (latents [1, 8, 3, 4, 6]), given
        prompt_embeds / negative_prompt_embeds [1, 512, 64] and noise latents. Writes
        OUT/io.safetensors: prompt, negative, noise, latents (output_type="latent"), and video: the
        pipeline's own decode of those latents (de-normalised by the VAE's statistics, then
        vae.decode, in [-1, 1], before its post-processing). With IMAGE (loaded with
        diffusers.utils.load_image) the picture is the first frame: its latent kept in place of the
        first latent frame, whose tokens get timestep 0.

    diffusers_ti2v_reference.py open DIR IMAGE
        Opens DIR with WanImageToVideoPipeline.from_pretrained (what `vidit export --pipeline`
        wrote), checks that it asks for a timestep per token, samples 2 steps from IMAGE and random
        prompt embeddings at the sizes above, and prints the pipeline's class and the latents' shape.

Exit status: 0 done, 1 the folder does not sample as TI2V, 2 bad usage, 3 diffusers missing or
without expand_timesteps.
"""
import inspect
import json
import sys
from pathlib import Path


def die(msg, code):
    print(f"diffusers_ti2v_reference: {msg}", file=sys.stderr)
    sys.exit(code)


try:
    import torch
    from diffusers import UniPCMultistepScheduler, WanImageToVideoPipeline, WanPipeline, WanTransformer3DModel
    from diffusers.utils import load_image
    from safetensors.torch import save_file
    from small_wan_parts import prompt_pair
    from diffusers_vae22_reference import small_vae22, Z_DIM
except ImportError as e:  # the C++ test skips on this status
    die(f"cannot import the reference packages: {e}", 3)

if "expand_timesteps" not in inspect.signature(WanPipeline.__init__).parameters:
    die("this diffusers' WanPipeline has no expand_timesteps (Wan 2.2 TI2V)", 3)

FRAMES, HEIGHT, WIDTH, STEPS, SHIFT = 9, 64, 96, 6, 5.0
TEXT_LEN, TEXT_DIM = 512, 64


def open_and_sample(folder, image_path):
    try:
        import accelerate  # noqa: F401
    except ImportError:  # from_pretrained wants accelerate for this list, which matters only below fp32
        WanTransformer3DModel._keep_in_fp32_modules = None
    index = json.loads((Path(folder) / "model_index.json").read_text())
    absent = {k: None for k in ("text_encoder", "tokenizer", "transformer_2", "image_encoder", "image_processor")
              if index.get(k, [None])[0] is None}
    pipe = WanImageToVideoPipeline.from_pretrained(folder, **absent)
    if not pipe.config.expand_timesteps:
        die(f"{folder}: the pipeline does not take a timestep per token (expand_timesteps)", 1)
    g = torch.Generator().manual_seed(2)
    prompt = torch.randn(1, TEXT_LEN, pipe.transformer.config.text_dim, generator=g)
    with torch.no_grad():
        latents = pipe(image=load_image(image_path), prompt_embeds=prompt, negative_prompt_embeds=torch.zeros_like(prompt),
                       height=HEIGHT, width=WIDTH, num_frames=FRAMES, num_inference_steps=2, guidance_scale=5.0,
                       output_type="latent", generator=g).frames
    if not torch.isfinite(latents).all():
        die(f"{folder}: the pipeline's latents are not finite", 1)
    print(f"opened {folder}: {type(pipe).__name__} with expand_timesteps; latents {tuple(latents.shape)}")


def main(argv):
    if len(argv) == 3 and argv[0] == "open":
        return open_and_sample(argv[1], argv[2])
    if len(argv) not in (1, 2):
        die(__doc__, 2)
    out = Path(argv[0])
    image_path = argv[1] if len(argv) == 2 else None
    vae = small_vae22()
    torch.manual_seed(3)
    transformer = WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16,
                                        in_channels=Z_DIM, out_channels=Z_DIM, text_dim=TEXT_DIM, freq_dim=32,
                                        ffn_dim=64, num_layers=2, eps=1e-6).eval()
    with torch.no_grad():  # no zero- or one-initialised tensor may hide a wrong input
        for p in transformer.parameters():
            p.add_(0.1 * torch.randn_like(p))
    scheduler = UniPCMultistepScheduler(num_train_timesteps=1000, solver_order=2, prediction_type="flow_prediction",
                                        use_flow_sigmas=True, flow_shift=SHIFT, solver_type="bh2", predict_x0=True,
                                        lower_order_final=True)
    if image_path:
        pipe = WanImageToVideoPipeline(tokenizer=None, text_encoder=None, vae=vae, scheduler=scheduler,
                                       image_processor=None, image_encoder=None, transformer=transformer,
                                       expand_timesteps=True)
    else:
        pipe = WanPipeline(tokenizer=None, text_encoder=None, vae=vae, scheduler=scheduler, transformer=transformer,
                           expand_timesteps=True)
    pipe.save_pretrained(out)

    g = torch.Generator().manual_seed(1)
    prompt, negative = prompt_pair(g, TEXT_LEN, TEXT_DIM)
    noise = torch.randn(1, Z_DIM, (FRAMES - 1) // 4 + 1, HEIGHT // 16, WIDTH // 16, generator=g)
    with torch.no_grad():
        args = dict(prompt_embeds=prompt, negative_prompt_embeds=negative, latents=noise.clone(), height=HEIGHT,
                    width=WIDTH, num_frames=FRAMES, num_inference_steps=STEPS, guidance_scale=5.0, output_type="latent")
        if image_path:
            args["image"] = load_image(image_path)
        latents = pipe(**args).frames
        # The pipeline's decode, as WanPipeline does it for any output type but "latent".
        mean = torch.tensor(vae.config.latents_mean).view(1, Z_DIM, 1, 1, 1)
        inv_std = 1.0 / torch.tensor(vae.config.latents_std).view(1, Z_DIM, 1, 1, 1)
        video = vae.decode(latents / inv_std + mean, return_dict=False)[0]
    save_file({"prompt": prompt, "negative": negative, "noise": noise, "latents": latents.float().contiguous(),
               "video": video.float().contiguous()}, str(out / "io.safetensors"))
    print(f"made {out}: timesteps {pipe.scheduler.timesteps.tolist()}, latents {tuple(latents.shape)}, "
          f"video {tuple(video.shape)}")


if __name__ == "__main__":
    main(sys.argv[1:])
