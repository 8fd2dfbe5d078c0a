#include "prepare/progress_board.h"

#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/safetensors.h"

namespace vidit {
namespace fs = std::filesystem;

std::string worker_name(int w) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "w%03d", w);
  return buf;
}

ProgressBoard::ProgressBoard(Progress& p, const std::string& cache_dir, int worker, int workers, int64_t all_entries)
    : progress_(p), dir_(cache_dir + "/progress"), worker_(worker), workers_(workers), all_entries_(all_entries) {
  if (workers_ <= 1) return;
  fs::create_directories(dir_);
  if (worker_ == 0) progress_.set_note([this](const ProgressSnapshot& mine) { return totals(mine); });
}

void ProgressBoard::update(bool now) {
  if (workers_ <= 1 || (!now && progress_.elapsed() - last_ < kEverySeconds)) return;
  last_ = progress_.elapsed();
  const std::string mine = dir_ + "/" + worker_name(worker_) + ".json";
  try {
    write_file_atomic(mine, nlohmann::json{{"worker", worker_}, {"workers", workers_}, {"finished", now},
                                           {"progress", progress_.snapshot().to_json()}}.dump());
    if (!since_) since_ = fs::last_write_time(mine) - std::chrono::seconds(60);
  } catch (const std::exception& e) {
    // Only the display of the totals depends on these files: say so once and go on.
    if (!warned_) std::fprintf(stderr, "warning: cannot write the progress file %s (%s)\n", mine.c_str(), e.what());
    warned_ = true;
  }
  if (worker_ == 0 && since_) read_others();
}

void ProgressBoard::read_others() {
  others_.clear();
  not_heard_ = 0;
  for (int w = 0; w < workers_; ++w) {
    if (w == worker_) continue;
    const std::string path = dir_ + "/" + worker_name(w) + ".json";
    std::error_code ec;
    const auto when = fs::last_write_time(path, ec);
    if (ec || when < *since_) {
      ++not_heard_;
      continue;
    }
    try {
      std::ifstream in(path);
      others_.push_back(ProgressSnapshot::from_json(nlohmann::json::parse(in).at("progress")));
    } catch (const std::exception&) {
      ++not_heard_;  // damaged (the file is replaced whole, never seen half written): next time
    }
  }
}

std::string ProgressBoard::totals(const ProgressSnapshot& mine) const {
  std::vector<ProgressSnapshot> parts = others_;
  parts.push_back(mine);
  ProgressSnapshot all = sum_progress(parts);
  all.total = all_entries_;
  std::string out = "all " + std::to_string(workers_) + " workers: " + std::to_string(all.done) + "/" +
                    std::to_string(all.total) + " videos";
  if (all.total > 0) out += " " + std::to_string(all.done * 100 / all.total) + "%";
  out += ", clips " + std::to_string(all.counter("clips"));
  int64_t rejected = 0;
  for (const auto& [name, n] : all.counters)
    if (name.rfind("rejected/", 0) == 0) rejected += n;
  out += ", rejected " + std::to_string(rejected);
  if (all.rate > 0) {
    char buf[48];
    std::snprintf(buf, sizeof buf, all.rate >= 1 ? ", %.2f videos/s" : ", %.1f s/video", all.rate >= 1 ? all.rate : 1 / all.rate);
    out += buf;
  }
  const double left = all.seconds_left();
  if (left >= 0) out += ", " + short_duration(left) + " left";
  if (not_heard_) out += " (" + std::to_string(not_heard_) + " not heard from)";
  return out;
}

}  // namespace vidit
