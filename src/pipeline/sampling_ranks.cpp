#include "pipeline/sampling_ranks.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <sstream>

#include "core/error.h"

namespace vidit {

namespace {

int64_t degree_product(const ParallelConfig& p) { return p.replicate * p.shard * p.ring * p.ulysses * p.tensor; }

}  // namespace

SamplingLayout sampling_layout(const Config& cfg, int64_t tokens, int world) {
  SamplingLayout out;
  out.parallel = cfg.parallel;
  const bool guidance = cfg.sample.cfg_scale != 1.0;
  const int64_t given = degree_product(cfg.parallel);
  if (world == 1) {  // one process: whatever a training config says, nothing to split
    out.parallel.replicate = out.parallel.shard = out.parallel.ring = out.parallel.ulysses = out.parallel.tensor = 1;
    return out;
  }
  if (given > 1) {
    if (given == world) return out;
    VIDIT_CHECK(guidance && cfg.sample.cfg_parallel && 2 * given == world, cfg.source,
                ": sampling on ", world, " ranks: parallel.replicate x shard x ring x ulysses x tensor = ", given,
                " must be the number of ranks", guidance && cfg.sample.cfg_parallel ? " or half of it (guidance on "
                "two halves, sample.cfg_parallel)" : "", "; set the degrees for ", world, " ranks, or leave them "
                "all 1 and the tokens are split over the ranks");
    out.halves = true;
    return out;
  }
  out.halves = guidance && cfg.sample.cfg_parallel && world % 2 == 0;
  const int64_t n = out.halves ? world / 2 : world;
  VIDIT_CHECK(tokens % n == 0, cfg.source, ": sampling on ", world, " ranks splits a sample's ", tokens,
              " tokens over ", n, " rank", n == 1 ? "" : "s", out.halves ? " (each half of the guidance)" : "",
              " and ", tokens, " is not a multiple of ", n, "; launch a number of ranks whose ",
              out.halves ? "half " : "", "divides the tokens, change --size / --frames, or set parallel.* "
              "yourself (e.g. parallel.shard = ", n, " shards the weights and keeps every token on every rank)");
  int64_t u = n;  // Ulysses as far as the heads allow, the rest of the ranks a ring
  while (cfg.model.heads % u != 0) --u;
  while (n % u != 0) --u;
  out.parallel.ulysses = u;
  out.parallel.ring = n / u;
  return out;
}

std::string SamplingRanks::describe() const {
  std::ostringstream s;
  s << size() << " rank" << (size() == 1 ? "" : "s");
  if (size() == 1) return s.str();
  if (halves) s << ": guidance on two halves of " << size() / 2 << "; each half:";
  else s << ":";
  const ParallelConfig& p = mesh_config.parallel;
  bool any = false;
  auto add = [&](const char* name, int64_t d) {
    if (d > 1) s << " " << name << " " << d, any = true;
  };
  add("shard", p.shard), add("replicate", p.replicate), add("tensor", p.tensor), add("ulysses", p.ulysses),
      add("ring", p.ring);
  if (!any) s << " one rank";
  return s.str();
}

SamplingRanks make_sampling_ranks(const Config& cfg, const std::vector<int64_t>& latent, std::shared_ptr<Comm> world) {
  VIDIT_CHECK(latent.size() == 5, "sampling ranks: the latent shape must be [1, C, T, H, W]");
  SamplingRanks r;
  r.world = world;
  r.mesh_config = cfg;
  Config& mc = r.mesh_config;
  mc.data.latent_frames = latent[2], mc.data.latent_height = latent[3], mc.data.latent_width = latent[4];
  const SamplingLayout layout = sampling_layout(cfg, tokens_per_sample(mc), world->size());
  mc.parallel = layout.parallel;
  mc.train.batch_size = mc.parallel.replicate * mc.parallel.shard;  // one sample on every data-parallel member
  r.halves = layout.halves;
  std::shared_ptr<Comm> half = world;
  if (r.halves) {
    const int h = world->size() / 2;
    r.branch = world->rank() < h ? 0 : 1;
    half = world->split(r.branch, world->rank());
    r.pair = world->split(world->rank() % h, world->rank());
  }
  r.mesh = std::make_shared<Mesh>(mc, half);
  return r;
}

at::Tensor combine_guidance(const SamplingRanks& ranks, const at::Tensor& v, double cfg_scale) {
  VIDIT_CHECK(ranks.halves && ranks.pair, "combine_guidance: guidance is not on two halves");
  at::Tensor mine = v.to(at::kFloat).contiguous();
  std::vector<int64_t> sizes = mine.sizes().vec();
  sizes[0] *= 2;
  at::Tensor both = at::empty(sizes, mine.options());
  ranks.pair->all_gather(mine, both)->wait();
  auto h = both.chunk(2, 0);  // the prompt's, then the negative prompt's
  return h[1] + cfg_scale * (h[0] - h[1]);
}

at::Tensor broadcast_any(Comm& comm, const at::Tensor& t, int root, at::Device device) {
  constexpr int64_t kMaxDims = 8;
  at::Tensor meta = at::zeros({2 + kMaxDims}, at::kLong);
  if (comm.rank() == root) {
    VIDIT_CHECK(t.defined() && t.dim() <= kMaxDims, "broadcast_any: the root's tensor must be defined, at most ",
                kMaxDims, " dims");
    meta[0] = int64_t(t.scalar_type());
    meta[1] = t.dim();
    for (int64_t d = 0; d < t.dim(); ++d) meta[2 + d] = t.size(d);
  }
  comm.broadcast(meta, root)->wait();
  const auto dtype = at::ScalarType(meta[0].item<int64_t>());
  std::vector<int64_t> sizes;
  for (int64_t d = 0; d < meta[1].item<int64_t>(); ++d) sizes.push_back(meta[2 + d].item<int64_t>());
  at::Tensor out = comm.rank() == root ? t.to(device).contiguous() : at::empty(sizes, at::TensorOptions(device).dtype(dtype));
  comm.broadcast(out, root)->wait();
  return out;
}

TileShare tile_share(const SamplingRanks& ranks, at::Device device) {
  TileShare s;
  s.index = ranks.rank();
  s.count = ranks.size();
  std::shared_ptr<Comm> world = ranks.world;
  s.share = [world, device](size_t, int owner, const at::Tensor& output) {
    return broadcast_any(*world, output, owner, device);
  };
  return s;
}

void check_ranks_agree(Comm& world, const std::vector<uint64_t>& fingerprints, const std::vector<std::string>& names) {
  VIDIT_CHECK(fingerprints.size() == names.size(), "check_ranks_agree: one name per fingerprint");
  const int64_t k = int64_t(fingerprints.size());
  at::Tensor mine = at::empty({k}, at::kLong);
  for (int64_t i = 0; i < k; ++i) mine[i] = int64_t(fingerprints[size_t(i)]);
  at::Tensor all = at::empty({world.size() * k}, at::kLong);
  world.all_gather(mine, all)->wait();
  auto a = all.view({world.size(), k});
  for (int r = 1; r < world.size(); ++r)
    for (int64_t i = 0; i < k; ++i)
      VIDIT_CHECK(a[r][i].item<int64_t>() == a[0][i].item<int64_t>(), "rank ", r, " of the sampling job has other ",
                  names[size_t(i)], " than rank 0: every rank must be started with the same config, prompts and "
                  "weights (the same files, or identical copies). Nothing was sampled");
}

uint64_t fingerprint(const std::string& text) { return XXH3_64bits(text.data(), text.size()); }

uint64_t weights_fingerprint(const TensorMap& weights) {
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  for (const auto& [name, t] : weights) {  // a std::map: the same order everywhere
    XXH3_64bits_update(state, name.data(), name.size());
    const int64_t dtype = int64_t(t.scalar_type());
    XXH3_64bits_update(state, &dtype, sizeof dtype);
    for (int64_t s : t.sizes()) XXH3_64bits_update(state, &s, sizeof s);
    if (t.numel() == 0) continue;
    // 16 values spread over the tensor, first and last included, as fp64.
    const int64_t n = t.numel(), picks = std::min<int64_t>(16, n);
    at::Tensor idx = at::linspace(0, double(n - 1), picks, at::kDouble).round().to(at::kLong);
    at::Tensor v = t.reshape({-1}).index_select(0, idx.to(t.device())).to(at::kCPU, at::kDouble).contiguous();
    XXH3_64bits_update(state, v.data_ptr(), size_t(v.numel()) * sizeof(double));
  }
  const uint64_t h = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return h;
}

}  // namespace vidit
