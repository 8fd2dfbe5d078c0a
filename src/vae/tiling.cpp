#include "vae/tiling.h"

#include <algorithm>

#include "core/error.h"

namespace vidit {

std::vector<TileSpan> tile_spans(int64_t size, int64_t tile, int64_t stride) {
  VIDIT_CHECK(tile > 0 && stride > 0 && stride <= tile, "tiling: need 0 < stride <= tile, got tile ", tile,
              ", stride ", stride);
  std::vector<TileSpan> spans;
  for (int64_t begin = 0;; begin += stride) {
    spans.push_back({begin, std::min(begin + tile, size)});
    if (begin + tile >= size) break;
  }
  return spans;
}

namespace {

// Blend weights [n] (output pixels) for tile k of `spans`: a linear ramp up across the overlap with
// the previous tile and down across the overlap with the next one.
at::Tensor axis_weights(const std::vector<TileSpan>& spans, size_t k, int64_t num, int64_t den,
                        const at::TensorOptions& options) {
  const int64_t n = (spans[k].end - spans[k].begin) * num / den;
  at::Tensor y = at::arange(n, options.dtype(at::kFloat));
  at::Tensor w = at::ones({n}, options.dtype(at::kFloat));
  if (k > 0) {
    const int64_t e = (spans[k - 1].end - spans[k].begin) * num / den;
    w = w * ((y + 1) / double(e + 1)).clamp_max(1.0);
  }
  if (k + 1 < spans.size()) {
    const int64_t e = (spans[k].end - spans[k + 1].begin) * num / den;
    w = w * ((n - y) / double(e + 1)).clamp_max(1.0);
  }
  return w;
}

int64_t scaled(int64_t v, int64_t num, int64_t den, const char* what) {
  VIDIT_CHECK(v * num % den == 0, "tiling: ", what, " ", v, " times ", num, "/", den,
              " is not a whole number of pixels: use tile and stride sizes that are multiples of ", den);
  return v * num / den;
}

}  // namespace

at::Tensor tiled_apply(const at::Tensor& x, int64_t tile, int64_t stride, int64_t num, int64_t den,
                       const std::function<at::Tensor(const at::Tensor&)>& fn, const TileShare* share) {
  const int64_t H = x.size(-2), W = x.size(-1);
  const auto rows = tile_spans(H, tile, stride), cols = tile_spans(W, tile, stride);
  const int64_t Ho = scaled(H, num, den, "frame height"), Wo = scaled(W, num, den, "frame width");
  auto input = [&](size_t i, size_t j) {
    return x.slice(-2, rows[i].begin, rows[i].end).slice(-1, cols[j].begin, cols[j].end);
  };
  // Shared: this process's tiles first (they are what it spends its time on), blended below.
  std::vector<at::Tensor> own;
  if (share) {
    VIDIT_CHECK(share->count >= 1 && share->index >= 0 && share->index < share->count && share->share,
                "tiling: a TileShare needs 0 <= index < count and a share function");
    own.resize(rows.size() * cols.size());
    for (size_t k = size_t(share->index); k < own.size(); k += size_t(share->count))
      own[k] = fn(input(k / cols.size(), k % cols.size()));
  }
  at::Tensor out, weight_sum;
  for (size_t i = 0; i < rows.size(); ++i) {
    at::Tensor wr = axis_weights(rows, i, num, den, x.options());
    for (size_t j = 0; j < cols.size(); ++j) {
      const TileSpan r = rows[i], c = cols[j];
      const size_t k = i * cols.size() + j;
      at::Tensor y = share ? share->share(k, int(k % size_t(share->count)), own[k]) : fn(input(i, j));
      if (share) own[k] = at::Tensor();
      const int64_t r0 = scaled(r.begin, num, den, "tile start"), r1 = scaled(r.end, num, den, "tile end");
      const int64_t c0 = scaled(c.begin, num, den, "tile start"), c1 = scaled(c.end, num, den, "tile end");
      VIDIT_CHECK(y.dim() >= 2 && y.size(-2) == r1 - r0 && y.size(-1) == c1 - c0, "tiling: a tile of ",
                  r.end - r.begin, "x", c.end - c.begin, " gave an output of ", y.sizes(), ", expected ",
                  r1 - r0, "x", c1 - c0, " on the last two dims");
      if (!out.defined()) {
        auto sizes = y.sizes().vec();
        sizes[sizes.size() - 2] = Ho;
        sizes[sizes.size() - 1] = Wo;
        out = at::zeros(sizes, y.options());
        weight_sum = at::zeros({Ho, Wo}, y.options().dtype(at::kFloat));
      }
      VIDIT_CHECK(y.sizes().slice(0, y.dim() - 2).equals(out.sizes().slice(0, out.dim() - 2)),
                  "tiling: tiles gave different leading dims: ", y.sizes(), " vs ", out.sizes());
      at::Tensor w = at::outer(wr, axis_weights(cols, j, num, den, x.options()));
      out.slice(-2, r0, r1).slice(-1, c0, c1).add_(y * w.to(y.scalar_type()));
      weight_sum.slice(0, r0, r1).slice(1, c0, c1).add_(w);
    }
  }
  return out / weight_sum.to(out.scalar_type());
}

namespace {

// b's first rows (dim -2, or columns: dim -1) become a's last ones faded into them, in place.
void fade_into(const at::Tensor& a, at::Tensor& b, int64_t dim, int64_t extent) {
  const int64_t e = std::min({a.size(dim), b.size(dim), extent});
  if (e <= 0) return;
  std::vector<int64_t> shape(size_t(b.dim()), 1);
  shape[size_t(b.dim() + dim)] = e;
  const at::Tensor w = (at::arange(e, b.options().dtype(at::kDouble)) / double(e)).to(b.scalar_type()).view(shape);
  at::Tensor head = b.narrow(dim, 0, e);
  head.copy_(a.narrow(dim, a.size(dim) - e, e) * (1 - w) + head * w);
}

}  // namespace

at::Tensor blend_tiles_as_diffusers(const at::Tensor& x, int64_t tile, int64_t stride, int64_t out_stride, int64_t blend,
                                    int64_t out_h, int64_t out_w, const std::function<at::Tensor(const at::Tensor&)>& fn) {
  VIDIT_CHECK(tile > 0 && stride > 0 && out_stride > 0 && blend >= 0, "tiling: need tile, stride and out_stride > 0, "
              "got ", tile, ", ", stride, ", ", out_stride);
  const int64_t H = x.size(-2), W = x.size(-1);
  std::vector<std::vector<at::Tensor>> rows;
  for (int64_t i = 0; i < H; i += stride) {
    rows.emplace_back();
    for (int64_t j = 0; j < W; j += stride)
      rows.back().push_back(
          fn(x.slice(-2, i, std::min(i + tile, H)).slice(-1, j, std::min(j + tile, W))).contiguous());
  }
  std::vector<at::Tensor> kept_rows;
  for (size_t i = 0; i < rows.size(); ++i) {
    std::vector<at::Tensor> kept;
    for (size_t j = 0; j < rows[i].size(); ++j) {
      at::Tensor& t = rows[i][j];
      VIDIT_CHECK(t.dim() >= 2 && t.sizes().slice(0, t.dim() - 2).equals(rows[0][0].sizes().slice(0, t.dim() - 2)),
                  "tiling: tiles gave different leading dims: ", t.sizes(), " vs ", rows[0][0].sizes());
      if (i > 0) fade_into(rows[i - 1][j], t, -2, blend);
      if (j > 0) fade_into(rows[i][j - 1], t, -1, blend);
      kept.push_back(t.slice(-2, 0, out_stride).slice(-1, 0, out_stride));
    }
    kept_rows.push_back(at::cat(kept, -1));
  }
  return at::cat(kept_rows, -2).slice(-2, 0, out_h).slice(-1, 0, out_w).contiguous();
}

}  // namespace vidit
