#include "diffusion/frame_condition.h"

#include "core/error.h"

namespace vidit {

at::Tensor frame_condition_mask(int64_t frames, int64_t height, int64_t width, bool last) {
  VIDIT_CHECK(frames >= 1 && (frames - 1) % 4 == 0, "frame condition: ", frames,
              " frames is not 1 + 4k (the VAE codes frame 0 alone, then groups of 4)");
  VIDIT_CHECK(!last || frames > 1, "frame condition: a clip of one frame has no separate last frame");
  const int64_t latent_frames = (frames - 1) / 4 + 1;
  at::Tensor mask = at::zeros({1, 4, latent_frames, height, width}, at::kFloat);
  mask.select(2, 0).fill_(1);  // frame 0, repeated over the 4 channels of latent frame 0
  // m[f] for f >= 1 sits in latent frame (f + 3) / 4, channel (f + 3) % 4.
  if (last) mask.select(2, latent_frames - 1).select(1, 3).fill_(1);
  return mask;
}

at::Tensor condition_video(const at::Tensor& first, const at::Tensor& last, int64_t frames) {
  VIDIT_CHECK(first.dim() == 3 && first.size(0) == 3, "frame condition: the first image must be [3, H, W], got ",
              first.sizes());
  VIDIT_CHECK(!last.defined() || last.sizes() == first.sizes(), "frame condition: the last image is ", last.sizes(),
              " but the first is ", first.sizes(), "; both must be resized to the video's size");
  VIDIT_CHECK(frames >= 1 && (frames - 1) % 4 == 0, "frame condition: ", frames, " frames is not 1 + 4k");
  at::Tensor video = at::zeros({1, 3, frames, first.size(1), first.size(2)}, first.options());
  video[0].select(1, 0).copy_(first);
  if (last.defined()) video[0].select(1, frames - 1).copy_(last);
  return video;
}

at::Tensor frame_condition(const at::Tensor& mask, const at::Tensor& latent) {
  VIDIT_CHECK(latent.dim() == 5 && mask.dim() == 5 && mask.size(1) == 4 && mask.sizes().slice(2) == latent.sizes().slice(2),
              "frame condition: the mask ", mask.sizes(), " does not match the condition latent ", latent.sizes());
  return at::cat({mask.to(latent.options()).expand({latent.size(0), 4, latent.size(2), latent.size(3), latent.size(4)}),
                  latent},
                 1);
}

at::Tensor with_frame_condition(const at::Tensor& noisy, const at::Tensor& condition) {
  if (!condition.defined()) return noisy;
  VIDIT_CHECK(condition.dim() == 5 && condition.sizes().slice(2) == noisy.sizes().slice(2) &&
                  (condition.size(0) == 1 || condition.size(0) == noisy.size(0)),
              "frame condition ", condition.sizes(), " does not match the latent ", noisy.sizes());
  const at::Tensor c = condition.to(noisy.options());
  return at::cat({noisy, c.size(0) == noisy.size(0) ? c : c.expand({noisy.size(0), -1, -1, -1, -1})}, 1);
}

bool fuses_first_frame(const ModelConfig& m) {
  return m.condition == FrameCondition::first_frame && m.in_channels == m.out_channels;
}

bool appends_condition(const ModelConfig& m) {
  return m.condition != FrameCondition::none && !fuses_first_frame(m);
}

at::Tensor keep_first_frame(const at::Tensor& x, const at::Tensor& first) {
  const int64_t T = x.size(2);
  at::Tensor head = first.to(x.scalar_type()).expand({x.size(0), x.size(1), 1, x.size(3), x.size(4)});
  return T == 1 ? head.contiguous() : at::cat({head, x.narrow(2, 1, T - 1)}, 2);
}

at::Tensor first_frame_timesteps(const at::Tensor& t, at::IntArrayRef latent, const Patch& patch) {
  VIDIT_CHECK(patch[0] == 1, "a model that keeps its first frame (Wan 2.2 TI2V) needs model.patch's time 1, got ", patch[0]);
  const int64_t per_frame = (latent[3] / patch[1]) * (latent[4] / patch[2]);
  const int64_t L = latent[2] * per_frame;
  at::Tensor out = t.to(at::kFloat).reshape({-1, 1}).expand({t.size(0), L}).clone();
  out.narrow(1, 0, per_frame).zero_();
  return out;
}

at::Tensor loss_frames(const at::Tensor& x, const ModelConfig& m) {
  return fuses_first_frame(m) && x.size(2) > 1 ? x.narrow(2, 1, x.size(2) - 1) : x;
}

}  // namespace vidit
