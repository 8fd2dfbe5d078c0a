// Wan's initialisation by element (model/init.h): any part of a parameter computed alone equals
// that part of the whole; the rules give Wan's distributions; a model built without storage
// holds no memory until filled, and the model's own modules draw LibTorch's default fills in
// LibTorch's order when built with storage.
#include "model/init.h"

#include <gtest/gtest.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>

#include "../../tests/test_util.h"
#include "core/host_peak.h"
#include "core/unallocated.h"
#include "model/dit.h"
#include "model/state_dict.h"

namespace vidit {
namespace {

at::Tensor initial(const InitRule& rule, const std::string& name, const TensorRegion& r, uint64_t seed = 7) {
  at::Tensor out = at::empty({r.numel()}, at::kFloat);
  fill_initial(out, rule, seed, name, r);
  return out;
}

TEST(Init, AnyPartEqualsThatPartOfTheWhole) {
  const std::vector<int64_t> shape{12, 10};
  for (const InitRule rule : {InitRule{InitRule::Kind::Uniform, 0.3}, InitRule{InitRule::Kind::Normal, 0.02},
                              InitRule{InitRule::Kind::Ones, 0}}) {
    const at::Tensor whole = initial(rule, "blocks.0.ffn.0.weight", whole_region(shape)).view({12, 10});
    // Rows 4..8 (a split of dim 0 in three), columns 5..10 (dim 1 in two), then the third of four
    // flat chunks of that box (the last one padded), as FSDP cuts tensor parallel's part.
    TensorRegion box = whole_region(shape);
    box.offset = {4, 5}, box.length = {4, 5};
    EXPECT_TRUE(at::equal(initial(rule, "blocks.0.ffn.0.weight", box), whole.narrow(0, 4, 4).narrow(1, 5, 5).reshape(-1)));
    for (int c = 0; c < 4; ++c) {
      TensorRegion flat = box;
      flat.flat_start = c * 5, flat.flat_count = 5;
      at::Tensor want = at::constant_pad_nd(whole.narrow(0, 4, 4).narrow(1, 5, 5).reshape(-1), {0, 0});
      want = at::constant_pad_nd(want, {0, 20 - want.numel()}).narrow(0, c * 5, 5);
      EXPECT_TRUE(at::equal(initial(rule, "blocks.0.ffn.0.weight", flat), want)) << "chunk " << c;
    }
    // A flat chunk running past the end of the whole tensor is zero there.
    TensorRegion tail = whole_region(shape);
    tail.flat_start = 112, tail.flat_count = 16;
    const at::Tensor t = initial(rule, "blocks.0.ffn.0.weight", tail);
    EXPECT_TRUE(at::equal(t.narrow(0, 0, 8), whole.reshape(-1).narrow(0, 112, 8)));
    EXPECT_EQ(t.narrow(0, 8, 8).abs().sum().item<float>(), 0.f);
  }
}

TEST(Init, RulesGiveWansDistributions) {
  Config c = test::tiny_config({"model.dim=256", "model.ffn_dim=1024", "model.heads=4"});
  const ModelConfig& m = c.model;
  const InitRule x = wan_init_rule("blocks.3.ffn.0.weight", std::vector<int64_t>{1024, 256}, m);
  EXPECT_EQ(x.kind, InitRule::Kind::Uniform);
  EXPECT_NEAR(x.scale, std::sqrt(6.0 / (1024 + 256)), 1e-12);
  const at::Tensor w = initial(x, "blocks.3.ffn.0.weight", whole_region({1024, 256}));
  EXPECT_LE(w.abs().max().item<double>(), x.scale);
  EXPECT_NEAR(w.std().item<double>(), x.scale / std::sqrt(3.0), 0.01 * x.scale);
  EXPECT_NEAR(w.mean().item<double>(), 0, 0.01 * x.scale);

  const InitRule n = wan_init_rule("text_embedding.0.weight", std::vector<int64_t>{256, 8}, m);
  EXPECT_EQ(n.kind, InitRule::Kind::Normal);
  const at::Tensor e = initial(n, "text_embedding.0.weight", whole_region({512, 512}));
  EXPECT_NEAR(e.std().item<double>(), 0.02, 0.0003);
  EXPECT_NEAR(e.mean().item<double>(), 0, 0.0003);
  EXPECT_NEAR((e.abs() > 0.04).to(at::kFloat).mean().item<double>(), 0.0455, 0.003);  // two sigmas

  EXPECT_EQ(wan_init_rule("blocks.0.modulation", std::vector<int64_t>{1, 6, 256}, m).scale, 1 / 16.0);
  EXPECT_EQ(wan_init_rule("head.head.weight", std::vector<int64_t>{16, 256}, m).kind, InitRule::Kind::Zeros);
  EXPECT_EQ(wan_init_rule("blocks.0.norm3.bias", std::vector<int64_t>{256}, m).kind, InitRule::Kind::Zeros);
  EXPECT_EQ(wan_init_rule("blocks.0.self_attn.norm_k.weight", std::vector<int64_t>{256}, m).kind, InitRule::Kind::Ones);
  const InitRule p = wan_init_rule("patch_embedding.weight", std::vector<int64_t>{256, 4, 1, 2, 2}, m);
  EXPECT_NEAR(p.scale, std::sqrt(6.0 / (16 + 256)), 1e-12);
  const std::string err = test::message_of([&] { wan_init_rule("blocks.0.img_emb.scale", std::vector<int64_t>{3}, m); });
  EXPECT_NE(err.find("blocks.0.img_emb.scale"), std::string::npos) << err;

  // Seeds and names draw different values.
  const at::Tensor a = initial(x, "blocks.3.ffn.0.weight", whole_region({64}), 1);
  EXPECT_FALSE(at::equal(a, initial(x, "blocks.3.ffn.0.weight", whole_region({64}), 2)));
  EXPECT_FALSE(at::equal(a, initial(x, "blocks.4.ffn.0.weight", whole_region({64}), 1)));
}

TEST(Init, AModelBuiltWithoutStorageHoldsNoMemoryUntilFilled) {
  Config c = test::tiny_config({"model.dim=128", "model.ffn_dim=512", "model.heads=4", "model.layers=4"});
  int64_t bytes = 0;
  HostPeak peak;
  DiT empty = dit_without_storage(c.model, at::kCPU);
  for (const auto& p : empty->parameters()) {
    EXPECT_TRUE(is_unallocated(p));
    bytes += p.numel() * 4;
  }
  EXPECT_LT(peak.peak(), 64 << 10) << "building the model's description allocated memory";
  EXPECT_GT(bytes, 1 << 20);
  // init_weights(seed) fills it whole; a model built with storage gets the same values.
  empty->init_weights(5);
  DiT full(c.model);
  full->init_weights(5);
  const TensorMap a = state_dict(*empty), b = state_dict(*full);
  for (const auto& [name, t] : a) EXPECT_TRUE(at::equal(t, b.at(name))) << name;
  // load_state_dict fills a model built without storage a tensor at a time.
  DiT loaded = dit_without_storage(c.model, at::kCPU);
  load_state_dict(*loaded, b, "test");
  for (const auto& [name, t] : state_dict(*loaded)) EXPECT_TRUE(at::equal(t, b.at(name))) << name;
}

// The model's Linear and patch embedding, built with storage, draw what LibTorch's modules draw,
// in the same order (a seeded model is what it was before these modules were ours).
TEST(Init, ModulesBuiltWithStorageFillAsLibTorchDoes) {
  torch::manual_seed(9);
  Linear ours(24, 40);
  PatchEmbedding patch(4, 16, std::array<int64_t, 3>{1, 2, 2});
  torch::manual_seed(9);
  torch::nn::Linear theirs(24, 40);
  torch::nn::Conv3d conv(torch::nn::Conv3dOptions(4, 16, {1, 2, 2}).stride({1, 2, 2}));
  EXPECT_TRUE(at::equal(ours->weight, theirs->weight));
  EXPECT_TRUE(at::equal(ours->bias, theirs->bias));
  EXPECT_TRUE(at::equal(patch->weight, conv->weight));
  EXPECT_TRUE(at::equal(patch->bias, conv->bias));
  const at::Tensor x = at::randn({2, 4, 3, 6, 8});
  EXPECT_TRUE(at::allclose(patch(x), conv(x)));
}

}  // namespace
}  // namespace vidit
