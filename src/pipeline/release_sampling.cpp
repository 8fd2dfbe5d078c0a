// A release's own sampling settings (see release_sampling.h).
#include "pipeline/release_sampling.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <toml++/toml.h>

#include "core/error.h"

namespace vidit {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

}  // namespace

ReleaseSampling release_sampling(const std::string& root, const ModelConfig& m, int64_t pixels) {
  ReleaseSampling r;
  const bool i2v = m.condition == FrameCondition::first_frame, flf = m.condition == FrameCondition::first_last_frame;
  r.model = std::string("Wan 2.1 ") + (flf ? "first-and-last-frame" : i2v ? "image-to-video" : "text-to-video");
  r.steps = i2v ? 40 : 50;
  r.shift = flf ? 16.0 : i2v && pixels <= 832 * 480 ? 3.0 : 5.0;
  // Wan 2.2 TI2V-5B: the Wan 2.2 VAE's 48 channels, or a diffusers release that asks for a timestep per token (model_index.json's expand_timesteps).
  bool expand = false;
  if (const fs::path index = fs::path(root) / "model_index.json"; fs::is_regular_file(index)) {
    std::ifstream in(index);
    const json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
    expand = j.is_object() && j.value("expand_timesteps", false) == true;
  }
  if (m.out_channels == 48 || expand) {
    r.model = std::string("Wan 2.2 TI2V-5B ") + (i2v ? "image" : "text") + "-to-video";
    r.steps = 50, r.shift = 5.0, r.cfg_scale = 5.0, r.fps = 24.0;
  }
  if (m.boundary > 0) {  // Wan 2.2 A14B: two experts
    r.model = std::string("Wan 2.2 ") + (i2v ? "image" : "text") + "-to-video A14B (two experts)";
    r.steps = 40;
    r.shift = i2v ? 5.0 : 12.0;
    r.cfg_scale = i2v ? 3.5 : 4.0;
    r.cfg_scale_2 = i2v ? 3.5 : 3.0;
  }
  const fs::path file = fs::path(root) / "scheduler" / "scheduler_config.json";
  if (!fs::is_regular_file(file)) return r;
  json c;
  try {
    std::ifstream in(file);
    c = json::parse(in);
  } catch (const json::exception& e) {
    fail("'", file.string(), "' is not valid JSON (", e.what(), "); repair it or sample with --set sample.solver and "
         "sample.shift");
  }
  const std::string cls = c.value("_class_name", std::string());
  const std::string prediction = c.value("prediction_type", std::string("flow_prediction"));
  if (cls == "UniPCMultistepScheduler") {
    VIDIT_CHECK(prediction == "flow_prediction", "'", file.string(), "': prediction_type \"", prediction, "\"; vidit "
                "samples flow-matching models (\"flow_prediction\", as Wan's releases ship)");
    r.solver = Solver::unipc;
    r.shift = c.value("flow_shift", 1.0);
  } else if (cls == "FlowMatchEulerDiscreteScheduler") {
    r.solver = Solver::euler;
    r.shift = c.value("shift", 1.0);
  } else {
    std::fprintf(stderr, "warning: '%s' names %s, which vidit does not run; sampling with %s's defaults (UniPC)\n",
                 file.string().c_str(), cls.empty() ? "no scheduler class" : cls.c_str(), r.model.c_str());
    return r;
  }
  VIDIT_CHECK(r.shift > 0, "'", file.string(), "': the shift ", r.shift, " must be > 0");
  r.scheduler = (fs::path("scheduler") / "scheduler_config.json").string();
  return r;
}

std::set<std::string> sample_keys_given(const std::string& config_path, const std::vector<std::string>& sets) {
  std::set<std::string> given;
  if (!config_path.empty()) {
    try {
      const toml::table t = toml::parse_file(config_path);
      if (const toml::table* s = t["sample"].as_table())
        for (const auto& [k, v] : *s) given.insert(std::string(k.str()));
    } catch (const toml::parse_error&) {
      // load_config has read this file already and names any error itself.
    }
  }
  for (const std::string& s : sets) {
    const auto eq = s.find('=');
    const std::string key = s.substr(0, eq);
    if (key.rfind("sample.", 0) == 0) given.insert(key.substr(7));
  }
  return given;
}

std::string apply_release_sampling(SampleConfig& s, const ReleaseSampling& r, const std::set<std::string>& given) {
  std::vector<std::string> scheduler, defaults, kept;
  auto take = [&](const char* key, auto& field, const auto& value, const std::string& shown, bool from_scheduler) {
    if (given.count(key)) {
      kept.push_back("sample." + std::string(key));
      return;
    }
    field = value;
    (from_scheduler ? scheduler : defaults).push_back(shown);
  };
  const bool sch = !r.scheduler.empty();
  take("solver", s.solver, r.solver, r.solver == Solver::unipc ? "UniPC" : "Euler", sch);
  take("shift", s.shift, r.shift, "shift " + number(r.shift), sch);
  take("steps", s.steps, r.steps, std::to_string(r.steps) + " steps", false);
  take("cfg_scale", s.cfg_scale, r.cfg_scale, "guidance " + number(r.cfg_scale), false);
  if (r.cfg_scale_2 > 0)
    take("cfg_scale_2", s.cfg_scale_2, r.cfg_scale_2, "low-noise guidance " + number(r.cfg_scale_2), false);
  take("fps", s.fps, r.fps, number(r.fps) + " fps", false);
  auto join = [](const std::vector<std::string>& v) {
    std::string out;
    for (const auto& x : v) out += (out.empty() ? "" : ", ") + x;
    return out;
  };
  std::ostringstream line;
  line << "[sample] " << r.model << ":";
  if (!scheduler.empty()) line << " " << join(scheduler) << " from the release's " << r.scheduler << ";";
  if (!defaults.empty()) line << " " << join(defaults) << " (Wan's defaults for it);";
  if (!kept.empty()) line << " " << join(kept) << " as configured;";
  std::string out = line.str();
  out.back() = '\n';
  return out;
}

}  // namespace vidit
