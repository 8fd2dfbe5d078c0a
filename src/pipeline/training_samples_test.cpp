// Samples during training (sample.every) from a real `vidit train` run on the demo's videos: the
// videos land under samples/step_N at every Nth step and the last, the same prompts each time,
// readable by FFmpeg with the clip's frame count, and TensorBoard's own reader finds one image per
// prompt at each of those steps. The prompt sets: one clip per bucket first from the cache, named
// prompts at the most common bucket's size with the run's caption embedding. The Wan VAE path
// decodes to frames through a random VAE. Bad settings are refused naming the key.
#include "pipeline/training_samples.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <map>

#include "../../tests/test_util.h"
#include "core/error.h"
#include "loader/latent_cache.h"
#include "model/dit.h"
#include "model/state_dict.h"
#include "../../tests/mpi_test_util.h"
#include <ATen/CPUGeneratorImpl.h>
#include "parallel/launch_env.h"
#include "parallel/parallelize.h"
#include "prepare/caption_embedder.h"
#include "train/run_weights.h"
#include "vae/wan_vae.h"
#include "video/video_decoder.h"

namespace vidit {
namespace {
namespace fs = std::filesystem;

#ifndef VIDIT_PYTHON
#define VIDIT_PYTHON "python3"
#endif

const std::vector<std::string> kDemoSets = {"data.source=demo", "demo.videos=12", "model.dim=32", "model.ffn_dim=64",
                                            "model.heads=2",    "model.layers=2", "train.threads=1", "sample.steps=3"};

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += " " + x;
  return s;
}

std::vector<std::string> mp4s(const std::string& dir) {
  std::vector<std::string> names;
  if (!fs::exists(dir)) return names;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".mp4") names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

TEST(TrainingSamples, TrainRunWritesVideosAndImagesAtEveryNthAndLastStep) {
  test::ScratchDir dir("train_samples");
  const std::string out = dir / "run";
  const std::string cmd = std::string(VIDIT_BINARY) + " train --set" + join(kDemoSets) +
                          " train.steps=5 train.log_every=1 sample.every=2 sample.count=2 train.out_dir=" + out + " 2>&1";
  auto r = test::run_process(cmd);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("sample.every = 2: 2 prompt(s)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[sample] step 5: 2 video(s)"), std::string::npos) << r.output;

  // Steps 2, 4 and the last (5); none at 1 or 3; the same two names each time.
  const auto at2 = mp4s(out + "/samples/step_0000002");
  ASSERT_EQ(at2.size(), 2u);
  EXPECT_EQ(mp4s(out + "/samples/step_0000004"), at2);
  EXPECT_EQ(mp4s(out + "/samples/step_0000005"), at2);
  EXPECT_TRUE(mp4s(out + "/samples/step_0000001").empty());
  EXPECT_TRUE(mp4s(out + "/samples/step_0000003").empty());
  EXPECT_EQ(at2[0].rfind("00_", 0), 0u) << at2[0];
  // A demo clip is 6 frames 16 pixels high (16 to 24 wide, by bucket); the video shows them 4x,
  // and the image shows the 6 frames side by side at the same scale.
  std::map<std::string, int64_t> width;
  for (const auto& name : at2) {
    DecodedVideo v = decode_video(out + "/samples/step_0000005/" + name);
    EXPECT_EQ(v.frames.size(0), 6) << name;
    EXPECT_EQ(v.frames.size(1), 64) << name;
    width[name] = v.frames.size(2);
    EXPECT_TRUE(width[name] == 64 || width[name] == 80 || width[name] == 96) << name << ": " << width[name];
  }

  auto tb = test::run_process(std::string(VIDIT_PYTHON) + " " + VIDIT_SOURCE_DIR +
                              "/tests/reference/tensorboard_reader.py " + out + "/tb 2>&1");
  if (tb.status == 3) GTEST_SKIP() << tb.output;
  ASSERT_EQ(tb.status, 0) << tb.output;
  const nlohmann::json j = nlohmann::json::parse(tb.output);
  int tags = 0;
  for (const auto& [tag, rows] : j["images"].items()) {
    if (tag.rfind("samples/", 0) != 0) continue;
    ++tags;
    const std::string name = tag.substr(8) + ".mp4";
    ASSERT_TRUE(width.count(name)) << tag;
    std::vector<int64_t> steps;
    for (const auto& row : rows) {
      steps.push_back(row["step"].get<int64_t>());
      EXPECT_EQ(row["height"].get<int>(), 64);
      EXPECT_EQ(row["width"].get<int>(), 6 * width[name]);
    }
    EXPECT_EQ(steps, (std::vector<int64_t>{2, 4, 5})) << tag;
  }
  EXPECT_EQ(tags, 2);

  // The run's cache: each prompt's cached embedding is the demo embedder's for its caption.
  Config cfg = load_config("", kDemoSets);
  cfg.sample.count = 3;
  LatentCache cache(out + "/cache");
  const auto own = training_sample_prompts(cfg, cache);
  ASSERT_EQ(own.size(), 3u);
  for (const auto& p : own) {
    EXPECT_EQ(p.text.sizes(), (at::IntArrayRef{cfg.model.text_len, cfg.model.text_dim}));
    EXPECT_TRUE(at::allclose(p.text, demo::embed_caption(p.caption, cfg.model.text_len, cfg.model.text_dim), 1e-2, 1e-2))
        << p.caption;
  }
}

// Under mpirun: every rank samples with the run's own parallelized model (its part of the
// weights; FSDP gathers a block at a time), the prompts split over the
// data-parallel ranks (HSDP over 4 with 3 prompts: one rank samples a prompt again and drops it);
// rank 0 alone writes. (That these are the whole-weights path's samples, latents within 1e-5, is
// MeshSamples below: compared as videos, H.264 turns a rounding-sized change into other coding
// decisions.)
class ShardedSamples : public ::testing::TestWithParam<test::WorkerMesh> {};

TEST_P(ShardedSamples, EveryRankSamplesItsPartAndRankZeroWrites) {
  VIDIT_REQUIRE_MPI();
  const test::WorkerMesh& m = GetParam();
  test::ScratchDir dir(std::string("train_samples_mpi_") + m.name);
  const std::string out = dir / "run";
  const std::string args = " train --set" + join(kDemoSets) + " train.steps=4 sample.every=2 sample.count=3";
  auto r = test::mpirun(m.ranks, "env OMP_NUM_THREADS=1 " + std::string(VIDIT_BINARY) + args + " " + m.sets +
                                     " train.out_dir=" + out, 300);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(mp4s(out + "/samples/step_0000002").size(), 3u) << r.output;
  EXPECT_EQ(mp4s(out + "/samples/step_0000004").size(), 3u) << r.output;
  size_t lines = 0;
  for (size_t at = 0; (at = r.output.find("[sample] step 4:", at)) != std::string::npos; ++at) ++lines;
  EXPECT_EQ(lines, 1u) << r.output;
  EXPECT_EQ(r.output.find("failed on rank"), std::string::npos) << r.output;
}

INSTANTIATE_TEST_SUITE_P(Meshes, ShardedSamples,
                         ::testing::Values(test::WorkerMesh{"Fsdp2", 2, "parallel.shard=2"},
                                           test::WorkerMesh{"Hsdp2x2", 4, "parallel.shard=2 parallel.replicate=2"}),
                         test::mesh_test_name);

// One rank: the run's model parallelized on the mesh (parts initialised as one process would),
// prompts of two sizes sampled on the mesh, against the whole-weights path in this process.
TEST(MpiWorker, SamplesOnTheMeshEqualTheWholeWeights) {
  VIDIT_MPI_WORKER_ONLY();
  auto world = make_world_comm(detect_launch_env());
  Config cfg = test::tiny_config(test::sets_from_env("VIDIT_SAMPLES_SETS", {"sample.steps=3", "sample.cfg_scale=3.0",
                                                                            "train.batch_size=4", "train.out_dir=/tmp"}));
  auto mesh = std::make_shared<Mesh>(cfg, world);
  std::unique_ptr<ParallelModel> pm = parallelize(dit_without_storage(cfg.model, at::kCPU), mesh, cfg);
  pm->init_parts(17);
  std::vector<SamplePrompt> prompts;
  for (int i = 0; i < 3; ++i) {
    const std::vector<int64_t> shape = i == 1 ? std::vector<int64_t>{cfg.model.in_channels, 2, 4, 8}
                                              : std::vector<int64_t>{cfg.model.in_channels, 2, 4, 4};
    prompts.push_back({"prompt " + std::to_string(i), at::randn({cfg.model.text_len, cfg.model.text_dim},
                                                                at::make_generator<at::CPUGeneratorImpl>(i)), shape, "b"});
  }
  const at::Tensor null_text = at::zeros({cfg.model.text_len, cfg.model.text_dim});
  TrainingSamples samples = world->rank() == 0 ? TrainingSamples(cfg, prompts, null_text, at::kCPU) : TrainingSamples(cfg, at::kCPU);
  samples.share(*world);
  ASSERT_EQ(samples.prompts().size(), 3u);
  EXPECT_EQ(samples.prompts()[2].caption, "prompt 2");
  pm->model()->eval();
  const std::vector<at::Tensor> got = samples.latents_on_mesh(pm->model(), *mesh);
  DiT one = dit_without_storage(cfg.model, at::kCPU);
  one->init_weights(17);
  const std::vector<at::Tensor> want = samples.latents(state_dict(*one));
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(got[i].sizes(), want[i].sizes()) << i;
    const double err = (got[i] - want[i]).abs().max().item<double>() / want[i].abs().max().item<double>();
    EXPECT_LE(err, 1e-5) << "prompt " << i << " on rank " << world->rank();
    if (world->rank() == 0) std::printf("prompt %zu: latents within %.2e of the whole-weights path\n", i, err);
  }
  world->barrier();
  if (HasFailure()) abort_world(1);
}

class MeshSamples : public ::testing::TestWithParam<test::WorkerMesh> {};

TEST_P(MeshSamples, LatentsEqualTheWholeWeightsPath) {
  VIDIT_REQUIRE_MPI();
  test::run_mesh_worker(GetParam(), "MpiWorker.SamplesOnTheMeshEqualTheWholeWeights", "VIDIT_SAMPLES_SETS");
}

INSTANTIATE_TEST_SUITE_P(Meshes, MeshSamples,
                         ::testing::Values(test::WorkerMesh{"Fsdp2", 2, "parallel.shard=2"},
                                           test::WorkerMesh{"Hsdp2x2", 4, "parallel.shard=2 parallel.replicate=2"},
                                           test::WorkerMesh{"Fsdp2Ulysses2", 4, "parallel.shard=2 parallel.ulysses=2"},
                                           test::WorkerMesh{"Tensor2", 2, "parallel.tensor=2"}),
                         test::mesh_test_name);

// A cache of five clips in two buckets, written by CacheWriter.
void write_two_bucket_cache(const std::string& dir, const Config& cfg) {
  CacheWriter w(dir, 0, 1 << 20, at::kFloat);
  const std::vector<std::pair<std::string, std::vector<int64_t>>> clips = {
      {"2x4x4", {12, 2, 4, 4}}, {"2x4x4", {12, 2, 4, 4}}, {"3x4x6", {12, 3, 4, 6}}, {"2x4x4", {12, 2, 4, 4}},
      {"3x4x6", {12, 3, 4, 6}}};
  for (size_t i = 0; i < clips.size(); ++i) {
    CacheSample s;
    s.key = "k" + std::to_string(i), s.bucket = clips[i].first;
    s.mean = at::zeros(clips[i].second), s.std = at::zeros(clips[i].second);
    s.text = at::full({3, cfg.model.text_dim}, double(i));
    s.meta = {{"caption", "clip " + std::to_string(i)}};
    w.add(s);
  }
}

TEST(TrainingSamples, PromptSetsFromTheCacheAndByName) {
  test::ScratchDir dir("train_samples_sets");
  Config cfg = load_config("", {});
  write_two_bucket_cache(dir / "cache", cfg);
  LatentCache cache(dir / "cache");
  cfg.sample.count = 3;
  const auto own = training_sample_prompts(cfg, cache);
  ASSERT_EQ(own.size(), 3u);
  // One clip per bucket first (index order: k0, then k2), then the next one (k1).
  EXPECT_EQ(own[0].caption, "clip 0");
  EXPECT_EQ(own[1].caption, "clip 2");
  EXPECT_EQ(own[2].caption, "clip 1");
  EXPECT_EQ(own[1].bucket, "3x4x6");
  EXPECT_EQ(own[1].latent_shape, (std::vector<int64_t>{12, 3, 4, 6}));
  // The cached text, zero-padded to text_len.
  EXPECT_EQ(own[1].text.sizes(), (at::IntArrayRef{cfg.model.text_len, cfg.model.text_dim}));
  EXPECT_EQ(own[1].text[2][0].item<float>(), 2.0f);
  EXPECT_EQ(own[1].text[3].abs().sum().item<float>(), 0.0f);

  // Named prompts: at the most common bucket's size, embedded by the demo embedder.
  cfg.sample.prompts = {"a red circle moving up", "a blue square moving left"};
  const auto named = training_sample_prompts(cfg, cache);
  ASSERT_EQ(named.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(named[i].caption, cfg.sample.prompts[i]);
    EXPECT_EQ(named[i].bucket, "2x4x4");
    EXPECT_EQ(named[i].latent_shape, (std::vector<int64_t>{12, 2, 4, 4}));
    EXPECT_TRUE(at::equal(named[i].text, demo::embed_caption(cfg.sample.prompts[i], cfg.model.text_len, cfg.model.text_dim)));
  }
}

TEST(TrainingSamples, RefusesWhatItCannotSample) {
  test::ScratchDir dir("train_samples_bad");
  Config cfg = load_config("", {"data.text_encoder=precomputed"});
  cfg.sample.prompts = {"a caption"};
  // A one-sample cache to take a size from.
  {
    CacheWriter w(dir / "cache", 0, 1 << 20, at::kFloat);
    CacheSample s;
    s.key = "k", s.bucket = "2x4x4", s.mean = at::zeros({12, 2, 4, 4}), s.std = at::zeros({12, 2, 4, 4});
    s.text = at::zeros({3, cfg.model.text_dim});
    w.add(s);
  }
  LatentCache cache(dir / "cache");
  try {
    training_sample_prompts(cfg, cache);
    FAIL() << "named prompts without a caption encoder";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("text.encoder"), std::string::npos) << e.what();
  }
  cfg.sample.prompts.clear();  // the cache's own caption and embedding need no encoder
  ASSERT_EQ(training_sample_prompts(cfg, cache).size(), 1u);
  EXPECT_EQ(training_sample_prompts(cfg, cache)[0].latent_shape, (std::vector<int64_t>{12, 2, 4, 4}));

  cfg.data.codec = Codec::wan_vae;
  try {
    TrainingSamples(cfg, training_sample_prompts(cfg, cache), at::zeros({1, cfg.model.text_dim}), at::kCPU);
    FAIL() << "wan_vae samples without data.vae_weights";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("data.vae_weights"), std::string::npos) << e.what();
  }
}

TEST(TrainingSamples, WanVaeRunDecodesItsSamplesToVideo) {
  test::ScratchDir dir("train_samples_vae");
  Config cfg = load_config("", {"model.in_channels=16", "model.out_channels=16", "model.dim=32", "model.ffn_dim=64",
                                "model.heads=2", "model.layers=1", "data.source=cache", "data.cache_dir=" + (dir / "cache"), "data.codec=wan_vae", "sample.steps=2",
                                "train.out_dir=" + (dir / "run")});
  {
    torch::NoGradGuard no_grad;
    WanVAE vae;
    for (auto& p : vae->parameters()) p.normal_(0, 0.02);
    save_safetensors(dir / "vae.safetensors", state_dict(*vae));
  }
  cfg.data.vae_weights = dir / "vae.safetensors";
  torch::manual_seed(5);
  DiT model(cfg.model);
  model->init_weights();
  std::vector<SamplePrompt> prompts = {
      {"a clip, of 5 frames!", at::randn({cfg.model.text_len, cfg.model.text_dim}), {16, 2, 4, 6}, "5x32x48"}};
  TrainingSamples samples(cfg, prompts, at::zeros({cfg.model.text_len, cfg.model.text_dim}), at::kCPU);
  EXPECT_FALSE(samples.due(7));  // sample.every = 0: never
  const auto paths = samples.write(state_dict(*model), 7, nullptr);
  ASSERT_EQ(paths.size(), 1u);
  EXPECT_EQ(fs::path(paths[0]).filename(), "00_a_clip_of_5_frames.mp4");
  EXPECT_EQ(fs::path(paths[0]).parent_path(), fs::path(dir / "run/samples/step_0000007"));
  // 2 latent frames are 1 + 4 frames; 4x6 latents are 32x48 pixels, shown 2x.
  DecodedVideo v = decode_video(paths[0]);
  EXPECT_EQ(v.frames.size(0), 5);
  EXPECT_EQ(v.frames.size(1), 64);
  EXPECT_EQ(v.frames.size(2), 96);
}

TEST(TrainingSamples, FrameStripPicksSpreadFramesAndScales) {
  at::Tensor frames = at::zeros({10, 16, 20, 3}, at::kByte);
  for (int64_t t = 0; t < 10; ++t) frames[t].fill_(t * 10);
  int up = 0;
  at::Tensor s = frame_strip(frames, 4, &up);
  EXPECT_EQ(up, 4);
  EXPECT_EQ(s.sizes(), (at::IntArrayRef{64, 4 * 20 * 4, 3}));
  // Frames 0, 3, 6 and 9, left to right.
  const std::vector<int> shown = {0, 30, 60, 90};
  for (int k = 0; k < 4; ++k) EXPECT_EQ(s[0][k * 80][0].item<int>(), shown[size_t(k)]);
  // Wide frames: one row of at most 4096 pixels.
  at::Tensor wide = frame_strip(at::zeros({81, 480, 832, 3}, at::kByte), 8, &up);
  EXPECT_EQ(up, 1);
  EXPECT_LE(wide.size(1), 4096);
  EXPECT_EQ(wide.size(0), 240);
}

}  // namespace
}  // namespace vidit
