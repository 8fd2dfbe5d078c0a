// The demo's world: one coloured shape (square or circle) moving in a straight line on a
// black background, and its caption, e.g. "a red square moving left". Clips are rendered
// here as RGB frames; the demo encodes them to H.264 with FFmpeg and decodes them back.
#pragma once
#include <ATen/ATen.h>

#include <array>
#include <string>
#include <vector>

namespace vidit::demo {

enum class Direction { Left, Right, Up, Down };

struct Colour {
  const char* name;
  std::array<uint8_t, 3> rgb;
};

const std::vector<Colour>& palette();               // red, green, blue, yellow
const std::vector<const char*>& shape_names();      // square, circle
const std::vector<Direction>& directions();         // left, right, up, down
const char* direction_name(Direction d);

struct ClipSpec {
  int colour = 0;                 // index into palette()
  int shape = 0;                  // index into shape_names()
  Direction direction = Direction::Left;
  int64_t width = 32, height = 32, frames = 8;
  double size = 9;                // square side / circle diameter, pixels
  double speed = 2;               // pixels per frame
  double x0 = 16, y0 = 16;        // centre at frame 0
};

// "a red square moving left"; without the colour, "a square moving left".
std::string caption(const ClipSpec& c, bool with_colour = true);

// Renders frames [T, H, W, 3] uint8 with anti-aliased edges (supersampled 4x4).
at::Tensor render_clip(const ClipSpec& c);

// A random clip of the given colour/shape/direction whose shape stays within the central
// `inner` x `inner` square of a width x height frame for the first `path_frames` frames
// (default: all; later frames may carry it out of view). The shape crosses 50-60% of the crop
// in those frames, so each frame moves it by a good part of its own size: a model that
// draws it standing still is clearly wrong.
ClipSpec random_clip(int colour, int shape, Direction d, int64_t width, int64_t height,
                     int64_t frames, int64_t inner, at::Generator& gen, int64_t path_frames = -1);

// The (colour, direction) pairs held out of training: (red, left), (green, right),
// (blue, up), (yellow, down). Every colour and every direction is still seen in training.
bool held_out(int colour, Direction d);

// A pair seen in training that mirrors the held-out one: (red, right), (green, left), (blue,
// down), (yellow, up). Sampling these beside the held-out pairs separates fitting from
// generalisation.
bool seen_mirror(int colour, Direction d);

}  // namespace vidit::demo
