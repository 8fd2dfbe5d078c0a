// The caption path of Wan: captions -> umT5 tokenizer -> umT5 encoder -> the DiT's text context.
// Following Wan, a caption's context is [text_len, d_model]: the encoder's output on its real
// tokens (EOS included), zeros on the padding positions. Captions are sorted by token count and
// encoded in batches of `batch_size`, each batch cut to its longest caption (the encoder ignores
// padded keys, so the real tokens' outputs do not depend on how much padding follows, and it
// computes no padded rows: Umt5Encoder::PaddedRows::zeros), and the results are put back in the
// order given.
#pragma once
#include <ATen/ATen.h>

#include <memory>
#include <string>
#include <vector>

#include "core/config.h"
#include "text/tokenizer.h"
#include "text/umt5.h"

namespace vidit::text {

struct TextEncoderOptions {
  std::string encoder;     // text_encoder folder, pipeline root, or weight file (Umt5Encoder::load)
  std::string tokenizer;   // spiece.model or a folder; "" = beside `encoder` (its folder, or tokenizer/)
  int64_t text_len = 512;  // tokens per caption (Wan: 512)
  at::ScalarType dtype = at::kBFloat16;  // at::kFloat or at::kBFloat16
  at::Device device = at::kCPU;
  int64_t batch_size = 16;  // captions per encoder call
};

// Options from the config's text.* keys and model.text_len (device "auto": CUDA when present).
TextEncoderOptions text_encoder_options(const Config& cfg);

struct EncodedCaptions {
  at::Tensor embedding;          // [B, text_len, d_model] fp32 CPU; zeros after each caption's tokens
  std::vector<int64_t> lengths;  // real tokens per caption (EOS included)
  std::vector<bool> truncated;   // caption was cut to text_len tokens
  int64_t truncated_count() const;
};

class TextEncoder {
 public:
  // Opens the tokenizer and the encoder. Throws vidit::Error naming the file at fault; when no
  // tokenizer is given and none is found beside the encoder, the error says to pass one.
  explicit TextEncoder(const TextEncoderOptions& opts);

  // Embeddings of `captions` (any number, any order; "" is the null prompt). Throws vidit::Error
  // naming a caption that is not valid UTF-8. Not thread-safe (counts truncations).
  EncodedCaptions encode_captions(const std::vector<std::string>& captions);
  // The embedding tensor alone.
  at::Tensor encode(const std::vector<std::string>& captions) { return encode_captions(captions).embedding; }

  // Captions cut to text_len so far, over every call.
  int64_t truncated_so_far() const { return truncated_so_far_; }
  int64_t text_len() const { return opts_.text_len; }
  int64_t dim() const { return encoder_->config().d_model; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  const Umt5Encoder& encoder() const { return *encoder_; }

 private:
  TextEncoderOptions opts_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<Umt5Encoder> encoder_;
  int64_t truncated_so_far_ = 0;
};

}  // namespace vidit::text
