#!/usr/bin/env python3
"""Reference outputs for vidit's CLIP image encoder and its preprocessing (src/vision/*_test.cpp).

Writes into OUT:
  small/                 transformers' CLIPVisionModel (random weights, small config, quick_gelu):
                         config.json + model.safetensors under "vision_model." names (the Hugging
                         Face hub's and transformers 4's, as in diffusers' image_encoder/)
  small_bare/            the same weights without the prefix (what transformers 5 saves)
  small_sharded/         the same in 3 shards named by model.safetensors.index.json
  small_clip/            the same under a CLIPConfig (vision_config nested; num_channels and
                         layer_norm_eps left out, as a config holding only non-default fields
                         does), with a text tower tensor beside that must be ignored
  pipe/                  a diffusers-style pipeline root: image_encoder/ and image_processor/
  small_io.safetensors   pixel_values and every hidden state (hidden.0 .. hidden.N), pooled
  gelu_new/, gelu_new_io.safetensors   1 layer, hidden_act gelu_new, eps 1e-6
  vit_h/, vit_h_io.safetensors         ViT-H/14's layer shape (1280 wide, 16 heads, MLP 5120,
                         patch 14, 224 pixels: 257 tokens), 2 layers, gelu
  images/                pictures made with the ffmpeg CLI (and, with PIL, a greyscale JPEG and two
                         with an EXIF orientation), the image processor's configs, and
                         images/images.safetensors: per picture N, N.pil (the picture as diffusers'
                         load_image loads it: EXIF orientation applied, then convert("RGB"), which
                         drops alpha; uint8 [H, W, 3]), N.resized (PIL's BICUBIC resize of N.pil to
                         the processor's size, uint8) and N.pixels (the processor's pixel_values
                         [3, 224, 224] for N.pil); per processor variant V, V.pixels for rgb.png
  images/images.json     which pictures and variants exist (none without the ffmpeg CLI: "why")
Exit status 3 (with the reason on stdout) when a needed Python package is missing.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

try:
    import numpy as np
    import torch
    from PIL import Image, ImageOps
    from safetensors.torch import save_file
    from transformers import CLIPConfig, CLIPVisionConfig, CLIPVisionModel
except ImportError as e:  # the C++ tests skip, naming this
    print(f"missing Python package: {e}")
    sys.exit(3)

try:  # transformers 5: the PIL implementation has its own name (CLIPImageProcessor uses torchvision)
    from transformers import CLIPImageProcessorPil as PilClipProcessor
except ImportError:
    try:  # transformers 4: CLIPImageProcessor is the PIL one
        from transformers import CLIPImageProcessor as PilClipProcessor
    except ImportError as e:
        print(f"missing Python package: {e}")
        sys.exit(3)

PREFIX = "vision_model."

# diffusers' image_processor/preprocessor_config.json of Wan 2.1 I2V (CLIP's settings).
PROCESSOR = {
    "crop_size": {"height": 224, "width": 224},
    "do_center_crop": True,
    "do_convert_rgb": True,
    "do_normalize": True,
    "do_rescale": True,
    "do_resize": True,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_processor_type": "CLIPImageProcessor",
    "image_std": [0.26862954, 0.26130258, 0.27577711],
    "resample": 3,
    "rescale_factor": 0.00392156862745098,
    "size": {"shortest_edge": 224},
}

# Variants of the processor's settings the C++ reader must follow (applied to rgb.png).
VARIANTS = {
    "bilinear": dict(PROCESSOR, resample=2),
    # the resize leaves 200 x 320, the crop is taller: rows of zeros above and below
    "pad": dict(PROCESSOR, size={"shortest_edge": 200}, crop_size={"height": 224, "width": 240}),
    "exact_size": dict(PROCESSOR, size={"height": 256, "width": 250}, image_mean=0.5, image_std=0.5),
    "legacy_numbers": dict(PROCESSOR, size=224, crop_size=224),
    "no_crop": dict(PROCESSOR, do_center_crop=False, do_normalize=False),
}


def make_model(cfg, seed):
    torch.manual_seed(seed)
    try:
        model = CLIPVisionModel(cfg, attn_implementation="eager")
    except TypeError:
        cfg._attn_implementation = "eager"
        model = CLIPVisionModel(cfg)
    model.eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                p.uniform_(0.5, 1.5)  # not all ones, so a norm weight that is ignored shows
            elif name.endswith("bias"):
                p.normal_(0.0, 0.1)  # not zeros, so a bias that is ignored shows
    return model


def bare_state_dict(model):
    """The model's tensors under names without the vision tower's prefix (whichever transformers)."""
    out = {}
    for k, t in model.state_dict().items():
        k = k[len(PREFIX):] if k.startswith(PREFIX) else k
        if k.endswith("position_ids"):
            continue
        out[k] = t.detach().contiguous().clone()
    return out


def write_config(cfg, folder):
    os.makedirs(folder, exist_ok=True)
    cfg.to_json_file(os.path.join(folder, "config.json"))


def save_model(model, out, name, seed_inputs, batch):
    """Writes OUT/name (prefixed names), and OUT/name_io.safetensors: inputs and every hidden state."""
    folder = os.path.join(out, name)
    write_config(model.config, folder)
    sd = bare_state_dict(model)
    save_file({PREFIX + k: t for k, t in sd.items()}, os.path.join(folder, "model.safetensors"))
    cfg = model.config
    g = torch.Generator().manual_seed(seed_inputs)
    pixels = torch.randn(batch, cfg.num_channels, cfg.image_size, cfg.image_size, generator=g)
    with torch.no_grad():
        o = model(pixel_values=pixels, output_hidden_states=True)
    assert len(o.hidden_states) == cfg.num_hidden_layers + 1
    io = {"pixel_values": pixels, "pooled": o.pooler_output.contiguous()}
    for i, h in enumerate(o.hidden_states):
        io[f"hidden.{i}"] = h.contiguous()
    save_file(io, os.path.join(out, f"{name}_io.safetensors"))
    return sd


def write_small_variants(out, model, sd):
    """The small model's weights in the other layouts a user may hand over."""
    bare = os.path.join(out, "small_bare")
    write_config(model.config, bare)
    save_file(sd, os.path.join(bare, "model.safetensors"))

    sharded = os.path.join(out, "small_sharded")
    write_config(model.config, sharded)
    keys = sorted(sd)
    parts = [keys[i::3] for i in range(3)]
    weight_map = {}
    for i, part in enumerate(parts):
        file = f"model-{i + 1:05d}-of-00003.safetensors"
        save_file({PREFIX + k: sd[k] for k in part}, os.path.join(sharded, file))
        weight_map.update({PREFIX + k: file for k in part})
    with open(os.path.join(sharded, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map}, f, indent=1)

    clip = os.path.join(out, "small_clip")
    os.makedirs(clip, exist_ok=True)
    full = CLIPConfig(vision_config=model.config.to_dict())
    full.to_json_file(os.path.join(clip, "config.json"))
    with open(os.path.join(clip, "config.json")) as f:
        j = json.load(f)
    for key in ("num_channels", "layer_norm_eps"):  # equal to CLIPVisionConfig's defaults
        j["vision_config"].pop(key, None)
    with open(os.path.join(clip, "config.json"), "w") as f:
        json.dump(j, f, indent=1)
    tensors = {PREFIX + k: t for k, t in sd.items()}
    tensors["text_model.encoder.layers.0.mlp.fc1.weight"] = torch.zeros(3, 5)  # another tower: ignored
    tensors["visual_projection.weight"] = torch.zeros(7, model.config.hidden_size)
    save_file(tensors, os.path.join(clip, "model.safetensors"))

    pipe = os.path.join(out, "pipe")
    shutil.copytree(os.path.join(out, "small"), os.path.join(pipe, "image_encoder"), dirs_exist_ok=True)
    os.makedirs(os.path.join(pipe, "image_processor"), exist_ok=True)
    with open(os.path.join(pipe, "image_processor", "preprocessor_config.json"), "w") as f:
        json.dump(PROCESSOR, f, indent=1)


def ffmpeg(*args):
    subprocess.run(["ffmpeg", "-hide_banner", "-nostdin", "-loglevel", "error", "-y", *args], check=True)


def ffmpeg_has_encoder(name):
    r = subprocess.run(["ffmpeg", "-hide_banner", "-h", f"encoder={name}"], capture_output=True, text=True)
    return r.returncode == 0 and f"Encoder {name} " in r.stdout


def make_pictures(folder):
    """[(file name, kind)]: kind "exact" (every decoder gives the same pixels), "jpeg", "cmyk_jpeg", "lossy_webp"."""
    src = "testsrc2=size={}:rate=1"
    pics = []

    def still(name, size, kind, *opts):
        ffmpeg("-f", "lavfi", "-i", src.format(size), *opts, "-frames:v", "1", os.path.join(folder, name))
        pics.append((name, kind))

    still("rgb.png", "320x200", "exact")
    still("portrait.png", "200x320", "exact")
    still("tiny.png", "40x25", "exact")          # upscaled ~9x
    still("big.png", "1280x720", "exact")        # shrunk 3.2x: the widened (antialiasing) kernel
    still("gray.png", "320x200", "exact", "-pix_fmt", "gray")
    # alpha from 0 to 255 across the picture: dropped, not composited
    still("rgba.png", "320x200", "exact", "-vf", "format=rgba,geq=r='r(X,Y)':g='g(X,Y)':b='b(X,Y)':a='X*255/W'")
    still("rgb420.jpg", "320x200", "jpeg", "-pix_fmt", "yuvj420p", "-q:v", "3")
    still("rgb422.jpg", "320x200", "jpeg", "-pix_fmt", "yuvj422p", "-q:v", "3")
    still("rgb444.jpg", "320x200", "jpeg", "-pix_fmt", "yuvj444p", "-q:v", "3")
    still("odd420.jpg", "321x203", "jpeg", "-pix_fmt", "yuvj420p", "-q:v", "2")
    # one-component (greyscale) JPEG: the ffmpeg CLI's encoder writes none, PIL does
    Image.open(os.path.join(folder, "gray.png")).save(os.path.join(folder, "gray.jpg"), quality=90)
    pics.append(("gray.jpg", "jpeg"))
    # a CMYK JPEG (print workflows write them; PIL stores Adobe's inverted samples)
    Image.open(os.path.join(folder, "rgb.png")).convert("CMYK").save(os.path.join(folder, "cmyk.jpg"), quality=90)
    pics.append(("cmyk.jpg", "cmyk_jpeg"))
    # EXIF orientation (a phone's portrait photo): 6 turns the picture a quarter clockwise, 7 also
    # mirrors it (transverse)
    for orientation in (6, 7):
        im = Image.open(os.path.join(folder, "rgb.png"))
        exif = im.getexif()
        exif[0x0112] = orientation
        name = f"orient{orientation}.jpg"
        im.save(os.path.join(folder, name), quality=90, exif=exif.tobytes())
        pics.append((name, "jpeg"))
    if ffmpeg_has_encoder("libwebp"):
        still("rgb.webp", "320x200", "exact", "-c:v", "libwebp", "-lossless", "1")
        ffmpeg("-i", os.path.join(folder, "rgba.png"), "-c:v", "libwebp", "-lossless", "0", "-q:v", "90",
               os.path.join(folder, "rgba_lossy.webp"))
        pics.append(("rgba_lossy.webp", "lossy_webp"))
    return pics


def load_image(path):
    """diffusers' load_image: EXIF orientation applied, then RGB (alpha dropped, grey repeated)."""
    return ImageOps.exif_transpose(Image.open(path)).convert("RGB")


def processor_from(cfg):
    return PilClipProcessor(**{k: v for k, v in cfg.items() if k != "image_processor_type"})


def resized_size(h, w, edge):
    short, long = (w, h) if w <= h else (h, w)
    new_long = int(edge * long / short)
    return (new_long, edge) if w <= h else (edge, new_long)


def write_images(out):
    folder = os.path.join(out, "images")
    os.makedirs(folder, exist_ok=True)
    info = {"available": False, "why": "", "pictures": [], "variants": [], "processor": PilClipProcessor.__name__}
    if shutil.which("ffmpeg") is None:
        info["why"] = "the ffmpeg program is not on PATH"
    else:
        pics = make_pictures(folder)
        with open(os.path.join(folder, "preprocessor_config.json"), "w") as f:
            json.dump(PROCESSOR, f, indent=1)
        proc = processor_from(PROCESSOR)
        tensors, notes = {}, {}
        for name, kind in pics:
            path = os.path.join(folder, name)
            image = load_image(path)
            pil = np.asarray(image)
            h, w = resized_size(pil.shape[0], pil.shape[1], 224)
            resized = np.asarray(Image.fromarray(pil).resize((w, h), resample=Image.BICUBIC))
            # The pipeline hands the processor the RGB picture (given RGBA, the processor itself
            # would composite it on white).
            pixels = proc(images=image, return_tensors="pt")["pixel_values"][0]
            tensors[f"{name}.pil"] = torch.from_numpy(pil.copy())
            tensors[f"{name}.resized"] = torch.from_numpy(resized.copy())
            tensors[f"{name}.pixels"] = pixels.float().contiguous()
            info["pictures"].append({"name": name, "kind": kind, "mode": Image.open(path).mode})
            # For the record: ATen's antialiased bicubic against PIL's resize (not used by vidit).
            t = torch.from_numpy(pil.copy()).permute(2, 0, 1)[None].float()
            aten = torch.nn.functional.interpolate(t, size=(h, w), mode="bicubic", antialias=True, align_corners=False)
            aten = aten.round().clamp(0, 255)[0].permute(1, 2, 0).numpy()
            notes[name] = int(np.abs(aten - resized.astype(np.float32)).max())
        for vname, vcfg in VARIANTS.items():
            with open(os.path.join(folder, f"variant_{vname}.json"), "w") as f:
                json.dump(vcfg, f, indent=1)
            pixels = processor_from(vcfg)(images=load_image(os.path.join(folder, "rgb.png")), return_tensors="pt")
            tensors[f"{vname}.pixels"] = torch.as_tensor(np.asarray(pixels["pixel_values"][0])).float().contiguous()
            info["variants"].append(vname)
        save_file(tensors, os.path.join(folder, "images.safetensors"))
        info["available"] = True
        info["aten_bicubic_aa_max_levels_off_pil"] = notes
        print("ATen antialiased bicubic vs PIL's resize, max levels off per picture:", notes)
    with open(os.path.join(folder, "images.json"), "w") as f:
        json.dump(info, f, indent=1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--no-vit-h", action="store_true")
    args = ap.parse_args()
    out = args.out
    os.makedirs(out, exist_ok=True)
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

    small_cfg = CLIPVisionConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
                                 patch_size=8, image_size=32, num_channels=3, hidden_act="quick_gelu",
                                 layer_norm_eps=1e-5)
    model = make_model(small_cfg, seed=1)
    sd = save_model(model, out, "small", seed_inputs=2, batch=2)
    write_small_variants(out, model, sd)

    gelu_cfg = CLIPVisionConfig(hidden_size=48, intermediate_size=80, num_hidden_layers=1, num_attention_heads=3,
                                patch_size=4, image_size=20, hidden_act="gelu_new", layer_norm_eps=1e-6)
    save_model(make_model(gelu_cfg, seed=3), out, "gelu_new", seed_inputs=4, batch=3)

    if not args.no_vit_h:
        vit_h_cfg = CLIPVisionConfig(hidden_size=1280, intermediate_size=5120, num_hidden_layers=2,
                                     num_attention_heads=16, patch_size=14, image_size=224, hidden_act="gelu",
                                     layer_norm_eps=1e-5, projection_dim=1024)
        save_model(make_model(vit_h_cfg, seed=5), out, "vit_h", seed_inputs=6, batch=1)

    write_images(out)
    print("ok")


if __name__ == "__main__":
    main()
