// The fused GPU kernels against the ATen compositions they replace, side by side in one run, at
// Wan 2.1 1.3B's real shape (one sample of 32,760 tokens, dim 1536, 12 heads): LayerNorm +
// modulate (the entry of every sub-block), QK RMSNorm + RoPE (q and k of every self-attention),
// and the gated residual + LayerNorm between sub-blocks (timed with both outputs summed, which
// adds one elementwise pass to each path).
// For each op: forward, and forward + backward, median milliseconds of both paths and their
// ratio, with the bytes each direction must move at least (inputs read once, outputs written
// once) and the achieved GB/s of the fused path: these ops are memory-bound, so GB/s against the
// device's bandwidth is their roofline. FLOPs are listed for completeness (a few per element).
//   bench_kernels [--device cuda|cpu] [--tokens 32760] [--dim 1536] [--heads 12] [--repeats 50]
// On the CPU both paths are ATen where the op has no CPU kernel (a check that the binary runs).
#include <CLI/CLI.hpp>
#include <torch/autograd.h>
#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "kernels/qk_norm_rope.h"
#include "kernels/residual_layernorm.h"
#include "kernels/rmsnorm_cpu.h"
#include "kernels/rope_cpu.h"
#include "model/layers.h"
#include "model/rope.h"

using namespace vidit;

namespace {

bool on_gpu = false;

void sync() {
  if (on_gpu) torch::cuda::synchronize();
}

// Median seconds of fn() over `repeats` runs after a warm-up, the device drained around each.
double median_seconds(const std::function<void()>& fn, int repeats) {
  for (int i = 0; i < 3; ++i) fn();
  sync();
  std::vector<double> t;
  for (int i = 0; i < repeats; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    sync();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

struct Op {
  std::string name;
  double fwd_bytes, bwd_bytes, fwd_flops, bwd_flops;
  std::function<at::Tensor(bool fused)> forward;  // returns the output; inputs require grad
  std::vector<at::Tensor> inputs;                 // what backward differentiates
};

void run(const Op& op, int repeats) {
  auto fwd = [&](bool fused) { return [&, fused] { at::NoGradGuard ng; op.forward(fused); }; };
  auto both = [&](bool fused) {
    return [&, fused] {
      at::Tensor y = op.forward(fused);
      torch::autograd::grad({y}, op.inputs, {at::ones_like(y)});
    };
  };
  // Alternated, so that noise falls on both paths alike.
  const double f_fused = median_seconds(fwd(true), repeats), f_aten = median_seconds(fwd(false), repeats);
  const double b_fused = median_seconds(both(true), repeats), b_aten = median_seconds(both(false), repeats);
  const double fb_bytes = op.fwd_bytes + op.bwd_bytes;
  std::printf("%-20s forward            %8.3f ms %8.3f ms  %5.2fx  %7.1f MB  %7.1f GB/s  %6.1f MFLOP\n", op.name.c_str(),
              f_fused * 1e3, f_aten * 1e3, f_aten / f_fused, op.fwd_bytes / 1e6, op.fwd_bytes / f_fused / 1e9,
              op.fwd_flops / 1e6);
  std::printf("%-20s forward+backward   %8.3f ms %8.3f ms  %5.2fx  %7.1f MB  %7.1f GB/s  %6.1f MFLOP\n", op.name.c_str(),
              b_fused * 1e3, b_aten * 1e3, b_aten / b_fused, fb_bytes / 1e6, fb_bytes / b_fused / 1e9,
              (op.fwd_flops + op.bwd_flops) / 1e6);
  std::printf("{\"op\":\"%s\",\"fwd_ratio\":%.4f,\"fwd_bwd_ratio\":%.4f,\"fwd_gbps\":%.2f,\"fwd_bwd_gbps\":%.2f}\n",
              op.name.c_str(), f_aten / f_fused, b_aten / b_fused, op.fwd_bytes / f_fused / 1e9, fb_bytes / b_fused / 1e9);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"fused GPU kernels vs the ATen compositions they replace"};
  std::string device = "cuda";
  int64_t tokens = 32760, dim = 1536, heads = 12;
  int repeats = 50;
  app.add_option("--device", device)->check(CLI::IsMember({"cuda", "cpu"}));
  app.add_option("--tokens", tokens, "tokens of the one sample (Wan 1.3B at 480x832, 81 frames: 32760)");
  app.add_option("--dim", dim);
  app.add_option("--heads", heads);
  app.add_option("--repeats", repeats);
  CLI11_PARSE(app, argc, argv);
  on_gpu = device == "cuda";
  if (on_gpu && !torch::cuda::is_available()) {
    std::fprintf(stderr, "bench_kernels: no CUDA device (use --device cpu)\n");
    return 2;
  }
  const at::Device dev = on_gpu ? at::Device(at::kCUDA, 0) : at::Device(at::kCPU);
  const auto f32 = at::TensorOptions().device(dev).dtype(at::kFloat);
  const double n = double(tokens) * double(dim);
  std::printf("bench_kernels on %s: 1 x %lld tokens x dim %lld, %lld heads; fused path %s\n", device.c_str(),
              (long long)tokens, (long long)dim, (long long)heads,
              on_gpu && qk_norm_rope_cuda_available() ? "CUDA kernels" : "as the model runs it on this device");
  std::printf("%-20s %-18s %11s %11s  %6s  %10s  %12s  %s\n", "op", "direction", "fused", "ATen", "ATen/f", "bytes",
              "fused", "FLOPs");

  // LayerNorm + modulate: x fp32 (the residual stream), shift / scale [1, 1, D] fp32.
  {
    at::Tensor x = at::randn({1, tokens, dim}, f32).requires_grad_();
    at::Tensor shift = (at::randn({1, 1, dim}, f32) * 0.1).requires_grad_();
    at::Tensor scale = (at::randn({1, 1, dim}, f32) * 0.1).requires_grad_();
    Op op{"layernorm_modulate", 8 * n, 12 * n, 8 * n, 14 * n,
          [&](bool fused) {
            if (fused) return layernorm_modulate(x, shift, scale, 1e-6);
            return at::addcmul(shift, at::layer_norm(x, {dim}, {}, {}, 1e-6), 1 + scale);
          },
          {x, shift, scale}};
    run(op, repeats);
  }
  // QK RMSNorm + RoPE: x bf16 (the projection's output under bf16 autocast), y fp32.
  {
    at::Tensor x = at::randn({1, tokens, dim}, f32).to(at::kBFloat16).requires_grad_();
    at::Tensor w = (1 + at::randn({dim}, f32) * 0.1).requires_grad_();
    // The angles of a 1 x tokens x 1 grid: the cost does not depend on their values.
    auto [cos, sin] = rope_tables(1, tokens, 1, dim / heads, 10000.0, dev);
    Op op{"qk_norm_rope", 6 * n, 8 * n, 10 * n, 16 * n,
          [&](bool fused) {
            if (fused && on_gpu && qk_norm_rope_cuda_available())
              return qk_norm_rope_fused(x, w, cos, sin, heads, 1e-6);
            // The model's path without the kernel: RMSNorm (ATen's fused one on CUDA), then RoPE.
            // On the CPU the fused path is the CPU kernels of both steps.
            at::Tensor nx = fused || on_gpu ? rmsnorm(x.to(at::kFloat), w, 1e-6) : rmsnorm_composite(x.to(at::kFloat), w, 1e-6);
            at::Tensor h = nx.view({1, tokens, heads, dim / heads});
            return fused ? rope_apply(h, cos, sin) : rope_composite(h, cos, sin);
          },
          {x, w}};
    run(op, repeats);
  }
  // Gated residual + LayerNorm (norm3's weight and bias): x fp32, the attention's output bf16.
  {
    at::Tensor x = at::randn({1, tokens, dim}, f32).requires_grad_();
    at::Tensor y = at::randn({1, tokens, dim}, f32).to(at::kBFloat16).requires_grad_();
    at::Tensor gate = (at::randn({1, 1, dim}, f32) * 0.1).requires_grad_();
    at::Tensor w = (1 + at::randn({dim}, f32) * 0.1).requires_grad_(), bias = (at::randn({dim}, f32) * 0.1).requires_grad_();
    Op op{"residual_layernorm", 14 * n, 20 * n, 12 * n, 20 * n,
          [&](bool fused) {
            // Both outputs feed on, as in the block: the residual stream and the normalised copy.
            ResidualNorm r = fused && on_gpu && residual_layernorm_cuda_available()
                                 ? residual_layernorm_fused(x, y, gate, w, bias, {}, {}, 1e-6)
                                 : residual_layernorm_composite(x, y, gate, w, bias, {}, {}, 1e-6);
            return r.residual + r.out;
          },
          {x, y, gate, w, bias}};
    run(op, repeats);
  }
  return 0;
}
