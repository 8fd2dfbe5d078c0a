// Build, parallelize, then allocate (ParallelModel::init_parts), in real processes under mpirun:
// a model built without storage and parallelized (FSDP, tensor parallel, both) gives each rank
// only its part, initialised to exactly the values a one-process init_weights(seed) gives; no
// rank allocates more than its part plus one whole tensor's worth (the fp64 buffer a part is
// computed in) on the way, and nothing is sent.
#include <gtest/gtest.h>

#include "../../tests/test_util.h"
#include "core/host_peak.h"
#include "core/unallocated.h"
#include "model/state_dict.h"
#include "parallel/counting_comm.h"
#include "../../tests/mpi_test_util.h"
#include "parallel/parallelize.h"
#include "parallel/plan.h"

namespace vidit {
namespace {

// Every layout's part, computed alone, is that part of the whole init (one process).
TEST(InitParts, EveryCutsRegionIsThatPartOfTheWholeInit) {
  Config c = test::tiny_config({"model.dim=48", "model.ffn_dim=96", "model.heads=4"});
  DiT whole = dit_without_storage(c.model, at::kCPU);
  whole->init_weights(3);
  for (const auto& [name, w] : state_dict(*whole)) {
    for (const ParallelConfig& p : {ParallelConfig{.shard = 3}, ParallelConfig{.tensor = 2},
                                    ParallelConfig{.shard = 5, .tensor = 2}}) {
      const Layout l = planned_layouts({{name, w}}, p).at(name);
      std::vector<int> degrees;
      for (const Cut& cut : l.cuts) degrees.push_back(cut.degree);
      for (int a = 0; a < (degrees.empty() ? 1 : degrees[0]); ++a)
        for (int b = 0; b < (degrees.size() < 2 ? 1 : degrees[1]); ++b) {
          std::vector<int> coords;
          if (!degrees.empty()) coords.push_back(a);
          if (degrees.size() > 1) coords.push_back(b);
          const at::Tensor want = cut_part(l, w, coords);
          at::Tensor got = at::empty(want.sizes(), at::kFloat);
          fill_initial(got, wan_init_rule(name, w.sizes(), c.model), 3, name, part_region(l, coords));
          EXPECT_TRUE(at::equal(got, want)) << name << " part " << a << "," << b;
        }
    }
  }
}

TEST(MpiWorker, ModelBuiltWithoutStorageHoldsOnlyItsParts) {
  VIDIT_MPI_WORKER_ONLY();
  auto world = make_world_comm(detect_launch_env());
  const int n = world->size();
  Config cfg = test::tiny_config(test::sets_from_env(
      "VIDIT_PARTS_SETS", {"model.dim=256", "model.ffn_dim=1024", "model.heads=4", "model.layers=4", "model.text_dim=64",
                           "train.batch_size=4"}));
  auto counting = std::make_shared<CountingComm>(world);
  auto mesh = std::make_shared<Mesh>(cfg, counting);

  HostPeak peak;
  std::unique_ptr<ParallelModel> pm = parallelize(dit_without_storage(cfg.model, at::kCPU), mesh, cfg);
  pm->init_parts(11);
  const int64_t built = peak.peak();
  for (const auto& [what, bytes] : counting->counts()) ADD_FAILURE() << "building the model sent " << bytes << " bytes by " << what;

  // The one-process init, for reference (after the measurement).
  DiT one = dit_without_storage(cfg.model, at::kCPU);
  one->init_weights(11);
  const TensorMap want = state_dict(*one);
  int64_t whole_bytes = 0, largest = 0, held = 0;
  for (const auto& [name, t] : want) whole_bytes += t.nbytes(), largest = std::max<int64_t>(largest, t.nbytes());
  for (const auto& [name, t] : pm->params()) held += t.nbytes();
  for (const auto& item : pm->model()->named_parameters())
    if (!pm->params().count(item.key())) EXPECT_TRUE(is_unallocated(item.value())) << item.key() << " holds memory";

  const TensorMap got = pm->whole(pm->params());
  for (const auto& [name, t] : want) EXPECT_TRUE(at::equal(got.at(name), t)) << name;
  // What the plan says a rank keeps (its parts, FSDP's padding included), and under FSDP over
  // every rank no more than 1/n of the whole (tensor parallel alone keeps the unsplit
  // parameters, norms and embeddings, whole).
  EXPECT_EQ(double(held), plan_step(cfg).weights) << "rank " << world->rank();
  if (cfg.parallel.shard == n) EXPECT_LE(held, whole_bytes / n + 64 * 1024) << "rank " << world->rank();
  // Its parts, and the fp64 buffer a part is computed in (at most twice the largest fp32 tensor).
  EXPECT_LE(built, held + 2 * largest) << "rank " << world->rank() << " allocated " << built << " bytes to build "
                                   << held << " of its part (the whole model: " << whole_bytes << ")";
  std::printf("rank %d: holds %lld of %lld bytes; building allocated %lld at most (largest tensor %lld)\n",
              world->rank(), (long long)held, (long long)whole_bytes, (long long)built, (long long)largest);
  world->barrier();
  if (HasFailure()) abort_world(1);
}

class InitPartsMesh : public ::testing::TestWithParam<test::WorkerMesh> {};

TEST_P(InitPartsMesh, EachRankHoldsAndInitialisesOnlyItsPart) {
  VIDIT_REQUIRE_MPI();
  test::run_mesh_worker(GetParam(), "MpiWorker.ModelBuiltWithoutStorageHoldsOnlyItsParts", "VIDIT_PARTS_SETS");
}

INSTANTIATE_TEST_SUITE_P(Meshes, InitPartsMesh,
                         ::testing::Values(test::WorkerMesh{"Fsdp4", 4, "parallel.shard=4"},
                                           test::WorkerMesh{"Tensor2", 2, "parallel.tensor=2"},
                                           test::WorkerMesh{"TensorFsdp", 4, "parallel.tensor=2 parallel.shard=2"}),
                         test::mesh_test_name);

}  // namespace
}  // namespace vidit
