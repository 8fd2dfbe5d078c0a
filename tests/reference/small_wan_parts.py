"""Parts the diffusers references share (tests only): the random small Wan VAE they all build, and
the given prompt embeddings their pipelines run on. Imported by the scripts beside it."""
import torch
from diffusers import AutoencoderKLWan


def randomize(module, scale=1.0):
    """Every parameter drawn again, so that no zero- or one-initialised tensor hides a wrong input:
    norm gains near 1, matrices at fan-in scale, vectors small."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("gamma"):
                p.normal_(1.0, 0.2)
            elif p.dim() > 1:
                p.normal_(0.0, scale * (1.0 / (p.numel() // p.shape[0])) ** 0.5)
            else:
                p.normal_(0.0, 0.1)


def small_vae():
    """AutoencoderKLWan of Wan 2.1's structure at base_dim 8 (z_dim 16), randomized from seed 0."""
    torch.manual_seed(0)
    vae = AutoencoderKLWan(base_dim=8, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=2,
                           temperal_downsample=[False, True, True]).eval()
    randomize(vae)
    return vae


def prompt_pair(g, text_len, text_dim):
    """A prompt's and a negative prompt's embeddings [1, text_len, text_dim] from generator g: 7 and
    3 real tokens, zero-padded as WanPipeline pads them."""
    prompt = torch.zeros(1, text_len, text_dim)
    prompt[:, :7] = torch.randn(1, 7, text_dim, generator=g)
    negative = torch.zeros(1, text_len, text_dim)
    negative[:, :3] = torch.randn(1, 3, text_dim, generator=g)
    return prompt, negative
