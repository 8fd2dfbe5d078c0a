#include "loader/cache_loader.h"

#include <cstdio>

#include "core/error.h"
#include "diffusion/frame_condition.h"
#include "loader/validation_split.h"

namespace vidit {

CacheLoader::CacheLoader(std::shared_ptr<const LatentCache> cache, const Config& cfg, int rank, int world, bool pin,
                         std::optional<CostModel> costs)
    : cache_(std::move(cache)), cfg_(cfg), pin_(pin) {
  const auto& m = cfg_.model;
  std::map<std::string, int> bucket_index;
  std::vector<int> bucket_of;
  std::vector<int64_t> tokens;
  members_ = training_indices(*cache_, cfg_);
  for (int64_t i : members_) {
    const CacheIndexEntry& e = cache_->entry(i);
    VIDIT_CHECK(e.shape[0] == m.out_channels, "latent cache '", cache_->dir(), "': sample '", e.key, "' has ",
                e.shape[0], " latent channels but model.out_channels is ", m.out_channels,
                "; the cache was made with another codec: re-run vidit prepare or fix the config");
    // Image-to-video trains on what prepare stored per clip (prepare/frame_encoder.h): a cache
    // made for text-to-video has nothing to condition on.
    if (appends_condition(m)) {
      VIDIT_CHECK(e.cond, "latent cache '", cache_->dir(), "': sample '", e.key, "' has no condition latent, but "
                  "model.condition = \"", name_of(m.condition), "\": the cache was "
                  "prepared for text-to-video. Run vidit prepare with this config (model.condition set) into another "
                  "data.cache_dir");
      VIDIT_CHECK(m.image_dim == 0 || (e.image_shape.size() == 2 && e.image_shape[1] == m.image_dim), "latent cache '",
                  cache_->dir(), "': sample '", e.key, "' has ",
                  e.image_shape.empty() ? std::string("no CLIP image features")
                                        : "image features " + c10::str(c10::IntArrayRef(e.image_shape)),
                  " but model.image_dim = ", m.image_dim, ": prepare it with data.image_encoder set to the model's CLIP "
                  "image encoder");
    }
    for (int a = 0; a < 3; ++a)
      VIDIT_CHECK(e.shape[size_t(a) + 1] % m.patch[size_t(a)] == 0, "latent cache '", cache_->dir(), "': sample '",
                  e.key, "' (bucket ", e.bucket, ") has latent shape ", c10::IntArrayRef(e.shape),
                  " which model.patch does not divide; choose buckets.multiple / frames to fit the patch");
    auto [it, fresh] = bucket_index.emplace(e.bucket, int(tokens.size()));
    if (fresh) {
      tokens.push_back((e.shape[1] / m.patch[0]) * (e.shape[2] / m.patch[1]) * (e.shape[3] / m.patch[2]));
      bucket_names_.push_back(e.bucket);
    }
    bucket_of.push_back(it->second);
  }
  budget_ = cfg_.data.token_budget > 0 ? cfg_.data.token_budget : cfg_.train.batch_size * tokens_per_sample(cfg_);
  std::vector<double> cost(tokens.begin(), tokens.end());
  double budget = double(budget_);
  if (cfg_.data.balance == Balance::cost) {
    // The budget: the predicted cost of budget_ tokens made of samples of the reference shape.
    const CostModel model = costs ? *costs : cost_model_for(cfg_);
    cost_unit_ = model.unit;
    const int64_t ref = tokens_per_sample(cfg_);
    VIDIT_CHECK(ref > 0, "data.balance = \"cost\": the reference shape data.latent_frames/height/width (",
                cfg_.data.latent_frames, "x", cfg_.data.latent_height, "x", cfg_.data.latent_width,
                ") holds no whole model.patch; set it to a bucket's latent shape");
    std::vector<int64_t> samples(tokens.size(), 0);
    for (int b : bucket_of) ++samples[size_t(b)];
    for (size_t b = 0; b < tokens.size(); ++b) cost[b] = model.cost(tokens[b]);
    balanced_ = balanced_budget(cost, samples, double(budget_) / double(ref) * model.cost(ref));
    budget = balanced_.budget;
  }
  sampler_ = std::make_unique<BucketBatchSampler>(bucket_of, cost, budget, cfg_.train.seed, rank, world);
  handed_ = sampler_->state();
  start();
}

CacheLoader::~CacheLoader() { stop(); }

std::string CacheLoader::plan() const {
  std::string s;
  char buf[512];
  if (cfg_.data.balance == Balance::cost)
    std::snprintf(buf, sizeof buf,
                  "balance cost: batches of %.4g %s predicted (the budget: %lld tokens of %lldx%lldx%lld latents; "
                  "full batches %.0f%% of the costliest on average, %.0f%% at the full budget);",
                  balanced_.budget, cost_unit_.c_str(), (long long)budget_, (long long)cfg_.data.latent_frames,
                  (long long)cfg_.data.latent_height, (long long)cfg_.data.latent_width, 100 * balanced_.efficiency,
                  100 * balanced_.efficiency_unbalanced);
  else
    std::snprintf(buf, sizeof buf, "balance tokens: %lld tokens per batch;", (long long)budget_);
  s = buf;
  for (size_t b = 0; b < bucket_names_.size(); ++b)
    s += " " + bucket_names_[b] + " x" + std::to_string(sampler_->batch_size_of_bucket(int(b)));
  return s;
}

void CacheLoader::start() {
  stopping_ = false;
  for (int64_t t = 0; t < cfg_.data.loader_threads; ++t) threads_.emplace_back([this] { work(); });
}

void CacheLoader::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
  threads_.clear();
}

void CacheLoader::work() {
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || next_seq_ - want_seq_ < cfg_.data.prefetch; });
      if (stopping_) return;
      job.seq = next_seq_++;
      job.indices = sampler_->next();
      for (int64_t& i : job.indices) i = members_[size_t(i)];
      after_[job.seq] = sampler_->state();
    }
    MicroBatch b = assemble(job);
    {
      std::lock_guard<std::mutex> lock(mu_);
      ready_[job.seq] = std::move(b);
    }
    cv_.notify_all();
  }
}

MicroBatch read_cache_batch(const LatentCache& cache, const std::vector<int64_t>& indices, const ModelConfig& m,
                            const std::function<void(const std::string&)>& skipped) {
  std::vector<at::Tensor> lat, spread, txt, cond, image;
  std::vector<std::string> ids;
  for (int64_t i : indices) {
    try {
      LatentCache::Loaded s = cache.load(i, /*verify=*/true);
      at::Tensor t = s.text.to(at::kFloat);
      VIDIT_CHECK(t.dim() == 2 && t.size(1) == m.text_dim && t.size(0) <= m.text_len, "sample '", cache.entry(i).key,
                  "': text embedding of shape ", t.sizes(), " does not fit [", m.text_len, ", ", m.text_dim, "]");
      if (t.size(0) < m.text_len) t = at::cat({t, at::zeros({m.text_len - t.size(0), m.text_dim})});
      lat.push_back(s.mean);
      spread.push_back(s.std);
      txt.push_back(t);
      if (appends_condition(m)) cond.push_back(s.cond.to(at::kFloat));
      if (appends_condition(m) && m.image_dim > 0) image.push_back(s.image.to(at::kFloat));
      const CacheIndexEntry& e = cache.entry(i);
      nlohmann::json id = {{"key", e.key}, {"bucket", e.bucket}};
      for (const char* k : {"source", "start", "end"})
        if (e.meta.is_object() && e.meta.contains(k)) id[k] = e.meta[k];
      ids.push_back(id.dump());
    } catch (const Error& e) {
      skipped(e.what());
    }
  }
  if (lat.empty()) {
    const auto& sh = indices.empty() ? std::vector<int64_t>{m.out_channels, 1, 1, 1} : cache.entry(indices[0]).shape;
    at::Tensor empty = at::zeros({0, sh[0], sh[1], sh[2], sh[3]});
    MicroBatch none;
    none.latents = none.latent_std = empty, none.texts = at::zeros({0, m.text_len, m.text_dim});
    if (appends_condition(m)) none.condition = at::zeros({0, sh[0] + 4, sh[1], sh[2], sh[3]});
    if (appends_condition(m) && m.image_dim > 0) none.image = at::zeros({0, 1, m.image_dim});
    return none;
  }
  MicroBatch b;
  b.latents = at::stack(lat), b.latent_std = at::stack(spread), b.texts = at::stack(txt);
  b.ids = std::move(ids);
  if (!cond.empty()) {  // the mask of the given frames, the same for every clip of the bucket
    const at::Tensor c = at::stack(cond);
    const int64_t frames = 4 * (c.size(2) - 1) + 1;
    b.condition = frame_condition(
        frame_condition_mask(frames, c.size(3), c.size(4), m.condition == FrameCondition::first_last_frame), c);
  }
  if (!image.empty()) b.image = at::stack(image);
  return b;
}

MicroBatch CacheLoader::assemble(const Job& job) {
  MicroBatch b = read_cache_batch(*cache_, job.indices, cfg_.model, [this](const std::string& what) {
    std::fprintf(stderr, "[loader] skipping a sample: %s\n", what.c_str());
    std::lock_guard<std::mutex> lock(mu_);
    skipped_.push_back(what);
  });
  if (!pin_ || b.latents.size(0) == 0) return b;
  b.latents = b.latents.pin_memory(), b.latent_std = b.latent_std.pin_memory(), b.texts = b.texts.pin_memory();
  if (b.condition.defined()) b.condition = b.condition.pin_memory();
  if (b.image.defined()) b.image = b.image.pin_memory();
  return b;
}

MicroBatch CacheLoader::next(int64_t) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return ready_.count(want_seq_) > 0; });
  MicroBatch b = std::move(ready_[want_seq_]);
  ready_.erase(want_seq_);
  handed_ = after_[want_seq_];
  after_.erase(want_seq_);
  ++want_seq_;
  lock.unlock();
  cv_.notify_all();
  return skip_.empty() ? b : without_skipped(std::move(b));
}

MicroBatch CacheLoader::without_skipped(MicroBatch b) const {
  std::vector<int64_t> keep;
  std::vector<std::string> ids;
  for (size_t i = 0; i < b.ids.size(); ++i) {
    const nlohmann::json id = nlohmann::json::parse(b.ids[i], nullptr, /*allow_exceptions=*/false);
    const std::string key = id.is_object() ? id.value("key", "") : "";
    if (skip_.count(key)) {
      std::fprintf(stderr, "[loader] skipping quarantined sample %s (%s)\n", key.c_str(), id.value("source", "").c_str());
      continue;
    }
    keep.push_back(int64_t(i));
    ids.push_back(b.ids[i]);
  }
  if (keep.size() == b.ids.size()) return b;
  const at::Tensor idx = at::tensor(keep, at::kLong);
  auto rows = [&](const at::Tensor& t) {
    at::Tensor r = t.index_select(0, idx);
    return pin_ && r.numel() > 0 ? r.pin_memory() : r;
  };
  b.latents = rows(b.latents), b.latent_std = rows(b.latent_std), b.texts = rows(b.texts);
  if (b.condition.defined()) b.condition = rows(b.condition);
  if (b.image.defined()) b.image = rows(b.image);
  b.ids = std::move(ids);
  return b;
}

SamplerState CacheLoader::state() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {handed_.seed, handed_.epoch, handed_.consumed};
}

void CacheLoader::set_state(const SamplerState& s) {
  stop();
  ready_.clear();
  after_.clear();
  next_seq_ = want_seq_ = 0;
  sampler_->set_state({s.seed, s.epoch, s.position});
  handed_ = sampler_->state();
  start();
}

std::vector<std::string> CacheLoader::skipped() const {
  std::lock_guard<std::mutex> lock(mu_);
  return skipped_;
}

}  // namespace vidit
