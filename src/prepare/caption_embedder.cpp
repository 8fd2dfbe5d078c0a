#include "prepare/caption_embedder.h"

#include <ATen/CPUGeneratorImpl.h>

#include <cctype>
#include <sstream>

#include "core/error.h"

namespace vidit::demo {

at::Tensor embed_caption(const std::string& caption, int64_t text_len, int64_t dim) {
  at::Tensor out = at::zeros({text_len, dim}, at::kFloat);
  std::istringstream words(caption);
  std::string w;
  int64_t i = 0;
  while (words >> w) {
    VIDIT_CHECK(i < text_len, "caption \"", caption, "\" has more than ", text_len,
                " words; raise model.text_len");
    uint64_t h = 1469598103934665603ull;  // FNV-1a
    for (char ch : w) h = (h ^ uint64_t(std::tolower(static_cast<unsigned char>(ch)))) * 1099511628211ull;
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(h);
    out[i++] = at::randn({dim}, gen, at::kFloat);
  }
  return out;
}

}  // namespace vidit::demo
