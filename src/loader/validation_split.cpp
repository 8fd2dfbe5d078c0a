#include "loader/validation_split.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace vidit {

namespace {

// Two independent hashes of a key: which side of the split it is on, and its place among the
// held-out clips.
uint64_t key_hash(const std::string& key, uint64_t seed) { return XXH64(key.data(), key.size(), seed); }
constexpr uint64_t kSplitSeed = 0x76616c2d73706c74ull;  // "val-splt"
constexpr uint64_t kOrderSeed = 0x76616c2d6f726472ull;  // "val-ordr"

}  // namespace

bool held_out(const std::string& key, double fraction) {
  if (fraction <= 0) return false;
  // The hash's top 53 bits as a number in [0, 1).
  const double u = double(key_hash(key, kSplitSeed) >> 11) * 0x1.0p-53;
  return u < fraction;
}

std::vector<int64_t> training_indices(const LatentCache& cache, const Config& cfg) {
  const double fraction = cfg.data.val_fraction;
  std::vector<int64_t> train;
  for (int64_t i = 0; i < cache.size(); ++i)
    if (!held_out(cache.entry(i).key, fraction)) train.push_back(i);
  if (fraction > 0) {
    VIDIT_CHECK(int64_t(train.size()) < cache.size(), "data.val_fraction = ", fraction, " holds out none of the ",
                cache.size(), " clips of latent cache '", cache.dir(), "'; raise it (a clip is held out with that "
                "probability), or prepare held-out videos into a cache of their own and set data.val_cache");
    VIDIT_CHECK(!train.empty(), "data.val_fraction = ", fraction, " holds out all ", cache.size(),
                " clips of latent cache '", cache.dir(), "' and leaves none to train on; lower it");
  }
  return train;
}

std::string ValidationSet::describe() const {
  return std::to_string(indices.size()) + " of " + std::to_string(held_out) + " held-out clips of " + cache->dir();
}

std::optional<ValidationSet> validation_set(const Config& cfg, std::shared_ptr<const LatentCache> train_cache) {
  const auto& d = cfg.data;
  if (cfg.train.val_every == 0 || (d.val_fraction == 0 && d.val_cache.empty())) return std::nullopt;
  ValidationSet set;
  std::vector<int64_t> held;
  if (!d.val_cache.empty()) {
    set.cache = std::make_shared<const LatentCache>(d.val_cache);
    VIDIT_CHECK(set.cache->size() > 0, "data.val_cache '", d.val_cache, "' holds no clips; run vidit prepare "
                "into it with the held-out videos' manifest, or unset data.val_cache");
    for (int64_t i = 0; i < set.cache->size(); ++i) held.push_back(i);
  } else {
    VIDIT_CHECK(train_cache != nullptr, "data.val_fraction needs the latent cache it holds clips out of");
    set.cache = std::move(train_cache);
    training_indices(*set.cache, cfg);  // the split's own checks: neither none nor all held out
    for (int64_t i = 0; i < set.cache->size(); ++i)
      if (held_out(set.cache->entry(i).key, d.val_fraction)) held.push_back(i);
  }
  set.held_out = int64_t(held.size());
  const LatentCache& c = *set.cache;
  std::sort(held.begin(), held.end(), [&](int64_t a, int64_t b) {
    const uint64_t ha = key_hash(c.entry(a).key, kOrderSeed), hb = key_hash(c.entry(b).key, kOrderSeed);
    return ha != hb ? ha < hb : c.entry(a).key < c.entry(b).key;
  });
  if (int64_t(held.size()) > cfg.train.val_samples) held.resize(size_t(cfg.train.val_samples));
  set.indices = std::move(held);
  return set;
}

}  // namespace vidit
