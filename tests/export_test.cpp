// `vidit export` on a checkpoint two FSDP ranks saved in parts (a real mpirun job): the
// diffusers and the official folders it writes hold exactly the checkpoint's EMA weights, diffusers'
// own WanTransformer3DModel.from_pretrained opens the diffusers one with every key in place and
// computes what our DiT computes, and an export target that already holds files is refused
// without touching them.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <tuple>

#include "core/safetensors.h"
#include "model/dit.h"
#include "model/state_dict.h"
#include "model/weight_layout.h"
#include "mpi_test_util.h"
#include "test_util.h"
#include "checkpoint/checkpoint.h"

namespace vidit {
namespace {

namespace fs = std::filesystem;

#ifndef VIDIT_PYTHON
#define VIDIT_PYTHON "python3"
#endif

TEST(Export, ShardedCheckpointToDiffusersAndWanFolders) {
  std::string why;
  if (test::mpi_launcher(&why).empty()) GTEST_SKIP() << why;
  test::ScratchDir dir("export");
  const std::string run = dir / "run";
  auto r = test::mpirun(2, std::string(VIDIT_BINARY) + test::kTinyTrainArgs + run +
                               " parallel.shard=2 model.rope_theta=10000.0 train.ema_decay=0.9");
  ASSERT_EQ(r.status, 0) << r.output;
  const auto latest = latest_checkpoint(run);
  ASSERT_TRUE(latest);
  ASSERT_TRUE(fs::exists(*latest + "/model.part-00001-of-00002.safetensors")) << "not saved in parts";
  const CheckpointState s = load_checkpoint(*latest);
  ASSERT_FALSE(s.ema.empty());

  for (const std::string format : {"diffusers", "wan"}) {
    const std::string out = dir / format;
    auto e = test::run_process(std::string(VIDIT_BINARY) + " export --format " + format + " " + run + " " + out + " 2>&1");
    ASSERT_EQ(e.status, 0) << e.output;
    const TensorMap back = read_transformer_weights(out);
    ASSERT_EQ(back.size(), s.ema.size()) << format;
    for (const auto& [k, v] : s.ema) {
      ASSERT_TRUE(back.count(k)) << format << " lacks " << k;
      EXPECT_TRUE(at::equal(back.at(k), v)) << format << " " << k;
    }
  }
  // An export target that holds files is refused, and they stay.
  std::ofstream(dir / "diffusers/keep.txt") << "mine";
  auto again = test::run_process(std::string(VIDIT_BINARY) + " export " + run + " " + (dir / "diffusers") + " 2>&1");
  EXPECT_NE(again.status, 0);
  EXPECT_NE(again.output.find(dir / "diffusers"), std::string::npos) << again.output;
  EXPECT_TRUE(fs::exists(dir / "diffusers/keep.txt"));
  fs::remove(dir / "diffusers/keep.txt");

  // diffusers opens the folder as it is and computes what our DiT computes with these weights.
  Config cfg = parse_config("", "<test>", {});
  cfg.model = read_transformer_config(dir / "diffusers");
  DiT model(cfg.model);
  load_state_dict(*model, s.ema, "ema");
  model->eval();
  at::manual_seed(5);
  const at::Tensor x = at::randn({1, 4, 2, 4, 4}), t = at::tensor({321.0f}), text = at::randn({1, 4, 8});
  at::Tensor ours;
  {
    at::NoGradGuard g;
    ours = model->forward(x, t, text);
  }
  save_safetensors(dir / "in.safetensors", {{"x", x}, {"t", t}, {"text", text}});
  auto py = test::run_process(std::string(VIDIT_PYTHON) + " " + VIDIT_SOURCE_DIR + "/tests/reference/diffusers_wan_reference.py forward " +
                              (dir / "diffusers") + " " + (dir / "in.safetensors") + " " + (dir / "theirs.safetensors") + " 2>&1");
  if (py.status == 3) GTEST_SKIP() << py.output;
  ASSERT_EQ(py.status, 0) << py.output;
  const at::Tensor theirs = load_safetensors(dir / "theirs.safetensors").at("out");
  // diffusers computes the timestep sinusoid in fp32, we in fp64: a few 1e-6 apart.
  EXPECT_TRUE(at::allclose(ours, theirs, 1e-4, 1e-4)) << (ours - theirs).abs().max().item<double>();
}

// A LoRA run's adapters as diffusers reads them: `vidit export --format lora` read by diffusers' own
// WanLoraLoaderMixin.lora_state_dict (the reader of WanPipeline.load_lora_weights) and fused into
// the base model gives what our merged export (--format diffusers) computes in diffusers.
TEST(Export, LoraFileReadByDiffusersEqualsTheMergedExport) {
  test::ScratchDir dir("export_lora");
  const std::string tiny = test::kTinyTrainArgs;
  auto base = test::run_process(std::string(VIDIT_BINARY) + tiny + (dir / "base") +
                                " model.rope_theta=10000.0 train.ema_decay=0 train.steps=12 train.lr=1e-2 train.warmup_steps=0 2>&1");
  ASSERT_EQ(base.status, 0) << base.output;
  auto lora = test::run_process(std::string(VIDIT_BINARY) + tiny + (dir / "lora") +
                                " model.rope_theta=10000.0 train.ema_decay=0 train.steps=12 train.lr=2e-2 train.warmup_steps=0"
                                " lora.rank=4 lora.alpha=2 'lora.targets=[\"self_attn.q\",\"self_attn.o\",\"cross_attn.v\",\"ffn.0\",\"ffn.2\"]'"
                                " train.init_from=" + (dir / "base") + " 2>&1");
  ASSERT_EQ(lora.status, 0) << lora.output;
  for (const auto& [from, format, out] : {std::tuple<std::string, std::string, std::string>{dir / "base", "diffusers", dir / "base_d"},
                                          {dir / "lora", "diffusers", dir / "merged_d"},
                                          {dir / "lora", "lora", dir / "adapters.safetensors"}}) {
    auto e = test::run_process(std::string(VIDIT_BINARY) + " export --format " + format + " " + from + " " + out + " 2>&1");
    ASSERT_EQ(e.status, 0) << e.output;
  }
  at::manual_seed(7);
  save_safetensors(dir / "in.safetensors",
                   {{"x", at::randn({1, 4, 2, 4, 4})}, {"t", at::tensor({640.0f})}, {"text", at::randn({1, 4, 8})}});
  const std::string ref = std::string(VIDIT_PYTHON) + " " + VIDIT_SOURCE_DIR + "/tests/reference/diffusers_wan_reference.py forward ";
  auto with_lora = test::run_process(ref + (dir / "base_d") + " " + (dir / "in.safetensors") + " " + (dir / "a.safetensors") +
                                     " " + (dir / "adapters.safetensors") + " 2>&1");
  if (with_lora.status == 3) GTEST_SKIP() << with_lora.output;
  ASSERT_EQ(with_lora.status, 0) << with_lora.output;
  EXPECT_NE(with_lora.output.find("fused 10 LoRA adapters"), std::string::npos) << with_lora.output;
  auto merged = test::run_process(ref + (dir / "merged_d") + " " + (dir / "in.safetensors") + " " + (dir / "b.safetensors") + " 2>&1");
  ASSERT_EQ(merged.status, 0) << merged.output;
  auto plain = test::run_process(ref + (dir / "base_d") + " " + (dir / "in.safetensors") + " " + (dir / "c.safetensors") + " 2>&1");
  ASSERT_EQ(plain.status, 0) << plain.output;
  const at::Tensor a = load_safetensors(dir / "a.safetensors").at("out"), b = load_safetensors(dir / "b.safetensors").at("out"),
                   c = load_safetensors(dir / "c.safetensors").at("out");
  // The adapters changed the model, and diffusers' reading of them is the merge (bf16 file: 1e-2).
  EXPECT_GT((b - c).abs().max().item<double>(), 1e-3);
  EXPECT_LT((a - b).abs().max().item<double>(), 1e-2 * (b - c).abs().max().item<double>() + 1e-6)
      << (a - b).abs().max().item<double>() << " vs a LoRA effect of " << (b - c).abs().max().item<double>();
}

}  // namespace
}  // namespace vidit
