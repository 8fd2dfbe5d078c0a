#!/usr/bin/env python3
"""diffusers' own AutoencoderKLWan in its Wan 2.2 form (is_residual, 2x2 patchify, the VAE of
Wan2.2-TI2V-5B's vae/ folder) as the reference for vidit's Wan22VAE (src/vae/wan22_vae_test.cpp runs
it; tests only, never the product).

    diffusers_vae22_reference.py OUT
        Builds a small AutoencoderKLWan of Wan 2.2's structure (is_residual, patch_size 2, 12
        channels in and out, 4 stages of 2 residual blocks, time halved in the last two
        downsamplings, 16x spatial) at base_dim 8, decoder_base_dim 16, z_dim 8, with random latent
        statistics and random weights everywhere (small_wan_parts.randomize: no zero- or
        one-initialised tensor hides a wrong mapping), and writes
          OUT/vae/            save_pretrained: config.json + diffusion_pytorch_model.safetensors
          OUT/io.safetensors  video [2,3,9,64,96] in [-1,1] (H != W, so a swapped patch order
                              shows); mean, logvar: encode(video)'s posterior [2,8,3,4,6];
                              latents: (mean - latents_mean) / latents_std as the pipelines use
                              them; decoded: decode(mean) as diffusers returns it (clamped to
                              [-1,1]); decoded_raw: the same before that clamp (the decoder's
                              chunks, captured by a forward hook, unpatchified);
                              tiled_mean, tiled_decoded: the first video's mean and decode with
                              enable_tiling(32, 32, 16, 16) (the encoder's tiles in the
                              patchified video, the decoder's blend in the patchified output).

Exit status: 0 done, 1 the reference disagrees with itself, 2 bad usage, 3 diffusers missing or too
old for the Wan 2.2 VAE.
"""
import inspect
import sys
from pathlib import Path


def die(msg, code):
    print(f"diffusers_vae22_reference: {msg}", file=sys.stderr)
    sys.exit(code)


try:
    import torch
    from diffusers import AutoencoderKLWan
    from diffusers.models.autoencoders.autoencoder_kl_wan import unpatchify
    from safetensors.torch import save_file
    from small_wan_parts import randomize
except ImportError as e:  # the C++ test skips on this status
    die(f"cannot import the reference packages: {e}", 3)

if "is_residual" not in inspect.signature(AutoencoderKLWan.__init__).parameters:
    die("this diffusers has no Wan 2.2 VAE (AutoencoderKLWan without is_residual)", 3)

Z_DIM = 8


def small_vae22():
    """AutoencoderKLWan of Wan 2.2's structure at small widths, randomized from seed 0."""
    torch.manual_seed(0)
    stats = torch.Generator().manual_seed(2)
    mean = (torch.randn(Z_DIM, generator=stats) * 0.3).tolist()
    std = (torch.rand(Z_DIM, generator=stats) + 0.4).tolist()
    vae = AutoencoderKLWan(base_dim=8, decoder_base_dim=16, z_dim=Z_DIM, dim_mult=[1, 2, 4, 4], num_res_blocks=2,
                           temperal_downsample=[False, True, True], is_residual=True, patch_size=2,
                           in_channels=12, out_channels=12, scale_factor_temporal=4, scale_factor_spatial=16,
                           latents_mean=mean, latents_std=std).eval()
    randomize(vae)
    return vae


def make(out):
    out = Path(out)
    vae = small_vae22()
    vae.save_pretrained(out / "vae")

    g = torch.Generator().manual_seed(1)
    video = torch.rand(2, 3, 9, 64, 96, generator=g) * 2 - 1
    raw = []
    hook = vae.decoder.register_forward_hook(lambda module, args, res: raw.append(res.detach().clone()))
    with torch.no_grad():
        posterior = vae.encode(video).latent_dist
        mean = posterior.mean.contiguous()
        raw.clear()  # only the decoder's chunks of decode(mean)
        decoded = vae.decode(mean).sample
    hook.remove()
    decoded_raw = unpatchify(torch.cat(raw, 2), patch_size=2)
    stats_shape = (1, Z_DIM, 1, 1, 1)
    latents_mean = torch.tensor(vae.config.latents_mean).view(stats_shape)
    latents_std = torch.tensor(vae.config.latents_std).view(stats_shape)
    res = {"video": video, "mean": mean, "logvar": posterior.logvar.contiguous(),
           "latents": ((mean - latents_mean) / latents_std).contiguous(), "decoded": decoded.contiguous(),
           "decoded_raw": decoded_raw.contiguous()}
    if not torch.equal(decoded_raw.clamp(-1, 1), decoded):
        die("the captured raw decode does not clamp to diffusers' decode: the hook missed a chunk", 1)
    # Tiled (enable_tiling with 32-pixel tiles every 16): the encoder tiles the patchified video,
    # the decoder tiles the latents and blends in the patchified space.
    vae.enable_tiling(tile_sample_min_height=32, tile_sample_min_width=32, tile_sample_stride_height=16,
                      tile_sample_stride_width=16)
    with torch.no_grad():
        res["tiled_mean"] = vae.encode(video[:1]).latent_dist.mean.contiguous()
        res["tiled_decoded"] = vae.decode(mean[:1]).sample.contiguous()
    vae.disable_tiling()
    if torch.allclose(res["tiled_mean"], mean[:1], atol=1e-3) or torch.allclose(res["tiled_decoded"], decoded[:1], atol=1e-3):
        die("tiling changed nothing: the tiles do not overlap the way this reference expects", 1)
    save_file(res, str(out / "io.safetensors"))
    print(f"made {out}: mean {tuple(mean.shape)}, decoded {tuple(decoded.shape)}, "
          f"max |decoded_raw| {decoded_raw.abs().max().item():.4g}")


def main(argv):
    if len(argv) == 1:
        make(argv[0])
    else:
        die(__doc__, 2)


if __name__ == "__main__":
    main(sys.argv[1:])
