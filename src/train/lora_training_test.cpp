// Real LoRA runs (model/lora.h): base weights held in fp8 are read back within their rounding
// and a run on them trains the adapters; a LoRA run trains, checkpoints and resumes its adapters
// only (bit for bit); recomputed blocks train the adapters as kept ones do; `vidit train` with
// LoRA under mpirun matches one process and its checkpoint exports as a LoRA file; and a run of
// Wan 2.1 1.3B's shape holds optimizer state for the adapters alone, as `vidit plan` counts.
#include <gtest/gtest.h>

#include <cmath>
#include <regex>

#include "../../tests/test_util.h"
#include "core/safetensors.h"
#include "loader/dataset.h"
#include "model/dit.h"
#include "model/lora.h"
#include "model/lora_test_util.h"
#include "model/state_dict.h"
#include "../../tests/mpi_test_util.h"
#include "parallel/plan.h"
#include "checkpoint/checkpoint.h"
#include "train/run_weights.h"
#include "train/trainer.h"

namespace vidit {
namespace {

using lora_test::copy_of;
using lora_test::fresh_model;
using lora_test::inputs;
using lora_test::Inputs;
using test::ScratchDir;
using test::tiny_config;

std::shared_ptr<const Dataset> synthetic(const Config& c) { return std::make_shared<SyntheticDataset>(c, 8, 11); }
at::Tensor null_text(const Config& c) { return at::zeros({c.model.text_len, c.model.text_dim}); }

// lora.base_dtype = "fp8": the targeted weights held as e4m3 (a quarter of fp32's bytes) with a
// scale per row; read back, each is within e4m3's rounding (2^-4 relative) of the original; the
// model's output moves by that rounding only; a run trains the adapters, and its sampling weights
// are the read-back base with the adapters merged.
TEST(Lora, BaseWeightsInFp8AreReadBackWithinTheirRounding) {
  const Config c = tiny_config({"lora.rank=4", "lora.base_dtype=\"fp8\""});
  DiT model = fresh_model(c);
  const TensorMap original = copy_of(model);
  const Inputs in = inputs(c);
  at::Tensor before;
  {
    at::NoGradGuard ng;
    before = model->forward(in.x, in.t, in.text);
  }
  apply_lora(*model, c.lora);
  const auto& q = model->blocks[0]->as<DiTBlockImpl>()->self_attn->q->weight;
  EXPECT_EQ(q.scalar_type(), at::kFloat8_e4m3fn);
  EXPECT_EQ(q.element_size(), 1);
  EXPECT_EQ(model->blocks[0]->as<DiTBlockImpl>()->norm3->weight.scalar_type(), at::kFloat);  // not targeted
  const TensorMap back = lora_base_weights(*model);
  ASSERT_EQ(back.size(), original.size());
  for (const auto& [k, w] : original) {
    const at::Tensor& r = back.at(k);
    ASSERT_EQ(r.scalar_type(), at::kFloat) << k;
    if (!k.ends_with("self_attn.q.weight") && !k.ends_with("ffn.0.weight")) continue;
    // Each element within 2^-4 of itself, or of its row's largest (the subnormal range).
    const at::Tensor row_max = w.abs().amax(1, true);
    EXPECT_TRUE(((r - w).abs() <= w.abs() / 16 + row_max / 256).all().item<bool>()) << k;
    EXPECT_FALSE(at::equal(r, w)) << k << ": not rounded at all?";
  }
  {
    at::NoGradGuard ng;
    const at::Tensor after = model->forward(in.x, in.t, in.text);
    EXPECT_EQ(after.scalar_type(), at::kFloat);
    EXPECT_LT((after - before).abs().max().item<double>(), 0.1 * before.abs().max().item<double>());
  }

  ScratchDir dir("lora_fp8");
  Config run = tiny_config({"train.steps=4", "train.warmup_steps=0", "train.lr=1e-2", "lora.rank=4",
                            "lora.base_dtype=\"fp8\"", "train.ema_decay=0"});
  run.train.out_dir = dir / "run";
  Trainer t(run, synthetic(run), null_text(run));
  const std::vector<double> losses = t.fit(-1, false);
  for (double l : losses) EXPECT_TRUE(std::isfinite(l));
  for (const auto& [name, p] : t.parallel_model().params()) EXPECT_NE(name.find(".lora_"), std::string::npos) << name;
  const TensorMap sampling = t.sampling_weights();
  const TensorMap merged = merge_lora(lora_base_weights(*t.model()), t.weights(), lora_scale(run.lora));
  for (const auto& [k, v] : merged) EXPECT_TRUE(at::equal(sampling.at(k), v)) << k;
  EXPECT_EQ(sampling.at("blocks.0.self_attn.q.weight").scalar_type(), at::kFloat);
  // `vidit plan`: the targeted weights at one byte each plus a scale per row.
  Config fp32 = run;
  fp32.lora.base_dtype = Precision::fp32;
  const LoraCounts n = lora_counts(run.model, run.lora);
  EXPECT_DOUBLE_EQ(plan_step(fp32).weights - plan_step(run).weights, 3.0 * double(n.adapted_weights) - 4.0 * double(n.adapted_rows));
}

TEST(Lora, RunTrainsOnlyTheAdaptersAndResumesBitwise) {
  ScratchDir dir("lora_run");
  // The base: a short full run, whose checkpoint the LoRA runs start from (train.init_from takes a
  // vidit run as well as a release folder).
  Config base = tiny_config({"train.steps=2", "checkpoint.every=0", "train.warmup_steps=0"});
  base.train.out_dir = dir / "base";
  {
    Trainer t(base, synthetic(base), null_text(base));
    t.fit(-1, false);
  }
  const CheckpointWeights base_w = read_checkpoint_weights(base.train.out_dir);
  auto lora_cfg = [&](const std::string& out) {
    Config c = tiny_config({"train.steps=6", "checkpoint.every=3", "train.warmup_steps=0", "train.lr=1e-2",
                            "lora.rank=4", "train.ema_decay=0.9"});
    c.train.out_dir = out;
    c.train.init_from = base.train.out_dir;
    return c;
  };
  const Config full_cfg = lora_cfg(dir / "full");
  Trainer full(full_cfg, synthetic(full_cfg), null_text(full_cfg));
  // params() (what AdamW, the EMA and the reductions see) are the adapters alone.
  for (const auto& [name, p] : full.parallel_model().params())
    EXPECT_NE(name.find(".lora_"), std::string::npos) << name;
  EXPECT_EQ(full.parallel_model().params().size(), 2u * 10 * 2);
  const std::vector<double> losses = full.fit(-1, false);
  // The frozen base is untouched; the adapters moved; sampling weights are base + merged adapters.
  for (const auto& [k, v] : state_dict(*full.model())) EXPECT_TRUE(at::equal(v, base_w.weights.at(k))) << k;
  const TensorMap sampling = full.sampling_weights();
  EXPECT_FALSE(at::equal(sampling.at("blocks.0.self_attn.q.weight"), base_w.weights.at("blocks.0.self_attn.q.weight")));
  EXPECT_TRUE(at::equal(sampling.at("blocks.0.norm3.weight"), base_w.weights.at("blocks.0.norm3.weight")));
  // Its checkpoint holds the adapters and their optimizer state only.
  const auto latest = latest_checkpoint(full_cfg.train.out_dir);
  ASSERT_TRUE(latest);
  const CheckpointState s = load_checkpoint(*latest);
  for (const auto& [k, t] : s.model) EXPECT_NE(k.find(".lora_"), std::string::npos) << k;
  for (const auto& [k, t] : s.optimizer)
    if (k.rfind("exp_avg", 0) == 0) EXPECT_NE(k.find(".lora_"), std::string::npos) << k;
  // The checkpoint read back as whole weights: the base merged with the EMA adapters.
  const CheckpointWeights w = read_checkpoint_weights(full_cfg.train.out_dir);
  EXPECT_FALSE(w.adapters.empty());
  for (const auto& [k, t] : sampling) EXPECT_TRUE(at::allclose(w.weights.at(k), t, 1e-6, 1e-7)) << k;

  // Interrupted after step 3 and resumed: the same losses, bit for bit.
  const Config part_cfg = lora_cfg(dir / "part");
  {
    Trainer first(part_cfg, synthetic(part_cfg), null_text(part_cfg));
    first.fit(3, false);
  }
  Trainer second(part_cfg, synthetic(part_cfg), null_text(part_cfg));
  ASSERT_TRUE(second.resume());
  EXPECT_EQ(second.steps_done(), 3);
  const std::vector<double> rest = second.fit(-1, false);
  ASSERT_EQ(rest.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(rest[i], losses[3 + i]) << "step " << 4 + i;
}

TEST(Lora, RecomputedBlocksTrainTheAdaptersAsKeptOnesDo) {
  // With the embeddings frozen nothing entering the first block asks for a gradient; a recomputed
  // block must still give its adapters theirs (model/dit.cpp).
  std::vector<double> want;
  for (const char* recompute : {"train.recompute_blocks=0", "train.recompute_blocks=-1",
                                "train.recompute_policy=\"selective\""}) {
    ScratchDir dir("lora_recompute");
    std::vector<std::string> sets = {"train.steps=3", "train.warmup_steps=0", "train.lr=1e-2", "lora.rank=4", recompute};
    if (std::string(recompute).find("selective") != std::string::npos) sets.push_back("train.recompute_blocks=-1");
    Config c = tiny_config(sets);
    c.train.out_dir = dir.path();
    Trainer t(c, synthetic(c), null_text(c));
    const std::vector<double> losses = t.fit(-1, false);
    if (want.empty()) {
      want = losses;
      EXPECT_NE(losses[2], losses[0]);  // the adapters moved the loss
    } else {
      for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(losses[i], want[i], 1e-6 * want[i]) << recompute << " step " << i + 1;
    }
  }
}

// `vidit train` with LoRA under mpirun: data parallel over 2 ranks and Ulysses over 2 train the
// adapters as one process does (final loss to 1e-5), and the adapters-only checkpoint of the
// 2-rank run exports as a LoRA file.
TEST(Mpi, LoraUnderMpirunMatchesOneProcess) {
  VIDIT_REQUIRE_MPI();
  ScratchDir one("lora_one"), two("lora_two"), sp("lora_sp");
  const std::string sets = test::kTinyTrainArgs;
  const std::string lora = " lora.rank=4 lora.alpha=8 train.lr=1e-2 train.warmup_steps=0";
  auto single = test::run_process(std::string(VIDIT_BINARY) + sets + one.path() + lora);
  ASSERT_EQ(single.status, 0) << single.output;
  EXPECT_NE(single.output.find("LoRA: rank 4, scale 2, 20 projections adapted"), std::string::npos) << single.output;
  std::regex final_loss("done: 4 steps, final loss ([0-9.eE+-]+)");
  std::smatch a;
  ASSERT_TRUE(std::regex_search(single.output, a, final_loss)) << single.output;
  for (auto [dir, set] : {std::pair<const ScratchDir*, const char*>{&two, " parallel.replicate=2"},
                          {&sp, " parallel.ulysses=2"}}) {
    auto run = test::mpirun(2, std::string(VIDIT_BINARY) + sets + dir->path() + lora + set);
    ASSERT_EQ(run.status, 0) << run.output;
    std::smatch b;
    ASSERT_TRUE(std::regex_search(run.output, b, final_loss)) << run.output;
    EXPECT_LE(std::abs(std::stod(b[1]) - std::stod(a[1])), 1e-5 * std::stod(a[1])) << set << ": " << a[1] << " vs " << b[1];
  }
  auto exported = test::run_process(std::string(VIDIT_BINARY) + " export --format lora " + two.path() + " " +
                                    (two / "adapters.safetensors"));
  ASSERT_EQ(exported.status, 0) << exported.output;
  const TensorMap file = load_safetensors(two / "adapters.safetensors");
  EXPECT_EQ(file.size(), 20u * 3);
  EXPECT_FLOAT_EQ(file.at("diffusion_model.blocks.1.ffn.2.alpha").item<float>(), 8.0f);
  // A second export to the same file is refused, the file left as it was.
  auto again = test::run_process(std::string(VIDIT_BINARY) + " export --format lora " + two.path() + " " +
                                 (two / "adapters.safetensors"));
  EXPECT_NE(again.status, 0);
  EXPECT_NE(again.output.find("exists"), std::string::npos) << again.output;
  EXPECT_EQ(load_safetensors(two / "adapters.safetensors").size(), 20u * 3);
}

TEST(Lora, WanOneAndAHalfBShapedRunHoldsOptimizerStateForTheAdaptersOnly) {
  // Wan 2.1 T2V-1.3B's transformer (dim 1536, MLP 8960, 12 heads, 30 blocks, umT5 width 4096),
  // LoRA rank 16 on every attention projection and the MLP, one real step on a tiny latent.
  ScratchDir dir("lora_13b");
  Config c = parse_config("", "<test>",
                          {"model.dim=1536", "model.ffn_dim=8960", "model.heads=12", "model.layers=30",
                           "model.in_channels=16", "model.out_channels=16", "model.text_dim=4096", "model.text_len=4",
                           "model.freq_dim=256", "model.patch=[1,2,2]", "model.rope_theta=10000",
                           "data.source=\"synthetic\"", "data.latent_frames=1", "data.latent_height=4",
                           "data.latent_width=4", "train.batch_size=1", "train.steps=1", "train.log_every=1000",
                           "lora.rank=16", "train.ema_decay=0.99"});
  c.train.out_dir = dir.path();
  const LoraCounts n = lora_counts(c.model, c.lora);
  EXPECT_EQ(n.projections, 30 * 10);
  // Per block: 8 attention projections 1536x1536 and the MLP's 1536x8960 and 8960x1536.
  EXPECT_EQ(n.adapter_params, 30 * 16 * (8 * (1536 + 1536) + 2 * (1536 + 8960)));
  const StepPlan plan = plan_step(c);
  EXPECT_EQ(plan.lora_params, n.adapter_params);
  EXPECT_DOUBLE_EQ(plan.optimizer, 8.0 * double(n.adapter_params));
  EXPECT_DOUBLE_EQ(plan.grads, 4.0 * double(n.adapter_params));
  EXPECT_GT(plan.params, 1'300'000'000);

  Trainer t(c, std::make_shared<SyntheticDataset>(c, 2, 11), null_text(c));
  int64_t trained = 0;
  for (const auto& [name, p] : t.parallel_model().params()) trained += p.numel();
  EXPECT_EQ(trained, n.adapter_params);
  t.fit(-1, false);
  const auto latest = latest_checkpoint(c.train.out_dir);
  ASSERT_TRUE(latest);
  const CheckpointState s = load_checkpoint(*latest);
  int64_t moments = 0, model = 0;
  for (const auto& [k, v] : s.optimizer)
    if (k.rfind("exp_avg", 0) == 0) {
      EXPECT_NE(k.find(".lora_"), std::string::npos) << k;
      moments += v.numel();
    }
  for (const auto& [k, v] : s.model) model += v.numel();
  EXPECT_EQ(moments, 2 * n.adapter_params);  // exp_avg and exp_avg_sq
  EXPECT_EQ(model, n.adapter_params);
  EXPECT_LT(double(n.adapter_params) / double(plan.params), 0.02);
}

}  // namespace
}  // namespace vidit
