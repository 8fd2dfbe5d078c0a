// The caption path: captions in, Wan's text context out, equal to transformers' encoder on the
// SentencePiece ids with padding positions zero, whatever the batching.
#include "text/text_encoder.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>

#include "../../tests/test_util.h"
#include "core/error.h"
#include "core/safetensors.h"
#include "text/text_test_util.h"

namespace vidit::text {
namespace {

#ifdef VIDIT_HAVE_SENTENCEPIECE
std::vector<std::string> reference_captions(const std::string& dir) {
  std::ifstream in(dir + "/tokens.json");
  const auto j = nlohmann::json::parse(in);
  std::vector<std::string> out;
  for (const auto& c : j["cases"]) out.push_back(c["text"]);
  return out;
}

TEST(TextEncoderReference, ContextEqualsTransformersWithZeroPadding) {
  VIDIT_UMT5_REFERENCE(dir);
  const TensorMap io = load_safetensors(dir + "/small_io.safetensors");
  const std::vector<std::string> captions = reference_captions(dir);
  TextEncoderOptions o;
  o.encoder = dir + "/small";
  o.tokenizer = dir + "/spm/spiece.model";
  o.text_len = io.at("caption_ids").size(1);
  o.dtype = at::kFloat;
  for (int64_t batch : {1, 4, 64}) {
    o.batch_size = batch;
    TextEncoder enc(o);
    const EncodedCaptions e = enc.encode_captions(captions);
    const at::Tensor& ctx = e.embedding;
    ASSERT_EQ(ctx.sizes(), io.at("context").sizes());
    EXPECT_EQ(ctx.scalar_type(), at::kFloat);
    EXPECT_TRUE(ctx.device().is_cpu());
    EXPECT_LT(test::relative_error(ctx, io.at("context")), 1e-5) << "batch " << batch;
    const at::Tensor mask = io.at("caption_mask");
    EXPECT_EQ(ctx.masked_select(mask.eq(0).unsqueeze(-1)).abs().max().item<float>(), 0.0f);
    for (size_t i = 0; i < captions.size(); ++i) EXPECT_EQ(e.lengths[i], mask[i].sum().item<int64_t>());
    EXPECT_GT(e.truncated_count(), 0);
    EXPECT_EQ(enc.truncated_so_far(), e.truncated_count());
  }
}

TEST(TextEncoderReference, OpensADiffusersPipelineFolder) {
  VIDIT_UMT5_REFERENCE(dir);
  TextEncoderOptions o;
  o.encoder = dir + "/pipe";  // text_encoder/ and tokenizer/ found inside
  o.text_len = 8;
  o.dtype = at::kFloat;
  TextEncoder enc(o);
  EXPECT_EQ(enc.dim(), 64);
  const at::Tensor a = enc.encode({"a cat", "", "一只猫 🐱"});
  EXPECT_EQ(a.sizes(), (at::IntArrayRef{3, 8, 64}));
  // A caption's context does not depend on what else is in the batch.
  EXPECT_LT(test::relative_error(enc.encode({"一只猫 🐱"})[0], a[2]), 1e-6);
}
#endif

TEST(TextEncoderErrors, MissingPiecesSayWhatToSet) {
  vidit::test::ScratchDir tmp("text_encoder");
  TextEncoderOptions o;
  try {
    TextEncoder enc(o);
    FAIL() << "expected vidit::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("text.encoder"), std::string::npos) << e.what();
  }
  o.encoder = tmp.path();
  try {
    TextEncoder enc(o);
    FAIL() << "expected vidit::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("text.tokenizer"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace vidit::text
