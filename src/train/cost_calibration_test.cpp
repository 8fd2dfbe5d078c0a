// Cost calibration (train/cost_calibration.h) on a real latent cache of three buckets and a real
// tiny DiT: the measured model predicts re-timed batches, is written and then reused bit for bit,
// a corrupt or foreign file is replaced with a warning, every rank of a 2-process job gets rank
// 0's coefficients, and a `vidit train` run with data.balance = "cost" killed mid-run and
// restarted reuses the file and ends with the loss of the uninterrupted run; --fresh sets it aside.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>

#include "../../tests/test_util.h"
#include "diffusion/flow_matching.h"
#include "loader/latent_cache.h"
#include "model/dit.h"
#include "parallel/comm.h"
#include "parallel/launch_env.h"
#include "../../tests/mpi_test_util.h"
#include "train/cost_calibration.h"

namespace vidit {
namespace {

namespace fs = std::filesystem;

struct TinyBucket {
  const char* name;
  int64_t t, h, w, count;
};
// Latents [4, T, H, W] under patch (1, 2, 2): 8, 32 and 64 tokens per sample.
const TinyBucket kBuckets[] = {{"short-2x4x4", 2, 4, 4, 24}, {"middle-2x8x8", 2, 8, 8, 8}, {"long-4x8x8", 4, 8, 8, 6}};

void write_cache(const std::string& dir) {
  at::manual_seed(1);
  {
    CacheWriter w(dir, 0, 1 << 20, at::kFloat);
    int i = 0;
    for (const TinyBucket& b : kBuckets)
      for (int64_t k = 0; k < b.count; ++k, ++i) {
        CacheSample s;
        s.key = cache_key("clip" + std::to_string(i), -1, -1);
        s.mean = at::randn({4, b.t, b.h, b.w});
        s.std = at::rand({4, b.t, b.h, b.w}) * 0.1;
        s.text = at::randn({4, 8});
        s.bucket = b.name;
        w.add(s);
      }
  }
  merge_cache_index(dir);
}

// The tiny model of tests/test_util.h reading `cache` in batches of 64 tokens balanced by cost.
Config cost_config(const std::string& cache, std::vector<std::string> extra = {}) {
  extra.insert(extra.begin(), {"data.source=\"cache\"", "data.cache_dir=\"" + cache + "\"", "data.balance=\"cost\"",
                               "data.token_budget=64", "model.dim=64", "model.ffn_dim=128"});
  return test::tiny_config(extra);
}

std::string read(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Per-sample seconds of forward + loss + backward of `samples` samples of shape [4, t, h, w],
// timed here independently of the calibration (fastest of 5).
double seconds_per_sample(DiT& model, int64_t samples, int64_t t, int64_t h, int64_t w) {
  const at::Tensor x0 = at::randn({samples, 4, t, h, w}), noise = at::randn_like(x0), sigma = at::rand({samples});
  const at::Tensor text = at::randn({samples, 4, 8});
  double best = 1e30;
  for (int k = 0; k < 6; ++k) {
    model->zero_grad();
    const auto t0 = std::chrono::steady_clock::now();
    const FlowSample fs = make_flow_sample(x0, noise, sigma);
    flow_loss(model->forward(fs.x_t, fs.timestep, text), fs.target).backward();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (k > 0) best = std::min(best, s);
  }
  return best / double(samples);
}

TEST(CostCalibration, MeasuresOnceThenReusesAndReplacesABadFile) {
  test::ScratchDir dir("cost_calibration");
  write_cache(dir / "cache");
  const LatentCache cache(dir / "cache");
  const std::vector<LatentBucket> buckets = latent_buckets(cache);
  ASSERT_EQ(buckets.size(), 3u);
  EXPECT_EQ(buckets[0].shape, (std::vector<int64_t>{4, 2, 4, 4}));
  const Config cfg = cost_config(dir / "cache");
  auto world = make_single_comm();
  const std::string out = dir / "run";  // not there yet: rank 0 makes it

  testing::internal::CaptureStdout();
  const CostCalibration first = calibrate_cost_model(cfg, buckets, at::kCPU, *world, out);
  const std::string said = testing::internal::GetCapturedStdout();
  EXPECT_FALSE(first.reused);
  EXPECT_NE(said.find("cost model: measured 3 batch shape(s)"), std::string::npos) << said;
  EXPECT_NE(said.find("long-4x8x8"), std::string::npos) << said;  // the per-bucket check
  EXPECT_EQ(first.model.unit, "s");
  EXPECT_EQ(first.model.measured_tokens, (std::set<int64_t>{8, 32, 64}));
  ASSERT_EQ(first.measurements.size(), 3u);
  // Batches as the 64-token budget gives them: 8, 2 and 1 samples.
  EXPECT_EQ(first.measurements[0].samples, 8);
  EXPECT_EQ(first.measurements[1].samples, 2);
  EXPECT_EQ(first.measurements[2].samples, 1);
  EXPECT_GT(first.seconds, 0);
  ASSERT_TRUE(fs::exists(out + "/cost_model.json"));
  const std::string written = read(out + "/cost_model.json");
  const auto j = nlohmann::json::parse(written);
  EXPECT_EQ(j["unit"], "s");
  EXPECT_EQ(j["measurements"].size(), 3u);
  EXPECT_EQ(j["fixed"].get<double>(), first.model.fixed);

  // Re-timed here: the model's per-sample predictions are those times within a factor of 3 (a
  // shared 2-core machine is noisy), and a long clip costs more than a short one.
  {
    DiT model(cfg.model);
    model->init_weights();
    for (const TinyBucket& b : kBuckets) {
      const int64_t tokens = b.t * (b.h / 2) * (b.w / 2), samples = std::max<int64_t>(1, 64 / tokens);
      const double measured = seconds_per_sample(model, samples, b.t, b.h, b.w);
      const double predicted = first.model.cost(tokens);
      EXPECT_GT(predicted, measured / 3) << b.name;
      EXPECT_LT(predicted, measured * 3) << b.name;
    }
    EXPECT_GT(first.model.cost(64), first.model.cost(8));
  }

  // A second attempt reads the file: no measurement, the same coefficients bit for bit, the file
  // untouched.
  testing::internal::CaptureStdout();
  const CostCalibration again = calibrate_cost_model(cfg, buckets, at::kCPU, *world, out);
  const std::string said_again = testing::internal::GetCapturedStdout();
  EXPECT_TRUE(again.reused);
  EXPECT_EQ(again.seconds, 0);
  EXPECT_NE(said_again.find("cost model: reused " + out + "/cost_model.json"), std::string::npos) << said_again;
  EXPECT_EQ(again.model.fixed, first.model.fixed);
  EXPECT_EQ(again.model.per_token, first.model.per_token);
  EXPECT_EQ(again.model.per_token_pair, first.model.per_token_pair);
  EXPECT_EQ(again.model.origin, first.model.origin);
  EXPECT_EQ(again.model.measured_tokens, first.model.measured_tokens);
  EXPECT_EQ(read(out + "/cost_model.json"), written);

  // A file that does not parse: a warning naming it, measured again, replaced.
  { std::ofstream(out + "/cost_model.json") << "{\"version\": 1, \"fixed\": "; }
  testing::internal::CaptureStderr();
  testing::internal::CaptureStdout();
  const CostCalibration mended = calibrate_cost_model(cfg, buckets, at::kCPU, *world, out);
  const std::string warned = testing::internal::GetCapturedStderr();
  const std::string said_mended = testing::internal::GetCapturedStdout();
  EXPECT_FALSE(mended.reused);
  EXPECT_NE(warned.find("warning: cost model file " + out + "/cost_model.json does not parse"), std::string::npos)
      << warned;
  EXPECT_NE(said_mended.find("cost model: measured"), std::string::npos) << said_mended;
  EXPECT_EQ(nlohmann::json::parse(read(out + "/cost_model.json"))["unit"], "s");

  // A file made for another model is not reused either.
  testing::internal::CaptureStderr();
  testing::internal::CaptureStdout();
  const CostCalibration other = calibrate_cost_model(cost_config(dir / "cache", {"model.layers=1"}), buckets, at::kCPU,
                                                     *world, out);
  const std::string warned_other = testing::internal::GetCapturedStderr();
  testing::internal::GetCapturedStdout();
  EXPECT_FALSE(other.reused);
  EXPECT_NE(warned_other.find("was made for another model"), std::string::npos) << warned_other;
}

TEST(CostCalibration, BadBucketsAreRefused) {
  test::ScratchDir dir("cost_calibration_bad");
  const Config cfg = cost_config(dir / "cache");
  auto world = make_single_comm();
  EXPECT_THROW(calibrate_cost_model(cfg, {}, at::kCPU, *world, dir / "run"), Error);
  try {
    calibrate_cost_model(cfg, {{"odd", {4, 2, 5, 4}}}, at::kCPU, *world, dir / "run");
    FAIL() << "an odd latent width passed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bucket 'odd'"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(dir / "run/cost_model.json"));
}

// Under mpirun: every rank gets rank 0's coefficients bit for bit (rank 1 never measures).
TEST(MpiWorker, CostCalibrationIsRankZerosOnEveryRank) {
  VIDIT_MPI_WORKER_ONLY();
  const std::string dir = std::getenv("COST_CALIBRATION_DIR");
  auto world = make_world_comm(detect_launch_env());
  const CostCalibration c =
      calibrate_cost_model(cost_config(dir + "/cache"), latent_buckets(LatentCache(dir + "/cache")), at::kCPU, *world,
                           dir + "/run");
  EXPECT_EQ(c.reused, false);
  EXPECT_EQ(c.model.unit, "s");
  EXPECT_EQ(c.model.measured_tokens, (std::set<int64_t>{8, 32, 64}));
  at::Tensor mine = at::tensor({c.model.fixed, c.model.per_token, c.model.per_token_pair}, at::kDouble);
  at::Tensor all = at::zeros({2 * 3}, at::kDouble);
  world->all_gather(mine, all)->wait();
  EXPECT_TRUE(at::equal(all.narrow(0, 0, 3), all.narrow(0, 3, 3))) << all;
  EXPECT_EQ(c.measurements.empty(), world->rank() != 0);
}

TEST(Mpi, CostCalibrationIsRankZerosOnEveryRank) {
  VIDIT_REQUIRE_MPI();
  test::ScratchDir dir("cost_calibration_mpi");
  write_cache(dir / "cache");
  test::expect_workers_passed(
      test::mpirun_worker(2, "MpiWorker.CostCalibrationIsRankZerosOnEveryRank", "COST_CALIBRATION_DIR=" + dir.path()),
      2);
}

// `vidit train` on 2 ranks with data.balance = "cost", killed by the fault injection after step 5
// (checkpoint at 4) and restarted: the restart reuses cost_model.json, and ends with the loss of
// an uninterrupted run given the same calibration (its out_dir starts with a copy of the file: a
// calibration measured anew could size the batches differently).
TEST(Mpi, CostBalancedRunResumesExactlyWithItsCalibration) {
  VIDIT_REQUIRE_MPI();
  test::ScratchDir dir("cost_calibration_train");
  write_cache(dir / "cache");
  auto command = [&](const std::string& out) {
    return std::string(VIDIT_BINARY) + test::kTinyTrainArgs + out + " data.source=cache data.cache_dir=" +
           dir.path() + "/cache data.balance=cost data.token_budget=64 train.steps=8 checkpoint.every=4 "
           "checkpoint.async=false parallel.replicate=2";
  };
  auto line = [](const std::string& output, const std::string& pattern) {
    std::smatch m;
    EXPECT_TRUE(std::regex_search(output, m, std::regex(pattern))) << pattern << " in:\n" << output;
    return m.size() > 1 ? m[1].str() : std::string("none");
  };
  const std::string faulty = dir / "faulty", straight = dir / "straight";
  auto killed = test::mpirun(2, command(faulty) + " faults.kind=kill faults.step=5", 240);
  ASSERT_NE(killed.status, 0) << "the fault did not fire:\n" << killed.output;
  ASSERT_NE(killed.output.find("fault injection"), std::string::npos) << killed.output;
  EXPECT_NE(killed.output.find("cost model: measured 3 batch shape(s)"), std::string::npos) << killed.output;
  ASSERT_TRUE(fs::exists(faulty + "/cost_model.json"));
  const std::string calibration = read(faulty + "/cost_model.json");

  fs::create_directories(straight);
  fs::copy_file(faulty + "/cost_model.json", straight + "/cost_model.json");
  auto whole = test::mpirun(2, command(straight), 240);
  ASSERT_EQ(whole.status, 0) << whole.output;
  EXPECT_NE(whole.output.find("cost model: reused"), std::string::npos) << whole.output;
  const std::string plan = line(whole.output, "loader: (balance cost: batches of [^\n]* s predicted[^\n]*)");

  auto restarted = test::mpirun(2, command(faulty) + " faults.kind=kill faults.step=5 faults.attempt=9", 240);
  ASSERT_EQ(restarted.status, 0) << restarted.output;
  EXPECT_NE(restarted.output.find("resumed from step 4"), std::string::npos) << restarted.output;
  EXPECT_NE(restarted.output.find("cost model: reused " + faulty + "/cost_model.json"), std::string::npos)
      << restarted.output;
  EXPECT_EQ(restarted.output.find("cost model: measured"), std::string::npos) << restarted.output;
  EXPECT_EQ(read(faulty + "/cost_model.json"), calibration);
  EXPECT_EQ(line(restarted.output, "loader: (balance cost: [^\n]*)"), plan);
  EXPECT_EQ(line(restarted.output, "done: 8 steps, final loss (\\S+)"),
            line(whole.output, "done: 8 steps, final loss (\\S+)"));

  // --fresh sets the calibration aside with the run's other files and measures again.
  auto fresh = test::mpirun(2, command(faulty) + " train.steps=1 --fresh", 240);
  ASSERT_EQ(fresh.status, 0) << fresh.output;
  EXPECT_NE(fresh.output.find("cost model: measured"), std::string::npos) << fresh.output;
  int aside = 0;
  for (const auto& e : fs::directory_iterator(faulty))
    if (e.path().filename().string().rfind("previous-", 0) == 0)
      aside += read(e.path().string() + "/cost_model.json") == calibration;
  EXPECT_EQ(aside, 1) << "the earlier calibration is not in " << faulty << "/previous-*";
}

}  // namespace
}  // namespace vidit
