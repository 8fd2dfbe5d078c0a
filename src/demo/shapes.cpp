#include "demo/shapes.h"

#include <cmath>

namespace vidit::demo {

const std::vector<Colour>& palette() {
  static const std::vector<Colour> p = {{"red", {230, 40, 40}},
                                        {"green", {40, 210, 60}},
                                        {"blue", {50, 90, 240}},
                                        {"yellow", {235, 215, 40}}};
  return p;
}

const std::vector<const char*>& shape_names() {
  static const std::vector<const char*> s = {"square", "circle"};
  return s;
}

const std::vector<Direction>& directions() {
  static const std::vector<Direction> d = {Direction::Left, Direction::Right, Direction::Up,
                                           Direction::Down};
  return d;
}

const char* direction_name(Direction d) {
  switch (d) {
    case Direction::Left: return "left";
    case Direction::Right: return "right";
    case Direction::Up: return "up";
    case Direction::Down: return "down";
  }
  return "?";
}

std::string caption(const ClipSpec& c, bool with_colour) {
  std::string colour = with_colour ? std::string(palette()[c.colour].name) + " " : "";
  return "a " + colour + shape_names()[c.shape] + " moving " + direction_name(c.direction);
}

at::Tensor render_clip(const ClipSpec& c) {
  at::Tensor out = at::zeros({c.frames, c.height, c.width, 3}, at::kByte);
  uint8_t* px = out.data_ptr<uint8_t>();
  const auto& rgb = palette()[c.colour].rgb;
  double dx = 0, dy = 0;
  switch (c.direction) {
    case Direction::Left: dx = -1; break;
    case Direction::Right: dx = 1; break;
    case Direction::Up: dy = -1; break;
    case Direction::Down: dy = 1; break;
  }
  const double r = c.size / 2;
  constexpr int S = 4;  // supersampling per axis
  for (int64_t t = 0; t < c.frames; ++t) {
    const double cx = c.x0 + dx * c.speed * double(t), cy = c.y0 + dy * c.speed * double(t);
    for (int64_t y = 0; y < c.height; ++y)
      for (int64_t x = 0; x < c.width; ++x) {
        int hits = 0;
        for (int sy = 0; sy < S; ++sy)
          for (int sx = 0; sx < S; ++sx) {
            const double u = double(x) + (sx + 0.5) / S - cx, v = double(y) + (sy + 0.5) / S - cy;
            const bool inside = c.shape == 0 ? (std::abs(u) <= r && std::abs(v) <= r) : (u * u + v * v <= r * r);
            hits += inside;
          }
        if (!hits) continue;
        uint8_t* p = px + ((t * c.height + y) * c.width + x) * 3;
        for (int k = 0; k < 3; ++k) p[k] = static_cast<uint8_t>(rgb[k] * hits / (S * S));
      }
  }
  return out;
}

ClipSpec random_clip(int colour, int shape, Direction d, int64_t width, int64_t height,
                     int64_t frames, int64_t inner, at::Generator& gen, int64_t path_frames) {
  if (path_frames < 0) path_frames = frames;
  auto uniform = [&](double lo, double hi) {
    return lo + (hi - lo) * at::rand({1}, gen, at::kDouble).item<double>();
  };
  ClipSpec c;
  c.colour = colour, c.shape = shape, c.direction = d;
  c.width = width, c.height = height, c.frames = frames;
  // Sizes scale with the crop (8-10 px at 32 px); the path spans 50-60% of it.
  c.size = double(inner) / 32.0 * uniform(8, 10);
  c.speed = double(inner) * uniform(0.5, 0.6) / double(std::max<int64_t>(1, path_frames - 1));
  const double travel = c.speed * double(path_frames - 1), r = c.size / 2;
  const double left = double(width - inner) / 2, top = double(height - inner) / 2;
  // The moving axis needs room for the travel; the other axis anywhere inside.
  double lo_x = left + r + 0.5, hi_x = left + double(inner) - r - 0.5;
  double lo_y = top + r + 0.5, hi_y = top + double(inner) - r - 0.5;
  switch (d) {
    case Direction::Left: lo_x += travel; break;
    case Direction::Right: hi_x -= travel; break;
    case Direction::Up: lo_y += travel; break;
    case Direction::Down: hi_y -= travel; break;
  }
  c.x0 = uniform(lo_x, std::max(lo_x, hi_x));
  c.y0 = uniform(lo_y, std::max(lo_y, hi_y));
  return c;
}

bool held_out(int colour, Direction d) {
  static const Direction pairs[4] = {Direction::Left, Direction::Right, Direction::Up, Direction::Down};
  return pairs[colour] == d;
}

bool seen_mirror(int colour, Direction d) {
  static const Direction pairs[4] = {Direction::Right, Direction::Left, Direction::Down, Direction::Up};
  return pairs[colour] == d;
}

}  // namespace vidit::demo
