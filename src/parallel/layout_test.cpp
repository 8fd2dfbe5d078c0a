// Layouts in one process: cutting and joining are inverse for every kind of cut (odd sizes
// padded), the planned layouts are those of tensor parallel then FSDP, and state keys find their
// parameter. (A one-process run's layouts are tested in src/train/one_process_mesh_test.cpp.)
#include "parallel/layout.h"

#include <gtest/gtest.h>

#include "../../tests/test_util.h"
#include "core/error.h"
#include "model/dit.h"
#include "parallel/parallelize.h"

namespace vidit {
namespace {

// Every part of `l` in row-major order over its cuts.
std::vector<at::Tensor> all_parts(const Layout& l, const at::Tensor& whole) {
  int64_t n = 1;
  for (const Cut& c : l.cuts) n *= c.degree;
  std::vector<at::Tensor> parts;
  for (int64_t p = 0; p < n; ++p) {
    std::vector<int> coords(l.cuts.size());
    int64_t rest = p;
    for (size_t i = l.cuts.size(); i-- > 0;) coords[i] = int(rest % l.cuts[i].degree), rest /= l.cuts[i].degree;
    parts.push_back(cut_part(l, whole, coords));
  }
  return parts;
}

TEST(Layout, CutAndJoinAreInverse) {
  const Cut rows{Cut::Kind::Split, "tensor", 0, 2}, cols{Cut::Kind::Split, "tensor", 1, 2},
      flat3{Cut::Kind::Flat, "shard", 0, 3}, flat4{Cut::Kind::Flat, "shard", 0, 4};
  at::Tensor a = at::randn({6, 10}, at::kDouble), odd = at::randn({7, 3}, at::kDouble);
  for (const auto& [l, t] : std::vector<std::pair<Layout, at::Tensor>>{
           {Layout{{6, 10}, {rows, flat3}}, a},  // tensor parallel then FSDP: 3 x 10 = 30 over 3
           {Layout{{6, 10}, {cols, flat4}}, a},  // 6 x 5 = 30 over 4: padded to 32
           {Layout{{7, 3}, {flat4}}, odd},       // 21 over 4: padded to 24
           {Layout{{7, 3}, {}}, odd}}) {
    std::vector<at::Tensor> parts = all_parts(l, t);
    for (const at::Tensor& p : parts) EXPECT_EQ(p.sizes().vec(), l.local_shape());
    EXPECT_TRUE(at::equal(join_parts(l, parts), t)) << l.cuts.size() << " cuts";
  }
  // Split along columns keeps whole rows of the part: member 1 holds columns 5..9.
  EXPECT_TRUE(at::equal(cut_part(Layout{{6, 10}, {cols}}, a, {1}), a.narrow(1, 5, 5)));
  // The padding is zero and only at the end of the last chunk.
  at::Tensor last = cut_part(Layout{{7, 3}, {flat4}}, odd, {3});
  EXPECT_TRUE(at::equal(last.narrow(0, 0, 3), odd.flatten().narrow(0, 18, 3)));
  EXPECT_EQ(last.narrow(0, 3, 3).abs().sum().item<double>(), 0.0);
  // A whole tensor of the wrong shape is refused with both shapes named.
  EXPECT_THROW(cut_part(Layout{{6, 10}, {rows}}, odd, {0}), Error);
}

TEST(Layout, StateKeysNameTheirParameter) {
  Layouts l{{"blocks.0.ffn.0.weight", Layout{{4, 2}, {}}}};
  EXPECT_EQ(state_param("blocks.0.ffn.0.weight", l), "blocks.0.ffn.0.weight");
  EXPECT_EQ(state_param("exp_avg/blocks.0.ffn.0.weight", l), "blocks.0.ffn.0.weight");
  EXPECT_EQ(state_param("exp_avg_sq/blocks.0.ffn.0.weight", l), "blocks.0.ffn.0.weight");
  EXPECT_EQ(state_param("step", l), "");
  EXPECT_EQ(state_param("rng/train.dp1", l), "");
}

TEST(Layout, PlannedLayoutsAreTensorParallelThenFsdp) {
  Config cfg = test::tiny_config({"model.heads=4"});
  DiT model(cfg.model);
  TensorMap whole;
  for (auto& item : model->named_parameters()) whole[item.key()] = item.value();
  ParallelConfig p;
  p.tensor = 2, p.shard = 3;
  const Layouts l = planned_layouts(whole, p);
  const Cut fsdp{Cut::Kind::Flat, "shard", 0, 3};
  EXPECT_EQ(l.at("blocks.1.self_attn.q.weight").cuts, (std::vector<Cut>{{Cut::Kind::Split, "tensor", 0, 2}, fsdp}));
  EXPECT_EQ(l.at("blocks.1.cross_attn.o.weight").cuts, (std::vector<Cut>{{Cut::Kind::Split, "tensor", 1, 2}, fsdp}));
  EXPECT_EQ(l.at("blocks.0.ffn.2.bias").cuts, std::vector<Cut>{fsdp});  // added after the sum: replicated
  EXPECT_EQ(l.at("blocks.0.self_attn.norm_k.weight").local_shape(),
            std::vector<int64_t>{(cfg.model.dim / 2 + 2) / 3});
  EXPECT_EQ(l.at("patch_embedding.weight").cuts, std::vector<Cut>{fsdp});
  // Degree 1 cuts nothing.
  for (const auto& [name, layout] : planned_layouts(whole, ParallelConfig{})) EXPECT_TRUE(layout.cuts.empty()) << name;
}

}  // namespace
}  // namespace vidit
