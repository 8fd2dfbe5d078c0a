#include "train/cost_calibration.h"

#include <ATen/CPUGeneratorImpl.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>

#include "core/error.h"
#include "core/precision.h"
#include "core/safetensors.h"
#include "diffusion/flow_matching.h"
#include "model/dit.h"
#include "model/fp8.h"

namespace vidit {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr int kRounds = 3;                // timed rounds after the warm-up (fewest kept)
constexpr double kRoundsBudgetS = 120;    // the timed rounds are cut to fit in about this
constexpr int kFileVersion = 1;

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// One batch to time: `samples` samples of the latent shape of bucket `name` (the first bucket of
// its token count).
struct Batch {
  std::string name;
  std::vector<int64_t> shape;  // [C, T, H, W]
  int64_t tokens = 0, samples = 0;
};

// The batches to time: one per distinct token count (buckets of equal tokens cost alike: the
// fit sees tokens only), sized as the token budget sizes them.
std::vector<Batch> batches_of(const Config& cfg, const std::vector<LatentBucket>& buckets) {
  const auto& m = cfg.model;
  const int64_t budget =
      cfg.data.token_budget > 0 ? cfg.data.token_budget : cfg.train.batch_size * tokens_per_sample(cfg);
  std::vector<Batch> out;
  std::map<int64_t, size_t> seen;
  for (const LatentBucket& b : buckets) {
    VIDIT_CHECK(b.shape.size() == 4, "cost calibration: bucket '", b.name, "' has latent shape ",
                c10::IntArrayRef(b.shape), "; expected [C, T, H, W]");
    VIDIT_CHECK(b.shape[0] == m.in_channels, "cost calibration: bucket '", b.name, "' has ", b.shape[0],
                " latent channels but model.in_channels is ", m.in_channels);
    int64_t tokens = 1;
    for (size_t a = 0; a < 3; ++a) {
      VIDIT_CHECK(b.shape[a + 1] % m.patch[a] == 0 && b.shape[a + 1] >= m.patch[a], "cost calibration: bucket '",
                  b.name, "' has latent shape ", c10::IntArrayRef(b.shape),
                  " which model.patch does not divide; choose buckets.multiple / frames to fit the patch");
      tokens *= b.shape[a + 1] / m.patch[a];
    }
    if (!seen.emplace(tokens, out.size()).second) continue;
    out.push_back({b.name, b.shape, tokens, std::max<int64_t>(1, budget / tokens)});
  }
  return out;
}

// What the measurements depend on; a file made under another one is not reused.
json fingerprint(const Config& cfg, const std::vector<Batch>& batches, at::Device device) {
  const auto& m = cfg.model;
  json batch_list = json::array();
  for (const Batch& b : batches) batch_list.push_back({{"tokens", b.tokens}, {"samples", b.samples}});
  return {{"model",
           {{"dim", m.dim}, {"ffn_dim", m.ffn_dim}, {"heads", m.heads}, {"layers", m.layers},
            {"in_channels", m.in_channels}, {"out_channels", m.out_channels},
            {"patch", {m.patch[0], m.patch[1], m.patch[2]}}, {"text_dim", m.text_dim}, {"text_len", m.text_len},
            {"freq_dim", m.freq_dim}}},
          {"precision", name_of(cfg.train.precision)},
          {"device", c10::DeviceTypeName(device.type(), /*lower_case=*/true)},
          {"batches", batch_list}};
}

// Times forward + loss + backward of each batch on `device`: a warm-up round, then up to kRounds
// rounds over all batches (fewest seconds kept). Rounds rather than repeats of one batch: load
// from other processes then falls on every batch alike.
std::vector<CostMeasurement> measure(const Config& cfg, const std::vector<Batch>& batches, at::Device device,
                                     int* rounds_done) {
  // The global generator draws the weights; it is put back afterwards, so the calibration leaves
  // the process's random state as it found it. The inputs come from a generator of our own.
  at::Generator global = at::detail::getDefaultCPUGenerator();
  const at::Tensor global_state = global.get_state();
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(cfg.train.seed);
  DiT model(cfg.model);
  model->init_weights();
  model->to(device);
  apply_fp8(*model, cfg.train.precision, cfg.train.fp8_fast_accum);
  global.set_state(global_state);

  struct Inputs {
    at::Tensor x0, noise, sigma, text;
  };
  std::vector<Inputs> inputs;
  for (const Batch& b : batches) {
    std::vector<int64_t> shape = {b.samples};
    shape.insert(shape.end(), b.shape.begin(), b.shape.end());
    inputs.push_back({at::randn(shape, gen).to(device), at::randn(shape, gen).to(device),
                      at::rand({b.samples}, gen).to(device),
                      at::randn({b.samples, cfg.model.text_len, cfg.model.text_dim}, gen).to(device)});
  }
  auto sync = [&] {
    if (device.is_cuda()) at::empty({1}, at::TensorOptions().device(device)).cpu();  // waits for the stream
  };
  auto time_one = [&](const Inputs& in) {
    model->zero_grad();
    sync();
    const double t0 = now();
    const FlowSample fs = make_flow_sample(in.x0, in.noise, in.sigma);
    at::Tensor pred;
    {
      AutocastGuard autocast(cfg.train.precision, device.type());
      pred = model->forward(fs.x_t, fs.timestep, in.text);
    }
    flow_loss(pred, fs.target).backward();
    sync();
    return now() - t0;
  };
  std::vector<double> best(batches.size());
  double warmup = 0;
  for (size_t i = 0; i < batches.size(); ++i) warmup += time_one(inputs[i]);
  const int rounds = std::clamp(int(kRoundsBudgetS / std::max(warmup, 1e-9)), 1, kRounds);
  for (int r = 0; r < rounds; ++r)
    for (size_t i = 0; i < batches.size(); ++i) {
      const double t = time_one(inputs[i]);
      best[i] = r == 0 ? t : std::min(best[i], t);
    }
  *rounds_done = rounds;
  std::vector<CostMeasurement> out;
  for (size_t i = 0; i < batches.size(); ++i)
    out.push_back({batches[i].name, batches[i].tokens, batches[i].samples, best[i]});
  return out;
}

json to_json(const CostModel& m, const std::vector<CostMeasurement>& ms, const json& fp, double seconds) {
  json measurements = json::array();
  for (const CostMeasurement& x : ms)
    measurements.push_back({{"bucket", x.bucket}, {"tokens", x.tokens}, {"samples", x.samples}, {"seconds", x.seconds},
                            {"predicted_s", double(x.samples) * m.cost(x.tokens)}});
  return {{"version", kFileVersion},
          {"fixed", m.fixed},
          {"per_token", m.per_token},
          {"per_token_pair", m.per_token_pair},
          {"unit", m.unit},
          {"origin", m.origin},
          {"measured_tokens", m.measured_tokens},
          {"measurements", measurements},
          {"calibration_seconds", seconds},
          {"fingerprint", fp}};
}

// The model and measurements a cost_model.json holds, or nullopt with *why saying what is wrong.
std::optional<CostModel> read_file(const std::string& path, const json& want, std::vector<CostMeasurement>* ms,
                                   std::string* why) {
  std::ifstream in(path);
  if (!in) {
    *why = "cannot be read";
    return std::nullopt;
  }
  try {
    const json j = json::parse(in);
    if (j.at("version").get<int>() != kFileVersion) {
      *why = "has version " + j.at("version").dump() + ", not " + std::to_string(kFileVersion);
      return std::nullopt;
    }
    if (j.at("fingerprint") != want) {
      *why = "was made for another model, precision, device or set of buckets (" + j.at("fingerprint").dump() +
             "; this run: " + want.dump() + ")";
      return std::nullopt;
    }
    CostModel m;
    m.fixed = j.at("fixed").get<double>(), m.per_token = j.at("per_token").get<double>();
    m.per_token_pair = j.at("per_token_pair").get<double>();
    m.unit = j.at("unit").get<std::string>(), m.origin = j.at("origin").get<std::string>();
    m.measured_tokens = j.at("measured_tokens").get<std::set<int64_t>>();
    VIDIT_CHECK(m.unit == "s" || m.unit == "FLOP", "unit '", m.unit, "' is neither \"s\" nor \"FLOP\"");
    for (const json& x : j.at("measurements"))
      ms->push_back({x.at("bucket").get<std::string>(), x.at("tokens").get<int64_t>(), x.at("samples").get<int64_t>(),
                     x.at("seconds").get<double>()});
    return m;
  } catch (const std::exception& e) {
    *why = std::string("does not parse: ") + e.what();
    return std::nullopt;
  }
}

// Rank 0: the model read from `path`, or measured (and written there).
CostCalibration on_rank0(const Config& cfg, const std::vector<Batch>& batches, at::Device device,
                         const std::string& path) {
  CostCalibration c;
  c.path = path;
  const CostModel formula = cost_model_for(cfg);
  const json fp = fingerprint(cfg, batches, device);
  if (fs::exists(path)) {
    std::string why;
    if (auto m = read_file(path, fp, &c.measurements, &why)) {
      c.model = *m, c.reused = true;
      std::printf("cost model: reused %s (%s)\n", path.c_str(), c.model.origin.c_str());
      if (!c.measurements.empty())
        std::printf("%s", format_cost_checks(c.model, compare_cost_model(c.model, c.measurements)).c_str());
      return c;
    }
    std::fprintf(stderr, "warning: cost model file %s %s; measuring again and replacing it\n", path.c_str(),
                 why.c_str());
    c.measurements.clear();
  }
  const double t0 = now();
  int rounds = 0;
  try {
    c.measurements = measure(cfg, batches, device, &rounds);
    c.model = fit_cost_model(c.measurements, formula);
  } catch (const std::exception& e) {
    // The run goes on with the formula, and records it, so later attempts size batches alike.
    c.measurements.clear();
    c.model = formula;
    c.model.origin = "the FLOP formula (the calibration failed: " + std::string(e.what()) + ")";
    std::fprintf(stderr, "warning: cost calibration failed (%s); batches are sized by the FLOP formula. Delete %s to "
                         "measure again on the next attempt\n", e.what(), path.c_str());
  }
  c.seconds = now() - t0;
  fs::create_directories(fs::path(path).parent_path());
  write_file_atomic(path, to_json(c.model, c.measurements, fp, c.seconds).dump(2) + "\n");
  if (!c.measurements.empty()) {
    std::printf("cost model: measured %zu batch shape(s) on %s in %.2f s (warm-up + fastest of %d), written to %s\n",
                batches.size(), device.str().c_str(), c.seconds, rounds, path.c_str());
    std::printf("%s", format_cost_checks(c.model, compare_cost_model(c.model, c.measurements)).c_str());
  }
  return c;
}

}  // namespace

std::vector<LatentBucket> latent_buckets(const LatentCache& cache) {
  std::vector<LatentBucket> out;
  std::set<std::string> seen;
  for (int64_t i = 0; i < cache.size(); ++i) {
    const CacheIndexEntry& e = cache.entry(i);
    if (seen.insert(e.bucket).second) out.push_back({e.bucket, e.shape});
  }
  return out;
}

CostCalibration calibrate_cost_model(const Config& cfg, const std::vector<LatentBucket>& buckets, at::Device device,
                                     Comm& world, const std::string& out_dir) {
  VIDIT_CHECK(!buckets.empty(), "cost calibration: the latent cache has no buckets (no samples)");
  VIDIT_CHECK(!out_dir.empty(), "cost calibration: train.out_dir is empty; it holds cost_model.json");
  if (cfg.train.threads > 0) at::set_num_threads(int(cfg.train.threads));
  const std::vector<Batch> batches = batches_of(cfg, buckets);  // (every rank: the same checks)
  CostCalibration c;
  c.path = (fs::path(out_dir) / "cost_model.json").string();
  if (world.rank() == 0) c = on_rank0(cfg, batches, device, c.path);
  // The coefficients, the unit and the measured token counts to every rank, bit for bit.
  at::Tensor head = at::zeros({5}, at::kDouble);
  if (world.rank() == 0) {
    double* h = head.data_ptr<double>();
    h[0] = c.model.fixed, h[1] = c.model.per_token, h[2] = c.model.per_token_pair;
    h[3] = c.model.unit == "s" ? 1 : 0, h[4] = double(c.model.measured_tokens.size());
  }
  world.broadcast(head, 0)->wait();
  at::Tensor tokens = at::zeros({std::max<int64_t>(1, int64_t(head[4].item<double>()))}, at::kLong);
  if (world.rank() == 0) {
    int64_t k = 0;
    for (int64_t t : c.model.measured_tokens) tokens[k++] = t;
  }
  world.broadcast(tokens, 0)->wait();
  if (world.rank() != 0) {
    const double* h = head.data_ptr<double>();
    c.model.fixed = h[0], c.model.per_token = h[1], c.model.per_token_pair = h[2];
    c.model.unit = h[3] != 0 ? "s" : "FLOP";
    c.model.origin = "broadcast by rank 0 (" + c.path + ")";
    for (int64_t k = 0; k < int64_t(h[4]); ++k) c.model.measured_tokens.insert(tokens[k].item<int64_t>());
  }
  return c;
}

}  // namespace vidit
