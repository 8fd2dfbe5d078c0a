// LoRA (model/lora.h): an adapted model starts as its base exactly and equals the base with the
// adapters merged; only the adapters get gradients; targets match by name suffix and a target
// that matches nothing is refused by name; the diffusers / ComfyUI file round-trips; and real
// runs: a LoRA run trains, checkpoints and resumes its adapters only (bit for bit), and a run of
// Wan 2.1 1.3B's shape holds optimizer state for the adapters alone, as `vidit plan` counts.
#include "model/lora.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <regex>

#include "../../tests/test_util.h"
#include "core/error.h"
#include "loader/dataset.h"
#include "model/state_dict.h"
#include "../../tests/mpi_test_util.h"
#include "parallel/plan.h"
#include "checkpoint/checkpoint.h"
#include "train/run_weights.h"
#include "train/trainer.h"

namespace vidit {
namespace {

using test::ScratchDir;
using test::tiny_config;

struct Inputs {
  at::Tensor x, t, text;
};
Inputs inputs(const Config& c) {
  at::manual_seed(3);
  return {at::randn({2, c.model.in_channels, c.data.latent_frames, c.data.latent_height, c.data.latent_width}),
          at::tensor({0.3, 0.8}, at::kFloat) * 1000, at::randn({2, c.model.text_len, c.model.text_dim})};
}

DiT fresh_model(const Config& c, uint64_t seed = 5) {
  torch::manual_seed(seed);
  DiT m(c.model);
  m->init_weights();
  // init_weights() zeroes the head (the model starts by predicting 0); a little noise everywhere
  // makes every projection matter to the output.
  at::NoGradGuard ng;
  for (auto& p : m->parameters()) p.add_(at::randn_like(p) * 0.02);
  return m;
}

TensorMap copy_of(DiT& model) {
  TensorMap out;
  for (const auto& [k, v] : state_dict(*model)) out[k] = v.clone();
  return out;
}

TEST(Lora, StartsAsTheBaseModelAndEqualsTheMergedWeights) {
  const Config c = tiny_config({"lora.rank=4", "lora.alpha=8"});
  DiT model = fresh_model(c);
  const TensorMap base = copy_of(model);
  const Inputs in = inputs(c);
  at::NoGradGuard ng;
  const at::Tensor before = model->forward(in.x, in.t, in.text);
  const TensorMap adapters = apply_lora(*model, c.lora);
  EXPECT_EQ(adapters.size(), 2u * 10 * 2);  // 10 projections x 2 blocks, A and B each
  // B starts at zero: the adapted model is the base model exactly.
  EXPECT_TRUE(at::equal(model->forward(in.x, in.t, in.text), before));
  // With B non-zero, the adapted model equals a plain model holding W + (alpha / r) B A.
  for (const auto& [k, t] : adapters)
    if (k.find("lora_B") != std::string::npos) at::Tensor(t).normal_(0, 0.05);
  const at::Tensor adapted = model->forward(in.x, in.t, in.text);
  EXPECT_GT((adapted - before).abs().max().item<double>(), 1e-3);
  DiT merged(c.model);
  load_state_dict(*merged, merge_lora(base, adapters, lora_scale(c.lora)), "merged");
  const at::Tensor want = merged->forward(in.x, in.t, in.text);
  EXPECT_LT((adapted - want).abs().max().item<double>(), 1e-5 * want.abs().max().item<double>());
  EXPECT_DOUBLE_EQ(lora_scale(c.lora), 2.0);
}

TEST(Lora, OnlyTheAdaptersGetGradients) {
  const Config c = tiny_config({"lora.rank=2"});
  DiT model = fresh_model(c);
  const TensorMap adapters = apply_lora(*model, c.lora);
  const Inputs in = inputs(c);
  model->forward(in.x, in.t, in.text).square().mean().backward();
  for (const auto& p : model->named_parameters()) {
    EXPECT_FALSE(p.value().requires_grad()) << p.key();
    EXPECT_FALSE(p.value().grad().defined()) << p.key();
  }
  for (const auto& [k, t] : adapters) {
    ASSERT_TRUE(t.grad().defined()) << k;
    // B = 0 at the start, so A's gradient (through B) is zero and B's is not.
    if (k.find("lora_B") != std::string::npos) EXPECT_GT(t.grad().abs().sum().item<double>(), 0) << k;
  }
}

TEST(Lora, TargetsMatchByNameSuffixAndNothingMatchedIsRefusedByName) {
  Config c = tiny_config();
  DiT model = fresh_model(c);
  EXPECT_EQ(lora_matches(*model, {"q"}),
            (std::vector<std::string>{"blocks.0.self_attn.q", "blocks.0.cross_attn.q", "blocks.1.self_attn.q",
                                      "blocks.1.cross_attn.q"}));
  EXPECT_EQ(lora_matches(*model, {"blocks.1.ffn.2"}), std::vector<std::string>{"blocks.1.ffn.2"});
  EXPECT_EQ(lora_matches(*model, {"self_attn.k", "ffn.0"}).size(), 4u);
  c.lora.rank = 4;
  c.lora.targets = {"attn.qq", "to_q"};
  try {
    apply_lora(*model, c.lora);
    FAIL() << "targets that match nothing were accepted";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("\"attn.qq\", \"to_q\""), std::string::npos) << what;
    EXPECT_NE(what.find("blocks.0.self_attn.q"), std::string::npos) << what;
  }
  // The model was left alone: nothing frozen.
  for (const auto& p : model->parameters()) EXPECT_TRUE(p.requires_grad());
}

TEST(Lora, BaseWeightsInBf16StillMultiplyFp32Inputs) {
  const Config c = tiny_config({"lora.rank=4", "lora.base_dtype=\"bf16\""});
  DiT model = fresh_model(c);
  const Inputs in = inputs(c);
  at::NoGradGuard ng;
  const at::Tensor before = model->forward(in.x, in.t, in.text);
  apply_lora(*model, c.lora);
  EXPECT_EQ(model->blocks[0]->as<DiTBlockImpl>()->self_attn->q->weight.scalar_type(), at::kBFloat16);
  EXPECT_EQ(model->blocks[0]->as<DiTBlockImpl>()->norm3->weight.scalar_type(), at::kFloat);  // not targeted
  const at::Tensor after = model->forward(in.x, in.t, in.text);
  EXPECT_EQ(after.scalar_type(), at::kFloat);
  // bf16 rounding of the weights only.
  EXPECT_LT((after - before).abs().max().item<double>(), 0.05 * before.abs().max().item<double>());
}

TEST(Lora, AdapterFileForDiffusersAndComfyUiRoundTrips) {
  const Config c = tiny_config({"lora.rank=4", "lora.alpha=2"});
  DiT model = fresh_model(c);
  const TensorMap base = copy_of(model);
  TensorMap adapters = apply_lora(*model, c.lora);
  for (auto& [k, t] : adapters) at::Tensor(t).detach().normal_(0, 0.1);
  const TensorMap file = lora_file_tensors(adapters, lora_scale(c.lora));
  // The names both readers take for Wan, with one scalar alpha per projection.
  ASSERT_TRUE(file.count("diffusion_model.blocks.0.self_attn.q.lora_A.weight"));
  ASSERT_TRUE(file.count("diffusion_model.blocks.1.ffn.2.lora_B.weight"));
  const at::Tensor alpha = file.at("diffusion_model.blocks.0.cross_attn.o.alpha");
  EXPECT_EQ(alpha.dim(), 0);
  EXPECT_FLOAT_EQ(alpha.item<float>(), 2.0f);
  EXPECT_EQ(file.size(), adapters.size() / 2 * 3);
  EXPECT_EQ(file.at("diffusion_model.blocks.0.self_attn.q.lora_A.weight").sizes(),
            (at::IntArrayRef{4, c.model.dim}));  // [r, in]
  EXPECT_EQ(file.at("diffusion_model.blocks.0.ffn.0.lora_B.weight").sizes(),
            (at::IntArrayRef{c.model.ffn_dim, 4}));  // [out, r]
  // Read back (scale folded into B): the same merged weights.
  ScratchDir dir("lora_file");
  save_safetensors(dir / "a.safetensors", file);
  const TensorMap back = lora_from_file_tensors(load_safetensors(dir / "a.safetensors"), "a.safetensors");
  const TensorMap m1 = merge_lora(base, adapters, lora_scale(c.lora)), m2 = merge_lora(base, back, 1.0);
  for (const auto& [k, t] : m1) EXPECT_TRUE(at::allclose(t, m2.at(k), 1e-6, 1e-6)) << k;
  // The kohya / musubi spelling reads the same way.
  TensorMap kohya;
  for (const auto& [k, t] : file) {
    std::string n = k;
    if (auto at = n.find("lora_A"); at != std::string::npos) n.replace(at, 6, "lora_down");
    if (auto at = n.find("lora_B"); at != std::string::npos) n.replace(at, 6, "lora_up");
    kohya[n] = t;
  }
  const TensorMap m3 = merge_lora(base, lora_from_file_tensors(kohya, "kohya"), 1.0);
  for (const auto& [k, t] : m1) EXPECT_TRUE(at::allclose(t, m3.at(k), 1e-6, 1e-6)) << k;
  // A tensor that is no LoRA's is named.
  TensorMap bad = file;
  bad["diffusion_model.blocks.0.norm3.weight"] = at::ones({c.model.dim});
  EXPECT_THROW(
      {
        try {
          lora_from_file_tensors(bad, "bad.safetensors");
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("bad.safetensors: 'diffusion_model.blocks.0.norm3.weight'"),
                    std::string::npos)
              << e.what();
          throw;
        }
      },
      Error);
  // An adapter of a projection the base lacks is named when merged.
  TensorMap stray = adapters;
  stray["blocks.7.ffn.0.lora_A.weight"] = at::zeros({4, c.model.dim});
  stray["blocks.7.ffn.0.lora_B.weight"] = at::zeros({c.model.ffn_dim, 4});
  EXPECT_THROW(merge_lora(base, stray, 1.0), Error);
}

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

TEST(Lora, ConfigRefusesShardedOrSplitAdaptersAndEmptyTargets) {
  for (const char* set : {"parallel.shard=2", "parallel.tensor=2"})
    try {
      tiny_config({"lora.rank=4", set});
      ADD_FAILURE() << set << " was accepted with LoRA";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("set parallel.tensor and parallel.shard to 1"), std::string::npos) << e.what();
    }
  EXPECT_THROW(tiny_config({"lora.rank=4", "lora.targets=[]"}), Error);
  EXPECT_NO_THROW(tiny_config({"lora.targets=[]"}));  // LoRA off: the targets do not matter
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
