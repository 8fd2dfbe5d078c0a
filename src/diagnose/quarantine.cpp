#include "diagnose/quarantine.h"

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "core/storage.h"

namespace vidit {

std::string sample_key(const nlohmann::json& id) {
  if (!id.is_object()) return "";
  if (id.contains("key") && id.at("key").is_string()) return id.at("key").get<std::string>();
  if (id.contains("index") && id.at("index").is_number_integer()) return "index " + std::to_string(id.at("index").get<int64_t>());
  return "";
}

Quarantine::Quarantine(std::string out_dir, int64_t after)
    : path_(out_dir.empty() ? "" : out_dir + "/quarantine.json"), after_(after) {
  if (path_.empty() || !std::filesystem::exists(path_)) return;
  std::ifstream f(path_);
  const nlohmann::json j = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
  VIDIT_CHECK(j.is_object() && j.value("samples", nlohmann::json()).is_object(), "'", path_,
              "' is not a quarantine record (a JSON object with \"samples\"); fix or remove it");
  samples_ = j.at("samples");
  rollbacks_ = j.value("rollbacks", nlohmann::json::array());
  for (const auto& [key, s] : samples_.items())
    if (s.value("quarantined", false)) quarantined_.insert(key);
}

bool Quarantine::blame(const nlohmann::json& id, int64_t step, bool now) {
  const std::string key = sample_key(id);
  if (key.empty()) return false;
  nlohmann::json& s = samples_[key];
  if (!s.contains("id")) s = {{"id", id}, {"blamed_at", nlohmann::json::array()}, {"quarantined", false}};
  s["blamed_at"].push_back(step);
  if (quarantined_.count(key)) return false;
  if (!now && (after_ <= 0 || int64_t(s["blamed_at"].size()) < after_)) return false;
  s["quarantined"] = true;
  quarantined_.insert(key);
  return true;
}

void Quarantine::add_rollback(int64_t from_step, int64_t to_step) {
  rollbacks_.push_back({{"from", from_step}, {"to", to_step}});
}

void Quarantine::save() const {
  if (path_.empty()) return;
  const nlohmann::json j = {{"samples", samples_}, {"rollbacks", rollbacks_}};
  local_storage().write_atomic(path_, j.dump(2) + "\n");
}

}  // namespace vidit
