#include "parallel/step_time.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "core/error.h"
#include "core/peak_flops.h"
#include "model/model_info.h"

namespace vidit {

StepTimePrediction predict_step_time(const Config& cfg, const StepPlan& plan, const DeviceRates& rates) {
  const auto& m = cfg.model;
  const auto& p = cfg.parallel;
  const double dp = double(p.replicate * p.shard), split = double(p.ulysses * p.ring * p.tensor);
  const double A = double(cfg.train.grad_accum), b = std::ceil(double(cfg.train.batch_size) / dp);
  const double L = double(tokens_per_sample(cfg)), Lt = double(m.text_len), d = double(m.dim), f = double(m.ffn_dim);
  const double layers = double(m.layers);
  const double whole = double(plan.recompute.whole), recomputed = whole + double(plan.recompute.selective);
  const ModelInfo info = model_info(cfg);
  // One sample's forward, split into attention and the rest (model_info.cpp's terms).
  const double attention_block = 4 * L * L * d + 4 * L * Lt * d;
  const double matmul_block = 2 * L * 4 * d * d + 2 * L * 2 * d * d + 2 * Lt * 2 * d * d + 2 * L * 2 * d * f;
  const double attention_fw = layers * attention_block, matmul_fw = info.forward_flops - attention_fw;
  const double samples = A * b / split;  // samples' worth of work per rank and step
  StepTimePrediction s;
  s.model_flops = 3 * info.forward_flops * samples;
  s.matmul_flops = (3 * matmul_fw + recomputed * matmul_block) * samples;
  // Selective recomputation reruns everything of a block but its self-attention (L^2 terms).
  s.attention_flops =
      (3 * attention_fw + whole * attention_block + (recomputed - whole) * 4 * L * Lt * d) * samples;
  // A block keeps (18 d + 2 ffn) x 4 bytes per local token for backward (plan.h): written
  // forward, read and their gradients written backward; a recomputed block writes them again.
  const double per_block = b * L / double(p.ulysses * p.ring) * (18 * d + 2 * f) * 4;
  // The update: AdamW reads weight, gradient and both moments and writes three of them, EMA
  // reads two and writes one, clipping reads and scales the gradients: about 13 fp32 passes
  // over what the rank keeps.
  s.elementwise_bytes = A * per_block * (3 * layers + recomputed) + 13 * plan.weights;  // plan.weights: fp32 bytes kept
  s.comm_bytes = plan.comm();
  s.matmul_s = rates.matmul_flops > 0 ? s.matmul_flops / rates.matmul_flops : 0;
  const double attention_rate = rates.attention_flops > 0 ? rates.attention_flops : rates.matmul_flops;
  s.attention_s = attention_rate > 0 ? s.attention_flops / attention_rate : 0;
  s.elementwise_s = rates.memory_bytes > 0 ? s.elementwise_bytes / rates.memory_bytes : 0;
  s.comm_s = rates.link_bytes > 0 ? s.comm_bytes / rates.link_bytes : 0;
  return s;
}

std::string format_step_time(const StepTimePrediction& p, const DeviceRates& r) {
  char line[256];
  std::ostringstream out;
  out << "rates           " << r.source << ": matmul " << r.matmul_flops / 1e12 << " TFLOP/s, attention "
      << (r.attention_flops > 0 ? r.attention_flops : r.matmul_flops) / 1e12 << " TFLOP/s, memory "
      << r.memory_bytes / 1e9 << " GB/s, link " << r.link_bytes / 1e9 << " GB/s, peak " << r.peak_flops / 1e12
      << " TFLOP/s\n";
  std::snprintf(line, sizeof line,
                "step time       matmul %.4g s (%.3g TFLOP), attention %.4g s (%.3g TFLOP), elementwise %.4g s "
                "(%.3g GB), communication %.4g s (%.3g GB)\n",
                p.matmul_s, p.matmul_flops / 1e12, p.attention_s, p.attention_flops / 1e12, p.elementwise_s,
                p.elementwise_bytes / 1e9, p.comm_s, p.comm_bytes / 1e9);
  out << line;
  std::snprintf(line, sizeof line, "predicted       %.4g s per step with communication overlapped, %.4g s without",
                p.overlapped_s(), p.serial_s());
  out << line;
  if (r.peak_flops > 0) {
    std::snprintf(line, sizeof line, "; MFU %.1f%% (overlapped) to %.1f%%", 100 * p.mfu(p.overlapped_s(), r.peak_flops),
                  100 * p.mfu(p.serial_s(), r.peak_flops));
    out << line;
  }
  out << "\n";
  return out.str();
}

namespace {

// Best of three windows of about 0.1 s each: seconds per call of `fn` (synchronized on a GPU).
template <typename F>
double seconds_per_call(F fn, bool cuda) {
  auto sync = [&] {
    if (cuda) at::empty({1}, at::TensorOptions().device(at::kCUDA)).cpu();  // waits for the stream
  };
  fn();
  sync();
  double best = 1e30;
  for (int window = 0; window < 3; ++window) {
    int calls = 0;
    const auto t0 = std::chrono::steady_clock::now();
    double s = 0;
    do {
      fn();
      ++calls;
      sync();
      s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    } while (s < 0.1);
    best = std::min(best, s / calls);
  }
  return best;
}

}  // namespace

DeviceRates measure_rates(const Config& cfg, const std::string& device) {
  const bool cuda = device == "cuda";
  VIDIT_CHECK(cuda || device == "cpu", "plan --measure: the device is 'cpu' or 'cuda', not '", device, "'");
  if (cfg.train.threads > 0) at::set_num_threads(int(cfg.train.threads));
  const auto opts = at::TensorOptions().device(cuda ? at::kCUDA : at::kCPU).dtype(cuda ? at::kBFloat16 : at::kFloat);
  const auto& m = cfg.model;
  const auto& p = cfg.parallel;
  const int64_t dp = p.replicate * p.shard, b = (cfg.train.batch_size + dp - 1) / dp;
  const int64_t L = tokens_per_sample(cfg), rows = std::min<int64_t>(b * L / (p.ulysses * p.ring), 16384);
  const int64_t d = m.dim, f = m.ffn_dim / p.tensor;
  DeviceRates r;
  r.source = std::string("measured (") + (cuda ? "bf16 on the GPU" : "fp32 on " + std::to_string(at::get_num_threads()) + " CPU thread(s)") + ")";
  {
    at::Tensor x = at::randn({rows, d}, opts), w = at::randn({d, f}, opts);
    r.matmul_flops = 2.0 * double(rows) * double(d) * double(f) / seconds_per_call([&] { at::mm(x, w); }, cuda);
  }
  {
    const int64_t heads = m.heads / (p.tensor * p.ulysses), hd = m.dim / m.heads, Lq = L / p.ring;
    at::Tensor q = at::randn({b, heads, Lq, hd}, opts), k = at::randn({b, heads, L, hd}, opts), v = at::randn_like(k);
    const double flops = 4.0 * double(b * heads * Lq * L * hd);
    r.attention_flops = flops / seconds_per_call([&] { at::scaled_dot_product_attention(q, k, v); }, cuda);
  }
  {
    at::Tensor a = at::empty({64 << 20}, opts.dtype(at::kFloat)), c = at::empty_like(a);
    a.fill_(1);
    r.memory_bytes = 2.0 * double(a.nbytes()) / seconds_per_call([&] { c.copy_(a); }, cuda);
  }
  r.peak_flops = cfg.train.peak_tflops > 0 ? cfg.train.peak_tflops * 1e12
                 : cuda                    ? peak_tflops(cuda_device_name(0), cfg.train.precision) * 1e12
                                           : 0;
  return r;
}

}  // namespace vidit
