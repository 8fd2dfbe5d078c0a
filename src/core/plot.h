// A minimal line-chart writer (PNG through libpng) for loss curves: raw values in light blue,
// their moving average in dark blue, log-scaled y axis with a grid line per decade.
#pragma once
#include <string>
#include <vector>

namespace vidit {

// Throws vidit::Error naming `path` when it cannot be written.
void write_loss_curve_png(const std::string& path, const std::vector<double>& values,
                          int width = 800, int height = 400);

}  // namespace vidit
