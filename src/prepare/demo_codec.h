// The lossless demo codec: space-to-depth. RGB frames [T, H, W, 3] uint8 become latents
// [3*b*b, T, H/b, W/b] in [-1, 1] (each b x b pixel block folded into channels), and back.
// Exactly invertible up to 8-bit rounding; stands in for the Wan VAE in the demo.
#pragma once
#include <ATen/ATen.h>

namespace vidit::demo {

at::Tensor codec_encode(const at::Tensor& frames, int64_t block);   // -> [3*b*b, T, H/b, W/b]
at::Tensor codec_decode(const at::Tensor& latent, int64_t block);   // -> [T, H, W, 3] uint8

}  // namespace vidit::demo
