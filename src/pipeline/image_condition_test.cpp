// Image-to-video sampling against diffusers' WanImageToVideoPipeline
// (tests/reference/diffusers_i2v_reference.py): on the same random VAE, CLIP image encoder and
// 36-channel transformer, the same PNG made by ffmpeg, prompt embeddings and noise, vidit's
// pictures for the VAE, CLIP features, condition frames (mask + condition latent) and the
// denoised latents equal the pipeline's; for image-to-video and first-and-last-frame.
#include "pipeline/image_condition.h"

#include <gtest/gtest.h>

#include <string>

#include "../../tests/mpi_test_util.h"
#include "../../tests/test_util.h"
#include "core/error.h"
#include "core/safetensors.h"
#include "diffusion/frame_condition.h"
#include "model/weight_layout.h"
#include "vision/image_file.h"

namespace vidit {
namespace {

double relative_deviation(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>() / b.abs().max().item<double>();
}

// Two pictures of another size and aspect than the video (100 x 70 against 48 x 32), so the
// pipeline's resize is exercised.
void make_pictures(const test::ScratchDir& dir) {
  for (const auto& [name, filter] : {std::pair<std::string, std::string>{"first", "testsrc2=size=100x70"},
                                     {"last", "testsrc2=size=100x70,hue=h=90"}}) {
    auto r = test::run_process("ffmpeg -v error -y -f lavfi -i '" + filter + "' -frames:v 1 " + (dir / (name + ".png")));
    ASSERT_EQ(r.status, 0) << r.output;
  }
}

void expect_equal_to_diffusers(bool last) {
  if (!vision::image_decoding_available()) GTEST_SKIP() << "built without FFmpeg";
  test::ScratchDir dir(last ? "i2v_flf_reference" : "i2v_reference");
  make_pictures(dir);
  const std::string out = dir / "ref";
  auto made = test::run_process(test::python() + " " + test::reference_script("diffusers_i2v_reference.py") + " " + out + " " + (dir / "first.png") +
                                (last ? " " + (dir / "last.png") : std::string()) + " 2>&1");
  if (made.status == 3) GTEST_SKIP() << made.output;
  ASSERT_EQ(made.status, 0) << made.output;
  const TensorMap io = load_safetensors(out + "/io.safetensors");

  Config cfg;
  cfg.model = read_transformer_config(out + "/transformer");
  EXPECT_EQ(cfg.model.condition, last ? FrameCondition::first_last_frame : FrameCondition::first_frame);
  EXPECT_EQ(cfg.model.in_channels, 36);
  cfg.sample.solver = Solver::unipc, cfg.sample.steps = 3, cfg.sample.shift = 3.0, cfg.sample.cfg_scale = 5.0;
  WanWeights w;
  w.vae = out + "/vae", w.image_encoder = out + "/image_encoder", w.image_processor = out + "/image_processor";
  VideoRequest req;
  req.frames = 9, req.width = 48, req.height = 32;
  req.image = dir / "first.png";
  if (last) req.last_image = dir / "last.png";

  // The picture as the VAE takes it: PIL's LANCZOS resize, reproduced bit for bit.
  const at::Tensor pixels = vae_image(vision::decode_image_file(req.image), req.height, req.width);
  EXPECT_LE((pixels - io.at("pixels")).abs().max().item<double>(), 1e-6);

  const ImageCondition cond = make_image_condition(cfg, w, req, at::kCPU);
  ASSERT_EQ(cond.frames.sizes(), (std::vector<int64_t>{1, 20, 3, 4, 6}));
  EXPECT_LE(relative_deviation(cond.image, io.at("image_embeds")), 1e-5) << "CLIP features";

  const at::Tensor latents = denoise_latents(cfg, read_transformer_weights(out + "/transformer"), "the reference",
                                             io.at("prompt"), io.at("negative"), io.at("noise"), at::kCPU, nullptr,
                                             false, cond);
  const double dev = relative_deviation(latents, io.at("latents"));
  std::printf("I2V%s latents against diffusers: max relative deviation %.3g\n", last ? " (first and last)" : "", dev);
  EXPECT_LE(dev, 1e-4);

  // The condition matters: without the last frame's mask and latent (or with the mask cleared)
  // the result is far from the pipeline's.
  ImageCondition wrong = cond;
  wrong.frames = cond.frames.clone();
  wrong.frames.slice(1, 0, 4).zero_();
  const at::Tensor off = denoise_latents(cfg, read_transformer_weights(out + "/transformer"), "the reference",
                                         io.at("prompt"), io.at("negative"), io.at("noise"), at::kCPU, nullptr, false,
                                         wrong);
  EXPECT_GT(relative_deviation(off, io.at("latents")), 100 * std::max(dev, 1e-6));
}

TEST(ImageToVideo, EqualsDiffusersWanImageToVideoPipeline) { expect_equal_to_diffusers(false); }

TEST(ImageToVideo, FirstAndLastFrameEqualsDiffusersPipeline) { expect_equal_to_diffusers(true); }

TEST(ImageToVideo, SizeFollowsThePicturesAspectAtTheDefaultArea) {
  // 832 x 480's area, multiples of 16: a 4:3 picture gives 720 x 544 (round(sqrt(399360 * 3/4)) =
  // 547 -> 544; round(sqrt(399360 * 4/3)) = 730 -> 720), as diffusers' example computes it.
  EXPECT_EQ(size_for_image(768, 1024, 832 * 480, 16), (std::pair<int64_t, int64_t>{544, 720}));
  EXPECT_EQ(size_for_image(480, 832, 832 * 480, 16), (std::pair<int64_t, int64_t>{480, 832}));
  // round(sqrt(399360 * 100)) = 6319 -> 6304; round(sqrt(3993.6)) = 63 -> 48.
  EXPECT_EQ(size_for_image(1000, 10, 832 * 480, 16), (std::pair<int64_t, int64_t>{6304, 48}));
}

TEST(ImageToVideo, ATextToVideoModelRefusesAnImageAndTheReverse) {
  Config cfg;
  WanWeights w;
  VideoRequest req;
  req.image = "first.png";
  EXPECT_NE(test::message_of([&] { make_image_condition(cfg, w, req, at::kCPU); }).find("text-to-video"),
            std::string::npos);
  cfg.model.in_channels = 2 * cfg.model.out_channels + 4;
  cfg.model.condition = FrameCondition::first_frame;
  req.image.clear();
  EXPECT_NE(test::message_of([&] { make_image_condition(cfg, w, req, at::kCPU); }).find("--image FILE"),
            std::string::npos);
}

}  // namespace
}  // namespace vidit
