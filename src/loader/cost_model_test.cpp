// The per-sample cost model: its coefficients equal model_info's FLOP accounting at any token
// count, a fit recovers known scales from measured times, a bucket it has not measured is
// predicted from the formula and flagged, the per-bucket check reports measured / predicted, and
// the cache loader sizes its batches by it under data.balance = "cost".
#include "loader/cost_model.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>

#include "../../tests/test_util.h"
#include "core/error.h"
#include "loader/cache_loader.h"
#include "loader/latent_cache.h"
#include "model/model_info.h"

namespace vidit {
namespace {

Config wan_13b(std::vector<std::string> extra = {}) {
  std::vector<std::string> sets = {"model.dim=1536",     "model.ffn_dim=8960",   "model.heads=12",
                                   "model.layers=30",    "model.text_dim=4096",  "model.text_len=512",
                                   "model.in_channels=16", "model.out_channels=16", "model.patch=[1, 2, 2]",
                                   "data.source=\"synthetic\""};
  sets.insert(sets.end(), extra.begin(), extra.end());
  return parse_config("", "<test>", sets);
}

TEST(CostModel, FromTheShapeEqualsModelInfoAtEveryTokenCount) {
  const Config base = wan_13b();
  const CostModel m = cost_model_for(base);
  EXPECT_EQ(m.unit, "FLOP");
  // Attention's scores and weighted sum: 4 L^2 d per layer forward, x3 for training.
  EXPECT_NEAR(m.per_token_pair, 3.0 * 30 * 4 * 1536, 1e-6 * m.per_token_pair);
  for (auto [t, h, w] : {std::tuple{21, 60, 104}, std::tuple{1, 2, 2}, std::tuple{5, 32, 32}}) {
    Config c = wan_13b({"data.latent_frames=" + std::to_string(t), "data.latent_height=" + std::to_string(h),
                        "data.latent_width=" + std::to_string(w)});
    const double want = model_info(c).train_flops;
    EXPECT_NEAR(m.cost(tokens_per_sample(c)), want, 1e-9 * want) << t << "x" << h << "x" << w;
  }
  // Cross-attention is linear in video tokens times text tokens: 4 L Lt d per layer forward.
  const CostModel longer_text = cost_model_for(wan_13b({"model.text_len=1024"}));
  EXPECT_NEAR(longer_text.per_token - m.per_token, 3.0 * 30 * 4 * 512 * 1536, 1e-6 * m.per_token);
  EXPECT_GT(longer_text.fixed, m.fixed);  // cross-attention's keys and values on the text
}

// Per-sample seconds from a known model, as a fit would see them.
std::vector<CostMeasurement> measure(const CostModel& truth, std::vector<int64_t> tokens) {
  std::vector<CostMeasurement> out;
  for (int64_t t : tokens)
    for (int64_t n : {1, 3}) out.push_back({"b" + std::to_string(t), t, n, double(n) * truth.cost(t)});
  return out;
}

TEST(CostModel, FitRecoversTheScalesOfEachTerm) {
  const CostModel formula = cost_model_for(wan_13b());
  CostModel truth = formula;
  truth.fixed *= 2e-15, truth.per_token *= 3e-15, truth.per_token_pair *= 7e-15;  // attention runs slower
  const CostModel fit = fit_cost_model(measure(truth, {256, 1024, 4096, 16384}), formula);
  EXPECT_EQ(fit.unit, "s");
  EXPECT_NEAR(fit.fixed, truth.fixed, 1e-6 * truth.fixed);
  EXPECT_NEAR(fit.per_token, truth.per_token, 1e-6 * truth.per_token);
  EXPECT_NEAR(fit.per_token_pair, truth.per_token_pair, 1e-6 * truth.per_token_pair);
  // Two token counts: one scale for the linear part, one for attention.
  const CostModel two = fit_cost_model(measure(truth, {1024, 16384}), formula);
  for (int64_t t : {1024, 16384}) EXPECT_NEAR(two.cost(t), truth.cost(t), 1e-6 * truth.cost(t));
  // One token count: the formula scaled, exact there.
  const CostModel one = fit_cost_model(measure(truth, {4096}), formula);
  EXPECT_NEAR(one.cost(4096), truth.cost(4096), 1e-9 * truth.cost(4096));
  EXPECT_NEAR(one.per_token_pair / one.per_token, formula.per_token_pair / formula.per_token, 1e-9);
}

TEST(CostModel, AnUnmeasuredBucketIsPredictedByTheFormulaAndSaysSo) {
  const CostModel formula = cost_model_for(wan_13b());
  const CostEstimate shape_only = formula.estimate(4096);
  EXPECT_FALSE(shape_only.measured);
  EXPECT_NE(shape_only.note.find("no measurements"), std::string::npos) << shape_only.note;
  CostModel truth = formula;
  truth.fixed *= 1e-15, truth.per_token *= 1e-15, truth.per_token_pair *= 1e-15;
  const CostModel fit = fit_cost_model(measure(truth, {1024, 4096}), formula);
  EXPECT_TRUE(fit.estimate(1024).measured);
  const CostEstimate guess = fit.estimate(16384);
  EXPECT_FALSE(guess.measured);
  EXPECT_NE(guess.note.find("not measured"), std::string::npos) << guess.note;
  EXPECT_NE(guess.note.find("1024, 4096"), std::string::npos) << guess.note;
  EXPECT_NEAR(guess.cost, truth.cost(16384), 1e-6 * truth.cost(16384));  // the formula holds here
}

TEST(CostModel, CheckReportsMeasuredOverPredictedPerBucket) {
  const CostModel formula = cost_model_for(wan_13b());
  // Bucket "long" runs twice as slow as its FLOPs say, relative to "short".
  std::vector<CostMeasurement> ms = {{"short", 1024, 4, 4 * formula.cost(1024) * 1e-15},
                                     {"long", 16384, 1, 2 * formula.cost(16384) * 1e-15},
                                     {"short", 1024, 2, 2 * formula.cost(1024) * 1e-15}};
  const auto checks = compare_cost_model(formula, ms);
  ASSERT_EQ(checks.size(), 2u);
  EXPECT_EQ(checks[0].bucket, "short");
  EXPECT_EQ(checks[0].samples, 6);
  EXPECT_NEAR(checks[1].ratio / checks[0].ratio, 2.0, 1e-9);
  EXPECT_NE(format_cost_checks(formula, checks).find("long"), std::string::npos);
  // A fitted model is compared in seconds, without a common scale.
  const CostModel fit = fit_cost_model({ms[0], ms[2]}, formula);
  const auto against_fit = compare_cost_model(fit, ms);
  EXPECT_NEAR(against_fit[0].ratio, 1.0, 1e-9);
  EXPECT_FALSE(against_fit[1].estimate.measured);
}

TEST(CostModel, BadMeasurementsAreRefused) {
  const CostModel formula = cost_model_for(wan_13b());
  EXPECT_THROW(fit_cost_model({}, formula), Error);
  EXPECT_THROW(fit_cost_model({{"a", 1024, 0, 1.0}}, formula), Error);
  EXPECT_THROW(fit_cost_model({{"a", 1024, 1, -1.0}}, formula), Error);
  EXPECT_THROW(fit_cost_model({{"a", 1024, 1, 1.0}}, CostModel{}), Error);
  EXPECT_THROW(compare_cost_model(formula, {{"a", 1024, 1, 1.0}, {"a", 2048, 1, 1.0}}), Error);
}

TEST(CostBalance, CacheLoaderSizesBatchesByPredictedCost) {
  // 60 short clips (latents 2x4x4: 8 tokens) and 12 long ones (4x8x8: 64 tokens); the budget is
  // two long clips (128 tokens of the 4x8x8 reference shape). Per token a short clip costs more
  // (cross-attention's keys and values on the text are paid per sample), so "cost" gives it fewer
  // samples per batch than the 16 that "tokens" does; each batch's predicted cost is within
  // [budget / 2, budget x 1.05]; two ranks still see every sample once per epoch.
  test::ScratchDir dir("cost_balance");
  const std::string cache_dir = dir / "cache";
  {
    CacheWriter w(cache_dir, 0, 1 << 20, at::kFloat);
    for (int i = 0; i < 72; ++i) {
      const bool is_long = i % 6 == 0;
      const int64_t t = is_long ? 4 : 2, hw = is_long ? 8 : 4;
      CacheSample s;
      s.key = cache_key("clip" + std::to_string(i), -1, -1);
      s.mean = at::randn({16, t, hw, hw});
      s.std = at::ones({16, t, hw, hw});
      s.text = at::randn({8, 32});
      s.bucket = is_long ? "long" : "short";
      w.add(s);
    }
  }
  merge_cache_index(cache_dir);
  auto cache = std::make_shared<LatentCache>(cache_dir);
  auto config = [&](const std::string& balance) {
    return parse_config("", "<test>", {"model.in_channels=16", "model.out_channels=16", "model.patch=[1, 2, 2]",
                                       "data.source=\"cache\"", "data.cache_dir=\"" + cache_dir + "\"",
                                       "data.latent_frames=4", "data.latent_height=8", "data.latent_width=8",
                                       "data.token_budget=128", "data.balance=\"" + balance + "\""});
  };
  const Config by_cost = config("cost");
  const CostModel model = cost_model_for(by_cost);
  const double budget = 2 * model.cost(64);
  auto epoch = [&](const Config& cfg, std::map<std::string, int64_t>& most) {
    std::vector<std::unique_ptr<CacheLoader>> ranks;
    for (int r = 0; r < 2; ++r) ranks.push_back(std::make_unique<CacheLoader>(cache, cfg, r, 2));
    std::multiset<std::string> seen;
    while (ranks[0]->state().position < cache->size())
      for (auto& loader : ranks) {
        const MicroBatch b = loader->next();
        if (b.latents.size(0) == 0) continue;
        const std::string bucket = nlohmann::json::parse(b.ids[0])["bucket"];
        most[bucket] = std::max(most[bucket], b.latents.size(0));
        const int64_t tokens = bucket == "long" ? 64 : 8;
        if (cfg.data.balance == Balance::cost) {
          EXPECT_LE(double(b.latents.size(0)) * model.cost(tokens), budget * 1.05 * (1 + 1e-9)) << bucket;
        }
        for (const auto& id : b.ids) seen.insert(nlohmann::json::parse(id)["key"].get<std::string>());
      }
    EXPECT_EQ(seen.size(), 72u);
    EXPECT_EQ(std::set<std::string>(seen.begin(), seen.end()).size(), 72u);
    return ranks[0]->plan();
  };
  std::map<std::string, int64_t> tokens_most, cost_most;
  EXPECT_EQ(epoch(config("tokens"), tokens_most).rfind("balance tokens", 0), 0u);
  const std::string plan = epoch(by_cost, cost_most);
  EXPECT_EQ(plan.rfind("balance cost", 0), 0u) << plan;
  EXPECT_EQ(tokens_most["short"], 16);
  EXPECT_EQ(tokens_most["long"], 2);
  EXPECT_LT(cost_most["short"], 16) << plan;
  EXPECT_GE(double(cost_most["short"]) * model.cost(8), budget / 2) << plan;
  EXPECT_EQ(cost_most["long"], 2) << plan;
}

}  // namespace
}  // namespace vidit
