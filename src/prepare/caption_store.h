// Captions embedded by umT5 (text/) for `vidit prepare`, before any video is decoded: the encoder
// runs over every caption of this worker's slice first (sorted by length in batches, on the GPU
// when one is visible), writes each caption's context (its real tokens only, in the cache's dtype)
// to <cache_dir>/text/, and is freed before the VAE is built, so umT5-XXL and the VAE never sit in
// memory together. The clips then read their caption's embedding back from those files.
//
// <cache_dir>/text/
//   w<worker>-<n>.safetensors   a batch of captions: key = xxHash64 of the caption (hex), [len, D]
//   w<worker>.index.json        the text encoder's identity (provenance.h: its weights, tokenizer,
//                               dtype, text_len) and caption hash -> file, for reruns (captions
//                               already there by the same encoder are not embedded again; another
//                               encoder's are) and for the clips
//   null.safetensors            "text": the empty prompt's embedding (classifier-free guidance's
//                               null text in training), and "negative": sample.negative_prompt's
//                               when it is set; null.encoder: the identity of its encoder
//
// A caption that cannot be embedded (not UTF-8) is left out and named when its clip asks for it,
// so that clip is rejected with the reason and the run goes on; a caption longer than
// model.text_len tokens is cut there and counted.
#pragma once
#include <ATen/ATen.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/config.h"
#include "prepare/prepare.h"

namespace vidit {

struct CaptionStoreReport {
  int64_t captions = 0;   // distinct captions of the slice
  int64_t embedded = 0;   // embedded by this run (the rest were in the store already)
  int64_t truncated = 0;  // of those, cut to model.text_len tokens
  int64_t failed = 0;     // could not be embedded (their clips will be rejected)
  double seconds = 0;
};

class CaptionStore {
 public:
  // Embeds what `captions` lacks from the store under `cache_dir` with the umT5 of cfg.text.* and
  // returns the store (the encoder is gone when this returns). Throws vidit::Error when the
  // encoder or tokenizer cannot be opened, or its width is not model.text_dim.
  static CaptionStore build(const Config& cfg, const std::vector<std::string>& captions, int worker,
                            CaptionStoreReport* report = nullptr);

  // The embedding [len, D] of a caption build() was given. Throws vidit::Error naming the caption
  // when it could not be embedded. Not thread-safe.
  at::Tensor lookup(const std::string& caption);
  // lookup() as prepare_cache's CaptionEncoder (holds a shared reference to this store's state).
  CaptionEncoder encoder() const;

 private:
  struct State;
  std::shared_ptr<State> state_;
};

// The null text of a cache prepared with umT5 (<cache_dir>/text/null.safetensors, "text"), zero-
// padded to [text_len, D], or an undefined tensor when the cache has none.
at::Tensor cached_null_text(const std::string& cache_dir, int64_t text_len);

}  // namespace vidit
