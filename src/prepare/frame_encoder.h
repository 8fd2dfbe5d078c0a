// The encoders `vidit prepare` runs, chosen by the config: data.codec picks the frame encoder
// (the lossless demo codec, or the Wan 2.1 VAE loaded from data.vae_weights) and
// data.text_encoder the caption encoder ("demo": the built-in caption embedder; "precomputed":
// none, the manifest names each clip's embedding file).
#pragma once
#include "core/config.h"
#include "prepare/prepare.h"

namespace vidit {

// Frames [T, H, W, 3] uint8 -> latent (mean, std), each [C, T', H', W']; wrapped by
// with_cache_faults when the config injects a fault into the cache.
FrameEncoder make_frame_encoder(const Config& cfg);

// Fault injection (resilience/fault_injection.h), as a forwarding wrapper of an encoder: with
// faults.kind = "poison_cache", the clip whose cache key or source file name is faults.sample
// gets latents x 1000 (the checksum the cache writes is then that of the bad latents: the data
// itself is bad), in every attempt, saying so on stderr. Otherwise `base` itself.
FrameEncoder with_cache_faults(FrameEncoder base, const FaultConfig& faults);

// Image-to-video (model.condition != "none"): the condition video of a clip's first frame (and
// last, for first_last_frame) through the same Wan VAE, and with model.image_dim > 0 the frames'
// CLIP features (data.image_encoder). Empty for text-to-video, and for a model that keeps its first
// frame in the latent (Wan 2.2 TI2V: nothing to cache). Throws vidit::Error naming the key
// that is missing (the Wan VAE codec, data.image_encoder).
ConditionEncoder make_condition_encoder(const Config& cfg);

// Empty for "precomputed".
CaptionEncoder make_caption_encoder(const Config& cfg);

}  // namespace vidit
