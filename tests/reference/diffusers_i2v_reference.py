#!/usr/bin/env python3
"""diffusers' own WanImageToVideoPipeline as the reference for vidit's image-to-video sampling
(src/pipeline/image_condition_test.cpp runs it; tests only, never the product).

    diffusers_i2v_reference.py OUT IMAGE [LAST_IMAGE]
        Builds, with random weights (seeded), a small image-to-video pipeline, saved by its
        save_pretrained (model_index.json and scheduler/ beside the parts; no text encoder):
          OUT/vae/          AutoencoderKLWan of Wan 2.1's structure at base_dim 8 (z_dim 16)
          OUT/image_encoder/  transformers' CLIPVisionModel (hidden 48, 3 layers, 4 heads, 32-pixel
                            pictures in 16-pixel patches: 5 tokens, quick_gelu)
          OUT/image_processor/  its CLIPImageProcessor (shortest edge 32, centre crop 32; the PIL
                            implementation)
          OUT/transformer/  WanTransformer3DModel, image-to-video: in_channels 36 (16 noisy + 4 mask
                            + 16 condition latent), out 16, image_dim 48, 2 layers, 2 heads of 16,
                            patch (1, 2, 2); with LAST_IMAGE a first-and-last-frame model (a position
                            embedding over 2 x 5 image tokens)
        and runs WanImageToVideoPipeline (UniPC, solver order 2, flow shift 3, 3 steps, guidance
        5) on IMAGE (and LAST_IMAGE) loaded with diffusers.utils.load_image, at 9 frames of 48 x 32
        pixels (the picture resized by the pipeline's own VideoProcessor, its CLIP features made
        by the pipeline's encode_image), with given random prompt_embeds / negative_prompt_embeds
        [1, 512, 32] (7 and 3 real tokens, zero-padded as WanPipeline pads them; umT5 is compared
        on its own in src/text/) and noise latents [1, 16, 3, 4, 6]. Writes
          OUT/io.safetensors  prompt, negative, noise, and
                              latents: the pipeline's output_type="latent" result;
                              pixels: the first picture as the VAE took it ([3, 32, 48], [-1, 1]);
                              image_embeds: the CLIP features the transformer attended to
                              ([1, n x 5, 48], the pictures' tokens one after the other)
        The pipeline refuses image_embeds beside the image; here it computes them itself.

    diffusers_i2v_reference.py open DIR IMAGE
        Opens DIR with WanImageToVideoPipeline.from_pretrained (what `vidit export --pipeline`
        wrote) and samples 2 steps at the sizes above from IMAGE and random prompt embeddings;
        prints the class of each component and the latents' shape.

Exit status: 0 done, 2 bad usage, 3 diffusers missing.
"""
import json
import sys
from pathlib import Path


def die(msg, code):
    print(f"diffusers_i2v_reference: {msg}", file=sys.stderr)
    sys.exit(code)


try:
    import torch
    from diffusers import UniPCMultistepScheduler, WanImageToVideoPipeline, WanTransformer3DModel
    from diffusers.utils import load_image
    from safetensors.torch import save_file
    from transformers import CLIPVisionConfig, CLIPVisionModel
    from small_wan_parts import prompt_pair, randomize, small_vae
except ImportError as e:  # the C++ test skips on this status
    die(f"cannot import the reference packages: {e}", 3)
try:  # transformers 5: the PIL implementation has its own name (CLIPImageProcessor uses torchvision)
    from transformers import CLIPImageProcessorPil as PilClipProcessor
except ImportError:
    from transformers import CLIPImageProcessor as PilClipProcessor

FRAMES, HEIGHT, WIDTH, STEPS, SHIFT, GUIDANCE = 9, 32, 48, 3, 3.0, 5.0
TEXT_LEN, TEXT_DIM, IMAGE_DIM, IMAGE_TOKENS = 512, 32, 48, 5


def make(out, image_path, last_path=None):
    out = Path(out)
    vae = small_vae()
    extra = {"pos_embed_seq_len": 2 * IMAGE_TOKENS} if last_path else {}
    transformer = WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16,
                                        in_channels=36, out_channels=16, text_dim=TEXT_DIM, freq_dim=32, ffn_dim=64,
                                        num_layers=2, eps=1e-6, image_dim=IMAGE_DIM, added_kv_proj_dim=32,
                                        **extra).eval()
    with torch.no_grad():  # no zero- or one-initialised tensor may hide a wrong input
        for p in transformer.parameters():
            p.add_(0.1 * torch.randn_like(p))

    clip = CLIPVisionModel(CLIPVisionConfig(hidden_size=IMAGE_DIM, intermediate_size=96, num_hidden_layers=3,
                                            num_attention_heads=4, image_size=32, patch_size=16,
                                            hidden_act="quick_gelu")).eval()
    randomize(clip, 1.0)
    processor = PilClipProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})

    scheduler = UniPCMultistepScheduler(num_train_timesteps=1000, solver_order=2, prediction_type="flow_prediction",
                                        use_flow_sigmas=True, flow_shift=SHIFT, solver_type="bh2", predict_x0=True,
                                        lower_order_final=True)
    pipe = WanImageToVideoPipeline(tokenizer=None, text_encoder=None, vae=vae, scheduler=scheduler,
                                   image_processor=processor, image_encoder=clip, transformer=transformer)
    pipe.save_pretrained(out)  # a release WanImageToVideoPipeline.from_pretrained opens (no text encoder)
    attended = []  # the CLIP features the transformer is given (the first call's)
    transformer.register_forward_pre_hook(
        lambda module, args, kwargs: attended.append(kwargs["encoder_hidden_states_image"].detach().clone()),
        with_kwargs=True)

    g = torch.Generator().manual_seed(1)
    prompt, negative = prompt_pair(g, TEXT_LEN, TEXT_DIM)
    noise = torch.randn(1, 16, (FRAMES - 1) // 4 + 1, HEIGHT // 8, WIDTH // 8, generator=g)

    image = load_image(image_path)
    last = load_image(last_path) if last_path else None
    pixels = pipe.video_processor.preprocess(image, height=HEIGHT, width=WIDTH)[0]
    with torch.no_grad():
        latents = pipe(image=image, last_image=last, prompt_embeds=prompt, negative_prompt_embeds=negative,
                       latents=noise.clone(), height=HEIGHT, width=WIDTH,
                       num_frames=FRAMES, num_inference_steps=STEPS, guidance_scale=GUIDANCE,
                       output_type="latent").frames
    save_file({"prompt": prompt, "negative": negative, "image_embeds": attended[0].reshape(1, -1, IMAGE_DIM).contiguous(),
               "noise": noise, "latents": latents.float().contiguous(), "pixels": pixels.float().contiguous()},
              str(out / "io.safetensors"))
    print(f"made {out}: latents {tuple(latents.shape)}, max |latents| {latents.abs().max().item():.4g}")


def open_and_sample(folder, image_path):
    try:
        import accelerate  # noqa: F401
    except ImportError:  # from_pretrained wants accelerate for this list, which matters only below fp32
        WanTransformer3DModel._keep_in_fp32_modules = None
    # The parts a release may leave out (no text encoder here: prompt embeddings are given).
    absent = {k: None for k in ("text_encoder", "tokenizer", "transformer_2")
              if json.loads((Path(folder) / "model_index.json").read_text()).get(k, [None])[0] is None}
    pipe = WanImageToVideoPipeline.from_pretrained(folder, **absent)
    parts = {name: type(c).__name__ for name, c in pipe.components.items() if c is not None}
    g = torch.Generator().manual_seed(2)
    prompt = torch.randn(1, TEXT_LEN, pipe.transformer.config.text_dim, generator=g)
    with torch.no_grad():
        latents = pipe(image=load_image(image_path), prompt_embeds=prompt, negative_prompt_embeds=torch.zeros_like(prompt),
                       height=HEIGHT, width=WIDTH, num_frames=FRAMES, num_inference_steps=2, guidance_scale=GUIDANCE,
                       output_type="latent", generator=g).frames
    assert torch.isfinite(latents).all(), "the pipeline's latents are not finite"
    print(f"opened {folder}: {type(pipe).__name__} with {parts}; latents {tuple(latents.shape)}")


def main(argv):
    if len(argv) == 3 and argv[0] == "open":
        open_and_sample(argv[1], argv[2])
    elif len(argv) in (2, 3):
        make(*argv)
    else:
        die(__doc__, 2)


if __name__ == "__main__":
    main(sys.argv[1:])
