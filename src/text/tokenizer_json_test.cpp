// The tokenizer from a tokenizer.json alone: ids against the tokenizers library on that file and
// the SentencePiece Python package on the spiece.model it was converted from by transformers
// (tests/reference/tokenizer_json_reference.py), the piece table against the spiece.model's, the
// folder rules, and the errors for what SentencePiece cannot express.
#include "text/tokenizer_json.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include "../../tests/test_util.h"
#include "core/error.h"
#include "text/text_test_util.h"
#include "text/text_encoder.h"
#include "text/tokenizer.h"

#ifdef VIDIT_HAVE_SENTENCEPIECE
#include <sentencepiece_processor.h>
#endif

namespace vidit::text {
namespace {

using nlohmann::json;

// The message of the vidit::Error that `f` throws ("" when it throws none).
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A small Unigram tokenizer.json written by hand (the shape transformers writes for T5).
json tiny_tokenizer_json() {
  return json::parse(R"({
    "version": "1.0", "truncation": null, "padding": null,
    "added_tokens": [
      {"id": 0, "content": "<pad>", "special": true}, {"id": 1, "content": "</s>", "special": true},
      {"id": 2, "content": "<unk>", "special": true}, {"id": 8, "content": "<sep>", "special": false},
      {"id": 9, "content": "<extra_id_0>", "special": true}],
    "normalizer": null,
    "pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "WhitespaceSplit"},
      {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": true}]},
    "post_processor": {"type": "TemplateProcessing",
      "single": [{"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": "</s>", "type_id": 0}}],
      "pair": [], "special_tokens": {"</s>": {"id": "</s>", "ids": [1], "tokens": ["</s>"]}}},
    "decoder": null,
    "model": {"type": "Unigram", "unk_id": 2, "byte_fallback": false, "vocab": [
      ["<pad>", 0.0], ["</s>", 0.0], ["<unk>", 0.0], ["\u2581", -2.0], ["a", -3.0], ["b", -3.0],
      ["\u2581ab", -1.0], ["\u2581a", -2.5], ["<sep>", 0.0]]}
  })");
}

std::string write(const vidit::test::ScratchDir& dir, const std::string& name, const std::string& text) {
  const std::string path = dir / name;
  std::ofstream(path) << text;
  return path;
}

TEST(TokenizerJsonErrors, BrokenJsonNamesTheFile) {
  vidit::test::ScratchDir tmp("tokenizer_json");
  const std::string path = write(tmp, "tokenizer.json", "{\"model\": {\"type\": \"Unigram\", ");
  const std::string msg = error_of([&] { sentencepiece_model_from_tokenizer_json(path); });
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("JSON"), std::string::npos) << msg;
  const std::string missing = error_of([&] { sentencepiece_model_from_tokenizer_json(tmp / "none.json"); });
  EXPECT_NE(missing.find(tmp / "none.json"), std::string::npos) << missing;
}

TEST(TokenizerJsonErrors, RefusesWhatSentencePieceCannotExpress) {
  vidit::test::ScratchDir tmp("tokenizer_json");
  struct Case {
    const char* what;
    std::function<void(json&)> edit;
    const char* expect;  // a part of the message
  };
  const std::vector<Case> cases = {
      {"BPE model", [](json& j) { j["model"]["type"] = "BPE"; }, "model.type is \"BPE\""},
      {"no model", [](json& j) { j.erase("model"); }, "no \"model\""},
      {"no unk", [](json& j) { j["model"]["unk_id"] = nullptr; }, "model.unk_id"},
      {"bad vocab entry", [](json& j) { j["model"]["vocab"][4] = "a"; }, "model.vocab entry 4"},
      {"NFKC normalizer", [](json& j) { j["normalizer"] = {{"type", "NFKC"}}; }, "NFKC"},
      {"lowercase in a sequence",
       [](json& j) {
         j["normalizer"] = json::parse(R"({"type": "Sequence", "normalizers": [{"type": "Lowercase"}]})");
       },
       "Lowercase"},
      {"charsmap not first",
       [](json& j) {
         j["normalizer"] = json::parse(R"({"type": "Sequence", "normalizers": [{"type": "Strip"},
           {"type": "Precompiled", "precompiled_charsmap": ""}]})");
       },
       "comes after another rule"},
      {"bad base64",
       [](json& j) { j["normalizer"] = {{"type", "Precompiled"}, {"precompiled_charsmap", "ab$d"}}; },
       "normalizer.precompiled_charsmap is not base64"},
      {"byte level", [](json& j) { j["pre_tokenizer"] = {{"type", "ByteLevel"}}; }, "ByteLevel"},
      {"other replacement", [](json& j) { j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "_"}}; },
       "replaces spaces with \"_\""},
      {"bos template",
       [](json& j) {
         j["post_processor"]["single"] = json::parse(
             R"([{"SpecialToken": {"id": "</s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}])");
       },
       "post_processor.single"},
      {"added token off the vocab",
       [](json& j) { j["added_tokens"].push_back({{"id", 40}, {"content", "<far>"}, {"special", true}}); },
       "added token \"<far>\" has id 40"},
  };
  for (const Case& c : cases) {
    json j = tiny_tokenizer_json();
    c.edit(j);
    const std::string path = write(tmp, "tokenizer.json", j.dump());
    const std::string msg = error_of([&] { sentencepiece_model_from_tokenizer_json(path); });
    EXPECT_NE(msg.find(path), std::string::npos) << c.what << ": " << msg;
    EXPECT_NE(msg.find(c.expect), std::string::npos) << c.what << ": " << msg;
  }
  // The unchanged file is accepted, so each refusal above comes from its one edit.
  const std::string path = write(tmp, "tokenizer.json", tiny_tokenizer_json().dump());
  EXPECT_FALSE(sentencepiece_model_from_tokenizer_json(path).empty());
}

#ifdef VIDIT_HAVE_SENTENCEPIECE

TEST(TokenizerJson, HandWrittenFileLoadsWithItsSpecialPieces) {
  vidit::test::ScratchDir tmp("tokenizer_json");
  const std::string path = write(tmp, "tokenizer.json", tiny_tokenizer_json().dump());
  Tokenizer tok(path);
  EXPECT_EQ(tok.model_file(), path);
  EXPECT_EQ(tok.eos_id(), 1);
  EXPECT_EQ(tok.pad_id(), 0);
  EXPECT_EQ(tok.vocab_size(), 10);  // the vocab and <extra_id_0>, added after it
  // Unigram: "▁ab" (-1) beats "▁a" "b" (-5.5); the non-special added token is one piece; "</s>" and
  // "<extra_id_0>" in the text are text (SentencePiece's CONTROL pieces), not their ids.
  EXPECT_EQ(tok.encode("ab  a"), (std::vector<int>{6, 7}));
  EXPECT_EQ(tok.encode("ab<sep>b"), (std::vector<int>{6, 8, 5}));
  const std::vector<int> eos_text = tok.encode("a</s>");
  EXPECT_EQ(std::count(eos_text.begin(), eos_text.end(), 1), 0);
  const TokenizedBatch batch = tok.tokenize({"ab ab", ""}, 4);
  EXPECT_EQ(batch.ids[0][0].item<int64_t>(), 6);
  EXPECT_EQ(batch.ids[0][2].item<int64_t>(), 1);
  EXPECT_EQ(batch.ids[1][0].item<int64_t>(), 1);
  // A folder holding only tokenizer.json (here in its tokenizer/ subfolder) uses it; spiece.model
  // wins when both are there.
  std::filesystem::create_directories(tmp / "pipe/tokenizer");
  std::filesystem::copy_file(path, tmp / "pipe/tokenizer/tokenizer.json");
  EXPECT_EQ(Tokenizer::find_model_file(tmp / "pipe"), tmp / "pipe/tokenizer/tokenizer.json");
  EXPECT_EQ(Tokenizer(tmp / "pipe").encode("ab"), (std::vector<int>{6}));
  write(tmp, "pipe/tokenizer/spiece.model", "x");
  EXPECT_EQ(Tokenizer::find_model_file(tmp / "pipe"), tmp / "pipe/tokenizer/spiece.model");
  // A vocab SentencePiece rejects (two pieces alike) is named too.
  json dup = tiny_tokenizer_json();
  dup["model"]["vocab"][5][0] = "a";
  const std::string bad = write(tmp, "dup.json", dup.dump());
  const std::string msg = error_of([&] { Tokenizer t(bad); });
  EXPECT_NE(msg.find(bad), std::string::npos) << msg;
}

#define VIDIT_TOKENIZER_JSON_REFERENCE(dir_var)                                                             \
  static const auto ref_ = ::vidit::text::test::python_reference("tokenizer_json_reference.py",            \
                                                                 "tokenizer_json_ref",                     \
                                                                 "transformers, tokenizers, sentencepiece"); \
  if (!ref_.skip.empty()) GTEST_SKIP() << ref_.skip;                                                        \
  ASSERT_TRUE(ref_.error.empty()) << ref_.error;                                                            \
  const std::string dir_var = ref_.dir

// U+0085 (NEXT LINE): T5's tokenizer.json splits words at it (WhitespaceSplit runs after the
// charsmap, which keeps it); SentencePiece does not, and vidit gives SentencePiece's ids.
bool known_divergence(const std::string& text) { return text.find("\u0085") != std::string::npos; }

TEST(TokenizerJsonReference, IdsEqualTokenizersAndSentencePiece) {
  VIDIT_TOKENIZER_JSON_REFERENCE(dir);
  std::ifstream in(dir + "/cases.json");
  const json all = json::parse(in);
  ASSERT_EQ(all.size(), 4u);
  for (const auto& [variant, v] : all.items()) {
    SCOPED_TRACE(variant);
    Tokenizer tok(dir + "/" + variant + "/tokenizer.json");
    EXPECT_EQ(tok.model_file(), dir + "/" + variant + "/tokenizer.json");
    EXPECT_EQ(tok.eos_id(), v["eos_id"].get<int>());
    EXPECT_EQ(tok.pad_id(), v["pad_id"].get<int>());
    // Does the tokenizer.json fall back to bytes as the spiece.model does? (transformers' T5
    // conversion drops byte fallback: there unknown characters are <unk> in both libraries' hands.)
    const json j = json::parse(std::ifstream(dir + "/" + variant + "/tokenizer.json"));
    const bool json_bytes = j["model"].value("byte_fallback", false);
    int with_spm = 0, divergent = 0;
    for (const auto& c : v["cases"]) {
      const std::string text = c["text"];
      const std::vector<int> ours = tok.encode(text);
      const std::vector<int> hf = c["hf"], spm = c["spm"], hf_full = c["hf_full"];
      // Our EOS is the one the post-processor appends (none for a file without one).
      std::vector<int> hf_eos = hf;
      if (!j["post_processor"].is_null()) hf_eos.push_back(tok.eos_id());
      EXPECT_EQ(hf_full, hf_eos) << "'" << text << "'";
      if (known_divergence(text)) {
        if (json_bytes || !c["spm_bytes"].get<bool>()) {
          EXPECT_EQ(ours, spm) << "'" << text << "'";
        }
        divergent += ours != hf;
        continue;
      }
      EXPECT_EQ(ours, hf) << "tokenizers library, '" << text << "'";
      if (json_bytes || !c["spm_bytes"].get<bool>()) {
        EXPECT_EQ(ours, spm) << "SentencePiece, '" << text << "'";
        ++with_spm;
      }
    }
    // Most strings are compared with both; the byte-fallback variants show the divergence.
    EXPECT_GE(with_spm, json_bytes || variant.rfind("generic", 0) == 0 ? 16 : 3);
    if (variant.rfind("umt5", 0) == 0) {
      EXPECT_EQ(divergent, 1);
    }
  }
}

TEST(TokenizerJsonReference, PieceTableEqualsTheSpieceModel) {
  VIDIT_TOKENIZER_JSON_REFERENCE(dir);
  for (const std::string variant : {"umt5_bytes", "umt5", "generic_nfkc"}) {
    SCOPED_TRACE(variant);
    sentencepiece::SentencePieceProcessor want, got;
    ASSERT_TRUE(want.Load(dir + "/" + variant + "/spiece.model").ok());
    ASSERT_TRUE(got.LoadFromSerializedProto(
                       sentencepiece_model_from_tokenizer_json(dir + "/" + variant + "/tokenizer.json"))
                    .ok());
    const bool bytes = variant == "umt5_bytes";
    // T5's conversion appends 3 <extra_id_N> (special: CONTROL) after the spiece.model's pieces.
    const int extra = variant.rfind("umt5", 0) == 0 ? 3 : 0;
    ASSERT_EQ(got.GetPieceSize(), want.GetPieceSize() + extra);
    for (int id = 0; id < want.GetPieceSize(); ++id) {
      ASSERT_EQ(got.IdToPiece(id), want.IdToPiece(id)) << id;
      EXPECT_EQ(got.GetScore(id), want.GetScore(id)) << id;
      EXPECT_EQ(got.IsControl(id), want.IsControl(id)) << id;
      EXPECT_EQ(got.IsUnknown(id), want.IsUnknown(id)) << id;
      // Byte pieces are BYTE only where the tokenizer.json keeps byte fallback.
      EXPECT_EQ(got.IsByte(id), bytes && want.IsByte(id)) << id;
    }
    for (int id = want.GetPieceSize(); id < got.GetPieceSize(); ++id) EXPECT_TRUE(got.IsControl(id)) << id;
    EXPECT_EQ(got.unk_id(), want.unk_id());
    EXPECT_EQ(got.eos_id(), want.eos_id());
    EXPECT_EQ(got.pad_id(), want.pad_id());
    EXPECT_EQ(got.bos_id(), -1);
  }
}

TEST(TokenizerJsonReference, WanCaptionsMatchTheSpieceModel) {
  // With byte fallback kept, captions tokenized by Wan's convention (clean, EOS, truncate, pad) are
  // the same from tokenizer.json as from spiece.model.
  VIDIT_TOKENIZER_JSON_REFERENCE(dir);
  const json all = json::parse(std::ifstream(dir + "/cases.json"));
  std::vector<std::string> captions;
  for (const auto& c : all["umt5_bytes"]["cases"]) captions.push_back(c["text"]);
  const Tokenizer from_json(dir + "/umt5_bytes/tokenizer.json"), from_spm(dir + "/umt5_bytes/spiece.model");
  const TokenizedBatch a = from_json.tokenize(captions, 16), b = from_spm.tokenize(captions, 16);
  EXPECT_TRUE(at::equal(a.ids, b.ids));
  EXPECT_TRUE(at::equal(a.mask, b.mask));
  EXPECT_EQ(a.truncated, b.truncated);
  EXPECT_GT(a.truncated_count(), 0);
}


// A pipeline folder whose tokenizer/ holds tokenizer.json alone (what today's transformers saves):
// the text encoder finds it beside its weights, as `vidit prepare` and `vidit encode-text` use it.
TEST(TokenizerJsonReference, FoundBesideAnEncoderWithoutSpieceModel) {
  VIDIT_TOKENIZER_JSON_REFERENCE(dir);
  const auto& umt5 = test::umt5_reference();
  if (!umt5.skip.empty()) GTEST_SKIP() << umt5.skip;
  ASSERT_TRUE(umt5.error.empty()) << umt5.error;
  vidit::test::ScratchDir tmp("tokenizer_json_beside");
  namespace fs = std::filesystem;
  fs::create_directories(tmp / "pipe/tokenizer");
  fs::create_directory_symlink(umt5.dir + "/pipe/text_encoder", tmp / "pipe/text_encoder");
  fs::copy_file(dir + "/umt5/tokenizer.json", tmp / "pipe/tokenizer/tokenizer.json");
  for (const std::string encoder : {tmp / "pipe", tmp / "pipe/text_encoder"}) {
    TextEncoderOptions o;
    o.encoder = encoder, o.text_len = 8, o.dtype = at::kFloat;
    TextEncoder enc(o);
    EXPECT_EQ(enc.encode({"a cat"}).sizes(), (at::IntArrayRef{1, 8, 64})) << encoder;
  }
}
#endif

}  // namespace
}  // namespace vidit::text
