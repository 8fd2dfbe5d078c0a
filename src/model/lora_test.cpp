// LoRA (model/lora.h): an adapted model starts as its base exactly and equals the base with the
// adapters merged; only the adapters get gradients; targets match by name suffix and a target
// that matches nothing is refused by name; base weights in bf16 still multiply fp32 inputs; the
// diffusers / ComfyUI file round-trips; the config refuses what LoRA cannot do. (Real LoRA runs
// are tested in src/train/lora_training_test.cpp.)
#include "model/lora.h"

#include <gtest/gtest.h>

#include "../../tests/test_util.h"
#include "core/error.h"
#include "core/safetensors.h"
#include "model/dit.h"
#include "model/lora_test_util.h"
#include "model/state_dict.h"

namespace vidit {
namespace {

using lora_test::copy_of;
using lora_test::fresh_model;
using lora_test::inputs;
using lora_test::Inputs;
using test::ScratchDir;
using test::tiny_config;

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

}  // namespace
}  // namespace vidit
