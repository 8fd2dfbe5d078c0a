// Wan 2.2 TI2V-5B's form sampled as text-to-video: a 48-channel transformer (here 8, the small
// VAE's) on the Wan 2.2 VAE. diffusers' WanPipeline runs it with expand_timesteps, a timestep per
// token: with no image every token's is the step's, so vidit's one timestep per sample gives the
// same latents, and the Wan 2.2 VAE decodes them as the pipeline does. The VAE's stride (16) and
// its latent channels are checked against the transformer.
#include <gtest/gtest.h>

#include <string>

#include "../../tests/mpi_test_util.h"
#include "../../tests/test_util.h"
#include "core/safetensors.h"
#include "model/weight_layout.h"
#include "pipeline/release_sampling.h"
#include "pipeline/wan_pipeline.h"
#include "train/run_weights.h"
#include "vae/wan22_vae.h"

namespace vidit {
namespace {

double relative(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>() / b.abs().max().item<double>();
}

TEST(Ti2v, TextToVideoEqualsDiffusersWithExpandTimesteps) {
  test::ScratchDir dir("ti2v_parity");
  const std::string release = dir / "release";
  const auto made = test::run_process(test::python() + " " + test::reference_script("diffusers_ti2v_reference.py") +
                                      " " + release + " 2>&1");
  if (made.status == 3) GTEST_SKIP() << made.output;
  ASSERT_EQ(made.status, 0) << made.output;
  WanWeights w;
  w.fill_from(release);
  Config cfg = parse_config("", "<test>", {"sample.steps=6", "sample.shift=5.0", "sample.solver=\"unipc\"",
                                           "sample.cfg_scale=5.0"});
  cfg.model = read_transformer_config(w.transformer);
  EXPECT_EQ(cfg.model.out_channels, 8);
  EXPECT_TRUE(is_wan22_vae(w.vae));
  EXPECT_EQ(vae_stride(w, cfg.model), 16);
  // The release's scheduler gives UniPC with shift 5.
  const ReleaseSampling rs = release_sampling(release, cfg.model, 96 * 64);
  EXPECT_EQ(rs.solver, Solver::unipc);
  EXPECT_EQ(rs.shift, 5.0);

  const TensorMap io = load_safetensors(release + "/io.safetensors");
  VideoRequest r;
  r.frames = 9, r.width = 96, r.height = 64;
  EXPECT_EQ(latent_shape(r, cfg.model, 16), io.at("noise").sizes().vec());
  const at::Tensor ours = denoise_latents(cfg, read_transformer_weights(w.transformer), w.transformer, io.at("prompt"),
                                          io.at("negative"), io.at("noise"), at::kCPU, nullptr, false);
  const double err = relative(ours, io.at("latents"));
  std::printf("TI2V-5B form, text-to-video: latents within %.2e of max\n", err);
  EXPECT_LT(err, 1e-5);
  at::NoGradGuard ng;
  const at::Tensor video = open_wan22_vae(w.vae)->decode_latents(ours);
  ASSERT_EQ(video.sizes(), io.at("video").sizes());
  const double verr = relative(video, io.at("video").clamp(-1, 1));
  std::printf("TI2V-5B form, decoded video within %.2e of max\n", verr);
  EXPECT_LT(verr, 1e-4);

  // The Wan 2.2 VAE with a transformer of other channels, and a 48-channel transformer without
  // it, are refused naming the VAE.
  ModelConfig wrong = cfg.model;
  wrong.in_channels = wrong.out_channels = 16;
  const std::string a = test::message_of([&] { vae_stride(w, wrong); });
  EXPECT_NE(a.find("Wan 2.2 VAE of 8 latent channels but the transformer denoises 16"), std::string::npos) << a;
  WanWeights other = w;
  other.vae = dir / "nowhere";
  wrong.in_channels = wrong.out_channels = 48;
  const std::string b = test::message_of([&] { vae_stride(other, wrong); });
  EXPECT_NE(b.find("is not the Wan 2.2 VAE"), std::string::npos) << b;
}

}  // namespace
}  // namespace vidit
