// The ranks of a sampling job (`vidit sample` under mpirun, torchrun or srun) and what each does.
// One process is the same code with one rank.
//
//  - Guidance on two halves (sample.cfg_parallel, with sample.cfg_scale != 1 and an even number
//    of ranks N): ranks [0, N/2) evaluate the DiT on the prompt, ranks [N/2, N) on the negative
//    prompt. After each model call the pair {r, r + N/2} exchange their velocities (one all-gather
//    of the latent's size) and both combine them as one process does (diffusion/sampler.h
//    guided_velocity), so every rank walks the same trajectory.
//  - Inside a half (or over every rank without halves) the DiT is parallelized as in training
//    (parallel/parallelize.h) on a mesh of that half: parallel.* when the config sets them (their
//    product the half's size, or N without halves), else every rank of the half splits the
//    tokens: Ulysses as far as the heads and tokens allow, ring attention for the rest.
//    parallel.shard shards the weights as FSDP does in training (a block gathered at a time),
//    parallel.tensor splits the heads and MLP units. Every rank of a half computes the whole
//    velocity (sequence parallel gathers the head's output), so the halves stay in step.
//  - Text: rank 0 runs umT5 and broadcasts the two contexts; no other rank loads it.
//  - Decode: a tiled decode shares its tiles among all ranks (vae/tiling.h TileShare: each tile
//    decoded by one rank and broadcast, blended everywhere in one process's order); an untiled
//    one runs on rank 0 alone. Rank 0 writes the video.
//  - Agreement: before any work the ranks compare fingerprints of the config, the request and the
//    transformer weights (check_ranks_agree); a rank that differs is named and nothing runs.
#pragma once
#include <ATen/ATen.h>

#include <memory>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/safetensors.h"
#include "parallel/comm.h"
#include "parallel/mesh.h"
#include "vae/tiling.h"

namespace vidit {

// How N ranks share a sample of `tokens` DiT tokens: whether guidance runs on two halves, and the
// parallel.* degrees of the DiT's mesh (the half's, or all ranks'). Not collective. Throws
// vidit::Error naming the keys when the config's degrees cannot fit N ranks or the tokens.
struct SamplingLayout {
  bool halves = false;
  ParallelConfig parallel;
};
SamplingLayout sampling_layout(const Config& cfg, int64_t tokens, int world);

struct SamplingRanks {
  std::shared_ptr<Comm> world;
  bool halves = false;
  int branch = 0;              // halves: 0 the prompt's, 1 the negative prompt's
  std::shared_ptr<Comm> pair;  // halves: {r, r + N/2}, the prompt's member first
  std::shared_ptr<const Mesh> mesh;  // the DiT's mesh: this rank's half, or every rank
  Config mesh_config;                // the config it was made from (degrees, the request's latent size)

  int rank() const { return world->rank(); }
  int size() const { return world->size(); }
  bool lead() const { return world->rank() == 0; }
  // "4 ranks: guidance on two halves of 2; each half: ulysses 2" (for the log).
  std::string describe() const;
};

// Decides the layout for the request's latent [1, C, T, H, W] and makes the groups. Collective
// over `world`.
SamplingRanks make_sampling_ranks(const Config& cfg, const std::vector<int64_t>& latent,
                                  std::shared_ptr<Comm> world);

// The guided velocity from this rank's branch `v` (the prompt's or the negative prompt's): the
// pair's two velocities gathered and combined as guided_velocity does. Collective over the pair.
at::Tensor combine_guidance(const SamplingRanks& ranks, const at::Tensor& v, double cfg_scale);

// `t` of `root` on every member, whatever its shape and dtype (the others pass an undefined
// tensor), on `device`. Collective.
at::Tensor broadcast_any(Comm& comm, const at::Tensor& t, int root, at::Device device);

// The VAE's tiles shared among every rank of the job (decoded on `device`).
TileShare tile_share(const SamplingRanks& ranks, at::Device device);

// Each rank's fingerprints against rank 0's, in order; throws vidit::Error on every rank, naming
// the first rank that differs and `names[i]` of what differs. Collective.
void check_ranks_agree(Comm& world, const std::vector<uint64_t>& fingerprints, const std::vector<std::string>& names);

// Fingerprints: of text, and of weights (names, shapes, dtypes and a few values of each tensor,
// spread over it: a mapped file is read a page or so per tensor).
uint64_t fingerprint(const std::string& text);
uint64_t weights_fingerprint(const TensorMap& weights);

}  // namespace vidit
