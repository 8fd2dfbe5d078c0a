// The validation split: which clips of the latent cache never train and are evaluated instead
// (train/validation.h).
//
// data.val_fraction holds out a part of data.cache_dir by key: a clip is held out when a 64-bit
// hash of its key falls below that fraction of the hash range. Every rank, world size and
// restart computes the same split from the keys alone; a clip added to the cache later falls on
// its side without moving any other; a re-captioned clip keeps its key and its side. Or
// data.val_cache names a cache of its own (held-out videos prepared apart), and data.cache_dir
// trains whole.
//
// The clips evaluated are the held-out ones ordered by a second hash of the key, the first
// train.val_samples of them: a fixed set, spread over buckets and sources rather than the first
// of one folder.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/config.h"
#include "loader/latent_cache.h"

namespace vidit {

// Whether the clip `key` is held out at `fraction` (0: never).
bool held_out(const std::string& key, double fraction);

// The indices of `cache` that train: all but the held-out clips (data.val_fraction). Throws
// vidit::Error naming the cache and the key when the split would hold out none or all of them.
std::vector<int64_t> training_indices(const LatentCache& cache, const Config& cfg);

struct ValidationSet {
  std::shared_ptr<const LatentCache> cache;  // data.cache_dir's, or data.val_cache's
  std::vector<int64_t> indices;              // the clips evaluated (at most train.val_samples)
  int64_t held_out = 0;                      // clips held out in all
  std::string describe() const;              // one line: where from, how many
};

// The validation set the config names, or nullopt when there is none (neither data.val_fraction
// nor data.val_cache, or train.val_every = 0). `train_cache`: data.cache_dir's cache, opened.
std::optional<ValidationSet> validation_set(const Config& cfg, std::shared_ptr<const LatentCache> train_cache);

}  // namespace vidit
