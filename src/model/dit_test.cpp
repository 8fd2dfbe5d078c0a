#include "model/dit.h"

#include <gtest/gtest.h>

#include "../../tests/test_util.h"
#include "core/error.h"
#include "model/model_info.h"
#include "model/rope.h"
#include "model/state_dict.h"
#include "core/precision.h"

namespace vidit {
namespace {

using test::tiny_config;

int64_t module_params(const torch::nn::Module& m) {
  int64_t n = 0;
  for (const auto& p : m.parameters()) n += p.numel();
  return n;
}

TEST(DiT, ForwardShapesAndParameterCount) {
  for (auto extra : std::vector<std::vector<std::string>>{
           {}, {"model.patch=[2, 2, 2]", "model.heads=4"}, {"model.image_dim=24", "model.image_pos_tokens=6"}}) {
    Config c = tiny_config(extra);
    torch::manual_seed(0);
    DiT m(c.model);
    m->init_weights();
    EXPECT_EQ(module_params(*m), count_parameters(c.model));
    // The analytic list (what vidit plan lays out) is the model's own, name, shape and order.
    const auto shapes = parameter_shapes(c.model);
    const auto named = m->named_parameters(true);
    ASSERT_EQ(shapes.size(), named.size());
    for (size_t i = 0; i < shapes.size(); ++i) {
      EXPECT_EQ(shapes[i].first, named[i].key());
      EXPECT_EQ(shapes[i].second, named[i].value().sizes().vec()) << shapes[i].first;
    }
    at::Tensor x = at::randn({3, 4, 2, 4, 6}), t = at::tensor({0.f, 500.f, 999.f}), text = at::randn({3, 3, 8});
    const at::Tensor image = c.model.image_dim > 0 ? at::randn({3, 6, 24}) : at::Tensor();
    EXPECT_EQ(m->forward(x, t, text, image).sizes(), x.sizes());
  }
}

TEST(DiT, OfficialKeyNames) {
  DiT m(tiny_config().model);
  auto sd = state_dict(*m);
  for (const char* k : {"patch_embedding.weight", "text_embedding.0.weight", "text_embedding.2.bias",
                        "time_embedding.0.weight", "time_embedding.2.weight", "time_projection.1.weight",
                        "blocks.0.self_attn.q.weight", "blocks.0.self_attn.norm_q.weight",
                        "blocks.1.cross_attn.k.bias", "blocks.1.cross_attn.norm_k.weight", "blocks.0.norm3.weight",
                        "blocks.0.ffn.0.weight", "blocks.0.ffn.2.bias", "blocks.1.modulation", "head.head.weight",
                        "head.modulation"})
    EXPECT_TRUE(sd.count(k)) << k;
  EXPECT_EQ(sd.at("blocks.1.modulation").sizes(), (std::vector<int64_t>{1, 6, 32}));
  EXPECT_EQ(sd.at("head.modulation").sizes(), (std::vector<int64_t>{1, 2, 32}));
}

TEST(DiT, WanPresetCountsWithoutAllocating) {
  Config c = parse_config("[model]\ndim=1536\nffn_dim=8960\nheads=12\nlayers=30\nin_channels=16\nout_channels=16\n"
                          "text_dim=4096\ntext_len=512\npatch=[1,2,2]\n[data]\nsource=\"synthetic\"\nlatent_frames=21\n"
                          "latent_height=60\nlatent_width=104\n", "1.3b");
  EXPECT_NEAR(double(count_parameters(c.model)), 1.419e9, 0.005 * 1.419e9);
  ModelInfo info = model_info(c);
  EXPECT_EQ(info.tokens, 21 * 30 * 52);
  EXPECT_DOUBLE_EQ(info.train_flops, 3 * info.forward_flops);
  // Matmul FLOPs dominate: 2 * params * tokens is a lower bound and attention adds the rest.
  EXPECT_GT(info.forward_flops, 2.0 * 1.39e9 * info.tokens);
}

TEST(RoPE, ScoresDependOnlyOnRelativePosition) {
  const int64_t hd = 24, L = 2 * 3 * 4;
  at::Tensor q = at::randn({1, L, 1, hd}, at::kDouble), k = at::randn({1, L, 1, hd}, at::kDouble);
  auto scores = [&](std::array<int64_t, 3> off) {
    auto [c, s] = rope_tables(2, 3, 4, hd, 10000.0, at::kCPU, off);
    at::Tensor qr = rope_apply(q, c.to(at::kDouble), s.to(at::kDouble)).squeeze(2).squeeze(0);
    at::Tensor kr = rope_apply(k, c.to(at::kDouble), s.to(at::kDouble)).squeeze(2).squeeze(0);
    return at::matmul(qr, kr.t());
  };
  at::Tensor base = scores({0, 0, 0});
  EXPECT_TRUE(at::allclose(base, scores({5, 7, 11}), 1e-4, 1e-4));
  // And it is not the identity: positions do change the scores.
  EXPECT_FALSE(at::allclose(base, at::matmul(q.view({L, hd}), k.view({L, hd}).t()), 1e-3, 1e-3));
  // Rotation preserves norms.
  auto [c, s] = rope_tables(2, 3, 4, hd, 10000.0, at::kCPU);
  EXPECT_NEAR(rope_apply(q, c, s).norm().item<double>(), q.norm().item<double>(), 1e-4);
}

TEST(RoPE, SplitsHeadDimOverAxes) {
  // head_dim 24 -> 12 pairs -> t:h:w = 4:4:4. A frame-only shift changes only the first 4 pairs.
  auto [c0, s0] = rope_tables(3, 1, 1, 24, 10000.0, at::kCPU);
  at::Tensor diff = (c0[1] - c0[0]).abs();
  EXPECT_GT(diff.slice(0, 0, 4).sum().item<double>(), 0.1);
  EXPECT_EQ(diff.slice(0, 4, 12).sum().item<double>(), 0.0);
}

TEST(DiT, Float64FiniteDifferenceGradient) {
  Config c = tiny_config({"model.dim=12", "model.heads=2", "model.ffn_dim=16", "model.layers=1",
                          "data.latent_height=2", "data.latent_width=2", "model.freq_dim=8"});
  torch::manual_seed(3);
  DiT m(c.model);
  m->init_weights();
  {
    torch::NoGradGuard ng;  // non-zero head so gradients reach every block
    m->head->head->weight.normal_(0, 0.3);
  }
  m->to(at::kDouble);
  at::Tensor x = at::randn({1, 4, 2, 2, 2}, at::kDouble), t = at::tensor({300.0}, at::kDouble);
  at::Tensor text = at::randn({1, 3, 8}, at::kDouble);
  at::Tensor w = at::randn({1, 4, 2, 2, 2}, at::kDouble);
  auto loss = [&]() { return (m->forward(x, t, text) * w).sum(); };
  m->zero_grad();
  loss().backward();
  int checked = 0;
  for (auto& item : m->named_parameters()) {
    at::Tensor p = item.value();
    at::Tensor g = p.grad().clone();
    for (int64_t i = 0; i < std::min<int64_t>(p.numel(), 3); ++i) {
      const int64_t idx = (i * 7919) % p.numel();
      double orig;
      {
        torch::NoGradGuard ng;
        orig = p.view(-1)[idx].item<double>();
        const double h = 1e-6;
        p.view(-1)[idx] = orig + h;
        double up = loss().item<double>();
        p.view(-1)[idx] = orig - h;
        double down = loss().item<double>();
        p.view(-1)[idx] = orig;
        const double num = (up - down) / (2 * h), ana = g.view(-1)[idx].item<double>();
        EXPECT_NEAR(ana, num, 1e-6 + 1e-5 * std::abs(num)) << item.key() << "[" << idx << "]";
      }
      ++checked;
    }
  }
  EXPECT_GT(checked, 40);
}

TEST(DiT, StateDictErrorsNameTheKeys) {
  Config c = tiny_config();
  DiT m(c.model);
  auto good = state_dict(*m);
  auto expect_error = [&](TensorMap sd, const std::string& needle) {
    try {
      load_state_dict(*m, sd, "weights.safetensors");
      ADD_FAILURE() << "no error for " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("weights.safetensors"), std::string::npos);
    }
  };
  auto missing = good;
  missing.erase("blocks.1.ffn.2.weight");
  expect_error(missing, "missing key(s): blocks.1.ffn.2.weight");
  auto extra = good;
  extra["blocks.9.self_attn.q.weight"] = at::zeros({1});
  expect_error(extra, "unexpected key(s): blocks.9.self_attn.q.weight");
  auto bad = good;
  bad["head.modulation"] = at::zeros({1, 3, 32});
  expect_error(bad, "mis-shaped key(s): head.modulation");
  // A good dict loads, and the values arrive.
  DiT other(c.model);
  TensorMap copy;
  for (auto& [k, v] : good) copy[k] = v.clone() + 1;
  load_state_dict(*other, copy, "copy");
  EXPECT_TRUE(at::equal(state_dict(*other).at("head.head.weight"), copy.at("head.head.weight")));
}

TEST(DiT, Bf16AutocastCloseToFp32) {
  Config c = tiny_config();
  torch::manual_seed(0);
  DiT m(c.model);
  m->init_weights();
  {
    torch::NoGradGuard ng;
    m->head->head->weight.normal_(0, 0.1);
  }
  at::Tensor x = at::randn({2, 4, 2, 4, 4}), t = at::tensor({100.f, 700.f}), text = at::randn({2, 4, 8});
  at::Tensor ref = m->forward(x, t, text), low;
  {
    AutocastGuard ac(Precision::bf16, at::kCPU);
    low = m->forward(x, t, text);
  }
  EXPECT_EQ(low.scalar_type(), at::kFloat);
  EXPECT_FALSE(at::equal(low, ref));  // autocast did change the matmul precision
  EXPECT_LT(((low - ref).norm() / ref.norm()).item<double>(), 0.05);
}

}  // namespace
}  // namespace vidit
