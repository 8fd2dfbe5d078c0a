#include "core/config.h"

#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "core/error.h"

namespace vidit {
namespace {

std::string error_of(const std::string& toml, const std::vector<std::string>& sets = {}) {
  try {
    parse_config(toml, "cfg.toml", sets);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Config, DefaultsAreTheDemoAndValid) {
  Config c = parse_config("", "<defaults>");
  EXPECT_EQ(c.data.source, DataSource::demo);
  EXPECT_EQ(c.model.in_channels, 3 * c.demo.codec_block * c.demo.codec_block);
}

TEST(Config, UnknownKeySuggestsClosest) {
  std::string e = error_of("[train]\nlearning_rate = 1e-4\nbatch_sise = 3\n");
  EXPECT_NE(e.find("cfg.toml"), std::string::npos) << e;
  EXPECT_NE(e.find("unknown key"), std::string::npos) << e;
  EXPECT_TRUE(e.find("did you mean 'train.batch_size'") != std::string::npos ||
              e.find("did you mean 'train.") != std::string::npos) << e;
  e = error_of("[train]\nbatch_sise = 3\n");
  EXPECT_NE(e.find("'train.batch_sise'"), std::string::npos) << e;
  EXPECT_NE(e.find("did you mean 'train.batch_size'"), std::string::npos) << e;
  e = error_of("[modle]\ndim = 3\n");
  EXPECT_NE(e.find("unknown section 'modle'; did you mean 'model'"), std::string::npos) << e;
}

TEST(Config, WrongTypeNamesKey) {
  std::string e = error_of("[model]\ndim = \"big\"\n");
  EXPECT_NE(e.find("'model.dim' must be an integer"), std::string::npos) << e;
  e = error_of("[train]\nlr = \"fast\"\n");
  EXPECT_NE(e.find("'train.lr' must be a number"), std::string::npos) << e;
  e = error_of("[model]\npatch = [1, 2]\n");
  EXPECT_NE(e.find("'model.patch' must be an array of 3 integers"), std::string::npos) << e;
}

TEST(Config, ImpossibleShapesRefused) {
  std::string e = error_of("[model]\ndim = 100\nheads = 3\n");
  EXPECT_NE(e.find("model.dim (100) must be divisible by model.heads (3)"), std::string::npos) << e;
  e = error_of("[data]\nsource = \"synthetic\"\nlatent_height = 7\n");
  EXPECT_NE(e.find("data.latent_height (7) is not divisible by the patch size 2"), std::string::npos) << e;
  e = error_of("[train]\nprecision = \"fp16\"\n");
  EXPECT_NE(e.find("train.precision"), std::string::npos) << e;
  // FP8 is a training precision, not a storage or reduction type.
  e = error_of("[parallel]\nreduce_dtype = \"fp8\"\n");
  EXPECT_NE(e.find("parallel.reduce_dtype"), std::string::npos) << e;
  EXPECT_NE(e.find("\"fp32\" or \"bf16\""), std::string::npos) << e;
  e = error_of("[data]\ncache_dtype = \"fp8_rowwise\"\n");
  EXPECT_NE(e.find("data.cache_dtype"), std::string::npos) << e;
}

// [checkpoint]'s keys were train.ckpt_* / train.keep_*: a config with the old names still loads,
// read as the new ones (a warning names each); both names at once is refused.
TEST(Config, OldCheckpointKeysAreReadAsTheNewOnes) {
  const Config c = parse_config("[train]\nckpt_every = 7\nkeep_checkpoints = 5\nckpt_async = false\n", "old.toml",
                                {"train.ckpt_timeout_s=60", "train.keep_every=100"});
  EXPECT_EQ(c.checkpoint.every, 7);
  EXPECT_EQ(c.checkpoint.keep, 5);
  EXPECT_FALSE(c.checkpoint.async);
  EXPECT_DOUBLE_EQ(c.checkpoint.timeout_s, 60);
  EXPECT_EQ(c.checkpoint.keep_every, 100);
  EXPECT_EQ(config_to_toml(c).find("ckpt_"), std::string::npos) << "written back under the new names";
  EXPECT_EQ(parse_config(config_to_toml(c), "again").checkpoint.every, 7);
  try {
    parse_config("[train]\nckpt_every = 7\n[checkpoint]\nevery = 3\n", "both.toml");
    FAIL() << "both names accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("train.ckpt_every and checkpoint.every are both set"), std::string::npos) << e.what();
  }
}

TEST(Config, SetOverridesAndTypos) {
  Config c = parse_config("", "x", {"train.lr=3e-4", "train.precision=bf16", "model.patch=[1, 2, 2]"});
  EXPECT_DOUBLE_EQ(c.train.lr, 3e-4);
  EXPECT_EQ(c.train.precision, Precision::bf16);
  std::string e = error_of("", {"train.stepz=3"});
  EXPECT_NE(e.find("did you mean 'train.steps'"), std::string::npos) << e;
  e = error_of("", {"trian.steps=3"});
  EXPECT_NE(e.find("did you mean 'train'"), std::string::npos) << e;
  e = error_of("", {"steps=3"});
  EXPECT_NE(e.find("section.key"), std::string::npos) << e;
}

TEST(Config, ResolvedTomlRoundTrips) {
  // Strings that need escaping in TOML (quotes, backslashes, a newline) survive the round trip.
  Config a = parse_config("", "x", {"train.lr=0.000123", "model.layers=3", "train.out_dir=\"runs/x y\"",
                                    "data.manifest=\"a \\\"quoted\\\" C:\\\\path\\nnext\"", "train.seed=12345678901",
                                    "train.precision=bf16", "buckets.aspect_ratios=[0.5625, 1.0, 1.7777777777777777]"});
  Config b = parse_config(config_to_toml(a), "y");
  EXPECT_EQ(config_to_toml(a), config_to_toml(b));
  EXPECT_EQ(b.model.layers, 3);
  EXPECT_EQ(b.train.out_dir, "runs/x y");
  EXPECT_EQ(b.data.manifest, "a \"quoted\" C:\\path\nnext");
  EXPECT_EQ(b.train.seed, 12345678901ull);
  EXPECT_EQ(b.train.precision, Precision::bf16);
  EXPECT_EQ(b.buckets.aspect_ratios, a.buckets.aspect_ratios);
  EXPECT_EQ(b.train.lr, 0.000123);
}

TEST(Config, ChoicesAreCheckedWhenRead) {
  std::string e = error_of("[train]\nschedule = \"cosin\"\n");
  EXPECT_NE(e.find("'train.schedule' must be one of \"cosine\", \"constant\" (got \"cosin\"; did you mean \"cosine\"?)"),
            std::string::npos) << e;
  e = error_of("", {"data.decoder=gpu"});
  EXPECT_NE(e.find("'data.decoder' must be one of \"auto\", \"cpu\", \"nvdec\""), std::string::npos) << e;
  EXPECT_EQ(parse_config("", "x", {"data.decoder=auto"}).data.decoder, Decoder::automatic);
  EXPECT_EQ(parse_config("", "x", {"train.device=\"cuda\""}).train.device, DeviceChoice::cuda);
  // A key's own check names the key and the value.
  e = error_of("[train]\nema_decay = 1.0\n");
  EXPECT_NE(e.find("'train.ema_decay' must be in [0, 1) (got 1)"), std::string::npos) << e;
  e = error_of("", {"buckets.frames=[5, 0]"});
  EXPECT_NE(e.find("'buckets.frames' must be > 0 (got [5, 0])"), std::string::npos) << e;
}

// docs/CONFIG.md is what `vidit keys` prints from the declarations.
TEST(Config, ReferenceDocIsCurrent) {
  std::ifstream in(std::string(VIDIT_SOURCE_DIR) + "/docs/CONFIG.md");
  ASSERT_TRUE(in) << "docs/CONFIG.md is missing: build/vidit keys > docs/CONFIG.md";
  std::stringstream doc;
  doc << in.rdbuf();
  EXPECT_EQ(doc.str(), config_reference()) << "docs/CONFIG.md is stale: build/vidit keys > docs/CONFIG.md";
  // Every key is in it.
  for (const char* key : {"`dim`", "`token_budget`", "`recompute_blocks`", "`reduce_dtype`", "`colourless_captions`"})
    EXPECT_NE(doc.str().find(key), std::string::npos) << key;
}

TEST(Config, ShippedDemoConfigIsTheEmbeddedDefault) {
  const std::string dir = std::string(VIDIT_SOURCE_DIR) + "/configs/";
  Config demo = load_config(dir + "demo.toml");
  EXPECT_EQ(config_to_toml(demo), config_to_toml(parse_config("", "<defaults>")))
      << "configs/demo.toml must equal the embedded defaults";
  EXPECT_THROW(load_config(dir + "no_such.toml"), Error);
}

}  // namespace
}  // namespace vidit
