// CLIP's image preprocessing (see image_input.h): PIL's resize reproduced, crop, rescale, normalise.
#include "vision/image_input.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/hf_checkpoint.h"
#include "vision/image_file.h"

namespace fs = std::filesystem;

namespace vidit::vision {
namespace {


// PIL's kernels: the cubic convolution kernel with a = -0.5 (support 2) and the triangle
// (support 1), both as functions of the distance in input pixels.
double cubic_kernel(double x) {
  constexpr double a = -0.5;
  x = std::fabs(x);
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
  if (x < 2.0) return (((x - 5.0) * x + 8.0) * x - 4.0) * a;
  return 0.0;
}
double triangle_kernel(double x) {
  x = std::fabs(x);
  return x < 1.0 ? 1.0 - x : 0.0;
}
// PIL's LANCZOS: sinc(x) sinc(x / 3) on [-3, 3) (support 3; the window is half-open as PIL's is).
// What diffusers' VideoProcessor resizes a pipeline's image with before the VAE.
double sinc(double x) {
  if (x == 0.0) return 1.0;
  x *= M_PI;
  return std::sin(x) / x;
}
double lanczos_kernel(double x) { return -3.0 <= x && x < 3.0 ? sinc(x) * sinc(x / 3.0) : 0.0; }

double kernel_support(Resample filter) {
  switch (filter) {
    case Resample::lanczos: return 3.0;
    case Resample::bicubic: return 2.0;
    case Resample::bilinear: return 1.0;
  }
  return 1.0;
}
double kernel(Resample filter, double x) {
  switch (filter) {
    case Resample::lanczos: return lanczos_kernel(x);
    case Resample::bicubic: return cubic_kernel(x);
    case Resample::bilinear: return triangle_kernel(x);
  }
  return 0.0;
}

// Bits after the binary point of the fixed-point weights: 32 - 8 (a pixel) - 2 (headroom).
constexpr int kWeightBits = 22;

// One axis of a resize: output sample o is sum over j < count[o] of in[first[o] + j] * weight[o * width + j],
// in fixed point.
struct Taps {
  std::vector<int64_t> first, count;
  std::vector<int64_t> weight;
  int64_t width = 0;  // weights stored per output sample (the widest window)
};

// PIL's weights for resampling `in` samples to `out`: output sample o is centred on input
// coordinate (o + 0.5) * in / out; the kernel is stretched by the shrink factor when shrinking
// (so that every input sample counts: antialiasing), cut to the input, normalised to sum 1 and
// rounded to fixed point (half away from zero).
Taps make_taps(int64_t in, int64_t out, Resample filter) {
  const double scale = static_cast<double>(in) / static_cast<double>(out);
  const double stretch = std::max(scale, 1.0);
  const double support = kernel_support(filter) * stretch;
  const double inv_stretch = 1.0 / stretch;
  Taps t;
  t.width = static_cast<int64_t>(std::ceil(support)) * 2 + 1;
  t.first.resize(out);
  t.count.resize(out);
  t.weight.assign(out * t.width, 0);
  std::vector<double> w(t.width);
  for (int64_t o = 0; o < out; ++o) {
    const double center = (static_cast<double>(o) + 0.5) * scale;
    // Truncation toward zero, then clamped to the picture (PIL's own rounding of the window).
    const int64_t lo = std::max<int64_t>(static_cast<int64_t>(center - support + 0.5), 0);
    const int64_t hi = std::min<int64_t>(static_cast<int64_t>(center + support + 0.5), in);
    const int64_t n = hi - lo;
    double sum = 0;
    for (int64_t j = 0; j < n; ++j) {
      const double x = (static_cast<double>(j + lo) - center + 0.5) * inv_stretch;
      w[j] = kernel(filter, x);
      sum += w[j];
    }
    for (int64_t j = 0; j < n; ++j) {
      const double v = (sum != 0.0 ? w[j] / sum : w[j]) * static_cast<double>(int64_t{1} << kWeightBits);
      t.weight[o * t.width + j] = static_cast<int64_t>(v < 0 ? v - 0.5 : v + 0.5);
    }
    t.first[o] = lo;
    t.count[o] = n;
  }
  return t;
}

// Rounds a fixed-point sum (the half already added) to a pixel, clipped to 0..255.
inline uint8_t to_pixel(int64_t sum) {
  return static_cast<uint8_t>(std::clamp<int64_t>(sum >> kWeightBits, 0, 255));
}

// One pass over axis `axis` (0: rows, 1: columns) of a contiguous uint8 [H, W, C] picture.
at::Tensor resample_axis(const at::Tensor& in, int64_t axis, int64_t out_size, Resample filter) {
  const int64_t H = in.size(0), W = in.size(1), C = in.size(2);
  const int64_t in_size = axis == 0 ? H : W;
  const Taps t = make_taps(in_size, out_size, filter);
  at::Tensor out = at::empty(axis == 0 ? std::vector<int64_t>{out_size, W, C} : std::vector<int64_t>{H, out_size, C},
                             in.options());
  const uint8_t* src = in.data_ptr<uint8_t>();
  uint8_t* dst = out.data_ptr<uint8_t>();
  const int64_t half = int64_t{1} << (kWeightBits - 1);
  if (axis == 1) {  // along each row
    const int64_t OW = out_size;
    for (int64_t y = 0; y < H; ++y) {
      const uint8_t* row = src + y * W * C;
      for (int64_t o = 0; o < OW; ++o) {
        const int64_t* k = &t.weight[o * t.width];
        const uint8_t* p = row + t.first[o] * C;
        for (int64_t c = 0; c < C; ++c) {
          int64_t sum = half;
          for (int64_t j = 0; j < t.count[o]; ++j) sum += static_cast<int64_t>(p[j * C + c]) * k[j];
          dst[(y * OW + o) * C + c] = to_pixel(sum);
        }
      }
    }
  } else {  // along each column: whole rows at a time
    const int64_t row_len = W * C;
    for (int64_t o = 0; o < out_size; ++o) {
      const int64_t* k = &t.weight[o * t.width];
      const uint8_t* rows = src + t.first[o] * row_len;
      uint8_t* out_row = dst + o * row_len;
      for (int64_t i = 0; i < row_len; ++i) {
        int64_t sum = half;
        for (int64_t j = 0; j < t.count[o]; ++j) sum += static_cast<int64_t>(rows[j * row_len + i]) * k[j];
        out_row[i] = to_pixel(sum);
      }
    }
  }
  return out;
}

nlohmann::json read_json(const std::string& path) {
  try {
    std::ifstream in(path);
    VIDIT_CHECK(in.good(), "cannot open");
    return nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    fail("CLIP image processor config '", path, "': cannot read it as JSON (", e.what(), ")");
  }
}

}  // namespace

ClipImageConfig ClipImageConfig::from_json_file(const std::string& path) {
  const nlohmann::json j = read_json(path);
  VIDIT_CHECK(j.is_object(), "CLIP image processor config '", path, "': not a JSON object");
  ClipImageConfig c;
  auto flag = [&](const char* key, bool& field) {
    if (!j.contains(key) || j[key].is_null()) return;
    VIDIT_CHECK(j[key].is_boolean(), "CLIP image processor config '", path, "': \"", key, "\" is not true or false");
    field = j[key].get<bool>();
  };
  auto positive = [&](const nlohmann::json& v, const std::string& key) -> int64_t {
    VIDIT_CHECK(v.is_number_integer() && v.get<int64_t>() > 0, "CLIP image processor config '", path, "': \"", key,
                "\" is not a positive integer");
    return v.get<int64_t>();
  };
  flag("do_resize", c.do_resize);
  flag("do_center_crop", c.do_center_crop);
  flag("do_rescale", c.do_rescale);
  flag("do_normalize", c.do_normalize);
  if (j.contains("size") && !j["size"].is_null()) {
    const auto& s = j["size"];
    if (s.is_number()) {  // an older file's single number: the shortest edge, for CLIP
      c.shortest_edge = positive(s, "size");
    } else {
      VIDIT_CHECK(s.is_object(), "CLIP image processor config '", path, "': \"size\" is neither a number nor an object");
      VIDIT_CHECK(!s.contains("longest_edge") && !s.contains("max_height"), "CLIP image processor config '", path,
                  "': size ", s.dump(), " is not supported: use {\"shortest_edge\": N} or {\"height\": H, \"width\": W}");
      if (s.contains("shortest_edge")) {
        c.shortest_edge = positive(s["shortest_edge"], "size.shortest_edge");
      } else {
        VIDIT_CHECK(s.contains("height") && s.contains("width"), "CLIP image processor config '", path, "': size ",
                    s.dump(), " has neither shortest_edge nor height and width");
        c.shortest_edge = 0;
        c.resize_height = positive(s["height"], "size.height");
        c.resize_width = positive(s["width"], "size.width");
      }
    }
  }
  if (j.contains("crop_size") && !j["crop_size"].is_null()) {
    const auto& s = j["crop_size"];
    if (s.is_number()) {  // one number: a square
      c.crop_height = c.crop_width = positive(s, "crop_size");
    } else {
      VIDIT_CHECK(s.is_object() && s.contains("height") && s.contains("width"), "CLIP image processor config '", path,
                  "': crop_size must be a number or {\"height\": H, \"width\": W}, got ", s.dump());
      c.crop_height = positive(s["height"], "crop_size.height");
      c.crop_width = positive(s["width"], "crop_size.width");
    }
  }
  if (j.contains("resample") && !j["resample"].is_null()) {
    const auto& r = j["resample"];
    const int64_t v = r.is_number_integer() ? r.get<int64_t>() : -1;
    VIDIT_CHECK(v == 1 || v == 2 || v == 3, "CLIP image processor config '", path, "': resample ", r.dump(),
                " is not supported (1: PIL's LANCZOS, 2: BILINEAR or 3: BICUBIC, CLIP's)");
    c.resample = static_cast<Resample>(v);
  }
  if (j.contains("rescale_factor") && !j["rescale_factor"].is_null()) {
    VIDIT_CHECK(j["rescale_factor"].is_number(), "CLIP image processor config '", path,
                "': \"rescale_factor\" is not a number");
    c.rescale_factor = j["rescale_factor"].get<double>();
  }
  auto triple = [&](const char* key, std::array<double, 3>& field, bool nonzero) {
    if (!j.contains(key) || j[key].is_null()) return;
    const auto& v = j[key];
    if (v.is_number()) {
      field.fill(v.get<double>());
    } else {
      VIDIT_CHECK(v.is_array() && v.size() == 3, "CLIP image processor config '", path, "': \"", key,
                  "\" must be a number or a list of 3 (one per RGB channel), got ", v.dump());
      for (size_t i = 0; i < 3; ++i) {
        VIDIT_CHECK(v[i].is_number(), "CLIP image processor config '", path, "': \"", key, "\"[", i, "] is not a number");
        field[i] = v[i].get<double>();
      }
    }
    if (nonzero)
      for (double x : field)
        VIDIT_CHECK(x != 0.0, "CLIP image processor config '", path, "': \"", key, "\" has a zero (it divides)");
  };
  triple("image_mean", c.image_mean, false);
  triple("image_std", c.image_std, true);
  return c;
}

ClipImageConfig ClipImageConfig::load(const std::string& path) {
  std::error_code ec;
  if (fs::is_regular_file(path, ec)) return from_json_file(path);
  for (const char* rel : {"preprocessor_config.json", "image_processor/preprocessor_config.json"}) {
    const fs::path p = fs::path(path) / rel;
    if (fs::is_regular_file(p, ec)) return from_json_file(p.string());
  }
  fail("CLIP image processor config: no preprocessor_config.json at '", path, "' (nor in its image_processor/); "
       "pass the file, its folder or a diffusers pipeline folder, or use the CLIP defaults");
}

ClipImageConfig ClipImageConfig::beside_encoder(const std::string& encoder) {
  const fs::path p(encoder);
  std::error_code ec;
  for (const fs::path& c : {p / "preprocessor_config.json", p / "image_processor", p.parent_path() / "image_processor"})
    if (fs::exists(c, ec)) return load(c.string());
  return {};
}

std::pair<int64_t, int64_t> clip_resized_size(const ClipImageConfig& cfg, int64_t height, int64_t width) {
  if (!cfg.do_resize) return {height, width};
  if (cfg.shortest_edge <= 0) return {cfg.resize_height, cfg.resize_width};
  // transformers: the short side becomes shortest_edge, the long one int(shortest_edge * long /
  // short), the product exact and the quotient in double, truncated.
  const int64_t s = cfg.shortest_edge;
  const bool portrait = width <= height;
  const int64_t shorter = portrait ? width : height, longer = portrait ? height : width;
  const auto scaled = static_cast<int64_t>(static_cast<double>(s * longer) / static_cast<double>(shorter));
  return portrait ? std::make_pair(scaled, s) : std::make_pair(s, scaled);
}

at::Tensor resize_like_pil(const at::Tensor& image, int64_t height, int64_t width, Resample filter) {
  VIDIT_CHECK(image.dim() == 3 && image.scalar_type() == at::kByte && image.size(0) > 0 && image.size(1) > 0,
              "resize_like_pil: the picture must be uint8 [H, W, C] with H, W >= 1, got ", image.scalar_type(), " ",
              shape_str(image.sizes()));
  VIDIT_CHECK(height > 0 && width > 0, "resize_like_pil: the output size must be at least 1x1, got ", width, "x", height);
  at::Tensor x = image.cpu().contiguous();
  // PIL resizes the width first, then the height, each pass rounded to 8 bits; a side that keeps
  // its size is not resampled.
  if (width != x.size(1)) x = resample_axis(x, 1, width, filter);
  if (height != x.size(0)) x = resample_axis(x, 0, height, filter);
  return x.is_same(image) ? x.clone() : x;
}

at::Tensor center_crop(const at::Tensor& image, int64_t height, int64_t width) {
  VIDIT_CHECK(image.dim() == 3 && height > 0 && width > 0, "center_crop: needs a [H, W, C] picture and a size of at "
              "least 1x1, got ", shape_str(image.sizes()), " to ", width, "x", height);
  const int64_t H = image.size(0), W = image.size(1);
  auto floor_half = [](int64_t v) { return v >= 0 ? v / 2 : -((-v + 1) / 2); };  // Python's v // 2
  const int64_t top = floor_half(H - height), left = floor_half(W - width);
  if (top >= 0 && left >= 0 && top + height <= H && left + width <= W)
    return image.narrow(0, top, height).narrow(1, left, width).contiguous();
  at::Tensor out = at::zeros({height, width, image.size(2)}, image.options());
  const int64_t y0 = std::max<int64_t>(top, 0), y1 = std::min(top + height, H);
  const int64_t x0 = std::max<int64_t>(left, 0), x1 = std::min(left + width, W);
  if (y1 > y0 && x1 > x0)
    out.narrow(0, y0 - top, y1 - y0).narrow(1, x0 - left, x1 - x0).copy_(image.narrow(0, y0, y1 - y0).narrow(1, x0, x1 - x0));
  return out;
}

at::Tensor preprocess_clip_image(const at::Tensor& image, const ClipImageConfig& cfg) {
  VIDIT_CHECK(image.dim() == 3 && image.size(2) == 3 && image.scalar_type() == at::kByte && image.size(0) > 0 &&
                  image.size(1) > 0,
              "CLIP preprocessing: the picture must be RGB uint8 [H, W, 3] with H, W >= 1, got ", image.scalar_type(),
              " ", shape_str(image.sizes()), " (decode_image_file gives that for an image file)");
  at::Tensor x = image.cpu();
  if (cfg.do_resize) {
    const auto [h, w] = clip_resized_size(cfg, x.size(0), x.size(1));
    x = resize_like_pil(x, h, w, cfg.resample);
  }
  if (cfg.do_center_crop) x = center_crop(x, cfg.crop_height, cfg.crop_width);
  at::Tensor v = x.permute({2, 0, 1});  // [3, h, w]
  // The arithmetic of transformers' NumPy code, in its dtypes: the rescale in double, rounded to
  // fp32; the normalisation in fp32.
  v = cfg.do_rescale ? (v.to(at::kDouble) * cfg.rescale_factor).to(at::kFloat) : v.to(at::kFloat);
  if (cfg.do_normalize) {
    const auto opts = at::TensorOptions().dtype(at::kDouble);
    const at::Tensor mean = at::tensor(std::vector<double>(cfg.image_mean.begin(), cfg.image_mean.end()), opts);
    const at::Tensor std = at::tensor(std::vector<double>(cfg.image_std.begin(), cfg.image_std.end()), opts);
    v = (v - mean.to(at::kFloat).view({3, 1, 1})) / std.to(at::kFloat).view({3, 1, 1});
  }
  return v.contiguous();
}

at::Tensor clip_pixel_values(const std::vector<at::Tensor>& images, const ClipImageConfig& cfg) {
  VIDIT_CHECK(!images.empty(), "clip_pixel_values: no pictures given");
  std::vector<at::Tensor> out;
  out.reserve(images.size());
  for (size_t i = 0; i < images.size(); ++i) {
    out.push_back(preprocess_clip_image(images[i], cfg));
    VIDIT_CHECK(out[i].sizes() == out[0].sizes(), "clip_pixel_values: picture ", i, " becomes ", shape_str(out[i].sizes()),
                " but picture 0 becomes ", shape_str(out[0].sizes()), "; without a centre crop, give pictures of one size");
  }
  return at::stack(out);
}

at::Tensor load_clip_pixel_values(const std::vector<std::string>& files, const ClipImageConfig& cfg) {
  std::vector<at::Tensor> images;
  images.reserve(files.size());
  for (const auto& f : files) images.push_back(decode_image_file(f));
  return clip_pixel_values(images, cfg);
}

}  // namespace vidit::vision
