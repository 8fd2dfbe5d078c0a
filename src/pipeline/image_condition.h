// Image-to-video's inputs from the pictures a request names, as diffusers'
// WanImageToVideoPipeline makes them:
//   picture file --decode (vision/image_file.h)--> uint8 RGB
//     --PIL LANCZOS resize to the video's size, / 255, 2x - 1 (its VideoProcessor)--> [3, H, W]
//     --condition video: this frame first, zeros after (the last picture in the final frame for
//       first-and-last-frame), VAE-encoded and normalised, beside the mask of the given frames
//       (diffusion/frame_condition.h)--> ImageCondition::frames
//   picture --CLIP image processor and encoder, penultimate layer (vision/)--> ImageCondition::image
//       (first and last: their tokens one after the other, [1, 2 x 257, 1280])
// The video's size, when the user gives none, follows the first picture's aspect ratio at the
// default size's pixel area, each side a multiple of the model's granularity (size_for_image).
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <utility>

#include "core/config.h"
#include "pipeline/wan_pipeline.h"
#include "vae/wan_vae.h"

namespace vidit {

// (height, width) for a picture of `height` x `width` at about `area` pixels with its aspect
// ratio: round(sqrt(area * h / w)) and round(sqrt(area * w / h)), each rounded down to a multiple
// of `multiple` (at least one multiple), as Wan's and diffusers' image-to-video examples choose it.
std::pair<int64_t, int64_t> size_for_image(int64_t height, int64_t width, int64_t area, int64_t multiple);

// A uint8 [H, W, 3] picture as the VAE takes it: resized to height x width with PIL's LANCZOS
// (unless it has that size), then x / 255 * 2 - 1 in fp32: [3, height, width].
at::Tensor vae_image(const at::Tensor& rgb, int64_t height, int64_t width);

// ImageCondition::frames for a clip of `frames` frames: the condition video of `first` (and
// `last`, when defined) [3, H, W] in [-1, 1] through `vae` (normalised latents), with the mask
// before it. [1, 4 + z_dim, T', H/8, W/8] on the VAE's device.
at::Tensor encode_frame_condition(WanVAEImpl& vae, const at::Tensor& first, const at::Tensor& last, int64_t frames,
                                  const VaeRunOptions& opts = {});

// The request's pictures turned into the model's condition on `device`: frames through the VAE
// at weights.vae, and the CLIP features where model.image_dim > 0 (weights.image_encoder and
// weights.image_processor). Throws vidit::Error naming the picture that cannot be read, a
// missing part (with the flag that gives it), or a model that takes no condition.
ImageCondition make_image_condition(const Config& cfg, const WanWeights& weights, const VideoRequest& request,
                                    at::Device device);

}  // namespace vidit
