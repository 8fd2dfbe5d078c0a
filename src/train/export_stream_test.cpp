// `vidit export` reads a checkpoint one whole tensor at a time (open_checkpoint_weights, a
// TensorStream) and writes it as it reads. What it writes is, file for file and byte for byte,
// what the whole weights in a map give (both layouts, in one file or in shards), whether one rank
// or two FSDP ranks saved the checkpoint; a LoRA run's export is merge_lora of its base (a
// release, a vidit run, or the run's own seeded init) and its adapters; and the host never holds
// much more than the largest tensor, where reading the checkpoint whole holds the model.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "../../tests/test_util.h"
#include "core/host_peak.h"
#include "core/storage.h"
#include "core/tensor_stream.h"
#include "model/dit.h"
#include "model/lora.h"
#include "model/state_dict.h"
#include "model/weight_layout.h"
#include "parallel/layout.h"
#include "checkpoint/checkpoint.h"
#include "train/run_weights.h"

namespace vidit {
namespace {

namespace fs = std::filesystem;
using test::ScratchDir;

// Random whole weights of `m`'s shape (not its init), official names.
TensorMap random_weights(const ModelConfig& m, int seed) {
  at::manual_seed(seed);
  TensorMap w;
  for (const auto& [name, shape] : transformer_shapes(m)) w[name] = at::randn(shape);
  return w;
}

// A checkpoint of `model` and `ema` (whole tensors, any names) at step 7 under the run folder
// `run`, saved as `parts` FSDP ranks save it: each tensor flattened and cut in `parts` (the last
// zero-padded), each part written by its own writer, then committed. Returns its folder.
std::string save_in_parts(const Config& cfg, const std::string& run, const TensorMap& model, const TensorMap& ema,
                          int parts) {
  CheckpointState s;
  s.step = 7;
  s.config_toml = config_to_toml(cfg);
  if (parts == 1) {
    s.model = model, s.ema = ema;
    return save_checkpoint(run, s, 3);
  }
  for (const auto& [name, t] : model) s.layouts[name] = Layout{t.sizes().vec(), {Cut{Cut::Kind::Flat, "shard", 0, parts}}};
  s.part.dims = {"shard"};
  s.part.degrees = {parts};
  const std::string tmp = begin_checkpoint(run, s.step, local_storage());
  std::vector<PartRecord> records;
  for (int i = 0; i < parts; ++i) {
    CheckpointState p = s;
    p.part.index = i;
    for (const auto& [name, t] : model) p.model[name] = cut_part(s.layouts.at(name), t, {i});
    for (const auto& [name, t] : ema) p.ema[name] = cut_part(s.layouts.at(name), t, {i});
    records.push_back(write_checkpoint_part(tmp, p, !ema.empty(), local_storage()));
  }
  return commit_checkpoint(run, s, records, 3, 0, local_storage());
}

template <class Weights>
void write_layout(WeightLayout layout, const Weights& w, const ModelConfig& m, const std::string& out, uint64_t shard) {
  if (layout == WeightLayout::diffusers)
    write_diffusers_transformer(w, m, out, shard);
  else
    write_wan_transformer(w, m, out, shard);
}

std::map<std::string, std::string> files_of(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    std::ifstream in(e.path(), std::ios::binary);
    out[e.path().filename().string()] = std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  return out;
}

// The same file names, each with the same bytes; returns how many .safetensors files there are.
size_t expect_same_files(const std::string& got, const std::string& want) {
  const auto a = files_of(got), b = files_of(want);
  std::vector<std::string> na, nb;
  for (const auto& [name, bytes] : a) na.push_back(name);
  for (const auto& [name, bytes] : b) nb.push_back(name);
  EXPECT_EQ(na, nb) << got << " vs " << want;
  size_t weights = 0;
  for (const auto& [name, bytes] : a) {
    weights += name.ends_with(".safetensors");
    auto it = b.find(name);
    if (it != b.end()) {
      EXPECT_TRUE(bytes == it->second) << got << "/" << name << " differs from " << want << "/" << name;
    }
  }
  return weights;
}

TEST(ExportStream, CheckpointOfOneOrTwoPartsExportsAsItsWeightsInAMapDo) {
  ScratchDir dir("export_stream");
  const Config cfg = test::tiny_config({"model.rope_theta=10000.0"});
  const TensorMap model = random_weights(cfg.model, 1), ema = random_weights(cfg.model, 2);
  for (int parts : {1, 2}) {
    const std::string run = dir / ("run" + std::to_string(parts));
    const std::string ckpt = save_in_parts(cfg, run, model, ema, parts);
    if (parts == 2) {
      ASSERT_TRUE(fs::exists(ckpt + "/ema.part-00001-of-00002.safetensors")) << "not saved in parts";
    }
    for (bool use_ema : {true, false})
      for (WeightLayout layout : {WeightLayout::wan, WeightLayout::diffusers})
        for (uint64_t shard : {uint64_t(20'000), kDefaultMaxShardBytes}) {
          const std::string tag = std::to_string(parts) + (use_ema ? "_ema_" : "_raw_") + layout_name(layout) +
                                  (shard == kDefaultMaxShardBytes ? "_one" : "_sharded");
          SCOPED_TRACE(tag);
          const CheckpointStream w = open_checkpoint_weights(run, use_ema);
          EXPECT_EQ(w.checkpoint, ckpt);
          EXPECT_EQ(w.step, 7);
          EXPECT_EQ(w.ema, use_ema);
          EXPECT_TRUE(w.adapters.empty());
          write_layout(layout, w.weights, cfg.model, dir / (tag + "_streamed"), shard);
          write_layout(layout, use_ema ? ema : model, cfg.model, dir / (tag + "_whole"), shard);
          const size_t files = expect_same_files(dir / (tag + "_streamed"), dir / (tag + "_whole"));
          if (shard == kDefaultMaxShardBytes)
            EXPECT_EQ(files, 1u);
          else
            EXPECT_GT(files, 3u) << "not sharded into several files";
        }
  }
}

TEST(ExportStream, HostHoldsAboutTheLargestTensorNotTheModel) {
  ScratchDir dir("export_stream_peak");
  // 4 blocks of width 256: about 19 MB in fp32, in 101 tensors, the largest time_projection's
  // 1.5 MiB.
  const Config cfg = test::tiny_config({"model.dim=256", "model.ffn_dim=1024", "model.heads=4", "model.text_dim=64",
                                        "model.freq_dim=64", "model.layers=4", "model.rope_theta=10000.0"});
  const TensorMap ema = random_weights(cfg.model, 3);
  uint64_t model_bytes = 0, largest = 0;
  for (const auto& [name, t] : ema) {
    const uint64_t b = uint64_t(t.numel()) * t.element_size();
    model_bytes += b, largest = std::max(largest, b);
  }
  ASSERT_GT(model_bytes, 12 * largest);
  const std::string run = dir / "run";
  save_in_parts(cfg, run, random_weights(cfg.model, 4), ema, 2);
  {
    HostPeak peak;
    ASSERT_TRUE(peak.active());
    write_diffusers_transformer(open_checkpoint_weights(run).weights, cfg.model, dir / "out", 4'000'000);
    EXPECT_GE(peak.peak(), int64_t(largest)) << "the measure did not see the largest tensor put together";
    EXPECT_LT(peak.peak(), int64_t(3 * largest)) << "of a model of " << model_bytes << " bytes";
    EXPECT_LT(peak.peak(), int64_t(model_bytes / 4));
  }
  {
    HostPeak whole;  // the measure itself, on the whole read: it holds the model
    const CheckpointWeights w = read_checkpoint_weights(run);
    EXPECT_GE(whole.peak(), int64_t(model_bytes));
  }
  const TensorMap back = read_transformer_weights(dir / "out");
  ASSERT_EQ(back.size(), ema.size());
  for (const auto& [k, v] : ema) EXPECT_TRUE(at::equal(back.at(k), v)) << k;
}

TEST(ExportStream, LoraRunExportsMergeLoraOfItsBaseAndAdapters) {
  ScratchDir dir("export_stream_lora");
  const std::vector<std::string> sets = {"model.rope_theta=10000.0", "lora.rank=4", "lora.alpha=8", "train.seed=123"};
  const Config plain = test::tiny_config(sets);
  // Bases: a release in diffusers' layout (renamed as it is read); a full vidit run (its EMA
  // weights, read through its own stream); the LoRA run's own seeded init (no train.init_from).
  const TensorMap release = random_weights(plain.model, 5);
  write_diffusers_transformer(release, plain.model, dir / "release");
  const TensorMap base_run_ema = random_weights(plain.model, 6);
  save_in_parts(test::tiny_config({"model.rope_theta=10000.0"}), dir / "base_run", random_weights(plain.model, 7),
                base_run_ema, 2);
  TensorMap init;
  {
    DiT m(plain.model);
    m->init_weights(123);
    for (const auto& [k, v] : state_dict(*m)) init[k] = v.clone();
  }
  const std::vector<std::pair<std::string, const TensorMap*>> bases = {
      {dir / "release", &release}, {dir / "base_run", &base_run_ema}, {"", &init}};
  const char* projections[] = {"blocks.0.self_attn.q", "blocks.1.cross_attn.o", "blocks.1.ffn.0", "blocks.0.ffn.2"};
  for (size_t b = 0; b < bases.size(); ++b) {
    const auto& [init_from, base_ptr] = bases[b];
    const TensorMap& base = *base_ptr;
    Config cfg = plain;
    cfg.train.init_from = init_from;
    // Trained adapters (B not zero); the EMA's differ from the raw ones.
    auto adapters = [&](int seed) {
      at::manual_seed(seed);
      TensorMap a;
      for (const std::string p : projections) {
        const at::Tensor& W = base.at(p + ".weight");
        a[p + ".lora_A.weight"] = at::randn({4, W.size(1)});
        a[p + ".lora_B.weight"] = at::randn({W.size(0), 4});
      }
      return a;
    };
    const TensorMap raw = adapters(8), ema = adapters(9);
    const TensorMap merged = merge_lora(base, ema, 2.0);
    // merge_lora is W + scale * B A as it always was computed, bit for bit.
    for (const std::string p : projections) {
      const at::Tensor& W = base.at(p + ".weight");
      EXPECT_TRUE(at::equal(merged.at(p + ".weight"), W + 2.0 * at::mm(ema.at(p + ".lora_B.weight"), ema.at(p + ".lora_A.weight"))))
          << p;
    }
    for (int parts : {1, 2}) {
      const std::string tag = "lora" + std::to_string(b) + "_" + std::to_string(parts);
      SCOPED_TRACE(tag + " on '" + init_from + "'");
      const std::string run = dir / tag;
      save_in_parts(cfg, run, raw, ema, parts);
      const CheckpointStream w = open_checkpoint_weights(run);
      EXPECT_TRUE(w.ema);
      EXPECT_EQ(w.adapters.size(), ema.size());
      EXPECT_DOUBLE_EQ(w.lora_scale, 2.0);
      for (const auto& [k, v] : ema) EXPECT_TRUE(at::equal(w.adapters.at(k), v)) << k;
      for (WeightLayout layout : {WeightLayout::wan, WeightLayout::diffusers}) {
        const std::string out = dir / (tag + "_" + layout_name(layout));
        write_layout(layout, w.weights, cfg.model, out + "_streamed", 30'000);
        write_layout(layout, merged, cfg.model, out + "_whole", 30'000);
        EXPECT_GT(expect_same_files(out + "_streamed", out + "_whole"), 2u);
      }
      const TensorMap back = read_transformer_weights(dir / (tag + "_wan_streamed"));
      ASSERT_EQ(back.size(), merged.size());
      for (const auto& [k, v] : merged) EXPECT_TRUE(at::equal(back.at(k), v)) << k;
    }
  }
  // A base that has moved is named, with the key to point at it.
  fs::rename(dir / "release", dir / "moved");
  const std::string msg = test::message_of([&] { open_checkpoint_weights(dir / "lora0_1"); });
  EXPECT_NE(msg.find("train.init_from"), std::string::npos) << msg;
  EXPECT_NE(msg.find(dir / "release"), std::string::npos) << msg;
}

}  // namespace
}  // namespace vidit
