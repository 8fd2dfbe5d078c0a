#include "demo/adherence.h"

#include <cmath>
#include <sstream>

namespace vidit::demo {

std::string ClipAnalysis::describe() const {
  std::ostringstream os;
  if (!object_found) return "no object";
  os << palette()[colour].name << (moving ? std::string(" moving ") + direction_name(direction) : " not moving clearly")
     << " (v = " << vx << ", " << vy << " px/frame)";
  return os.str();
}

ClipAnalysis analyse_clip(const at::Tensor& frames_in) {
  at::Tensor f = frames_in.to(at::kFloat);  // [T, H, W, 3]
  const int64_t T = f.size(0), H = f.size(1), W = f.size(2);
  at::Tensor mask = std::get<0>(f.max(-1)) > 90.0f;  // [T, H, W]
  at::Tensor count = mask.sum(at::IntArrayRef{1, 2}).to(at::kFloat);  // [T]
  at::Tensor ys = at::arange(H, at::kFloat).view({1, H, 1}), xs = at::arange(W, at::kFloat).view({1, 1, W});
  at::Tensor mf = mask.to(at::kFloat);
  at::Tensor cx = (mf * xs).sum(at::IntArrayRef{1, 2}) / count.clamp_min(1), cy = (mf * ys).sum(at::IntArrayRef{1, 2}) / count.clamp_min(1);

  ClipAnalysis a;
  std::vector<double> t_ok, x_ok, y_ok;
  for (int64_t t = 0; t < T; ++t)
    if (count[t].item<float>() >= 4) {
      t_ok.push_back(double(t));
      x_ok.push_back(cx[t].item<double>());
      y_ok.push_back(cy[t].item<double>());
    }
  if (t_ok.size() * 4 < size_t(T) * 3 || t_ok.size() < 2) return a;
  a.object_found = true;

  // Colour: nearest palette entry to the mean of the object's pixels.
  at::Tensor sel = mask.unsqueeze(-1).expand_as(f);
  at::Tensor mean = f.masked_select(sel).view({-1, 3}).mean(0);
  double best = 1e30;
  for (size_t i = 0; i < palette().size(); ++i) {
    double d = 0;
    for (int k = 0; k < 3; ++k) d += std::pow(mean[k].item<double>() - palette()[i].rgb[k], 2);
    if (d < best) best = d, a.colour = int(i);
  }

  // Motion: least-squares slope of the centroid track.
  auto slope = [&](const std::vector<double>& v) {
    double mt = 0, mv = 0;
    for (size_t i = 0; i < t_ok.size(); ++i) mt += t_ok[i], mv += v[i];
    mt /= double(t_ok.size()), mv /= double(t_ok.size());
    double num = 0, den = 0;
    for (size_t i = 0; i < t_ok.size(); ++i) num += (t_ok[i] - mt) * (v[i] - mv), den += (t_ok[i] - mt) * (t_ok[i] - mt);
    return den > 0 ? num / den : 0.0;
  };
  a.vx = slope(x_ok), a.vy = slope(y_ok);
  const double major = std::max(std::abs(a.vx), std::abs(a.vy)), minor = std::min(std::abs(a.vx), std::abs(a.vy));
  // Clear motion: at least 1/40 of the frame width per frame, mostly along one axis.
  a.moving = major >= double(W) / 40.0 && major > 2 * minor;
  if (std::abs(a.vx) >= std::abs(a.vy)) a.direction = a.vx < 0 ? Direction::Left : Direction::Right;
  else a.direction = a.vy < 0 ? Direction::Up : Direction::Down;
  return a;
}

bool adheres(const ClipAnalysis& a, int colour, Direction d) {
  return a.object_found && a.moving && a.colour == colour && a.direction == d;
}

}  // namespace vidit::demo
