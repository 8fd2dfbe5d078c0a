// Samples kept out of training, and the run's rollbacks: <out_dir>/quarantine.json, kept across
// restarts (a restarted run reads it before its first batch).
//
// A spike whose re-run reproduced it (train_step.cpp: the data's fault, not the device's)
// blames its samples (diagnose/forensics.h). A sample blamed `after` times is quarantined: the
// loader skips it from then on (loader/batch_source.h, BatchSource::skip). A rollback
// (train.spike_action = "rollback") quarantines the samples it blames at once, since replaying
// the steps from the checkpoint would meet them again, and is counted here, so that
// train.max_rollbacks and the learning-rate back-off hold across restarts.
//
// Samples are named by their key (sample_key): the cache key of a cached sample, "index N" for
// a dataset's sample N. Every rank keeps the same record (each learns of every blame from the
// same gathered report); rank 0 writes the file.
#pragma once
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace vidit {

// The key of a sample from its id (MicroBatch::ids): "" when the id names none.
std::string sample_key(const nlohmann::json& id);

class Quarantine {
 public:
  // Reads <out_dir>/quarantine.json when it exists (out_dir "": in memory only). `after`:
  // blames before a sample is quarantined (0: never, except by a rollback).
  Quarantine(std::string out_dir, int64_t after);
  // A reproduced spike at `step` blamed the sample `id`; `now` quarantines it at once. Returns
  // true when this made it quarantined.
  bool blame(const nlohmann::json& id, int64_t step, bool now);
  bool contains(const std::string& key) const { return quarantined_.count(key) > 0; }
  const std::set<std::string>& quarantined() const { return quarantined_; }
  // Rollbacks so far, in this run and the attempts before it.
  int64_t rollbacks() const { return int64_t(rollbacks_.size()); }
  void add_rollback(int64_t from_step, int64_t to_step);
  // Writes the file (atomically); only rank 0 calls it.
  void save() const;

 private:
  std::string path_;
  int64_t after_;
  nlohmann::json samples_ = nlohmann::json::object();  // key -> {"id", "blamed_at": [steps], "quarantined"}
  std::set<std::string> quarantined_;
  nlohmann::json rollbacks_ = nlohmann::json::array();  // {"from", "to"}
};

}  // namespace vidit
