// Prompt adherence of a generated demo clip: does it show one object of the prompted colour
// moving in the prompted direction? The object is the set of bright pixels (any channel above
// a threshold) on the black background; its colour is the nearest palette colour to their mean,
// and its motion is the least-squares slope of its centroid over the frames. A clip with no
// object in most frames, or whose object moves less than 1/40 of the frame width per frame, or
// not mostly along one axis, is a failure.
#pragma once
#include <ATen/ATen.h>

#include <string>

#include "demo/shapes.h"

namespace vidit::demo {

struct ClipAnalysis {
  bool object_found = false;   // an object in at least 3/4 of the frames
  int colour = -1;             // palette index, -1 when no object
  bool moving = false;         // clear straight motion along one axis
  Direction direction = Direction::Left;
  double vx = 0, vy = 0;       // centroid velocity, pixels/frame (y grows downwards)
  std::string describe() const;
};

// frames [T, H, W, 3] uint8.
ClipAnalysis analyse_clip(const at::Tensor& frames);

// True when the clip shows the prompted colour moving in the prompted direction.
bool adheres(const ClipAnalysis& a, int colour, Direction d);

}  // namespace vidit::demo
