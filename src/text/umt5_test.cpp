// The umT5 encoder against transformers' UMT5EncoderModel (tests/reference/umt5_reference.py):
// a small config (reaching the log-spaced and clamped position buckets) and umT5-XXL's layer
// shape, Hugging Face single-file and sharded folders, Wan's key names, and the errors.
#include "text/umt5.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include "../../tests/test_util.h"
#include "core/error.h"
#include "core/safetensors.h"
#include "text/text_test_util.h"

namespace fs = std::filesystem;

namespace vidit::text {
namespace {

using test::relative_error;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no vidit::Error)";
}

TEST(Umt5Buckets, BidirectionalBucketsOfT5) {
  // 32 buckets, max distance 128: keys before the query use 0..15, after it 16..31; distances
  // 0..7 exact, then log-spaced up to 128, then the last bucket of the half.
  const at::Tensor b = relative_position_buckets(200, 32, 128, at::kCPU);
  EXPECT_EQ(b[0][0].item<int64_t>(), 0);
  EXPECT_EQ(b[5][0].item<int64_t>(), 5);       // key 5 before the query
  EXPECT_EQ(b[0][5].item<int64_t>(), 16 + 5);  // key 5 after
  EXPECT_EQ(b[199][0].item<int64_t>(), 15);    // beyond max_distance: the last bucket
  EXPECT_EQ(b[0][199].item<int64_t>(), 31);
  EXPECT_EQ(b[8][0].item<int64_t>(), 8);       // first log-spaced bucket
}

TEST(Umt5Reference, SmallConfigEqualsTransformers) {
  VIDIT_UMT5_REFERENCE(dir);
  const TensorMap io = load_safetensors(dir + "/small_io.safetensors");
  const Umt5Encoder enc = Umt5Encoder::load(dir + "/small", at::kFloat, at::kCPU);
  EXPECT_EQ(enc.config().num_layers, 2);
  EXPECT_EQ(enc.config().max_distance, 20);
  const at::Tensor out = enc.forward(io.at("ids"), io.at("mask"));
  ASSERT_EQ(out.sizes(), io.at("hidden").sizes());
  EXPECT_LT(relative_error(out, io.at("hidden")), 1e-5);
}

TEST(Umt5Reference, ShardedEqualsUnsharded) {
  VIDIT_UMT5_REFERENCE(dir);
  const TensorMap io = load_safetensors(dir + "/small_io.safetensors");
  ASSERT_TRUE(fs::exists(dir + "/small_sharded/model-00002-of-00004.safetensors"));
  const at::Tensor a = Umt5Encoder::load(dir + "/small", at::kFloat, at::kCPU).forward(io.at("ids"), io.at("mask"));
  const at::Tensor b =
      Umt5Encoder::load(dir + "/small_sharded", at::kFloat, at::kCPU).forward(io.at("ids"), io.at("mask"));
  EXPECT_TRUE(at::equal(a, b));
}

TEST(Umt5Reference, WanKeyNamesLoad) {
  VIDIT_UMT5_REFERENCE(dir);
  const TensorMap io = load_safetensors(dir + "/small_io.safetensors");
  const at::Tensor want = Umt5Encoder::load(dir + "/small", at::kFloat, at::kCPU).forward(io.at("ids"), io.at("mask"));
  // The folder and the file itself (config.json beside it gives max_distance).
  for (const std::string p : {dir + "/small_wan", dir + "/small_wan/models_t5.safetensors"}) {
    const Umt5Encoder wan = Umt5Encoder::load(p, at::kFloat, at::kCPU);
    EXPECT_TRUE(at::equal(wan.forward(io.at("ids"), io.at("mask")), want)) << p;
  }
  // Wan's .pth: read by LibTorch's unpickler, or refused with the conversion to run.
  try {
    const Umt5Encoder pth = Umt5Encoder::load(dir + "/small_wan_pth", at::kFloat, at::kCPU);
    EXPECT_TRUE(at::equal(pth.forward(io.at("ids"), io.at("mask")), want));
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("models_t5.pth"), std::string::npos) << msg;
    EXPECT_NE(msg.find("st.save_file"), std::string::npos) << msg;
    ADD_FAILURE() << "the .pth did not load: " << msg;
  }
}

TEST(Umt5Reference, XxlLayerShapeEqualsTransformers) {
  VIDIT_UMT5_REFERENCE(dir);
  const TensorMap io = load_safetensors(dir + "/xxl_io.safetensors");
  const Umt5Encoder enc = Umt5Encoder::load(dir + "/xxl", at::kFloat, at::kCPU);
  EXPECT_EQ(enc.config().d_model, 4096);
  EXPECT_EQ(enc.config().d_ff, 10240);
  EXPECT_EQ(enc.config().num_heads, 64);
  const at::Tensor out = enc.forward(io.at("ids"), io.at("mask"));
  EXPECT_LT(relative_error(out, io.at("hidden")), 1e-5);
}

TEST(Umt5Reference, Bf16StaysCloseToFp32) {
  VIDIT_UMT5_REFERENCE(dir);
  const TensorMap io = load_safetensors(dir + "/small_io.safetensors");
  const at::Tensor out =
      Umt5Encoder::load(dir + "/small", at::kBFloat16, at::kCPU).forward(io.at("ids"), io.at("mask"));
  EXPECT_EQ(out.scalar_type(), at::kFloat);
  EXPECT_LT(relative_error(out, io.at("hidden")), 3e-2);
}

TEST(Umt5Reference, ShapeMismatchNamesTheTensor) {
  VIDIT_UMT5_REFERENCE(dir);
  vidit::test::ScratchDir tmp("umt5_shape");
  fs::copy(dir + "/small", tmp.path(), fs::copy_options::recursive);
  std::ifstream cfg_in(tmp / "config.json");
  nlohmann::json cfg = nlohmann::json::parse(cfg_in);
  cfg_in.close();
  cfg["d_ff"] = 128;
  std::ofstream(tmp / "config.json") << cfg.dump();
  const std::string msg = error_of([&] { Umt5Encoder::load(tmp.path(), at::kFloat, at::kCPU); });
  EXPECT_NE(msg.find("encoder.block.0.layer.1.DenseReluDense.wi_0.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[96, 64]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("expected [128, 64]"), std::string::npos) << msg;
}

TEST(Umt5Reference, KeyMissingFromEveryShardIsNamed) {
  VIDIT_UMT5_REFERENCE(dir);
  vidit::test::ScratchDir tmp("umt5_missing");
  fs::copy(dir + "/small_sharded", tmp.path(), fs::copy_options::recursive);
  std::ifstream cfg_in(tmp / "config.json");
  nlohmann::json cfg = nlohmann::json::parse(cfg_in);
  cfg_in.close();
  cfg["num_layers"] = 3;
  std::ofstream(tmp / "config.json") << cfg.dump();
  const std::string msg = error_of([&] { Umt5Encoder::load(tmp.path(), at::kFloat, at::kCPU); });
  EXPECT_NE(msg.find("encoder.block.2."), std::string::npos) << msg;
  EXPECT_NE(msg.find("none of the 4 shards"), std::string::npos) << msg;
}

TEST(Umt5Errors, MissingOrBadFilesAreNamed) {
  vidit::test::ScratchDir tmp("umt5_err");
  std::string msg = error_of([&] { Umt5Encoder::load(tmp / "absent", at::kFloat, at::kCPU); });
  EXPECT_NE(msg.find(tmp / "absent"), std::string::npos) << msg;
  msg = error_of([&] { Umt5Encoder::load(tmp.path(), at::kFloat, at::kCPU); });  // empty folder
  EXPECT_NE(msg.find("no model.safetensors"), std::string::npos) << msg;
  std::ofstream(tmp / "model.safetensors") << "garbage";
  msg = error_of([&] { Umt5Encoder::load(tmp.path(), at::kFloat, at::kCPU); });
  EXPECT_NE(msg.find(tmp / "model.safetensors"), std::string::npos) << msg;
  std::ofstream(tmp / "config.json") << "{\"model_type\": \"umt5\", \"d_model\": 8}";
  msg = error_of([&] { Umt5Config::from_json_file(tmp / "config.json"); });
  EXPECT_NE(msg.find(tmp / "config.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find("d_kv"), std::string::npos) << msg;
}

}  // namespace
}  // namespace vidit::text
