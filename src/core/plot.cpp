#include "core/plot.h"

#include <png.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>

#include "core/error.h"

namespace vidit {
namespace {


// A 5x7 bitmap font for the few characters the chart writes (one row per string, '#' = ink).
struct Glyph {
  char c;
  const char* rows[7];
};
const Glyph kFont[] = {
    {'0', {" ### ", "#   #", "#  ##", "# # #", "##  #", "#   #", " ### "}},
    {'1', {"  #  ", " ##  ", "  #  ", "  #  ", "  #  ", "  #  ", " ### "}},
    {'2', {" ### ", "#   #", "    #", "   # ", "  #  ", " #   ", "#####"}},
    {'3', {"#### ", "    #", "    #", " ### ", "    #", "    #", "#### "}},
    {'4', {"   # ", "  ## ", " # # ", "#  # ", "#####", "   # ", "   # "}},
    {'5', {"#####", "#    ", "#### ", "    #", "    #", "#   #", " ### "}},
    {'6', {" ### ", "#    ", "#    ", "#### ", "#   #", "#   #", " ### "}},
    {'7', {"#####", "    #", "   # ", "  #  ", " #   ", " #   ", " #   "}},
    {'8', {" ### ", "#   #", "#   #", " ### ", "#   #", "#   #", " ### "}},
    {'9', {" ### ", "#   #", "#   #", " ####", "    #", "    #", " ### "}},
    {'.', {"     ", "     ", "     ", "     ", "     ", " ##  ", " ##  "}},
    {'-', {"     ", "     ", "     ", " ### ", "     ", "     ", "     "}},
    {'e', {"     ", "     ", " ### ", "#   #", "#####", "#    ", " ### "}},
    {'l', {" ##  ", "  #  ", "  #  ", "  #  ", "  #  ", "  #  ", " ### "}},
    {'o', {"     ", "     ", " ### ", "#   #", "#   #", "#   #", " ### "}},
    {'s', {"     ", "     ", " ####", "#    ", " ### ", "    #", "#### "}},
    {'t', {" #   ", " #   ", "#### ", " #   ", " #   ", " #  #", "  ## "}},
    {'p', {"     ", "     ", "#### ", "#   #", "#### ", "#    ", "#    "}},
};

struct Canvas {
  int w, h;
  std::vector<uint8_t> px;
  Canvas(int w_, int h_) : w(w_), h(h_), px(size_t(w_) * h_ * 3, 255) {}
  void set(int x, int y, uint8_t r, uint8_t g, uint8_t b) {
    if (x < 0 || y < 0 || x >= w || y >= h) return;
    uint8_t* p = &px[(size_t(y) * w + x) * 3];
    p[0] = r, p[1] = g, p[2] = b;
  }
  void line(double x0, double y0, double x1, double y1, uint8_t r, uint8_t g, uint8_t b, int thick) {
    const int n = int(std::max(std::abs(x1 - x0), std::abs(y1 - y0))) + 1;
    for (int i = 0; i <= n; ++i) {
      const double t = double(i) / n;
      const int x = int(std::lround(x0 + (x1 - x0) * t)), y = int(std::lround(y0 + (y1 - y0) * t));
      for (int dy = 0; dy < thick; ++dy)
        for (int dx = 0; dx < thick; ++dx) set(x + dx, y + dy, r, g, b);
    }
  }
  // Writes `text` with its top-left corner at (x, y); unknown characters leave a gap.
  void text(int x, int y, const std::string& str) {
    for (char ch : str) {
      for (const auto& g : kFont)
        if (g.c == ch)
          for (int row = 0; row < 7; ++row)
            for (int col = 0; col < 5; ++col)
              if (g.rows[row][col] == '#') set(x + col, y + row, 40, 40, 40);
      x += 6;
    }
  }
};

}  // namespace

void write_loss_curve_png(const std::string& path, const std::vector<double>& values, int width, int height) {
  Canvas c(width, height);
  const int ml = 50, mr = 20, mt = 20, mb = 30;
  const double pw = width - ml - mr, ph = height - mt - mb;
  std::vector<double> v;
  for (double x : values) v.push_back(std::log10(std::max(x, 1e-12)));
  double lo = v.empty() ? 0 : *std::min_element(v.begin(), v.end());
  double hi = v.empty() ? 1 : *std::max_element(v.begin(), v.end());
  lo = std::floor(lo), hi = std::ceil(hi);
  if (hi <= lo) hi = lo + 1;
  auto X = [&](size_t i) { return ml + pw * (v.size() > 1 ? double(i) / double(v.size() - 1) : 0.0); };
  auto Y = [&](double y) { return mt + ph * (1 - (y - lo) / (hi - lo)); };
  for (double d = lo; d <= hi; d += 1) {  // a grid line and a label per decade
    c.line(ml, Y(d), ml + pw, Y(d), 220, 220, 220, 1);
    c.text(6, int(Y(d)) - 3, "1e" + std::to_string(int(d)));
  }
  c.text(ml, height - 20, "0");
  const std::string last = std::to_string(values.size());
  c.text(int(ml + pw) - 6 * int(last.size()), height - 20, last);
  c.text(ml + int(pw) / 2 - 30, height - 20, "step");
  c.text(ml + 8, 6, "loss");
  c.line(ml, mt, ml, mt + ph, 0, 0, 0, 2);
  c.line(ml, mt + ph, ml + pw, mt + ph, 0, 0, 0, 2);
  for (size_t i = 1; i < v.size(); ++i) c.line(X(i - 1), Y(v[i - 1]), X(i), Y(v[i]), 150, 190, 240, 1);
  const size_t win = std::max<size_t>(1, v.size() / 50);
  std::vector<double> avg(v.size());
  double run = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    run += v[i];
    if (i >= win) run -= v[i - win];
    avg[i] = run / double(std::min(i + 1, win));
  }
  for (size_t i = 1; i < avg.size(); ++i) c.line(X(i - 1), Y(avg[i - 1]), X(i), Y(avg[i]), 20, 60, 160, 2);

  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "wb"), &std::fclose);
  VIDIT_CHECK(f, "cannot write '", path, "'");
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png ? png_create_info_struct(png) : nullptr;
  VIDIT_CHECK(png && info, "libpng could not start writing '", path, "'");
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, &info);
    fail("libpng failed writing '", path, "'");
  }
  png_init_io(png, f.get());
  png_set_IHDR(png, info, width, height, 8, PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  png_write_info(png, info);
  for (int y = 0; y < height; ++y) png_write_row(png, &c.px[size_t(y) * width * 3]);
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
}

}  // namespace vidit
