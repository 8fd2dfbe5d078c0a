#include "parallel/mesh.h"

#include <sstream>

#include "core/error.h"
#include "parallel/timed_comm.h"

namespace vidit {
namespace {

std::array<int, 5> degrees_of(const ParallelConfig& p) {
  return {int(p.replicate), int(p.shard), int(p.ring), int(p.ulysses), int(p.tensor)};
}

// Which mesh dimensions (indices into kMeshDims) a group spans.
std::vector<int> dims_of(const std::string& name) {
  if (name == "dp") return {0, 1};
  if (name == "sp") return {2, 3};
  if (name == "dpsp") return {0, 1, 2, 3};
  for (int d = 0; d < 5; ++d)
    if (name == kMeshDims[d]) return {d};
  return {};
}

}  // namespace

void validate_mesh(const Config& cfg, int world) {
  const auto& p = cfg.parallel;
  const std::string& f = cfg.source;
  const int64_t product = p.replicate * p.shard * p.tensor * p.ulysses * p.ring;
  if (product != world) {
    std::ostringstream fix;
    const int64_t rest = p.shard * p.tensor * p.ulysses * p.ring;
    if (world % rest == 0)
      fix << "set parallel.replicate = " << world / rest;
    else
      fix << "choose degrees whose product is " << world;
    fix << " (or launch " << product << " process" << (product == 1 ? "" : "es") << ")";
    fail(f, ": parallel.replicate x parallel.shard x parallel.tensor x parallel.ulysses x parallel.ring = ",
         p.replicate, " x ", p.shard, " x ", p.tensor, " x ", p.ulysses, " x ", p.ring, " = ", product,
         ", but the job has ", world, " process", world == 1 ? "" : "es", "; ", fix.str());
  }
  const int64_t heads_split = p.tensor * p.ulysses;
  VIDIT_CHECK(cfg.model.heads % heads_split == 0, f, ": model.heads (", cfg.model.heads,
              ") must be divisible by parallel.tensor x parallel.ulysses = ", p.tensor, " x ", p.ulysses, " = ",
              heads_split, ", which split the heads; lower parallel.tensor or parallel.ulysses, or change model.heads");
  VIDIT_CHECK(cfg.model.dim % p.tensor == 0 && cfg.model.ffn_dim % p.tensor == 0, f, ": model.dim (",
              cfg.model.dim, ") and model.ffn_dim (", cfg.model.ffn_dim, ") must be divisible by parallel.tensor (",
              p.tensor, "); choose a parallel.tensor that divides both");
  const int64_t dp = p.replicate * p.shard;
  VIDIT_CHECK(cfg.data.source == DataSource::cache || cfg.train.batch_size % dp == 0, f, ": train.batch_size (",
              cfg.train.batch_size, ") is the global batch and must be divisible by the data-parallel degree "
              "parallel.replicate x parallel.shard = ", p.replicate, " x ", p.shard, " = ", dp,
              "; e.g. set train.batch_size = ", (cfg.train.batch_size + dp - 1) / dp * dp);
  const int64_t seq_split = p.ulysses * p.ring, tokens = tokens_per_sample(cfg);
  VIDIT_CHECK(tokens % seq_split == 0, f, ": a sample has ", tokens,
              " tokens (data.latent_frames/latent_height/latent_width over model.patch) which must be divisible "
              "by parallel.ulysses x parallel.ring = ", p.ulysses, " x ", p.ring, " = ", seq_split,
              "; change the sequence-parallel degrees or the latent size");
}

Mesh::Mesh(const Config& cfg, std::shared_ptr<Comm> world) {
  auto timed = std::make_shared<TimedComm>(std::move(world));
  // NCCL stages CPU tensors through the current GPU, whose stream waits for them too.
  if (timed->backend() == "nccl") timed->set_engine_gpu(current_gpu());
  timed_ = timed.get();
  world_ = std::move(timed);
  validate_mesh(cfg, world_->size());
  degrees_ = degrees_of(cfg.parallel);
  int r = world_->rank();
  for (int d = 4; d >= 0; --d) coords_[d] = r % degrees_[d], r /= degrees_[d];
  // The same groups in the same order on every rank: split is collective.
  for (const char* name : kMeshGroups) {
    std::vector<int> dims = dims_of(name);
    int color = 0, key = 0;
    for (int d = 0; d < 5; ++d) {
      bool in_group = std::find(dims.begin(), dims.end(), d) != dims.end();
      if (in_group)
        key = key * degrees_[d] + coords_[d];
      else
        color = color * degrees_[d] + coords_[d];
    }
    groups_[name] = world_->split(color, key);
    static_cast<TimedComm&>(*groups_[name]).set_group(name);  // a split of a TimedComm is one
    instances_[name] = color;
  }
}

int Mesh::instance(const std::string& name) const {
  group(name);  // names the known groups when `name` is not one
  return instances_.at(name);
}

int Mesh::degree(const std::string& name) const { return group(name)->size(); }
int Mesh::coord(const std::string& name) const { return group(name)->rank(); }

const std::shared_ptr<Comm>& Mesh::group(const std::string& name) const {
  auto it = groups_.find(name);
  VIDIT_CHECK(it != groups_.end(), "mesh: no group '", name,
              "'; groups are replicate, shard, ring, ulysses, tensor, dp, sp, dpsp");
  return it->second;
}

}  // namespace vidit
