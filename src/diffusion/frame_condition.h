// First-frame conditioning, as Wan's image-to-video models take it (model.condition).
//
// The DiT sees 2C + 4 channels per latent voxel (36 for Wan 2.1 I2V, C = 16):
//   [0, C)        the noisy latent being denoised
//   [C, C + 4)    a mask of the frames that are given, at the latent's temporal resolution
//   [C + 4, 2C+4) the VAE latent of the condition video: the given frames, zeros between
// The condition video has the clip's F = 1 + 4k frames: the first image, then zeros (and for
// first-and-last-frame models the last image in the final frame). Its latent is the VAE's
// normalised posterior mean, like the clip's own.
//
// The mask packs the VAE's temporal stride: the VAE codes frame 0 alone and then groups of 4, so
// the pixel-frame mask m[0..F) is laid out as 4 channels per latent frame: latent frame 0 holds
// m[0] four times, latent frame t >= 1 holds m[4t-3 .. 4t]. With the first frame given, latent
// frame 0 is all ones and the rest zeros; with the last frame too, channel 3 of the final latent
// frame is one (m[F-1] = m[4(T-1)]). diffusers' WanImageToVideoPipeline.prepare_latents builds the
// same tensor by repeating m[0] four times and viewing [T, 4].
//
// Wan 2.2 TI2V-5B conditions differently: model.condition = "first_frame" with in_channels =
// out_channels (nothing appended). The first latent frame is the picture's clean latent, put in
// place of the noisy one before every call and in the result, and its tokens are given timestep 0
// (a timestep per token, model/dit.h), diffusers' expand_timesteps. The VAE is causal, so a clip's
// own first latent frame is its first picture's latent: training keeps x0's first frame and
// learns on the frames after it (a clip of one latent frame trains as text-to-video).
#pragma once
#include <ATen/ATen.h>

#include <cstdint>

#include "core/config.h"

namespace vidit {

// [1, 4, T, h, w] float mask for a clip of `frames` = 1 + 4(T-1) pixel frames; `last`: the final
// frame is given too.
at::Tensor frame_condition_mask(int64_t frames, int64_t height, int64_t width, bool last);

// [1, 3, frames, H, W]: `first` [3, H, W] (in [-1, 1], as the VAE takes pixels) in frame 0, zeros
// after it, and `last` (when defined, same shape) in the final frame.
at::Tensor condition_video(const at::Tensor& first, const at::Tensor& last, int64_t frames);

// The 4 + C channels appended to the noisy latent: cat(mask, latent) on dim 1. `latent` [B, C, T,
// h, w] is the condition video's normalised latent; the mask is broadcast over the batch.
at::Tensor frame_condition(const at::Tensor& mask, const at::Tensor& latent);

// What the DiT takes: cat(noisy [B, C, T, h, w], condition [B or 1, 4 + C, T, h, w]) on dim 1;
// `condition` undefined: `noisy` as it is (text-to-video).
at::Tensor with_frame_condition(const at::Tensor& noisy, const at::Tensor& condition);

// Whether `m` takes its first frame as TI2V does (above): condition "first_frame", in = out channels.
bool fuses_first_frame(const ModelConfig& m);
// Whether `m` takes the Wan 2.1 condition channels (mask and latent) beside the noisy latent, and
// so needs each clip's condition latent cached.
bool appends_condition(const ModelConfig& m);
// `x` [B, C, T, h, w] with its first latent frame replaced by `first` [B or 1, C, 1, h, w].
at::Tensor keep_first_frame(const at::Tensor& x, const at::Tensor& first);
// The timestep per token [B, L] of latents shaped `latent` ([B, C, T, h, w]) under patch (1, ph,
// pw): each sample's `t` [B], and 0 on the first latent frame's h/ph x w/pw tokens.
at::Tensor first_frame_timesteps(const at::Tensor& t, at::IntArrayRef latent, const Patch& patch);
// What the loss is taken over: the frames after the first for a model that keeps it, else all.
at::Tensor loss_frames(const at::Tensor& x, const ModelConfig& m);

}  // namespace vidit
