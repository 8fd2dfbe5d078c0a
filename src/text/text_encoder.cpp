// The caption path (see text_encoder.h): tokenize, sort by length, encode in batches, unsort.
#include "text/text_encoder.h"

#include <ATen/Context.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <filesystem>
#include <numeric>

#include "core/error.h"

namespace fs = std::filesystem;

namespace vidit::text {
namespace {

// The tokenizer beside an encoder path: its folder (or the file's folder), the pipeline's
// tokenizer/, or the tokenizer/ next to a text_encoder/ folder.
std::string find_tokenizer_beside(const std::string& encoder) {
  std::error_code ec;
  fs::path dir = fs::is_directory(encoder, ec) ? fs::path(encoder) : fs::path(encoder).parent_path();
  for (const fs::path& cand : {dir, dir / "tokenizer", dir.parent_path() / "tokenizer"}) {
    // The SentencePiece model first (the original), then tokenizer.json (what today's
    // transformers saves alone), as Tokenizer::find_model_file orders them.
    for (const char* name : {"spiece.model", "tokenizer.model", "tokenizer.json"})
      if (fs::is_regular_file(cand / name, ec)) return (cand / name).string();
  }
  fail("text encoder: no tokenizer given and no spiece.model or tokenizer.json beside '", encoder, "' (looked in its "
       "folder, tokenizer/ and ../tokenizer/): set text.tokenizer (or --tokenizer) to umT5's spiece.model or "
       "tokenizer.json");
}

}  // namespace

TextEncoderOptions text_encoder_options(const Config& cfg) {
  TextEncoderOptions o;
  o.encoder = cfg.text.encoder;
  o.tokenizer = cfg.text.tokenizer;
  o.text_len = cfg.model.text_len;
  o.dtype = cfg.text.dtype == Precision::fp32 ? at::kFloat : at::kBFloat16;
  const bool cuda = cfg.text.device == DeviceChoice::cuda ||
                    (cfg.text.device == DeviceChoice::automatic && at::hasCUDA());
  VIDIT_CHECK(!cuda || at::hasCUDA(), "text.device = \"cuda\" but this vidit / machine has no CUDA: use \"cpu\" or \"auto\"");
  o.device = cuda ? at::Device(at::kCUDA) : at::Device(at::kCPU);
  o.batch_size = cfg.text.batch_size;
  return o;
}

int64_t EncodedCaptions::truncated_count() const {
  return std::count(truncated.begin(), truncated.end(), true);
}

TextEncoder::TextEncoder(const TextEncoderOptions& opts) : opts_(opts) {
  VIDIT_CHECK(!opts_.encoder.empty(), "text encoder: no umT5 weights given: set text.encoder (or --text-encoder) "
              "to a text_encoder folder, a diffusers Wan pipeline folder, or a weight file");
  VIDIT_CHECK(opts_.text_len >= 1 && opts_.batch_size >= 1, "text encoder: text_len and batch_size must be >= 1");
  std::error_code ec;
  VIDIT_CHECK(fs::exists(opts_.encoder, ec), "text encoder: '", opts_.encoder, "' does not exist: set text.encoder "
              "(or --text-encoder) to a text_encoder folder, a diffusers Wan pipeline folder, or a weight file");
  const std::string tok = opts_.tokenizer.empty() ? find_tokenizer_beside(opts_.encoder) : opts_.tokenizer;
  tokenizer_ = std::make_unique<Tokenizer>(tok);
  encoder_ = std::make_unique<Umt5Encoder>(Umt5Encoder::load(opts_.encoder, opts_.dtype, opts_.device));
  VIDIT_CHECK(tokenizer_->vocab_size() <= encoder_->config().vocab_size, "text encoder: the tokenizer '",
              tokenizer_->model_file(), "' has ", tokenizer_->vocab_size(), " pieces but the encoder '", opts_.encoder,
              "' embeds only ", encoder_->config().vocab_size, " ids: they do not belong together");
}

EncodedCaptions TextEncoder::encode_captions(const std::vector<std::string>& captions) {
  c10::InferenceMode inference;
  const auto n = static_cast<int64_t>(captions.size());
  const TokenizedBatch tok = tokenizer_->tokenize(captions, opts_.text_len);
  EncodedCaptions out;
  out.embedding = at::zeros({n, opts_.text_len, dim()}, at::kFloat);
  out.lengths = tok.lengths;
  out.truncated = tok.truncated;
  // Longest first, so each batch is cut to its first caption's length; stable for determinism.
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return tok.lengths[a] > tok.lengths[b]; });
  for (int64_t start = 0; start < n; start += opts_.batch_size) {
    const int64_t count = std::min(opts_.batch_size, n - start);
    const at::Tensor idx = at::from_blob(order.data() + start, {count}, at::kLong).clone();
    const int64_t L = tok.lengths[order[start]];
    const at::Tensor ids = tok.ids.index_select(0, idx).narrow(1, 0, L);
    const at::Tensor mask = tok.mask.index_select(0, idx).narrow(1, 0, L);
    // Zeros on padding, as Wan pads its context; the padded rows are not computed at all.
    const at::Tensor h = encoder_->forward(ids, mask, Umt5Encoder::PaddedRows::zeros).to(at::kCPU);
    out.embedding.narrow(1, 0, L).index_copy_(0, idx, h);
  }
  truncated_so_far_ += out.truncated_count();
  return out;
}

}  // namespace vidit::text
