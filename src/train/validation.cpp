#include "train/validation.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <chrono>
#include <cstdio>

#include "core/error.h"
#include "core/precision.h"
#include "diffusion/flow_matching.h"
#include "diffusion/frame_condition.h"
#include "loader/cache_loader.h"

namespace vidit {

namespace {
constexpr uint64_t kNoiseSeed = 0x76616c2d6e6f6973ull;  // "val-nois"
}

Validator::Validator(const Config& cfg, ValidationSet set, at::Device device)
    : cfg_(cfg), set_(std::move(set)), device_(device) {
  const SigmaRange served = sigma_range(cfg.train.expert, cfg.model.boundary);
  for (double s : cfg.train.val_sigmas)
    if (s >= served.lo && s < served.hi) sigmas_.push_back(s);
  VIDIT_CHECK(!sigmas_.empty(), cfg.source, ": no noise level of train.val_sigmas lies in [", served.lo, ", ",
              served.hi, "), the range train.expert = \"", name_of(cfg.train.expert),
              "\" trains; give train.val_sigmas inside it");
  VIDIT_CHECK(!set_.indices.empty(), "the validation set of ", set_.cache->dir(), " holds no clips");
  // Every held-out clip fits the model, checked on every rank before the first validation (a
  // clip that failed in the forward on one rank would leave the others waiting in a collective).
  const auto& m = cfg.model;
  for (int64_t i : set_.indices) {
    const CacheIndexEntry& e = set_.cache->entry(i);
    VIDIT_CHECK(e.shape.size() == 4 && e.shape[0] == m.out_channels, "validation: clip '", e.key, "' of ",
                set_.cache->dir(), " has latent shape ", c10::IntArrayRef(e.shape), " but model.out_channels is ",
                m.out_channels, "; prepare the validation videos with the training cache's settings");
    for (size_t a = 0; a < 3; ++a)
      VIDIT_CHECK(e.shape[a + 1] % m.patch[a] == 0, "validation: clip '", e.key, "' of ", set_.cache->dir(),
                  " has latent shape ", c10::IntArrayRef(e.shape), " which model.patch does not divide");
    VIDIT_CHECK(!appends_condition(m) || e.cond, "validation: clip '", e.key, "' of ", set_.cache->dir(),
                " has no condition latent, but the model is image-to-video; prepare it with this config");
    VIDIT_CHECK(!appends_condition(m) || m.image_dim == 0 || (e.image_shape.size() == 2 && e.image_shape[1] == m.image_dim),
                "validation: clip '", e.key, "' of ", set_.cache->dir(), " has no CLIP features of width ", m.image_dim,
                "; prepare it with data.image_encoder set");
  }
}

bool Validator::due(int64_t step) const {
  const int64_t every = cfg_.train.val_every;
  return every > 0 && (step % every == 0 || step == cfg_.train.steps);
}

ValidationMetrics Validator::run(DiT& model, const Mesh& mesh, int64_t step) const {
  const auto t0 = std::chrono::steady_clock::now();
  const auto& dp = mesh.group("dp");
  const int64_t rank = dp->rank(), ranks = dp->size();
  const LatentCache& cache = *set_.cache;
  const int64_t N = int64_t(set_.indices.size()), S = int64_t(sigmas_.size());
  // Each clip's losses in its own row; `read` counts the clips that loaded (1 in their row).
  at::Tensor table = at::zeros({N, S + 1}, at::kDouble);
  double* cell = table.data_ptr<double>();
  const auto& m = cfg_.model;
  for (int64_t round = 0; round * ranks < N; ++round) {
    const int64_t j = round * ranks + rank;
    const bool mine = j < N;
    const int64_t index = set_.indices[size_t(mine ? j : 0)];  // the stand-in: the first clip, discarded
    const CacheIndexEntry& e = cache.entry(index);
    MicroBatch b = read_cache_batch(cache, {index}, m, [&](const std::string& what) {
      std::fprintf(stderr, "[val] leaving out clip %s: %s\n", e.key.c_str(), what.c_str());
    });
    const bool ok = b.latents.size(0) == 1;
    if (!ok) {  // a forward of the clip's shape all the same, so every rank makes the same passes
      b.latents = at::zeros({1, e.shape[0], e.shape[1], e.shape[2], e.shape[3]});
      b.texts = at::zeros({1, m.text_len, m.text_dim});
      if (appends_condition(m)) b.condition = at::zeros({1, e.shape[0] + 4, e.shape[1], e.shape[2], e.shape[3]});
      if (appends_condition(m) && m.image_dim > 0)
        b.image = at::zeros({1, m.image_pos_tokens > 0 ? m.image_pos_tokens : 1, m.image_dim});
    }
    const at::Tensor x0 = b.latents.to(at::kFloat).to(device_);
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(XXH64(e.key.data(), e.key.size(), kNoiseSeed));
    const at::Tensor noise = at::randn(b.latents.sizes(), gen, at::kFloat).to(device_);
    const at::Tensor text = b.texts.to(at::kFloat).to(device_);
    const at::Tensor cond = b.condition.defined() ? b.condition.to(at::kFloat).to(device_) : at::Tensor();
    const at::Tensor image = b.image.defined() ? b.image.to(at::kFloat).to(device_) : at::Tensor();
    for (int64_t s = 0; s < S; ++s) {
      FlowSample fs = make_flow_sample(x0, noise, at::full({1}, sigmas_[size_t(s)], at::kFloat).to(device_));
      if (fuses_first_frame(m) && x0.size(2) > 1) {  // Wan 2.2 TI2V: as train_step.cpp conditions it
        fs.x_t = keep_first_frame(fs.x_t, x0.narrow(2, 0, 1));
        fs.timestep = first_frame_timesteps(fs.timestep, x0.sizes(), m.patch);
      }
      at::Tensor pred;
      {
        AutocastGuard autocast(cfg_.train.precision, device_.type());
        pred = model->forward(with_frame_condition(fs.x_t, cond), fs.timestep, text, image);
      }
      const double loss = flow_loss(loss_frames(pred, m), loss_frames(fs.target, m)).item<double>();
      if (mine && ok) cell[j * (S + 1) + s] = loss;
    }
    if (mine && ok) cell[j * (S + 1) + S] = 1;
  }
  dp->all_reduce(table, ReduceOp::Sum)->wait();

  ValidationMetrics v;
  v.step = step;
  std::vector<double> band(size_t(S), 0);
  std::map<std::string, std::pair<double, int64_t>> bucket;
  double total = 0;
  for (int64_t j = 0; j < N; ++j) {
    if (cell[j * (S + 1) + S] == 0) continue;
    ++v.clips;
    double clip = 0;
    for (int64_t s = 0; s < S; ++s) band[size_t(s)] += cell[j * (S + 1) + s], clip += cell[j * (S + 1) + s];
    total += clip;
    auto& b = bucket[cache.entry(set_.indices[size_t(j)]).bucket];
    b.first += clip, b.second += S;
  }
  v.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (v.clips == 0) return v;  // none could be read: the caller reports it, training goes on
  v.loss = total / double(v.clips * S);
  for (int64_t s = 0; s < S; ++s) v.by_sigma.emplace_back(sigmas_[size_t(s)], band[size_t(s)] / double(v.clips));
  for (const auto& [name, sum] : bucket) v.by_bucket[name] = sum.first / double(sum.second);
  return v;
}

}  // namespace vidit
