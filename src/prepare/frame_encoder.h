// The encoders `vidit prepare` runs, chosen by the config: data.codec picks the frame encoder
// (the lossless demo codec, or the Wan 2.1 VAE loaded from data.vae_weights) and
// data.text_encoder the caption encoder ("demo": the built-in caption embedder; "precomputed":
// none, the manifest names each clip's embedding file).
#pragma once
#include "core/config.h"
#include "prepare/prepare.h"

namespace vidit {

// Frames [T, H, W, 3] uint8 -> latent (mean, std), each [C, T', H', W'].
FrameEncoder make_frame_encoder(const Config& cfg);

// Empty for "precomputed".
CaptionEncoder make_caption_encoder(const Config& cfg);

}  // namespace vidit
