// Checkpoints of the first format ("vidit-checkpoint-1") still load: a run's state is written
// the way that format wrote it — whole files, or FSDP x tensor-parallel parts
// {what}.tp-0000t-of-0000T.shard-0000k-of-0000S.safetensors holding each split parameter's rows
// or columns t, flattened, zero-padded and cut in S chunks, with meta.json's "shards" (count and
// the parts' shapes) and "tensor" (count and split dims) — and a resume from it continues
// exactly like the run that saved it, once `vidit checkpoint seal` has recorded its checksums
// (that format's early checkpoints have no manifest).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "../../tests/test_util.h"
#include "parallel/tensor_parallel.h"
#include "checkpoint/checkpoint.h"
#include "train/trainer.h"

namespace vidit {
namespace {

namespace fs = std::filesystem;

// The first format's piece (t, k) of a whole tensor: rows / columns t of T along `dim` (< 0:
// not split), flattened, padded to a multiple of S, chunk k.
at::Tensor v1_piece(const at::Tensor& whole, int dim, int64_t t, int64_t T, int64_t k, int64_t S) {
  at::Tensor part = dim < 0 ? whole : whole.narrow(dim, t * (whole.size(dim) / T), whole.size(dim) / T);
  const int64_t n = part.numel(), chunk = (n + S - 1) / S;
  return at::constant_pad_nd(part.flatten(), {0, chunk * S - n}).narrow(0, k * chunk, chunk).clone();
}

// Writes `s` (whole tensors) as a first-format checkpoint at <out>/checkpoints/step_N, sharded
// S ways and split T ways (S = 0: whole files), and points `latest` at it.
void write_v1(const std::string& out, const CheckpointState& s, int64_t S, int64_t T) {
  char name[64];
  std::snprintf(name, sizeof name, "step_%08lld", (long long)s.step);
  const fs::path dir = fs::path(out) / "checkpoints" / name;
  fs::create_directories(dir);
  nlohmann::json meta = {{"format", "vidit-checkpoint-1"},
                         {"step", s.step},
                         {"ema_updates", s.ema_updates},
                         {"sampler", {{"seed", s.sampler.seed}, {"epoch", s.sampler.epoch}, {"position", s.sampler.position}}},
                         {"config", s.config_toml}};
  std::map<std::string, std::vector<int64_t>> shapes;
  std::map<std::string, int> split;
  for (const auto& [key, t] : s.model) {
    const std::vector<Cut> cuts = tensor_parallel_cuts(key, int(T));
    std::vector<int64_t> shape = t.sizes().vec();
    if (!cuts.empty()) split[key] = cuts[0].dim, shape[size_t(cuts[0].dim)] /= T;
    shapes[key] = shape;
  }
  auto param_of = [&](const std::string& key) {
    if (shapes.count(key)) return key;
    const size_t slash = key.find('/');
    return slash != std::string::npos && shapes.count(key.substr(slash + 1)) ? key.substr(slash + 1) : std::string();
  };
  for (const auto& [what, m] : std::map<std::string, const TensorMap*>{{"model", &s.model}, {"ema", &s.ema},
                                                                       {"optimizer", &s.optimizer}}) {
    if (S == 0) {
      save_safetensors((dir / (what + ".safetensors")).string(), *m);
      continue;
    }
    for (int64_t t = 0; t < T; ++t)
      for (int64_t k = 0; k < S; ++k) {
        TensorMap part;
        for (const auto& [key, x] : *m) {
          const std::string p = param_of(key);
          part[key] = p.empty() ? x : v1_piece(x, split.count(p) ? split.at(p) : -1, t, T, k, S);
        }
        char file[160];
        if (T > 1)
          std::snprintf(file, sizeof file, "%s.tp-%05lld-of-%05lld.shard-%05lld-of-%05lld.safetensors", what.c_str(),
                        (long long)t, (long long)T, (long long)k, (long long)S);
        else
          std::snprintf(file, sizeof file, "%s.shard-%05lld-of-%05lld.safetensors", what.c_str(), (long long)k,
                        (long long)S);
        save_safetensors((dir / file).string(), part);
      }
  }
  if (S > 0) meta["shards"] = {{"count", S}, {"shapes", shapes}};
  if (T > 1) meta["tensor"] = {{"count", T}, {"split", split}};
  std::ofstream((dir / "meta.json").string()) << meta.dump(2);
  std::ofstream((fs::path(out) / "checkpoints" / "latest").string()) << name << "\n";
}

TEST(Checkpoint, FirstFormatLoadsAndResumesExactly) {
  test::ScratchDir dir("ckpt_v1");
  Config cfg = test::tiny_config({"model.heads=4", "model.dim=40", "model.ffn_dim=50", "train.steps=8",
                                  "train.warmup_steps=2", "train.out_dir=" + dir.path() + "/full"});
  auto data = std::make_shared<SyntheticDataset>(cfg, 16, 5);
  auto null_text = at::zeros({cfg.model.text_len, cfg.model.text_dim});
  Trainer full(cfg, data, null_text);
  full.fit(4, false);
  const CheckpointState at4 = load_checkpoint(*latest_checkpoint(cfg.train.out_dir));
  const std::vector<double> want = full.fit(-1, false);

  // Whole files; FSDP over 3 (most tensors padded); FSDP over 2 x tensor parallel over 2.
  for (auto [S, T] : std::vector<std::pair<int64_t, int64_t>>{{0, 1}, {3, 1}, {2, 2}}) {
    Config c = cfg;
    c.train.out_dir = dir.path() + "/v1_" + std::to_string(S) + "x" + std::to_string(T);
    write_v1(c.train.out_dir, at4, S, T);
    // Without a manifest, nothing it holds can be verified: refused as it is, loaded once sealed.
    const std::string v1 = *latest_checkpoint(c.train.out_dir);
    {
      Trainer refused(c, data, null_text);
      EXPECT_THROW(refused.resume(), CheckpointUnreadable);
    }
    seal_checkpoint(v1);
    Trainer resumed(c, data, null_text);
    ASSERT_TRUE(resumed.resume());
    EXPECT_EQ(resumed.steps_done(), 4);
    for (const auto& [name, w] : at4.model) EXPECT_TRUE(at::equal(resumed.weights().at(name), w)) << name;
    const std::vector<double> got = resumed.fit(-1, false);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], want[i]) << "S " << S << " T " << T << " step " << i + 5;
  }
}

}  // namespace
}  // namespace vidit
