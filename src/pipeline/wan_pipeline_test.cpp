// Wan text-to-video end to end on a tiny release folder in diffusers' layout: umT5 made by
// transformers (random weights, tests/reference/umt5_reference.py), a DiT written by
// write_diffusers_transformer, a random Wan VAE; `vidit sample --weights` turns a prompt into an
// MP4 that ffprobe reads back with the frames, size and rate asked for.
#include "pipeline/wan_pipeline.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "model/dit.h"
#include "model/state_dict.h"
#include "model/weight_layout.h"
#include "../../tests/mpi_test_util.h"
#include "text/text_test_util.h"
#include "../../tests/test_util.h"
#include "pipeline/pipeline_test_util.h"
#include "vae/wan_vae.h"

namespace vidit {
namespace {

namespace fs = std::filesystem;

using pipeline_test::make_release;
using pipeline_test::tiny_wan;

struct Probe {
  std::string codec, rate;
  int64_t width = 0, height = 0, frames = 0;
};

Probe ffprobe(const std::string& path) {
  auto r = test::run_process("ffprobe -v error -select_streams v:0 -count_frames -show_entries "
                             "stream=codec_name,width,height,r_frame_rate,nb_read_frames -of json '" + path + "'");
  EXPECT_EQ(r.status, 0) << r.output;
  Probe p;
  if (r.status != 0) return p;
  auto s = nlohmann::json::parse(r.output)["streams"][0];
  p.codec = s["codec_name"], p.rate = s["r_frame_rate"];
  p.width = s["width"], p.height = s["height"];
  p.frames = std::stoll(s["nb_read_frames"].get<std::string>());
  return p;
}

TEST(WanPipeline, SampleWritesTheAskedVideoFromAReleaseFolder) {
  VIDIT_UMT5_REFERENCE(ref);
  test::ScratchDir dir("wan_pipeline");
  const std::string root = make_release(dir, ref);
  const std::string mp4 = dir / "out/cat.mp4";
  auto r = test::run_process(std::string(VIDIT_BINARY) + " sample --weights " + root +
                             " -p 'a cat walks across the floor' --frames 9 --size 48x32 --seed 7"
                             " --set sample.steps=3 --set sample.solver=\\\"unipc\\\" --set train.device=\\\"cpu\\\""
                             " -o " + mp4 + " 2>&1");
  ASSERT_EQ(r.status, 0) << r.output;
  // The run's own account of each phase (seconds, peak memory): docs/BENCHMARKS.md quotes it.
  const size_t wrote = r.output.find("wrote ");
  if (wrote != std::string::npos) std::printf("%s\n", r.output.substr(wrote, r.output.find('\n', wrote) - wrote).c_str());
  EXPECT_NE(r.output.find("unipc 3 steps"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("decode"), std::string::npos) << r.output;  // the phase report
  // Denoising progress: not a terminal, so a plain final line with the steps, rate and time.
  EXPECT_NE(r.output.find("\n[sample] 3/3 steps 100% | "), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find('\r'), std::string::npos) << r.output;
  const Probe p = ffprobe(mp4);
  EXPECT_EQ(p.codec, "h264");
  EXPECT_EQ(p.width, 48);
  EXPECT_EQ(p.height, 32);
  EXPECT_EQ(p.frames, 9);
  EXPECT_EQ(p.rate, "16/1");  // sample.fps
}

TEST(WanPipeline, SeedDecidesTheVideoAndGuidanceSeesTheNegativePrompt) {
  VIDIT_UMT5_REFERENCE(ref);
  test::ScratchDir dir("wan_pipeline_api");
  const std::string root = make_release(dir, ref);
  Config cfg = parse_config("", "<test>", {"sample.steps=2", "sample.cfg_scale=4.0", "text.dtype=\"fp32\""});
  cfg.model = read_transformer_config(root + "/transformer");
  EXPECT_EQ(cfg.model.dim, 32);
  WanWeights w;
  w.fill_from(root);
  EXPECT_EQ(w.vae, root + "/vae/Wan2.1_VAE.safetensors");
  VideoRequest req;
  req.prompt = "a red flower", req.frames = 5, req.width = 32, req.height = 32, req.seed = 11;
  const VideoResult a = generate_video(cfg, w, req, at::kCPU, {}, /*verbose=*/false);
  const VideoResult b = generate_video(cfg, w, req, at::kCPU, {}, false);
  EXPECT_TRUE(at::equal(a.frames, b.frames));
  ASSERT_EQ(a.frames.sizes(), (at::IntArrayRef{5, 32, 32, 3}));
  ASSERT_EQ(a.latents.sizes(), (at::IntArrayRef{1, 16, 2, 4, 4}));
  ASSERT_EQ(a.phases.size(), 3u);
  for (const auto& ph : a.phases) EXPECT_GT(ph.peak_bytes, 0) << ph.name;
  req.negative_prompt = "blurry, static";
  const VideoResult c = generate_video(cfg, w, req, at::kCPU, {}, false);
  EXPECT_FALSE(at::allclose(a.latents, c.latents)) << "the negative prompt changed nothing";
  req.negative_prompt = "", req.seed = 12;
  const VideoResult d = generate_video(cfg, w, req, at::kCPU, {}, false);
  EXPECT_FALSE(at::allclose(a.latents, d.latents)) << "the seed changed nothing";
}

TEST(WanPipeline, BadRequestsAndMissingPartsAreNamed) {
  ModelConfig m = tiny_wan();
  VideoRequest r;
  r.frames = 6;
  try {
    check_video_request(r, m);
    FAIL() << "6 frames accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--frames 6 must be 1 + 4k"), std::string::npos) << e.what();
  }
  r.frames = 5, r.width = 40;
  try {
    check_video_request(r, m);
    FAIL() << "width 40 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("width 40 must be a multiple of 16"), std::string::npos) << e.what();
  }
  WanWeights w;
  w.transformer = "x";
  try {
    w.require_all();
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--text-encoder"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--vae"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace vidit
