// The demo's built-in caption embedder: each word of a caption becomes one text token whose
// embedding is a fixed pseudo-random unit-variance vector derived from the word alone (FNV-1a
// hash -> seeded generator). Deterministic everywhere, no weights to ship. Real runs read
// precomputed text-encoder embeddings (e.g. umT5) instead.
#pragma once
#include <ATen/ATen.h>

#include <string>

namespace vidit::demo {

// [text_len, dim]: one row per word (lower-cased, split on spaces), zero rows after the last
// word. Throws vidit::Error when the caption has more than text_len words.
at::Tensor embed_caption(const std::string& caption, int64_t text_len, int64_t dim);

}  // namespace vidit::demo
