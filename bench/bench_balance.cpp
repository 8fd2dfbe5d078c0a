// Attention-cost balance against token balance, measured: how long the ranks of one step wait
// for the slowest.
//
// Writes a latent cache of three buckets (short, middle and long clips; the long one's attention
// outweighs its projections and MLP), then, for each of data.balance = "tokens", "cost" (the FLOP
// formula), "cost" refitted (fit_cost_model) to a first timing of the "tokens" plan's batches, and
// "cost" calibrated at the start as `vidit train` does (train/cost_calibration.h: its own timings
// of one batch per bucket, out of sample for the epoch timed here), builds one CacheLoader per
// rank of a --world-rank job, exactly as the ranks of that job would,
// and takes one epoch of batches (or --steps steps). Each distinct batch shape (bucket, samples)
// of the four plans is timed through the DiT's forward, the flow-matching loss and backward, in
// --repeats rounds over all shapes, keeping the fastest: on a shared machine the other processes'
// load then falls on every shape alike and drops out, which timing each batch once in step order
// would not do. A rank's time in a step is its batch's time. Per mode it prints the mean over
// steps of (max / mean - 1) of the ranks' times (how much longer the step takes than its average
// rank needs), the same figure predicted by the FLOP formula, the share of rank-time spent
// computing rather than waiting, and the epoch's compute time (the sum over steps of the slowest
// rank's time: every mode trains the same samples, so this compares throughput).
//   bench_balance [--world 4] [--steps 0 (one epoch)] [--repeats 15] [--threads 1] [--dir D] [--keep]
#include <CLI/CLI.hpp>
#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>

#include "core/config.h"
#include "loader/cache_loader.h"
#include "loader/cost_model.h"
#include "loader/latent_cache.h"
#include "model/dit.h"
#include "parallel/comm.h"
#include "train/cost_calibration.h"

using namespace vidit;
namespace fs = std::filesystem;

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// One training forward + backward of `model` on batch `b` (flow matching: x_t = (1 - s) x0 + s e,
// target e - x0); returns seconds.
double forward_backward(DiT& model, const MicroBatch& b) {
  const int64_t n = b.latents.size(0);
  if (n == 0) return 0;
  model->zero_grad();
  const double t0 = now();
  const at::Tensor x0 = b.latents.to(at::kFloat) + b.latent_std.to(at::kFloat) * at::randn(b.latents.sizes());
  const at::Tensor noise = at::randn_like(x0), sigma = at::rand({n});
  const at::Tensor s = sigma.view({n, 1, 1, 1, 1});
  const at::Tensor out = model->forward((1 - s) * x0 + s * noise, sigma * 1000, b.texts);
  at::mse_loss(out, noise - x0).backward();
  return now() - t0;
}

using Shape = std::pair<std::string, int64_t>;  // (bucket, samples)

Shape shape_of(const MicroBatch& b) {
  if (b.latents.size(0) == 0) return {"", 0};
  return {nlohmann::json::parse(b.ids[0])["bucket"].get<std::string>(), b.latents.size(0)};
}

int64_t tokens_of(const MicroBatch& b) {  // per sample, under patch (1, 2, 2)
  return b.latents.size(2) * (b.latents.size(3) / 2) * (b.latents.size(4) / 2);
}

struct Plan {
  std::string mode, line;
  std::vector<std::vector<MicroBatch>> steps;  // [step][rank]
};

struct Result {
  double measured = 0, predicted = 0;  // mean over steps of max / mean - 1
  double seconds = 0, busy = 0;        // sum over steps of the slowest rank's time; busy share
  int64_t samples = 0;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"cost-balanced against token-balanced batches: per-rank compute imbalance"};
  std::string dir = "/tmp/vidit_bench_balance";
  int world = 4, steps = 0, repeats = 15, threads = 1;
  bool keep = false;
  app.add_option("--dir", dir, "where the latent cache is written (removed at the end)");
  app.add_option("--world", world, "data-parallel ranks");
  app.add_option("--steps", steps, "steps timed per mode; 0 = one epoch");
  app.add_option("--repeats", repeats, "rounds over the batch shapes; the fastest time of each counts");
  app.add_option("--threads", threads, "intra-op threads");
  app.add_flag("--keep", keep, "keep the latent cache (e.g. to train on it with `vidit train`)");
  CLI11_PARSE(app, argc, argv);
  at::set_num_threads(threads);
  at::manual_seed(0);

  // Latents [16, T, H, W] under patch (1, 2, 2): 32, 256 and 1152 tokens per sample.
  struct Bucket { const char* name; int64_t t, h, w, count; };
  const Bucket buckets[] = {{"short-2x8x8", 2, 8, 8, 1920}, {"middle-4x16x16", 4, 16, 16, 240},
                            {"long-8x24x24", 8, 24, 24, 80}};
  const int64_t text_len = 16, text_dim = 64;
  fs::remove_all(dir);
  {
    CacheWriter w(dir, 0, 64 << 20);
    int64_t i = 0;
    for (const Bucket& b : buckets)
      for (int64_t k = 0; k < b.count; ++k, ++i) {
        CacheSample s;
        s.key = cache_key("clip" + std::to_string(i), -1, -1);
        s.mean = at::randn({16, b.t, b.h, b.w});
        s.std = at::rand({16, b.t, b.h, b.w}) * 0.1;
        s.text = at::randn({text_len, text_dim});
        s.bucket = b.name;
        w.add(s);
      }
  }
  merge_cache_index(dir);
  auto cache = std::make_shared<LatentCache>(dir);

  // The budget: one long clip (the reference shape), 1152 tokens.
  const std::vector<std::string> sets = {
      "model.dim=128", "model.ffn_dim=512", "model.heads=2", "model.layers=2", "model.in_channels=16",
      "model.out_channels=16", "model.patch=[1, 2, 2]", "model.text_dim=64", "model.text_len=16",
      "data.source=\"cache\"", "data.cache_dir=\"" + dir + "\"", "data.latent_frames=8", "data.latent_height=24",
      "data.latent_width=24", "data.token_budget=1152", "data.loader_threads=1", "data.prefetch=2"};
  auto config = [&](const char* balance) {
    std::vector<std::string> s = sets;
    s.push_back(std::string("data.balance=\"") + balance + "\"");
    return parse_config("", "<bench>", s);
  };
  const Config tokens_cfg = config("tokens"), cost_cfg = config("cost");
  const CostModel formula = cost_model_for(cost_cfg);
  DiT model(cost_cfg.model);
  for (const Bucket& b : buckets) {  // warm-up: one batch of each shape
    MicroBatch mb;
    mb.latents = at::randn({2, 16, b.t, b.h, b.w}), mb.latent_std = at::zeros({2, 16, b.t, b.h, b.w});
    mb.texts = at::randn({2, text_len, text_dim});
    forward_backward(model, mb);
  }

  auto make_plan = [&](const std::string& mode, const Config& cfg, std::optional<CostModel> costs) {
    Plan plan;
    std::vector<std::unique_ptr<CacheLoader>> ranks;
    for (int r = 0; r < world; ++r) ranks.push_back(std::make_unique<CacheLoader>(cache, cfg, r, world, false, costs));
    plan.mode = mode, plan.line = ranks[0]->plan();
    while (steps > 0 ? int64_t(plan.steps.size()) < steps : ranks[0]->state().position < cache->size()) {
      plan.steps.emplace_back();
      for (auto& loader : ranks) plan.steps.back().push_back(loader->next());
    }
    return plan;
  };
  std::map<Shape, double> seconds;  // fastest forward + backward of each batch shape
  auto time_shapes = [&](const std::vector<const Plan*>& plans, int rounds) {
    seconds.clear();
    std::map<Shape, const MicroBatch*> todo;
    for (const Plan* p : plans)
      for (const auto& step : p->steps)
        for (const auto& b : step)
          if (b.latents.size(0) > 0) todo.emplace(shape_of(b), &b);
    for (int k = 0; k < rounds; ++k)
      for (const auto& [shape, b] : todo) {
        const double t = forward_backward(model, *b);
        seconds[shape] = k == 0 ? t : std::min(seconds[shape], t);
      }
    for (const auto& [shape, b] : todo)
      std::fprintf(stderr, "timed %-16s x%-3lld %8.4f s  %6.2f GFLOP/s (formula)\n", shape.first.c_str(),
                   (long long)shape.second, seconds[shape],
                   double(shape.second) * formula.cost(tokens_of(*b)) / seconds[shape] / 1e9);
  };
  auto evaluate = [&](const Plan& plan) {
    Result res;
    for (const auto& step : plan.steps) {
      std::vector<double> secs, flops;
      for (const MicroBatch& b : step) {
        const int64_t n = b.latents.size(0);
        secs.push_back(n == 0 ? 0 : seconds.at(shape_of(b)));
        flops.push_back(n == 0 ? 0 : double(n) * formula.cost(tokens_of(b)));
        res.samples += n;
      }
      auto imbalance = [&](const std::vector<double>& v) {
        double most = 0, sum = 0;
        for (double x : v) most = std::max(most, x), sum += x;
        return sum > 0 ? most / (sum / double(v.size())) - 1 : 0;
      };
      res.measured += imbalance(secs), res.predicted += imbalance(flops);
      std::fprintf(stderr, "[%s] step %3zu: %5.1f%% (predicted %5.1f%%):", plan.mode.c_str(), size_t(&step - &plan.steps[0]),
                   100 * imbalance(secs), 100 * imbalance(flops));
      for (size_t r = 0; r < step.size(); ++r)
        std::fprintf(stderr, " %s x%lld %.4fs", shape_of(step[r]).first.c_str(), (long long)shape_of(step[r]).second,
                     secs[r]);
      std::fprintf(stderr, "\n");
      res.seconds += *std::max_element(secs.begin(), secs.end());
      for (double x : secs) res.busy += x;
    }
    res.measured /= double(plan.steps.size()), res.predicted /= double(plan.steps.size());
    res.busy /= double(world) * res.seconds;
    return res;
  };

  const Plan by_tokens = make_plan("tokens", tokens_cfg, std::nullopt);
  const Plan by_cost = make_plan("cost", cost_cfg, std::nullopt);
  time_shapes({&by_tokens}, repeats);  // for the refit
  std::vector<CostMeasurement> measured;  // the "tokens" plan's shapes: what the refit learns from
  std::set<Shape> once;
  for (const auto& step : by_tokens.steps)
    for (const auto& b : step)
      if (b.latents.size(0) > 0 && once.insert(shape_of(b)).second)
        measured.push_back({shape_of(b).first, tokens_of(b), b.latents.size(0), seconds.at(shape_of(b))});
  const CostModel refit = fit_cost_model(measured, formula);
  std::printf("%s", format_cost_checks(formula, compare_cost_model(formula, measured)).c_str());
  std::printf("%s", format_cost_checks(refit, compare_cost_model(refit, measured)).c_str());
  const Plan by_refit = make_plan("cost (refit)", cost_cfg, refit);
  // What a training run does: rank 0 measures one batch per bucket at the start of the run.
  const CostCalibration calibrated =
      calibrate_cost_model(cost_cfg, latent_buckets(*cache), at::kCPU, *make_single_comm(), dir + "/run");
  at::set_num_threads(threads);
  const Plan by_calibration = make_plan("cost (calibrated)", cost_cfg, calibrated.model);
  // Every plan's shapes timed together, in the same rounds: what all modes are judged by.
  time_shapes({&by_tokens, &by_cost, &by_refit, &by_calibration}, repeats);
  const std::vector<const Plan*> plans = {&by_tokens, &by_cost, &by_refit, &by_calibration};
  std::vector<Result> results;
  for (const Plan* p : plans) results.push_back(evaluate(*p));

  std::printf("\n%d ranks, %d intra-op thread(s), fastest of %d rounds per batch shape; imbalance = mean over steps "
              "of max/mean - 1 of the ranks' forward+backward seconds\n", world, threads, repeats);
  std::printf("%-17s %6s %8s %11s %11s %9s %10s %10s\n", "data.balance", "steps", "samples", "imbalance",
              "(predicted)", "busy", "compute s", "samples/s");
  for (size_t i = 0; i < plans.size(); ++i) {
    const Result& r = results[i];
    std::printf("%-17s %6zu %8lld %10.1f%% %10.1f%% %8.1f%% %10.3f %10.1f\n", plans[i]->mode.c_str(),
                plans[i]->steps.size(), (long long)r.samples, 100 * r.measured, 100 * r.predicted, 100 * r.busy,
                r.seconds, double(r.samples) / r.seconds);
  }
  for (const Plan* p : plans) std::printf("  %-17s %s\n", p->mode.c_str(), p->line.c_str());
  std::printf("calibration: %.2f s\n", calibrated.seconds);
  std::printf("{\"tokens\": %.4f, \"cost\": %.4f, \"cost_refit\": %.4f, \"cost_calibrated\": %.4f}\n",
              results[0].measured, results[1].measured, results[2].measured, results[3].measured);
  if (!keep) fs::remove_all(dir);
  return 0;
}
