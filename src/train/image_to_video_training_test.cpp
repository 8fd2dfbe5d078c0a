// Image-to-video training end to end, as a user runs it: `vidit prepare` on real videos (made by
// the ffmpeg CLI) stores each clip's condition latent and CLIP features beside its latents, and
// `vidit train` fine-tunes an image-to-video release (diffusers' layout, 36 input channels) on
// them, saves and resumes. The parts are the small random ones of
// tests/reference/diffusers_i2v_reference.py (a Wan VAE at base width 8, a CLIP image encoder, the
// transformer; and first-and-last-frame). A text-to-video cache given to an image-to-video run is
// refused by name.
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <fstream>
#include <sstream>
#include <string>

#include "../../tests/mpi_test_util.h"
#include "../../tests/test_util.h"
#include "core/config.h"
#include "loader/cache_loader.h"
#include "loader/latent_cache.h"
#include "core/safetensors.h"
#include "model/weight_layout.h"
#include "train/run_weights.h"
#include "video/video_test_util.h"

namespace vidit {
namespace {
namespace fs = std::filesystem;

// `kind`: "t2v", "first_frame" or "first_last_frame" (then 2 x 5 image tokens with a position
// embedding, as the reference's FLF transformer).
std::string i2v_config(const std::string& dir, const std::string& ref, const std::string& cache,
                       const std::string& kind) {
  const bool i2v = kind != "t2v";
  std::ostringstream c;
  c << "[model]\ndim = 32\nheads = 2\nlayers = 2\nffn_dim = 64\nfreq_dim = 32\npatch = [1, 2, 2]\ntext_dim = 32\n"
    << "text_len = 512\neps = 1e-6\nrope_theta = 10000.0\nout_channels = 16\n";
  c << (i2v ? "in_channels = 36\nimage_dim = 48\ncondition = \"" + kind + "\"\n" : "in_channels = 16\n");
  if (kind == "first_last_frame") c << "image_pos_tokens = 10\n";
  c << "[data]\nsource = \"cache\"\nmanifest = \"" << dir << "/manifest.jsonl\"\ncache_dir = \"" << cache << "\"\n"
    << "codec = \"wan_vae\"\nvae_weights = \"" << ref << "/vae\"\nimage_encoder = \"" << ref << "/image_encoder\"\n"
    << "cache_dtype = \"fp32\"\ndecode_threads = 1\nloader_threads = 1\ndecoder = \"cpu\"\n"
    << "[buckets]\nresolutions = [32]\naspect_ratios = [1.5]\nframes = [9]\nframe_stride = 1\nmultiple = 16\n"
    << "[train]\nbatch_size = 2\nsteps = 4\nthreads = 1\nlog_every = 1\nlr = 1e-4\nwarmup_steps = 0\ndevice = \"cpu\"\n"
    << "out_dir = \"" << dir << "/run\"\n" << (i2v ? "init_from = \"" + ref + "/transformer\"\n" : "")
    << "[checkpoint]\nevery = 2\n"
    << "[sample]\nevery = " << (i2v ? 4 : 0) << "\nsteps = 2\ncount = 1\n";
  const std::string path = dir + "/" + kind + ".toml";
  std::ofstream(path) << c.str();
  return path;
}

// Three 9-frame clips (made by ffmpeg) and their manifest under `dir`.
void make_videos(const test::ScratchDir& dir) {
  const std::string v = dir / "videos";
  fs::create_directories(v);
  std::ofstream manifest(dir / "manifest.jsonl");
  for (int i = 0; i < 3; ++i) {
    const std::string f = v + "/clip" + std::to_string(i) + ".mp4";
    ASSERT_TRUE(video_test::ffmpeg("-f lavfi -i testsrc2=size=48x32:rate=8 -vf hue=h=" + std::to_string(60 * i) +
                                   " -frames:v 9 -pix_fmt yuv420p -c:v libx264 " + f));
    manifest << "{\"path\": \"" << f << "\", \"caption\": \"clip " << i << "\"}\n";
  }
}

// The reference's parts in <dir>/ref (first and last frame: a FLF transformer); its exit status
// and output.
test::ProcessResult make_reference(const test::ScratchDir& dir, bool last) {
  const std::string png = dir / "first.png";
  if (!video_test::ffmpeg("-f lavfi -i testsrc2=size=48x32 -frames:v 1 " + png)) {
    test::ProcessResult failed;
    failed.status = 1, failed.output = "ffmpeg could not make " + png;
    return failed;
  }
  return test::run_process(test::python() + " " + test::reference_script("diffusers_i2v_reference.py") + " " +
                           (dir / "ref") + " " + png + (last ? " " + png : std::string()) + " 2>&1");
}

TEST(ImageToVideoTraining, PrepareStoresTheConditionAndTrainingResumesFromIt) {
  SKIP_WITHOUT_DECODING();
  test::ScratchDir dir("i2v_training");
  ASSERT_NO_FATAL_FAILURE(make_videos(dir));
  const std::string ref = dir / "ref";
  const auto made = make_reference(dir, false);
  if (made.status == 3) GTEST_SKIP() << made.output;
  ASSERT_EQ(made.status, 0) << made.output;

  // Prepare: each clip's condition latent (the first frame, zeros after, through the VAE) and its
  // first frame's CLIP features are in the cache.
  const std::string config = i2v_config(dir.path(), ref, dir / "cache", "first_frame");
  auto r = test::run_process(std::string(VIDIT_BINARY) + " prepare --config " + config + " 2>&1");
  ASSERT_EQ(r.status, 0) << r.output;
  const LatentCache cache(dir / "cache");
  ASSERT_EQ(cache.size(), 3);
  for (int64_t i = 0; i < cache.size(); ++i) {
    const CacheIndexEntry& e = cache.entry(i);
    EXPECT_TRUE(e.cond) << e.key;
    EXPECT_EQ(e.image_shape, (std::vector<int64_t>{5, 48})) << e.key;
    EXPECT_EQ(e.made.at("encode").at("model.condition"), "first_frame");
    const LatentCache::Loaded s = cache.load(i);
    ASSERT_EQ(s.cond.sizes(), s.mean.sizes());
    // The VAE is causal: the condition's first latent frame is the clip's own (the same first
    // frame); the later ones encode zeros, not the clip.
    EXPECT_TRUE(at::allclose(s.cond.select(1, 0), s.mean.select(1, 0), 1e-4, 1e-4)) << e.key;
    EXPECT_GT((s.cond.select(1, 2) - s.mean.select(1, 2)).abs().max().item<double>(), 0.1) << e.key;
  }

  // Train on it from the image-to-video release, with checkpoints; then resume.
  r = test::run_process(std::string(VIDIT_BINARY) + " train --config " + config + " 2>&1");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("step      4/4"), std::string::npos) << r.output;
  // sample.every: a clip's first frame, from the cache, continued by the model, to MP4.
  EXPECT_NE(r.output.find("[sample] step 4: 1 video(s)"), std::string::npos) << r.output;
  r = test::run_process(std::string(VIDIT_BINARY) + " train --config " + config + " --set train.steps=6 2>&1");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("resumed from step 4"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("step      6/6"), std::string::npos) << r.output;

  // Export as a whole pipeline: the trained transformer, the release's other parts linked;
  // diffusers' WanImageToVideoPipeline.from_pretrained opens it and samples from a picture.
  const std::string pipe = dir / "exported";
  r = test::run_process(std::string(VIDIT_BINARY) + " export " + (dir / "run") + " " + pipe + " --pipeline " + ref + " 2>&1");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("as a WanImageToVideoPipeline"), std::string::npos) << r.output;
  const TensorMap exported = read_transformer_weights(pipe + "/transformer"),
                  trained = read_checkpoint_weights(dir / "run").weights;
  ASSERT_EQ(exported.size(), trained.size());
  for (const auto& [k, v] : trained) EXPECT_TRUE(at::equal(exported.at(k), v)) << k;
  EXPECT_GT(fs::hard_link_count(pipe + "/vae/config.json"), 1u) << "the release's VAE was copied, not linked";
  r = test::run_process(test::python() + " " + test::reference_script("diffusers_i2v_reference.py") + " open " + pipe +
                        " " + (dir / "first.png") + " 2>&1");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("WanImageToVideoPipeline with"), std::string::npos) << r.output;
  // LoRA on the image keys and values (and a self-attention projection) of the I2V release:
  // the adapters train, and the exported adapter file holds them under Wan's names.
  r = test::run_process(std::string(VIDIT_BINARY) + " train --config " + config + " --set train.out_dir=\\\"" +
                        (dir / "lora_run") + "\\\" --set lora.rank=4 --set train.steps=2 --set sample.every=0 "
                        "--set 'lora.targets=[\"cross_attn.k_img\", \"cross_attn.v_img\", \"self_attn.q\"]' 2>&1");
  ASSERT_EQ(r.status, 0) << r.output;
  r = test::run_process(std::string(VIDIT_BINARY) + " export --format lora " + (dir / "lora_run") + " " +
                        (dir / "adapters.safetensors") + " 2>&1");
  ASSERT_EQ(r.status, 0) << r.output;
  const TensorMap adapters = load_safetensors(dir / "adapters.safetensors");
  for (const char* proj : {"cross_attn.k_img", "cross_attn.v_img", "self_attn.q"}) {
    const std::string b = std::string("diffusion_model.blocks.1.") + proj + ".lora_B.weight";
    ASSERT_TRUE(adapters.count(b)) << b;
    EXPECT_GT(adapters.at(b).abs().max().item<double>(), 0) << b << " did not train";
  }
  EXPECT_EQ(adapters.size(), 2u * 3u * 3u) << "2 blocks x 3 projections x (A, B, alpha)";

  // A text-to-video release does not go with this model: named, and nothing is written.
  fs::create_directories(dir / "t2v_release");
  std::ofstream(dir / "t2v_release/model_index.json") << R"({"_class_name": "WanPipeline"})";
  r = test::run_process(std::string(VIDIT_BINARY) + " export " + (dir / "run") + " " + (dir / "exported2") +
                        " --pipeline " + (dir / "t2v_release") + " 2>&1");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("is a WanPipeline, but the checkpoint's model is image-to-video"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir / "exported2"));

  // A cache prepared for text-to-video cannot train an image-to-video model: refused by name
  // before any step, and the run's checkpoints are left as they were.
  const std::string t2v = i2v_config(dir.path(), ref, dir / "cache_t2v", "t2v");
  r = test::run_process(std::string(VIDIT_BINARY) + " prepare --config " + t2v + " 2>&1");
  ASSERT_EQ(r.status, 0) << r.output;
  r = test::run_process(std::string(VIDIT_BINARY) + " train --config " + config + " --set data.cache_dir=\\\"" +
                        (dir / "cache_t2v") + "\\\" --set train.steps=8 2>&1");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("has no condition latent"), std::string::npos) << r.output;
  EXPECT_TRUE(fs::exists(dir / "run/checkpoints/step_00000006"));
}

// First and last frame: the cache holds both frames' CLIP tokens (2 x 5) and the loader's mask
// marks channel 3 of the last latent frame (the clip's last pixel frame); the FLF release trains.
TEST(ImageToVideoTraining, FirstAndLastFrameCachesBothFramesAndTrains) {
  SKIP_WITHOUT_DECODING();
  test::ScratchDir dir("flf_training");
  ASSERT_NO_FATAL_FAILURE(make_videos(dir));
  const auto made = make_reference(dir, true);
  if (made.status == 3) GTEST_SKIP() << made.output;
  ASSERT_EQ(made.status, 0) << made.output;
  const std::string config = i2v_config(dir.path(), dir / "ref", dir / "cache", "first_last_frame");
  auto r = test::run_process(std::string(VIDIT_BINARY) + " prepare --config " + config + " 2>&1");
  ASSERT_EQ(r.status, 0) << r.output;
  auto cache = std::make_shared<const LatentCache>(dir / "cache");
  ASSERT_EQ(cache->size(), 3);
  EXPECT_EQ(cache->entry(0).image_shape, (std::vector<int64_t>{10, 48}));
  CacheLoader loader(cache, load_config(config));
  const MicroBatch b = loader.next();
  ASSERT_TRUE(b.condition.defined() && b.image.defined());
  ASSERT_EQ(b.condition.size(1), 20);
  const at::Tensor mask = b.condition.slice(1, 0, 4);  // [B, 4, T, h, w]
  EXPECT_EQ(mask.select(2, 0).min().item<double>(), 1) << "frame 0 given";
  EXPECT_EQ(mask.select(2, 1).abs().max().item<double>(), 0) << "the middle not given";
  EXPECT_EQ(mask.select(2, 2).select(1, 3).min().item<double>(), 1) << "the last frame given";
  EXPECT_EQ(mask.select(2, 2).slice(1, 0, 3).abs().max().item<double>(), 0);
  EXPECT_EQ(b.image.sizes(), (at::IntArrayRef{b.latents.size(0), 10, 48}));
  r = test::run_process(std::string(VIDIT_BINARY) + " train --config " + config + " --set sample.every=0 2>&1");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("step      4/4"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace vidit
