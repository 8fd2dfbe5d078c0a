#include "model/init.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace vidit {
namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}
bool starts_with(const std::string& s, const std::string& head) { return s.rfind(head, 0) == 0; }

uint64_t mix64(uint64_t z) {  // splitmix64's finalizer
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t stream_key(uint64_t seed, const std::string& name) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a of the name
  for (unsigned char c : name) h = (h ^ c) * 0x100000001b3ull;
  return mix64(mix64(seed) ^ h);
}

// The d-th draw of element i: 53 random bits as a double in [0, 1).
double unit(uint64_t key, int64_t i, int d) {
  const uint64_t z = mix64(key + (2 * uint64_t(i) + uint64_t(d) + 1) * 0x9e3779b97f4a7c15ull);
  return double(z >> 11) * 0x1.0p-53;
}

double value(const InitRule& r, uint64_t key, int64_t i) {
  switch (r.kind) {
    case InitRule::Kind::Zeros: return 0;
    case InitRule::Kind::Ones: return 1;
    case InitRule::Kind::Uniform: return r.scale * (2 * unit(key, i, 0) - 1);
    case InitRule::Kind::Normal: {
      const double u1 = 1 - unit(key, i, 0), u2 = unit(key, i, 1);  // u1 in (0, 1]
      return r.scale * std::sqrt(-2 * std::log(u1)) * std::cos(2 * M_PI * u2);
    }
  }
  return 0;
}

InitRule xavier(int64_t fan_in, int64_t fan_out) {
  return {InitRule::Kind::Uniform, std::sqrt(6.0 / double(fan_in + fan_out))};
}

}  // namespace

InitRule wan_init_rule(const std::string& name, at::IntArrayRef shape, const ModelConfig& cfg) {
  using K = InitRule::Kind;
  if (name == "head.modulation" || ends_with(name, ".modulation") || name == "modulation")
    return {K::Normal, 1 / std::sqrt(double(cfg.dim))};
  if (name == "head.head.weight") return {K::Zeros};
  if (name == "patch_embedding.weight") {
    VIDIT_CHECK(shape.size() >= 2, "init: patch_embedding.weight has shape ", shape);
    int64_t in = 1;
    for (size_t d = 1; d < shape.size(); ++d) in *= shape[d];
    return xavier(in, shape[0]);
  }
  if (ends_with(name, ".bias")) return {K::Zeros};
  if (ends_with(name, "norm_q.weight") || ends_with(name, "norm_k.weight") || ends_with(name, "norm3.weight") ||
      ends_with(name, "norm_k_img.weight"))
    return {K::Ones};
  // The image embedding's LayerNorms (1-D weights) and its position embedding.
  if (starts_with(name, "img_emb.proj.") && ends_with(name, ".weight") && shape.size() == 1) return {K::Ones};
  if (name == "img_emb.emb_pos") return {K::Zeros};
  if ((starts_with(name, "text_embedding.") || starts_with(name, "time_embedding.")) && ends_with(name, ".weight"))
    return {K::Normal, 0.02};
  if (ends_with(name, ".weight") && shape.size() == 2) return xavier(shape[1], shape[0]);
  VIDIT_CHECK(false, "init: no initialisation rule for the parameter '", name, "' of shape ", shape,
              " (model/init.cpp wan_init_rule names every parameter the DiT has)");
  return {};
}

int64_t TensorRegion::numel() const {
  if (flat_count >= 0) return flat_count;
  int64_t n = 1;
  for (size_t d = 0; d < shape.size(); ++d) n *= length.empty() ? shape[d] : length[d];
  return n;
}

TensorRegion whole_region(at::IntArrayRef shape) {
  TensorRegion r;
  r.shape.assign(shape.begin(), shape.end());
  return r;
}

void fill_initial(const at::Tensor& out, const InitRule& rule, uint64_t seed, const std::string& name,
                  const TensorRegion& region) {
  VIDIT_CHECK(out.is_contiguous() && out.numel() == region.numel() && at::isFloatingType(out.scalar_type()),
              "init: the part of '", name, "' must be a contiguous floating tensor of ", region.numel(),
              " elements, got ", out.sizes(), " ", out.scalar_type());
  if (rule.kind == InitRule::Kind::Zeros || rule.kind == InitRule::Kind::Ones) {
    out.fill_(rule.kind == InitRule::Kind::Ones ? 1 : 0);
    if (region.flat_count < 0 || rule.kind == InitRule::Kind::Zeros) return;
  }
  const size_t dims = region.shape.size();
  std::vector<int64_t> offset = region.offset, length = region.length, stride(dims, 1);
  if (length.empty()) offset.assign(dims, 0), length = region.shape;
  int64_t box = 1;
  for (size_t d = dims; d-- > 0;) {
    if (d + 1 < dims) stride[d] = stride[d + 1] * region.shape[d + 1];
    box *= length[d];
  }
  bool whole = true;
  for (size_t d = 0; d < dims; ++d) whole = whole && offset[d] == 0 && length[d] == region.shape[d];
  const int64_t start = region.flat_count >= 0 ? region.flat_start : 0;
  const uint64_t key = stream_key(seed, name);
  // Element j of the part is element start + j of the box (row-major); past the box: padding.
  // Computed in fp64 a chunk at a time (a bounded buffer on the host), then copied into `out`.
  const int64_t n = out.numel(), chunk = std::min<int64_t>(n, int64_t(1) << 22);
  at::Tensor values = at::empty({chunk}, at::kDouble);
  double* v = values.data_ptr<double>();
  const at::Tensor flat = out.view(-1);
  for (int64_t c0 = 0; c0 < n; c0 += chunk) {
    const int64_t len = std::min(chunk, n - c0);
    at::parallel_for(0, len, 1 << 14, [&](int64_t begin, int64_t end) {
      for (int64_t j = begin; j < end; ++j) {
        int64_t k = start + c0 + j;
        if (k >= box) {
          v[j] = 0;
          continue;
        }
        int64_t index = 0;
        if (whole) {
          index = k;
        } else {
          for (size_t d = dims; d-- > 0;) {
            index += (offset[d] + k % length[d]) * stride[d];
            k /= length[d];
          }
        }
        v[j] = value(rule, key, index);
      }
    });
    flat.narrow(0, c0, len).copy_(values.narrow(0, 0, len));
  }
}

}  // namespace vidit
