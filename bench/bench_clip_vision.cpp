// The C++ half of bench/bench_clip_vision.sh: times vidit's CLIP image encoder on the weights and
// pixel values the script's Python half wrote: ClipVisionEncoder::penultimate (what Wan 2.1 I2V
// takes: the layers up to the penultimate, the last one not run) and forward (every layer and the
// pooled output, what transformers runs). Prints the median wall-clock and process CPU
// milliseconds of each over --reps runs after one warm-up run.
//   bench_clip_vision --model DIR --io FILE [--threads T] [--reps R] [--dtype fp32|bf16]
#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <functional>

#include "median_timing.h"
#include "core/safetensors.h"
#include "vision/clip_vision.h"

using namespace vidit;

using bench::median_ms;
using bench::Timing;

int main(int argc, char** argv) {
  CLI::App app{"time vidit's CLIP image encoder (see bench/bench_clip_vision.sh)"};
  std::string model, io_file, dtype = "fp32";
  int threads = 2, reps = 3;
  app.add_option("--model", model, "image_encoder folder")->required();
  app.add_option("--io", io_file, "safetensors with pixel_values [B, 3, S, S]")->required();
  app.add_option("--threads", threads, "intra-op threads");
  app.add_option("--reps", reps, "timed runs (the median is printed)");
  app.add_option("--dtype", dtype, "fp32 or bf16");
  CLI11_PARSE(app, argc, argv);
  at::set_num_threads(threads);
  const at::Tensor pixels = load_safetensors(io_file).at("pixel_values");
  const vision::ClipVisionEncoder enc =
      vision::ClipVisionEncoder::load(model, dtype == "bf16" ? at::kBFloat16 : at::kFloat, at::kCPU);
  at::InferenceMode inference;
  const Timing pen = median_ms(reps, [&] { (void)enc.penultimate(pixels); });
  const Timing all = median_ms(reps, [&] { (void)enc.forward(pixels); });
  std::printf("vidit threads %d penultimate_ms %.1f penultimate_cpu_ms %.1f forward_ms %.1f forward_cpu_ms %.1f\n",
              at::get_num_threads(), pen.wall_ms, pen.cpu_ms, all.wall_ms, all.cpu_ms);
  return 0;
}
