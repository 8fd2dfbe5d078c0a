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
#include "vision/vision_test_util.h"

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

// Image-to-video from a release folder: the tiny release with a 36-channel transformer that
// attends to the small CLIP encoder's features (its image_encoder/ and image_processor/, from
// tests/reference/clip_vision_reference.py); `vidit sample --image` writes the asked video, and
// the mistakes a user makes are named.
TEST(WanPipeline, SampleFromAPictureWithAnImageToVideoRelease) {
  VIDIT_UMT5_REFERENCE(ref);
  const auto& clip_ref = vision::test::clip_vision_reference();  // (its macro's name is taken by umT5's)
  if (!clip_ref.skip.empty()) GTEST_SKIP() << clip_ref.skip;
  ASSERT_TRUE(clip_ref.error.empty()) << clip_ref.error;
  const std::string clip = clip_ref.dir;
  test::ScratchDir dir("wan_pipeline_i2v");
  const std::string t2v = make_release(dir, ref);
  const std::string root = dir / "i2v";
  fs::create_directories(root);
  for (const char* part : {"text_encoder", "tokenizer"})
    fs::create_directory_symlink(fs::read_symlink(t2v + "/" + part), root + "/" + part);
  fs::create_directory_symlink(fs::absolute(t2v + "/vae"), root + "/vae");
  fs::create_directory_symlink(clip + "/pipe/image_encoder", root + "/image_encoder");
  // The small encoder takes 32-pixel pictures: its processor crops to that.
  fs::create_directories(root + "/image_processor");
  std::ofstream(root + "/image_processor/preprocessor_config.json")
      << R"({"crop_size": {"height": 32, "width": 32}, "size": {"shortest_edge": 32}, "resample": 3})";
  ModelConfig m = tiny_wan();
  m.in_channels = 36, m.image_dim = 64, m.condition = FrameCondition::first_frame;
  torch::manual_seed(5);
  DiT model(m);
  for (auto& p : model->parameters()) p.data().normal_(0, 0.05);
  write_diffusers_transformer(state_dict(*model), m, root + "/transformer");
  std::ofstream(root + "/model_index.json") << R"({"_class_name": "WanImageToVideoPipeline"})";
  auto pic = test::run_process("ffmpeg -v error -y -f lavfi -i testsrc2=size=64x48 -frames:v 1 " + (dir / "first.png"));
  ASSERT_EQ(pic.status, 0) << pic.output;

  const std::string base = std::string(VIDIT_BINARY) + " sample -p 'a cat' --frames 5 --size 48x32 --set sample.steps=2"
                           " --set train.device=\\\"cpu\\\" ";
  const std::string mp4 = dir / "out/cat.mp4";
  auto r = test::run_process(base + "--weights " + root + " --image " + (dir / "first.png") + " -o " + mp4 + " 2>&1");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("image condition encoded"), std::string::npos) << r.output;
  const Probe p = ffprobe(mp4);
  EXPECT_EQ(p.width, 48);
  EXPECT_EQ(p.height, 32);
  EXPECT_EQ(p.frames, 5);

  // Mistakes, each named: no picture for an I2V model; a picture for a T2V one; a file that is
  // not a picture.
  r = test::run_process(base + "--weights " + root + " -o " + mp4 + " 2>&1");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("give the first frame with --image FILE"), std::string::npos) << r.output;
  r = test::run_process(base + "--weights " + t2v + " --image " + (dir / "first.png") + " -o " + mp4 + " 2>&1");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("is a text-to-video model"), std::string::npos) << r.output;
  std::ofstream(dir / "broken.png") << "not a picture";
  r = test::run_process(base + "--weights " + root + " --image " + (dir / "broken.png") + " -o " + mp4 + " 2>&1");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find(dir / "broken.png"), std::string::npos) << r.output;
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
