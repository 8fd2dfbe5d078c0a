// The tokenizer: caption cleaning against Python's rules, and ids against the SentencePiece
// Python package (tests/reference/umt5_reference.py) for ASCII, accents, CJK, emoji, whitespace
// runs, HTML entities, a caption longer than text_len, and the empty caption.
#include "text/tokenizer.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>

#include "../../tests/test_util.h"
#include "core/error.h"
#include "text/caption_clean.h"
#include "text/text_test_util.h"

namespace vidit::text {
namespace {

TEST(TokenizerClean, FoldsWhitespaceAndUnescapesAsPython) {
  EXPECT_EQ(clean_caption("  a\t\tb\n\nc  "), "a b c");
  EXPECT_EQ(clean_caption("non\u00a0breaking\u3000ideographic\u2003em \u0085x"), "non breaking ideographic em x");
  EXPECT_EQ(clean_caption("\u200b zero width is not space"), "\u200b zero width is not space");
  EXPECT_EQ(clean_caption(""), "");
  EXPECT_EQ(clean_caption(" \t "), "");
  // Twice unescaped, as Wan's basic_clean does.
  EXPECT_EQ(clean_caption("&amp;lt;b&amp;gt;"), "<b>");
  EXPECT_EQ(html_unescape("caf&eacute; &#233; &#xE9; &#X1F600;"), "café é é 😀");
  EXPECT_EQ(html_unescape("&notit; &copy 2024 &amp"), "¬it; © 2024 &");  // legacy names need no ';'
  EXPECT_EQ(html_unescape("&#128;&#0;&#1;&#xD800;&#99999999999;"), "€\uFFFD\uFFFD\uFFFD");
  EXPECT_EQ(html_unescape("& &; &#; &#x; &unknownname; a&b"), "& &; &#; &#x; &unknownname; a&b");
}

TEST(TokenizerClean, RejectsMalformedUtf8) {
  size_t at = 0;
  EXPECT_TRUE(is_valid_utf8("ascii, café, 猫, 🐱"));
  EXPECT_FALSE(is_valid_utf8("ab\xC0\xAF", &at));  // overlong '/'
  EXPECT_EQ(at, 2u);
  EXPECT_FALSE(is_valid_utf8("\xED\xA0\x80"));     // a UTF-16 surrogate
  EXPECT_FALSE(is_valid_utf8("\xE4\xB8"));         // cut short
  EXPECT_FALSE(is_valid_utf8("\xF4\x90\x80\x80")); // past U+10FFFF
  EXPECT_EQ(caption_excerpt("bad \xFF tail", 40), "bad \\xFF tail");
}

#ifndef VIDIT_HAVE_SENTENCEPIECE
TEST(TokenizerBuild, WithoutSentencePieceSaysWhatToInstall) {
  try {
    Tokenizer t("spiece.model");
    FAIL() << "expected vidit::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("libsentencepiece-dev"), std::string::npos) << e.what();
  }
}
#else

TEST(TokenizerReference, IdsEqualSentencePiecePython) {
  VIDIT_UMT5_REFERENCE(dir);
  std::ifstream in(dir + "/tokens.json");
  const auto j = nlohmann::json::parse(in);
  const int64_t text_len = j["text_len"];
  Tokenizer tok(dir + "/spm/spiece.model");
  EXPECT_EQ(tok.eos_id(), 1);
  EXPECT_EQ(tok.pad_id(), 0);
  EXPECT_EQ(tok.vocab_size(), j["vocab_size"].get<int>());
  std::vector<std::string> all;
  int64_t truncated = 0;
  for (const auto& c : j["cases"]) {
    const std::string text = c["text"];
    all.push_back(text);
    const TokenizedBatch one = tok.tokenize({text}, text_len);
    const std::vector<int64_t> want = c["ids"];
    const std::vector<int64_t> got(one.ids.data_ptr<int64_t>(), one.ids.data_ptr<int64_t>() + text_len);
    EXPECT_EQ(got, want) << "caption '" << text << "'";
    EXPECT_EQ(one.lengths[0], c["length"].get<int64_t>()) << text;
    EXPECT_EQ(one.truncated[0], c["truncated"].get<bool>()) << text;
    EXPECT_EQ(one.mask.sum().item<int64_t>(), one.lengths[0]);
    truncated += c["truncated"].get<bool>();
  }
  // A batch is the rows of its captions.
  const TokenizedBatch batch = tok.tokenize(all, text_len);
  ASSERT_EQ(batch.ids.sizes(), (at::IntArrayRef{(int64_t)all.size(), text_len}));
  EXPECT_EQ(batch.truncated_count(), truncated);
  for (size_t i = 0; i < all.size(); ++i)
    EXPECT_TRUE(at::equal(batch.ids[i], tok.tokenize({all[i]}, text_len).ids[0])) << all[i];
  // The empty caption is the null prompt: EOS alone.
  const TokenizedBatch empty = tok.tokenize({""}, 4);
  EXPECT_EQ(empty.lengths[0], 1);
  EXPECT_EQ(empty.ids[0][0].item<int64_t>(), 1);
}

TEST(TokenizerReference, FindsTheModelInAPipelineFolder) {
  VIDIT_UMT5_REFERENCE(dir);
  Tokenizer tok(dir + "/pipe");
  EXPECT_EQ(tok.model_file(), dir + "/pipe/tokenizer/spiece.model");
}

TEST(TokenizerReference, NonUtf8CaptionIsNamed) {
  VIDIT_UMT5_REFERENCE(dir);
  Tokenizer tok(dir + "/spm/spiece.model");
  try {
    tok.tokenize({"fine", "broken \xFF\xFE caption"}, 8);
    FAIL() << "expected vidit::Error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("caption 1"), std::string::npos) << msg;
    EXPECT_NE(msg.find("broken \\xFF"), std::string::npos) << msg;
  }
}

TEST(TokenizerErrors, MissingOrCorruptModelNamesTheFile) {
  vidit::test::ScratchDir tmp("tokenizer");
  try {
    Tokenizer t(tmp / "nowhere/spiece.model");
    FAIL() << "expected vidit::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(tmp / "nowhere/spiece.model"), std::string::npos) << e.what();
  }
  try {
    Tokenizer t(tmp.path());  // a folder without a model
    FAIL() << "expected vidit::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no spiece.model"), std::string::npos) << e.what();
  }
  std::ofstream(tmp / "spiece.model") << "this is not a protobuf \x01\x02\x03";
  try {
    Tokenizer t(tmp.path());
    FAIL() << "expected vidit::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(tmp / "spiece.model"), std::string::npos) << e.what();
  }
}
#endif

}  // namespace
}  // namespace vidit::text
