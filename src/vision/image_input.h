// CLIP's image preprocessing: an RGB picture in, the encoder's pixel_values out, as transformers'
// CLIPImageProcessor makes them with PIL (transformers 4's, and transformers 5's
// CLIPImageProcessorPil, which its CLIPImageProcessor falls back to without torchvision; with
// torchvision installed it resizes through torchvision, i.e. ATen's antialiased bicubic, see
// below):
//   1. resize so that the shorter side is size.shortest_edge (224), the longer one
//      int(shortest_edge * long / short) (truncated), with PIL's BICUBIC filter;
//   2. centre crop to crop_size (224 x 224): top = floor((H - h) / 2), left likewise; where the
//      picture is smaller than the crop, zeros fill the rest;
//   3. rescale: value * rescale_factor (1/255) in double, then rounded to fp32;
//   4. normalise per channel in fp32: (x - image_mean) / image_std (CLIP's mean and std).
// Steps 1 and 2 work on 8-bit pixels, as PIL does.
//
// The resize is PIL's own arithmetic, reproduced bit for bit (resize_like_pil): separable
// convolution, horizontal pass first, with a cubic kernel (a = -0.5) or a triangle one whose
// support widens by the shrink factor when shrinking (antialiasing), weights normalised and
// rounded to 22-bit fixed point, and each pass rounded and clipped to 0..255. ATen's antialiased
// bicubic (at::_upsample_bicubic2d_aa) uses the same kernel but keeps the intermediate pass
// unclipped in floating point (and rounds once): measured against PIL 13 on a 320x200 testsrc2
// picture resized to 358x224 it is off by up to 17 levels at sharp edges (1.4% of values differ;
// 1 to 21 levels over the reference script's pictures, which it prints), so it is not used.
//
// Images come from decode_image_file (vision/image_file.h) or anywhere else as uint8 [H, W, 3].
#pragma once
#include <ATen/ATen.h>

#include <array>
#include <string>
#include <utility>
#include <vector>

namespace vidit::vision {

// PIL's resampling filters this file implements, by PIL's numbers (the `resample` field).
enum class Resample { lanczos = 1, bilinear = 2, bicubic = 3 };

// A CLIPImageProcessor's settings: the fields of its preprocessor_config.json, and transformers'
// CLIP defaults for those a file leaves out.
struct ClipImageConfig {
  bool do_resize = true;
  // size: {"shortest_edge": N} (CLIP's; the default) or {"height": H, "width": W} (resize to
  // exactly that). Exactly one of the two forms is set: shortest_edge > 0, or height and width.
  int64_t shortest_edge = 224;
  int64_t resize_height = 0, resize_width = 0;
  Resample resample = Resample::bicubic;
  bool do_center_crop = true;
  int64_t crop_height = 224, crop_width = 224;
  bool do_rescale = true;
  double rescale_factor = 1.0 / 255.0;
  bool do_normalize = true;
  std::array<double, 3> image_mean = {0.48145466, 0.4578275, 0.40821073};   // OpenAI CLIP's
  std::array<double, 3> image_std = {0.26862954, 0.26130258, 0.27577711};

  // Reads a preprocessor_config.json (size and crop_size as objects, or as one number the way
  // older files write them; image_mean / image_std as three numbers or one). Throws vidit::Error
  // naming the file and the field for a malformed value or a setting not implemented here
  // (another resample filter, size.longest_edge).
  static ClipImageConfig from_json_file(const std::string& path);
  // The same from `path`: a preprocessor_config.json, a folder holding one, or a diffusers
  // pipeline root (its image_processor/). Throws vidit::Error naming `path` when there is none.
  static ClipImageConfig load(const std::string& path);
  // The processor that goes with the CLIP encoder at `encoder`: its own preprocessor_config.json,
  // the image_processor/ of a pipeline root, or the image_processor/ beside an image_encoder/
  // folder; CLIP's defaults above (Wan's: 224 pixels, bicubic, OpenAI's mean and std) where there
  // is none. Sampling and `vidit prepare` both find it this way.
  static ClipImageConfig beside_encoder(const std::string& encoder);
};

// (height, width) after step 1 for a picture of `height` x `width`; the picture's own size when
// do_resize is false.
std::pair<int64_t, int64_t> clip_resized_size(const ClipImageConfig& cfg, int64_t height, int64_t width);

// PIL's Image.resize((width, height), filter) of a uint8 [H, W, C] CPU tensor (any C), bit for bit
// (see above). Returns a new uint8 [height, width, C] tensor; the same size returns a copy.
// Throws vidit::Error for a non-uint8 or non-[H, W, C] input or a size below 1.
at::Tensor resize_like_pil(const at::Tensor& image, int64_t height, int64_t width, Resample filter);

// transformers' centre crop of a [H, W, C] tensor (any dtype) to [height, width, C]: the window
// starting at floor((H - height) / 2), floor((W - width) / 2); where it falls outside the
// picture, zeros.
at::Tensor center_crop(const at::Tensor& image, int64_t height, int64_t width);

// Steps 1-4 on one picture: uint8 [H, W, 3] RGB (CPU; H, W >= 1) -> fp32 [3, h, w] (h, w: the
// crop size, or what the earlier steps leave when do_center_crop is false). Throws vidit::Error
// for any other input.
at::Tensor preprocess_clip_image(const at::Tensor& image, const ClipImageConfig& cfg);

// The encoder's input for a batch: fp32 [B, 3, h, w] on the CPU (move it to the encoder's device).
// The pictures may differ in size; their results must not (they do not with a centre crop).
at::Tensor clip_pixel_values(const std::vector<at::Tensor>& images, const ClipImageConfig& cfg = {});
// The same for image files, each read by decode_image_file (PNG, JPEG, WebP, ...). Throws
// vidit::Error naming the file that cannot be read.
at::Tensor load_clip_pixel_values(const std::vector<std::string>& files, const ClipImageConfig& cfg = {});

}  // namespace vidit::vision
