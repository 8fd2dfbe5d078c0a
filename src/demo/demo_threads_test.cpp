// `vidit demo` trains on one CPU thread unless train.threads names a count: the checkpoint it
// writes records the thread count the run used, and the console says so.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <string>

#include "../../tests/test_util.h"
#include "../../tests/mpi_test_util.h"
#include "video/video_decoder.h"

namespace vidit {
namespace {

// The [train] threads line of the resolved config in the run's final checkpoint.
std::string threads_in_checkpoint(const std::string& out_dir) {
  std::ifstream f(out_dir + "/checkpoints/step_00000004/meta.json");
  if (!f) return "(no checkpoint at step 4 in " + out_dir + ")";
  const std::string config = nlohmann::json::parse(f)["config"].get<std::string>();
  const size_t train = config.find("[train]");
  const size_t at = config.find("\nthreads = ", train);
  if (train == std::string::npos || at == std::string::npos) return "(no [train] threads in the config)";
  return config.substr(at + 1, config.find('\n', at + 1) - at - 1);
}

TEST(DemoThreads, EveryCoreMeansOneThreadAndACountIsKept) {
  if (!video_decoding_available()) GTEST_SKIP() << "built without FFmpeg";
  test::ScratchDir dir("demo_threads");
  const std::string common = std::string(VIDIT_BINARY) +
                             " demo --set demo.videos=24 --set train.steps=4 --set sample.steps=2 "
                             "--set demo.samples_per_prompt=1 --set train.out_dir=";
  // The default, train.threads = 0 ("every core"): one thread.
  auto run = test::run_process(common + (dir / "default") + " 2>&1");
  EXPECT_EQ(run.status, 3) << run.output;  // 4 steps cannot reach 90% adherence
  EXPECT_NE(run.output.find("training on one CPU thread per process"), std::string::npos) << run.output;
  EXPECT_EQ(threads_in_checkpoint(dir / "default"), "threads = 1");
  // A count asked for is used as it is.
  run = test::run_process(common + (dir / "two") + " --set train.threads=2 2>&1");
  EXPECT_EQ(run.status, 3) << run.output;
  EXPECT_EQ(run.output.find("training on one CPU thread"), std::string::npos) << run.output;
  EXPECT_EQ(threads_in_checkpoint(dir / "two"), "threads = 2");
}

}  // namespace
}  // namespace vidit
