// The umT5 tokenizer: a SentencePiece model (spiece.model, as google/umt5-xxl and diffusers'
// Wan pipelines ship it in tokenizer/; or Hugging Face's tokenizer.json of it, translated back into
// that SentencePiece model by tokenizer_json.h) applied with Wan's convention for a caption:
//   clean (caption_clean.h: Wan's prompt_clean without ftfy) -> SentencePiece ids -> append EOS
//   (`</s>`, id 1 in umT5) -> truncate to text_len keeping EOS last (Hugging Face's
//   truncation=True: the first text_len-1 ids, then EOS) -> pad with the pad id (0) to text_len.
// Text that merely looks like a special token ("</s>", "<extra_id_0>") is encoded as ordinary
// text, as SentencePiece does; Hugging Face's tokenizer would map it to the special id.
// Needs the SentencePiece library (Debian: libsentencepiece-dev); a build without it has this
// class but its constructor throws vidit::Error saying so.
#pragma once
#include <ATen/ATen.h>

#include <memory>
#include <string>
#include <vector>

namespace vidit::text {

// Captions as token ids, one row per caption, in the order given.
struct TokenizedBatch {
  at::Tensor ids;                // [B, text_len] int64: the ids, then pad ids
  at::Tensor mask;               // [B, text_len] int64: 1 on the real tokens (EOS included), 0 on padding
  std::vector<int64_t> lengths;  // real tokens of each caption (EOS included), 1..text_len
  std::vector<bool> truncated;   // caption had more than text_len tokens (with EOS) and was cut
  int64_t truncated_count() const;
};

class Tokenizer {
 public:
  // `path`: a spiece.model file, a tokenizer.json file (a name ending ".json"), or a folder holding
  // one (also in its tokenizer/ subfolder: a diffusers pipeline root); in a folder spiece.model (or
  // tokenizer.model) is preferred to tokenizer.json. Throws vidit::Error naming the path when no
  // model is found, when it cannot be parsed, when a tokenizer.json holds something SentencePiece
  // cannot express (see tokenizer_json.h), or when SentencePiece is not built in.
  explicit Tokenizer(const std::string& path);
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  // The model file `path` resolves to (same rules as the constructor); throws when none.
  static std::string find_model_file(const std::string& path);

  // SentencePiece ids of `text` as given (no cleaning, no EOS). Throws vidit::Error on text that
  // is not valid UTF-8.
  std::vector<int> encode(const std::string& text) const;

  // Wan's convention (see above) for every caption. An empty caption is the null prompt (EOS
  // alone). Throws vidit::Error naming the caption (index and first characters) when one is not
  // valid UTF-8; text_len must be >= 1. Thread-safe (const).
  TokenizedBatch tokenize(const std::vector<std::string>& captions, int64_t text_len) const;

  int eos_id() const { return eos_id_; }
  int pad_id() const { return pad_id_; }
  int vocab_size() const { return vocab_size_; }
  const std::string& model_file() const { return model_file_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string model_file_;
  int eos_id_ = 1, pad_id_ = 0, vocab_size_ = 0;
};

}  // namespace vidit::text
