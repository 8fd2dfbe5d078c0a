// A release's sampling as it ships (release_sampling.h): the solver and shift from its scheduler
// config, Wan's defaults for the rest and for official-layout releases, and every key the config
// or --set names kept; then `vidit sample --weights` of a release folder says which came from where.
#include "pipeline/release_sampling.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "../../tests/mpi_test_util.h"
#include "../../tests/test_util.h"
#include "core/error.h"
#include "pipeline/pipeline_test_util.h"
#include "text/text_test_util.h"

namespace vidit {
namespace {

namespace fs = std::filesystem;

void scheduler(const test::ScratchDir& dir, const std::string& json) {
  fs::create_directories(dir / "scheduler");
  std::ofstream(dir / "scheduler/scheduler_config.json") << json;
}

TEST(ReleaseSampling, WansDefaultsWithoutASchedulerConfig) {
  test::ScratchDir dir("release_sampling_official");
  ModelConfig m;
  ReleaseSampling r = release_sampling(dir.path(), m, 832 * 480);
  EXPECT_EQ(r.model, "Wan 2.1 text-to-video");
  EXPECT_EQ(r.solver, Solver::unipc);
  EXPECT_EQ(r.shift, 5.0);
  EXPECT_EQ(r.steps, 50);
  EXPECT_EQ(r.cfg_scale, 5.0);
  EXPECT_EQ(r.fps, 16.0);
  EXPECT_TRUE(r.scheduler.empty());
  m.condition = FrameCondition::first_frame;
  r = release_sampling(dir.path(), m, 832 * 480);
  EXPECT_EQ(r.steps, 40);
  EXPECT_EQ(r.shift, 3.0);  // 480p
  EXPECT_EQ(release_sampling(dir.path(), m, 1280 * 720).shift, 5.0);
  m.condition = FrameCondition::first_last_frame;
  EXPECT_EQ(release_sampling(dir.path(), m, 1280 * 720).shift, 16.0);
  // Wan 2.2 TI2V-5B (48 channels): 50 steps, guidance 5, shift 5, 24 fps.
  ModelConfig ti2v;
  ti2v.in_channels = ti2v.out_channels = 48;
  r = release_sampling(dir.path(), ti2v, 1280 * 704);
  EXPECT_EQ(r.model, "Wan 2.2 TI2V-5B text-to-video");
  EXPECT_EQ(r.steps, 50);
  EXPECT_EQ(r.shift, 5.0);
  EXPECT_EQ(r.cfg_scale, 5.0);
  EXPECT_EQ(r.fps, 24.0);
}

TEST(ReleaseSampling, SolverAndShiftFromTheSchedulerConfig) {
  test::ScratchDir dir("release_sampling_diffusers");
  const ModelConfig m;
  scheduler(dir, R"({"_class_name": "UniPCMultistepScheduler", "flow_shift": 7.0, "prediction_type": "flow_prediction"})");
  ReleaseSampling r = release_sampling(dir.path(), m, 832 * 480);
  EXPECT_EQ(r.solver, Solver::unipc);
  EXPECT_EQ(r.shift, 7.0);
  EXPECT_EQ(r.scheduler, "scheduler/scheduler_config.json");
  scheduler(dir, R"({"_class_name": "FlowMatchEulerDiscreteScheduler", "shift": 2.5})");
  r = release_sampling(dir.path(), m, 832 * 480);
  EXPECT_EQ(r.solver, Solver::euler);
  EXPECT_EQ(r.shift, 2.5);
  scheduler(dir, R"({"_class_name": "UniPCMultistepScheduler", "flow_shift": 3.0, "prediction_type": "epsilon"})");
  try {
    release_sampling(dir.path(), m, 832 * 480);
    FAIL() << "an epsilon-prediction scheduler accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("scheduler_config.json"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("epsilon"), std::string::npos) << e.what();
  }
  scheduler(dir, R"({"_class_name": "DDIMScheduler"})");  // not one vidit runs: Wan's defaults, warned
  r = release_sampling(dir.path(), m, 832 * 480);
  EXPECT_EQ(r.solver, Solver::unipc);
  EXPECT_TRUE(r.scheduler.empty());
}

TEST(ReleaseSampling, KeysTheConfigOrSetNameAreKept) {
  test::ScratchDir dir("release_sampling_given");
  std::ofstream(dir / "c.toml") << "[train]\nsteps = 4\n[sample]\nsteps = 20\nfps = 24.0\n";
  const std::set<std::string> given = sample_keys_given(dir / "c.toml", {"sample.shift=2.0", "train.lr=1e-4"});
  EXPECT_EQ(given, (std::set<std::string>{"steps", "fps", "shift"}));
  EXPECT_TRUE(sample_keys_given("", {}).empty());
  SampleConfig s;
  s.steps = 20, s.fps = 24, s.shift = 2.0;
  ReleaseSampling r;
  r.model = "Wan 2.1 text-to-video", r.shift = 3.0, r.steps = 50, r.scheduler = "scheduler/scheduler_config.json";
  const std::string line = apply_release_sampling(s, r, given);
  EXPECT_EQ(s.solver, Solver::unipc);
  EXPECT_EQ(s.cfg_scale, 5.0);
  EXPECT_EQ(s.steps, 20);
  EXPECT_EQ(s.shift, 2.0);
  EXPECT_EQ(s.fps, 24.0);
  EXPECT_EQ(line, "[sample] Wan 2.1 text-to-video: UniPC from the release's scheduler/scheduler_config.json; "
                  "guidance 5 (Wan's defaults for it); sample.shift, sample.steps, sample.fps as configured\n");
}

// End to end: a release folder whose scheduler says UniPC with shift 7; the steps come from --set.
TEST(ReleaseSampling, SampleSaysWhereEachValueCameFrom) {
  VIDIT_UMT5_REFERENCE(ref);
  test::ScratchDir dir("release_sampling_cli");
  const std::string root = pipeline_test::make_release(dir, ref);
  std::ofstream(root + "/scheduler_config.json");  // not where diffusers keeps it: ignored
  fs::create_directories(root + "/scheduler");
  std::ofstream(root + "/scheduler/scheduler_config.json")
      << R"({"_class_name": "UniPCMultistepScheduler", "flow_shift": 7.0, "prediction_type": "flow_prediction"})";
  auto r = test::run_process(std::string(VIDIT_BINARY) + " sample --weights " + root +
                             " -p 'a cat' --frames 5 --size 48x32 --set sample.steps=2 --set train.device=\\\"cpu\\\""
                             " -o " + (dir / "out/cat.mp4") + " 2>&1");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("[sample] Wan 2.1 text-to-video: UniPC, shift 7 from the release's "
                          "scheduler/scheduler_config.json; guidance 5, 16 fps (Wan's defaults for it); sample.steps "
                          "as configured"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("unipc 2 steps"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace vidit
