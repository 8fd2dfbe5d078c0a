// The umT5 tokenizer (see tokenizer.h): SentencePiece ids with Wan's EOS / truncation / padding.
#include "text/tokenizer.h"

#include <filesystem>

#include "core/error.h"
#include "text/caption_clean.h"
#include "text/tokenizer_json.h"

#ifdef VIDIT_HAVE_SENTENCEPIECE
#include <sentencepiece_processor.h>
#endif

namespace fs = std::filesystem;

namespace vidit::text {

#ifdef VIDIT_HAVE_SENTENCEPIECE
struct Tokenizer::Impl {
  sentencepiece::SentencePieceProcessor sp;
};
#else
struct Tokenizer::Impl {};
#endif

int64_t TokenizedBatch::truncated_count() const {
  int64_t n = 0;
  for (bool t : truncated) n += t;
  return n;
}

std::string Tokenizer::find_model_file(const std::string& path) {
  VIDIT_CHECK(!path.empty(), "tokenizer: no tokenizer given (text.tokenizer, or --tokenizer): pass spiece.model, "
              "tokenizer.json or the folder holding one");
  std::error_code ec;
  if (fs::is_regular_file(path, ec)) return path;
  VIDIT_CHECK(fs::is_directory(path, ec), "tokenizer: '", path, "' does not exist: pass a SentencePiece model "
              "(spiece.model), a tokenizer.json, or a folder holding one (a diffusers pipeline's tokenizer/)");
  // A SentencePiece model first: it is the original; tokenizer.json is Hugging Face's translation of it.
  for (const char* rel : {"spiece.model", "tokenizer/spiece.model", "tokenizer.model", "tokenizer/tokenizer.model",
                          "tokenizer.json", "tokenizer/tokenizer.json"}) {
    const fs::path p = fs::path(path) / rel;
    if (fs::is_regular_file(p, ec)) return p.string();
  }
  fail("tokenizer: no spiece.model or tokenizer.json in '", path, "' (nor in its tokenizer/ subfolder): pass the "
       "tokenizer of umT5 (google/umt5-xxl's spiece.model or tokenizer.json, or a diffusers Wan pipeline's "
       "tokenizer/ folder)");
}

Tokenizer::Tokenizer(const std::string& path) : impl_(std::make_unique<Impl>()) {
#ifndef VIDIT_HAVE_SENTENCEPIECE
  fail("tokenizer: this vidit was built without SentencePiece, so it cannot tokenize captions ('", path,
       "'): install libsentencepiece-dev (apt-get install libsentencepiece-dev) and rebuild");
#else
  model_file_ = find_model_file(path);
  if (is_tokenizer_json(model_file_)) {
    // Hugging Face's tokenizer.json, translated back into the SentencePiece model it describes.
    const auto status = impl_->sp.LoadFromSerializedProto(sentencepiece_model_from_tokenizer_json(model_file_));
    VIDIT_CHECK(status.ok(), "tokenizer: SentencePiece rejects the model read from '", model_file_, "' (",
                status.ToString(), "): its vocab or special tokens do not form a SentencePiece model");
  } else {
    const auto status = impl_->sp.Load(model_file_);
    VIDIT_CHECK(status.ok(), "tokenizer: cannot read the SentencePiece model '", model_file_, "' (",
                status.ToString(), "): the file is damaged or not a SentencePiece model; download spiece.model again");
  }
  vocab_size_ = impl_->sp.GetPieceSize();
  eos_id_ = impl_->sp.eos_id();
  pad_id_ = impl_->sp.pad_id() >= 0 ? impl_->sp.pad_id() : 0;
  VIDIT_CHECK(eos_id_ >= 0, "tokenizer: the model '", model_file_, "' has no end-of-sequence piece (</s>); umT5's "
              "model has it as id 1");
#endif
}

Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

std::vector<int> Tokenizer::encode(const std::string& text) const {
  size_t bad = 0;
  VIDIT_CHECK(is_valid_utf8(text, &bad), "tokenizer: text is not valid UTF-8 (byte ", bad, "): '",
              caption_excerpt(text), "'");
  std::vector<int> ids;
#ifdef VIDIT_HAVE_SENTENCEPIECE
  const auto status = impl_->sp.Encode(text, &ids);
  VIDIT_CHECK(status.ok(), "tokenizer: SentencePiece failed on '", caption_excerpt(text), "': ", status.ToString());
#endif
  return ids;
}

TokenizedBatch Tokenizer::tokenize(const std::vector<std::string>& captions, int64_t text_len) const {
  VIDIT_CHECK(text_len >= 1, "tokenizer: text_len must be >= 1 (got ", text_len, ")");
  const auto B = static_cast<int64_t>(captions.size());
  TokenizedBatch out;
  out.ids = at::full({B, text_len}, pad_id_, at::kLong);
  out.mask = at::zeros({B, text_len}, at::kLong);
  out.lengths.resize(B);
  out.truncated.resize(B);
  auto ids_a = out.ids.accessor<int64_t, 2>();
  auto mask_a = out.mask.accessor<int64_t, 2>();
  for (int64_t b = 0; b < B; ++b) {
    const std::string& caption = captions[b];
    size_t bad = 0;
    VIDIT_CHECK(is_valid_utf8(caption, &bad), "tokenizer: caption ", b, " is not valid UTF-8 (byte ", bad, "): '",
                caption_excerpt(caption), "'; re-save the captions as UTF-8");
    std::vector<int> ids = encode(clean_caption(caption));
    // Hugging Face's truncation leaves room for the EOS it appends: the first text_len-1 ids.
    out.truncated[b] = static_cast<int64_t>(ids.size()) + 1 > text_len;
    if (out.truncated[b]) ids.resize(text_len - 1);
    ids.push_back(eos_id_);
    out.lengths[b] = static_cast<int64_t>(ids.size());
    for (size_t t = 0; t < ids.size(); ++t) {
      ids_a[b][t] = ids[t];
      mask_a[b][t] = 1;
    }
  }
  return out;
}

}  // namespace vidit::text
