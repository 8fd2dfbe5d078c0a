// The fused CPU kernels against the ATen compositions they replace, side by side in one run:
// forward + backward of the QK RMSNorm and of RoPE at the demo model's training shapes (and
// optionally others), median over repeats, and the ratio fused / composite.
//   bench_fused_cpu [--batch 12] [--tokens 96] [--heads 2] [--head-dim 48] [--repeats 300] [--threads 0]
#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>
#include <torch/autograd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>

#include "core/malloc_tuning.h"
#include "kernels/rmsnorm_cpu.h"
#include "kernels/rope_cpu.h"
#include "model/rope.h"

using namespace vidit;

namespace {

// Median seconds of fn() over `repeats` runs after a warm-up.
double median_seconds(const std::function<void()>& fn, int repeats) {
  for (int i = 0; i < 10; ++i) fn();
  std::vector<double> t;
  for (int i = 0; i < repeats; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Alternates the two functions in five rounds so machine noise falls on both alike; returns the
// median round of each.
std::pair<double, double> side_by_side(const std::function<void()>& a, const std::function<void()>& b, int repeats) {
  std::vector<double> ra, rb;
  for (int r = 0; r < 5; ++r) {
    ra.push_back(median_seconds(a, repeats / 5));
    rb.push_back(median_seconds(b, repeats / 5));
  }
  std::nth_element(ra.begin(), ra.begin() + 2, ra.end());
  std::nth_element(rb.begin(), rb.begin() + 2, rb.end());
  return {ra[2], rb[2]};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"fused CPU RMSNorm / RoPE vs the ATen compositions"};
  int64_t batch = 12, frames = 6, height = 4, width = 4, heads = 2, head_dim = 48;
  int repeats = 300, threads = 0;
  app.add_option("--batch", batch);
  app.add_option("--frames", frames, "token grid (after patchify): frames x height x width");
  app.add_option("--height", height);
  app.add_option("--width", width);
  app.add_option("--heads", heads);
  app.add_option("--head-dim", head_dim);
  app.add_option("--repeats", repeats);
  app.add_option("--threads", threads, "0: LibTorch's default");
  CLI11_PARSE(app, argc, argv);
  keep_freed_memory();
  if (threads > 0) at::set_num_threads(threads);
  const int64_t L = frames * height * width, dim = heads * head_dim;
  auto [cos, sin] = rope_tables(frames, height, width, head_dim, 10000.0, at::kCPU);
  at::Tensor x = at::randn({batch, L, dim}).requires_grad_(), w = at::randn({dim}).requires_grad_();
  at::Tensor xr = at::randn({batch, L, heads, head_dim}).requires_grad_();
  at::Tensor gy = at::randn({batch, L, dim}), gyr = at::randn({batch, L, heads, head_dim});

  auto norm = [&](bool fused) {
    return [&, fused] {
      at::Tensor y = fused ? rmsnorm_cpu_fused(x, w, 1e-6) : rmsnorm_composite(x, w, 1e-6);
      torch::autograd::grad({y}, {x, w}, {gy});
    };
  };
  auto rope = [&](bool fused) {
    return [&, fused] {
      at::Tensor y = fused ? rope_cpu_fused(xr, cos, sin) : rope_composite(xr, cos, sin);
      torch::autograd::grad({y}, {xr}, {gyr});
    };
  };
  std::printf("shapes: batch %lld, %lld tokens, %lld heads x %lld; threads %d; forward + backward\n",
              (long long)batch, (long long)L, (long long)heads, (long long)head_dim, at::get_num_threads());
  std::printf("%-10s %14s %14s %8s\n", "op", "composite us", "fused us", "ratio");
  for (auto [name, make] : std::vector<std::pair<const char*, std::function<std::function<void()>(bool)>>>{
           {"rmsnorm", norm}, {"rope", rope}}) {
    auto [tc, tf] = side_by_side(make(false), make(true), repeats);
    std::printf("%-10s %14.1f %14.1f %8.3f\n", name, tc * 1e6, tf * 1e6, tf / tc);
  }
  return 0;
}
