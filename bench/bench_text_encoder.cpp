// The C++ half of bench/bench_text_encoder.sh: times vidit's umT5 encoder on the weights and
// token ids the script's Python half wrote, in two ways:
//   padded:  Umt5Encoder::forward on the full [B, text_len] batch (what transformers runs);
//   trimmed: what TextEncoder does with the same captions: the batch cut to its longest caption,
//            only the real tokens' rows computed (PaddedRows::zeros: the real tokens' outputs are
//            the same; padding positions are zeros).
// Prints the median wall-clock and process CPU milliseconds of each over --reps runs after one
// warm-up run.
//   bench_text_encoder --model DIR --io FILE [--threads T] [--reps R] [--dtype fp32|bf16]
#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <functional>
#include <cstdio>
#include <ctime>

#include "core/error.h"
#include "median_timing.h"
#include "core/safetensors.h"
#include "text/umt5.h"

using namespace vidit;

using bench::median_ms;
using bench::Timing;

int main(int argc, char** argv) {
  CLI::App app{"time vidit's umT5 encoder (see bench/bench_text_encoder.sh)"};
  std::string model, io_file, dtype = "fp32";
  int threads = 2, reps = 3;
  app.add_option("--model", model, "text_encoder folder")->required();
  app.add_option("--io", io_file, "safetensors with ids [B, text_len] and mask")->required();
  app.add_option("--threads", threads, "intra-op threads (at::set_num_threads)");
  app.add_option("--reps", reps, "timed runs (median printed)");
  app.add_option("--dtype", dtype, "fp32 or bf16")->check(CLI::IsMember({"fp32", "bf16"}));
  CLI11_PARSE(app, argc, argv);
  try {
    at::set_num_threads(threads);
    const text::Umt5Encoder enc =
        text::Umt5Encoder::load(model, dtype == "fp32" ? at::kFloat : at::kBFloat16, at::kCPU);
    const TensorMap io = load_safetensors(io_file);
    const at::Tensor ids = io.at("ids"), mask = io.at("mask");
    const int64_t longest = mask.sum(1).max().item<int64_t>();
    const at::Tensor ids_t = ids.narrow(1, 0, longest), mask_t = mask.narrow(1, 0, longest);
    const Timing padded = median_ms(reps, [&] { enc.forward(ids, mask); });
    const Timing trimmed =
        median_ms(reps, [&] { enc.forward(ids_t, mask_t, text::Umt5Encoder::PaddedRows::zeros); });
    std::printf("cpp padded_ms %.1f trimmed_ms %.1f padded_cpu_ms %.1f trimmed_cpu_ms %.1f threads %d B %lld "
                "text_len %lld longest %lld\n",
                padded.wall_ms, trimmed.wall_ms, padded.cpu_ms, trimmed.cpu_ms, at::get_num_threads(),
                (long long)ids.size(0), (long long)ids.size(1), (long long)longest);
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
  return 0;
}
