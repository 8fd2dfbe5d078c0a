// Sampling on many ranks (pipeline/sampling_ranks.h): real `mpirun` jobs on a tiny Wan release
// (umT5 by transformers, random DiT and VAE weights) give the latents one process gives within
// 1e-5 and the same frames, for guidance on two halves, Ulysses, ring attention, FSDP and tensor
// parallel, with a tiled decode shared among the ranks; `vidit sample` under mpirun writes one
// file from rank 0; ranks given different prompts are refused, the rank named.
#include "pipeline/sampling_ranks.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "core/error.h"
#include "model/weight_layout.h"
#include "parallel/launch_env.h"
#include "../../tests/mpi_test_util.h"
#include "pipeline/pipeline_test_util.h"
#include "pipeline/wan_pipeline.h"
#include "text/text_test_util.h"
#include "../../tests/test_util.h"

namespace vidit {
namespace {

namespace fs = std::filesystem;

Config sampling_config(const std::vector<std::string>& sets) {
  std::vector<std::string> all = {"sample.steps=3", "sample.cfg_scale=4.0", "sample.solver=\"unipc\"", "text.dtype=\"fp32\""};
  all.insert(all.end(), sets.begin(), sets.end());
  Config cfg = parse_config("", "<test>", all);
  cfg.model = pipeline_test::tiny_wan();
  return cfg;
}

// The request every sampling test here makes: 5 frames, "a red flower opens", seed 5.
VideoRequest flower_request(int64_t width = 48) {
  VideoRequest req;
  req.prompt = "a red flower opens", req.frames = 5, req.width = width, req.height = 32, req.seed = 5;
  return req;
}

// max |a - b| over max |b|.
double max_relative(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>() / b.abs().max().item<double>();
}

TEST(SamplingLayout, TheRanksSplitGuidanceThenTokens) {
  Config cfg = sampling_config({});
  cfg.model.heads = 4;
  SamplingLayout one = sampling_layout(cfg, 64, 1);
  EXPECT_FALSE(one.halves);
  SamplingLayout two = sampling_layout(cfg, 64, 2);  // guidance on two halves of one rank each
  EXPECT_TRUE(two.halves);
  EXPECT_EQ(two.parallel.ulysses * two.parallel.ring, 1);
  SamplingLayout eight = sampling_layout(cfg, 64, 8);  // halves of 4: Ulysses over the 4 heads
  EXPECT_TRUE(eight.halves);
  EXPECT_EQ(eight.parallel.ulysses, 4);
  EXPECT_EQ(eight.parallel.ring, 1);
  cfg.model.heads = 2;  // only 2 heads: Ulysses 2, then a ring of 2
  SamplingLayout ring = sampling_layout(cfg, 64, 8);
  EXPECT_EQ(ring.parallel.ulysses, 2);
  EXPECT_EQ(ring.parallel.ring, 2);
  SamplingLayout odd = sampling_layout(cfg, 63, 3);  // odd: no halves, a ring of 3
  EXPECT_FALSE(odd.halves);
  EXPECT_EQ(odd.parallel.ring, 3);
  cfg.sample.cfg_scale = 1.0;  // no guidance: every rank splits the tokens
  EXPECT_FALSE(sampling_layout(cfg, 64, 4).halves);
  // A training config's degrees for one process are dropped; given degrees are used as they are.
  cfg.sample.cfg_scale = 5.0;
  cfg.parallel.shard = 2;
  EXPECT_EQ(sampling_layout(cfg, 64, 1).parallel.shard, 1);
  SamplingLayout sharded = sampling_layout(cfg, 64, 4);
  EXPECT_TRUE(sharded.halves);
  EXPECT_EQ(sharded.parallel.shard, 2);
  EXPECT_FALSE(sampling_layout(cfg, 64, 2).halves);
}

TEST(SamplingLayout, ImpossibleLayoutsAreRefusedNamingTheKeys) {
  Config cfg = sampling_config({});
  try {
    sampling_layout(cfg, 10, 6);  // halves of 3 ranks; 10 tokens
    FAIL() << "10 tokens split over 3 ranks";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is not a multiple of 3"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("parallel.shard = 3"), std::string::npos) << e.what();
  }
  cfg.parallel.shard = 3;
  try {
    sampling_layout(cfg, 64, 4);
    FAIL() << "shard 3 on 4 ranks";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("must be the number of ranks or half of it"), std::string::npos) << e.what();
  }
}

TEST(SamplingRanks, FingerprintsSeeValuesNotOnlyShapes) {
  TensorMap a = {{"w", at::arange(1000, at::kFloat)}, {"b", at::ones({3})}};
  TensorMap b = {{"w", at::arange(1000, at::kFloat)}, {"b", at::ones({3})}};
  EXPECT_EQ(weights_fingerprint(a), weights_fingerprint(b));
  b["w"][999] = -1.0f;  // the last element is always looked at
  EXPECT_NE(weights_fingerprint(a), weights_fingerprint(b));
  b = a;
  b["b"] = at::ones({3}, at::kDouble);
  EXPECT_NE(weights_fingerprint(a), weights_fingerprint(b));
  EXPECT_NE(fingerprint("a cat"), fingerprint("a dog"));
}

// sample.dtype = "bf16": the DiT's projections held in bf16 (half their bytes), run under bf16
// autocast; the latents stay near the fp32 ones.
TEST(SampleDtype, Bf16ProjectionsSampleNearFp32) {
  VIDIT_UMT5_REFERENCE(ref);
  test::ScratchDir dir("sample_dtype");
  const std::string root = pipeline_test::make_release(dir, ref);
  WanWeights w;
  w.fill_from(root);
  const VideoRequest req = flower_request();
  const VideoResult fp32 = generate_video(sampling_config({}), w, req, at::kCPU, {}, false);
  const VideoResult bf16 = generate_video(sampling_config({"sample.dtype=\"bf16\""}), w, req, at::kCPU, {}, false);
  const double err = max_relative(bf16.latents, fp32.latents);
  std::printf("bf16 latents within %.2e of fp32\n", err);
  EXPECT_GT(err, 0.0) << "bf16 changed nothing: the projections were not held in bf16";
  EXPECT_LE(err, 5e-2);
}

// The pipeline on a GPU (bench/gpu/run.sh runs it): the DiT under bf16 autocast, with fp32 and with
// bf16 projections, near the CPU's fp32 latents.
TEST(SampleGpu, Fp32AndBf16WeightsNearTheCpu) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  VIDIT_UMT5_REFERENCE(ref);
  test::ScratchDir dir("sample_gpu");
  const std::string root = pipeline_test::make_release(dir, ref);
  WanWeights w;
  w.fill_from(root);
  const VideoRequest req = flower_request();
  const VideoResult cpu = generate_video(sampling_config({}), w, req, at::kCPU, {}, false);
  for (const char* dtype : {"fp32", "bf16"}) {
    const VideoResult gpu =
        generate_video(sampling_config({std::string("sample.dtype=\"") + dtype + "\""}), w, req, at::Device(at::kCUDA, 0), {}, false);
    const double err = max_relative(gpu.latents, cpu.latents);
    std::printf("GPU_PARITY sample_%s %.3e\n", dtype, err);
    EXPECT_LE(err, 5e-2) << dtype;
    EXPECT_EQ(gpu.frames.sizes(), cpu.frames.sizes());
  }
}

// One rank of a sampling job: the job's latents and frames against this process's own
// one-process run of the same request.
TEST(MpiWorker, SamplingOnRanksEqualsOneProcess) {
  VIDIT_MPI_WORKER_ONLY();
  const char* root = std::getenv("VIDIT_SAMPLE_RELEASE");
  ASSERT_NE(root, nullptr);
  Config cfg = sampling_config(test::sets_from_env("VIDIT_SAMPLE_SETS", {}));
  WanWeights w;
  w.fill_from(root);
  const VideoRequest req = flower_request(std::getenv("VIDIT_SAMPLE_WIDTH") ? std::atoi(std::getenv("VIDIT_SAMPLE_WIDTH")) : 48);
  const SamplingRanks ranks = make_sampling_ranks(cfg, latent_shape(req, cfg.model), make_world_comm(detect_launch_env()));
  if (ranks.lead()) std::printf("layout: %s\n", ranks.describe().c_str());
  const VideoResult job = generate_video(cfg, w, req, at::kCPU, {}, false, &ranks);
  const VideoResult one = generate_video(cfg, w, req, at::kCPU, {}, false);
  const double err = max_relative(job.latents, one.latents);
  EXPECT_LE(err, 1e-5) << "rank " << ranks.rank();
  std::printf("rank %d: latents within %.2e of one process\n", ranks.rank(), err);
  if (ranks.lead()) {
    ASSERT_TRUE(job.frames.defined());
    // The same frames: equal here; on another CPU a latent a rounding away from a level's edge
    // may land one 8-bit level over (the reduction order of the split work differs).
    const int64_t differ = job.frames.ne(one.frames).sum().item<int64_t>();
    EXPECT_LE(differ, one.frames.numel() / 1000) << "of " << one.frames.numel() << " frame values";
    EXPECT_LE((job.frames.to(at::kInt) - one.frames.to(at::kInt)).abs().max().item<int>(), 1);
  } else if (req.width <= 512) {
    EXPECT_FALSE(job.frames.defined()) << "an untiled decode is rank 0's";
  }
  ranks.world->barrier();
  if (HasFailure()) abort_world(1);
}

struct SamplingJob {
  const char* name;
  int ranks;
  const char* sets;
  int width;
};

class SamplingMesh : public ::testing::TestWithParam<SamplingJob> {};

TEST_P(SamplingMesh, LatentsAndFramesEqualOneProcess) {
  VIDIT_REQUIRE_MPI();
  VIDIT_UMT5_REFERENCE(ref);
  test::ScratchDir dir(std::string("sampling_mesh_") + GetParam().name);
  const std::string root = pipeline_test::make_release(dir, ref);
  const SamplingJob& j = GetParam();
  auto r = test::mpirun_worker(j.ranks, "MpiWorker.SamplingOnRanksEqualsOneProcess",
                               "OMP_NUM_THREADS=1 VIDIT_SAMPLE_RELEASE=" + root + " VIDIT_SAMPLE_WIDTH=" +
                                   std::to_string(j.width) + " VIDIT_SAMPLE_SETS='" + j.sets + "'",
                               300);
  test::expect_workers_passed(r, j.ranks);
  for (const char* what : {"layout: ", "latents within"})  // the job's layout and each rank's error
    for (size_t at = r.output.find(what); at != std::string::npos; at = r.output.find(what, at + 1)) {
      const size_t line = r.output.rfind('\n', at) + 1;
      std::printf("%s\n", r.output.substr(line, r.output.find('\n', at) - line).c_str());
    }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, SamplingMesh,
    ::testing::Values(SamplingJob{"GuidanceHalves", 2, "", 48},
                      SamplingJob{"HalvesUlyssesTiledDecode", 4, "", 544},
                      SamplingJob{"UlyssesRing", 4, "sample.cfg_parallel=false", 48},
                      SamplingJob{"HalvesFsdp", 4, "parallel.shard=2", 48},
                      SamplingJob{"Tensor2", 2, "parallel.tensor=2 sample.cfg_parallel=false", 48}),
    [](const ::testing::TestParamInfo<SamplingJob>& info) { return std::string(info.param.name); });

TEST(SamplingCli, MpirunWritesOneVideoFromRankZero) {
  VIDIT_REQUIRE_MPI();
  VIDIT_UMT5_REFERENCE(ref);
  test::ScratchDir dir("sampling_cli");
  const std::string root = pipeline_test::make_release(dir, ref);
  const std::string out = dir / "out";
  const std::string args = " sample --weights " + root + " --frames 5 --size 48x32 --seed 3"
                           " --set sample.steps=2 --set train.device=\\\"cpu\\\" -o " + out;
  auto r = test::mpirun(2, std::string("env OMP_NUM_THREADS=1 ") + VIDIT_BINARY + args + " -p 'a boat on a lake'", 300);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("2 ranks: guidance on two halves of 1"), std::string::npos) << r.output;
  size_t wrote = 0;
  for (size_t at = r.output.find("wrote "); at != std::string::npos; at = r.output.find("wrote ", at + 1)) ++wrote;
  EXPECT_EQ(wrote, 1u) << r.output;
  size_t files = 0;
  for (const auto& e : fs::directory_iterator(out)) files += e.path().extension() == ".mp4";
  EXPECT_EQ(files, 1u);

  // Rank 1 given another prompt: refused before any sampling, rank 1 named, nothing written.
  const std::string out2 = dir / "out2";
  const std::string args2 = " sample --weights " + root + " --frames 5 --size 48x32 --set sample.steps=2"
                            " --set train.device=\\\"cpu\\\" -o " + out2;
  auto bad = test::mpirun(1, std::string(VIDIT_BINARY) + args2 + " -p 'a boat' : -np 1 " + VIDIT_BINARY + args2 +
                                 " -p 'a train'", 300);
  EXPECT_NE(bad.status, 0) << bad.output;
  EXPECT_NE(bad.output.find("rank 1 of the sampling job has other prompts or video settings than rank 0"),
            std::string::npos) << bad.output;
  size_t written = 0;
  if (fs::exists(out2))
    for (const auto& e : fs::directory_iterator(out2)) written += e.path().extension() == ".mp4";
  EXPECT_EQ(written, 0u);
}

// A job whose memory plan does not fit the memory given is refused before any work, naming the
// phase and the keys that change it; nothing is written.
TEST(SamplingCli, AJobThatDoesNotFitIsRefusedBeforeAnyWork) {
  VIDIT_UMT5_REFERENCE(ref);
  test::ScratchDir dir("sampling_refused");
  const std::string root = pipeline_test::make_release(dir, ref);
  const std::string out = dir / "out";
  auto r = test::run_process(std::string(VIDIT_BINARY) + " sample --weights " + root + " --frames 5 --size 48x32"
                             " --set sample.steps=2 --set train.device=\\\"cpu\\\" --set train.host_memory_gb=0.001 -p 'a boat' -o " + out);
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("phase needs"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("sample.dtype"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("Nothing was sampled"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("[sample]"), std::string::npos) << r.output;
  size_t written = 0;
  if (fs::exists(out))
    for (const auto& e : fs::directory_iterator(out)) written += e.path().extension() == ".mp4";
  EXPECT_EQ(written, 0u);
}

}  // namespace
}  // namespace vidit
