// `vidit demo` as a job of 2 processes under mpirun: both train, data parallel over the demo's
// cache; rank 0 alone samples, reports and writes TensorBoard files (read back by TensorBoard's own
// reader); both exit with the verdict's status.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <string>

#include "../../tests/test_util.h"
#include "video/video_decoder.h"
#include "../../tests/mpi_test_util.h"

#ifndef VIDIT_PYTHON
#define VIDIT_PYTHON "python3"
#endif

namespace vidit {
namespace {

using test::ScratchDir;

// `vidit demo` with 2 processes: both train (data parallel over the demo's cache), rank 0 samples
// and reports once, and both exit with the verdict's status (3: adherence under 90% after a
// few steps).
TEST(Mpi, DemoRunsWithTwoProcesses) {
  VIDIT_REQUIRE_MPI();
  if (!video_decoding_available()) GTEST_SKIP() << "built without FFmpeg";
  ScratchDir out("demo2");
  auto run = test::mpirun(2, std::string(VIDIT_BINARY) +
                                 " demo --set demo.videos=24 train.steps=4 train.threads=1 train.log_every=2 "
                                 "sample.steps=2 demo.samples_per_prompt=1 demo.eval_every=2 train.out_dir=" + out.path(),
                          240);
  EXPECT_EQ(run.status, 3) << run.output;
  EXPECT_NE(run.output.find("distributed: 2 processes, data parallel over 2"), std::string::npos) << run.output;
  const std::string verdict = "prompt adherence on held-out prompts";
  ASSERT_NE(run.output.find(verdict), std::string::npos) << run.output;
  EXPECT_EQ(run.output.find(verdict, run.output.find(verdict) + 1), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("step 2: held-out adherence"), std::string::npos) << run.output;
  EXPECT_EQ(run.output.find("error"), std::string::npos) << run.output;
  EXPECT_TRUE(std::filesystem::exists(out / "samples"));
  EXPECT_TRUE(std::filesystem::exists(out / "rank1/cache"));
  // Rank 0's TensorBoard files, read by TensorBoard's own reader: each held-out prompt's sample as
  // an image at every check, the adherence, and the loss of each bucket.
  auto tb = test::run_process(std::string(VIDIT_PYTHON) + " " + VIDIT_SOURCE_DIR + "/tests/reference/tensorboard_reader.py " +
                              (out / "tb") + " 2>&1");
  if (tb.status == 3) GTEST_SKIP() << tb.output;
  ASSERT_EQ(tb.status, 0) << tb.output;
  const nlohmann::json j = nlohmann::json::parse(tb.output);
  int images = 0;
  for (const auto& [tag, rows] : j["images"].items()) {
    if (tag.rfind("samples/", 0) != 0) continue;
    ++images;
    ASSERT_EQ(rows.size(), 2u) << tag;  // steps 2 and 4
    EXPECT_EQ(rows[0]["step"].get<int64_t>(), 2) << tag;
    EXPECT_EQ(rows[1]["step"].get<int64_t>(), 4) << tag;
    EXPECT_EQ(rows[0]["height"].get<int>(), 16 * 4) << tag;  // a 16-pixel frame, 4x
    EXPECT_EQ(rows[0]["width"].get<int>(), 6 * 16 * 4) << tag;  // 6 frames side by side
  }
  EXPECT_EQ(images, 8);  // 4 held-out (colour, direction) pairs x 2 shapes
  EXPECT_EQ(j["scalars"]["demo/held_out_adherence"].size(), 2u);
  int buckets = 0;
  for (const auto& [tag, rows] : j["scalars"].items()) buckets += tag.rfind("train/loss_by_bucket/", 0) == 0;
  EXPECT_GE(buckets, 1) << j["scalars"].dump().substr(0, 400);
  EXPECT_TRUE(j["scalars"].contains("memory/host_heap_gib"));
}

}  // namespace
}  // namespace vidit
