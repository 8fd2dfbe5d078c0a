#include "diagnose/doctor.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "diagnose/events.h"
#include "diagnose/forensics.h"
#include "diagnose/profile.h"

namespace vidit {
namespace fs = std::filesystem;

namespace {

std::vector<nlohmann::json> read_jsonl(const fs::path& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object()) out.push_back(std::move(j));
  }
  return out;
}

std::string fmt(const char* f, double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, x);
  return buf;
}

}  // namespace

std::string doctor_report(const std::string& run_dir) {
  const fs::path dir(run_dir);
  const auto events = read_events(run_dir);
  const auto metrics = read_jsonl(dir / "metrics.jsonl");
  const auto saves = read_jsonl(dir / "saves.jsonl");
  VIDIT_CHECK(!events.empty() || !metrics.empty(), "'", run_dir,
              "' holds no events.jsonl or metrics.jsonl: give the train.out_dir of a run");
  std::ostringstream out;
  out << "run " << run_dir << "\n";
  // Attempts: every start and resume, where it ran, and how each attempt ended.
  std::map<std::string, std::map<std::string, int>> suspects;  // host -> what -> times
  int attempts = 0;
  for (const auto& e : events) {
    const std::string kind = e.at("event");
    const int64_t step = e.value("step", int64_t(0));
    if (kind == "started" || kind == "resumed") {
      ++attempts;
      out << "  " << e.value("time", "") << "  " << (kind == "started" ? "started at step 0" : "resumed at step " + std::to_string(step))
          << " (attempt " << e.value("attempt", 0) << ", " << e.value("world", 1) << " ranks on "
          << e.value("hosts", nlohmann::json::array()).size() << " host(s), " << e.value("launcher", "") << ")\n";
    } else if (kind == "stopped") {
      out << "  " << e.value("time", "") << "  stopped by signal " << e.value("signal", 0) << " after step " << step
          << " (saved; exit 75)\n";
    } else if (kind == "finished") {
      out << "  " << e.value("time", "") << "  finished at step " << step << ", final loss "
          << fmt("%.6g", e.value("final_loss", 0.0)) << "\n";
    } else if (kind == "skipped_update") {
      out << "  step " << step << ": update skipped (" << e.value("why", "") << ", " << e.value("in_a_row", 0)
          << " in a row)\n";
    } else if (kind == "spike") {
      out << "  step " << step << ": spike in the " << e.value("why", "") << " (loss z " << fmt("%.1f", e.value("loss_z", 0.0))
          << ", gradient z " << fmt("%.1f", e.value("grad_z", 0.0)) << "); blamed: "
          << describe_blamed(nlohmann::json{{"blamed", e.value("blamed", nlohmann::json::array())}});
      const std::string cause = e.value("cause", "unknown");
      if (cause == "data") out << "; reproduced on re-run: the data";
      if (cause == "device") {
        out << "; did not reproduce on re-run: the device of " << e.value("not_reproduced_on", nlohmann::json::array()).dump();
        for (const auto& r : e.value("not_reproduced_on", nlohmann::json::array())) {
          const std::string who = r.get<std::string>();
          const size_t open = who.find('('), close = who.rfind(')');
          if (open != std::string::npos && close > open) ++suspects[who.substr(open + 1, close - open - 1)]["device error"];
        }
      }
      const auto q = e.value("quarantined", nlohmann::json::array());
      if (!q.empty()) out << "; quarantined " << q.dump();
      out << "; " << e.value("forensics", "") << "\n";
    } else if (kind == "crashed") {
      out << "  step " << step << ": the attempt before lost rank " << e.value("rank", -1) << " (" << e.value("host", "")
          << ") without a word while " << e.value("phase", "") << " after step " << e.value("at_step", int64_t(0)) << "\n";
      ++suspects[e.value("host", "")]["lost rank"];
    } else if (kind == "excluded") {
      out << "  step " << step << ": host " << e.value("host", "") << " added to the exclude list (" << e.value("why", "")
          << ")\n";
    } else if (kind == "rollback") {
      out << "  step " << step << ": rolled back to step " << e.value("to", int64_t(0)) << " (rollback "
          << e.value("rollbacks", 0) << ", learning rate x " << fmt("%.3g", e.value("lr_scale", 1.0)) << ")\n";
    } else if (kind == "replicas_diverged") {
      out << "  step " << step << ": replicas' weights disagree (silent data corruption); suspect rank(s)";
      for (const auto& g : e.value("groups", nlohmann::json::array()))
        for (const auto& r : g.at("ranks"))
          for (const auto& s : g.at("suspects"))
            if (s == r.at("rank")) {
              out << " " << r.at("rank").get<int>() << " (" << r.value("host", "") << ")";
              ++suspects[r.value("host", "")]["silent data corruption"];
            }
      out << "\n";
    } else if (kind == "straggler") {
      out << "  step " << step << ": straggler rank " << e.value("rank", -1) << " (" << e.value("host", "")
          << "), score " << fmt("%.2f", e.value("score", 0.0)) << " (" << fmt("%.3f", e.value("busy_s", 0.0))
          << " s against a median of " << fmt("%.3f", e.value("median_busy_s", 0.0)) << " s)\n";
      ++suspects[e.value("host", "")]["straggler"];
    } else if (kind == "straggler_recovered") {
      out << "  step " << step << ": rank " << e.value("rank", -1) << " (" << e.value("host", "") << ") back to speed\n";
    } else if (kind == "slow_group") {
      out << "  step " << step << ": slow " << e.value("group", "") << " group (ranks";
      for (const auto& r : e.value("ranks", nlohmann::json::array())) out << " " << r.get<int>();
      out << " on";
      for (const auto& h : e.value("hosts", nlohmann::json::array())) out << " " << h.get<std::string>();
      out << "): blocked " << fmt("%.3f", e.value("wait_s", 0.0)) << " s in " << e.value("op", "") << " against "
          << fmt("%.3f", e.value("others_wait_s", 0.0)) << " s for the others"
          << (e.value("straggler", false) ? " (it has a straggler)" : "") << "\n";
      for (const auto& h : e.value("hosts", nlohmann::json::array())) ++suspects[h.get<std::string>()]["slow link"];
    } else if (kind == "save_failed") {
      out << "  step " << step << ": checkpoint not saved, rank " << e.value("rank", -1) << " (" << e.value("host", "")
          << "): " << e.value("error", "") << "\n";
      ++suspects[e.value("host", "")]["failed save"];
    }
  }
  if (attempts > 1) out << "attempts: " << attempts << " (" << attempts - 1 << " restart(s))\n";
  // metrics.jsonl holds logged steps and validation lines ("val_loss"); the steps are these.
  std::vector<nlohmann::json> steps;
  for (const auto& m : metrics)
    if (m.contains("loss")) steps.push_back(m);
  if (!steps.empty()) {
    const auto& last = steps.back();
    std::vector<double> secs;
    for (const auto& m : steps) secs.push_back(m.value("step_time_s", 0.0));
    std::sort(secs.begin(), secs.end());
    out << "steps: " << last.value("step", int64_t(0)) << " logged; last loss " << fmt("%.6g", last.value("loss", 0.0))
        << "; median step " << fmt("%.3f", secs[secs.size() / 2]) << " s\n";
  }
  for (auto m = metrics.rbegin(); m != metrics.rend(); ++m)
    if (m->contains("val_loss")) {
      out << "validation: loss " << fmt("%.6g", m->value("val_loss", 0.0)) << " at step " << m->value("step", int64_t(0))
          << " over " << m->value("val_clips", int64_t(0)) << " held-out clips\n";
      break;
    }
  if (!saves.empty()) {
    double pause = 0, write = 0;
    for (const auto& s : saves) pause = std::max(pause, s.value("blocked_s", 0.0)), write = std::max(write, s.value("write_s", 0.0));
    out << "saves: " << saves.size() << " committed, newest step " << saves.back().value("step", int64_t(0))
        << "; longest training pause " << fmt("%.3f", pause) << " s, longest write " << fmt("%.2f", write) << " s\n";
  }
  // Profiles (train.profile_steps): where each rank's time went.
  if (fs::is_directory(dir / "profile")) {
    std::vector<fs::path> summaries;
    for (const auto& f : fs::directory_iterator(dir / "profile"))
      if (f.path().filename().string().rfind("summary_rank", 0) == 0) summaries.push_back(f.path());
    std::sort(summaries.begin(), summaries.end());
    for (const auto& path : summaries) {
      try {
        std::ifstream in(path);
        const nlohmann::json j = nlohmann::json::parse(in);
        ProfileSummary s;
        s.window_s = j.value("window_s", 0.0);
        s.host_s = j.value("host_s", std::map<std::string, double>{});
        s.device_s = j.value("device_s", std::map<std::string, double>{});
        const std::string rank = path.stem().string().substr(std::string("summary_rank").size());
        out << "profile of steps " << j.value("first_step", int64_t(0)) << "-" << j.value("last_step", int64_t(0))
            << ", rank " << rank << " (" << fmt("%.3f", s.window_s) << " s): host " << s.format(false);
        if (s.has_device()) out << "; GPU " << s.format(true);
        out << "\n";
      } catch (const std::exception& e) {
        out << "profile summary " << path.string() << " unreadable: " << e.what() << "\n";
      }
    }
  }
  if (suspects.empty()) {
    out << "hosts: none stands out\n";
  } else {
    out << "hosts worth a look (vidit health; srun --exclude):\n";
    for (const auto& [host, what] : suspects) {
      out << "  " << host << ":";
      for (const auto& [w, n] : what) out << " " << w << " x" << n;
      out << "\n";
    }
  }
  return out.str();
}

}  // namespace vidit
