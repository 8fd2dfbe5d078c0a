// Two ranks training on a cache made by `vidit prepare` from real clips, each with batches and a
// random stream of its own: stopped after 3 steps and resumed, the run ends with the weights of
// the uninterrupted one, bit for bit.
#include <gtest/gtest.h>

#include <string>

#include "../../tests/test_util.h"
#include "prepare/prepared_cache_test_util.h"
#include "video/video_test_util.h"
#include "../../tests/mpi_test_util.h"
#include "checkpoint/checkpoint.h"

namespace vidit {
namespace {

using prepare_test::PreparedCache;
using prepare_test::run;

// Two ranks training on the cache (each with batches of its own and a random stream of its
// own, for the latents' reparameterisation and the noise): stopped after 3 steps and resumed,
// the run ends with the weights of the uninterrupted one, bit for bit. Every rank's stream is in
// the checkpoint; were rank 1 resumed with rank 0's, its noise would differ.
TEST(Prepare, TwoRanksResumeTrainingOnTheCacheExactly) {
  SKIP_WITHOUT_DECODING();
  VIDIT_REQUIRE_MPI();
  PreparedCache p;
  ASSERT_EQ(run(p.vidit("prepare") + " > /dev/null 2>&1"), 0);
  const std::string sets = " --set parallel.replicate=2 train.steps=6 train.warmup_steps=1 train.out_dir=";
  const std::string whole = p.dir / "whole", parts = p.dir / "parts";
  auto a = test::mpirun(2, p.vidit("train") + sets + whole);
  ASSERT_EQ(a.status, 0) << a.output;
  auto b = test::mpirun(2, p.vidit("train --max-steps 3") + sets + parts);
  ASSERT_EQ(b.status, 0) << b.output;
  auto c = test::mpirun(2, p.vidit("train --resume") + sets + parts);
  ASSERT_EQ(c.status, 0) << c.output;
  const CheckpointState x = load_checkpoint(*latest_checkpoint(whole)), y = load_checkpoint(*latest_checkpoint(parts));
  EXPECT_EQ(x.step, 6);
  EXPECT_EQ(y.step, 6);
  EXPECT_EQ(y.optimizer.count("rng/train.dp1"), 1u);
  for (const auto& [name, t] : x.model) EXPECT_TRUE(at::equal(t, y.model.at(name))) << name;
}

}  // namespace
}  // namespace vidit
