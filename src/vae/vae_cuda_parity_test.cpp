// GPU parity of the Wan VAE: encode and decode on CUDA give what they give on the CPU (fp32,
// TF32 off), at a width that runs in a moment. The test skips where no CUDA device is present
// (CI); bench/gpu/run.sh runs it on a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "core/cuda_parity_test_util.h"
#include "model/state_dict.h"
#include "vae/wan_vae.h"

namespace vidit {
namespace {

using cuda_parity::NoTf32;
using cuda_parity::rel_err;

TEST(CudaParity, WanVaeEncodeDecodeMatchCpu) {
  SKIP_WITHOUT_CUDA();
  NoTf32 fp32;
  WanVAEConfig cfg;
  cfg.base_dim = 8;
  torch::manual_seed(3);
  WanVAE cpu(cfg);
  {
    at::NoGradGuard ng;
    for (auto& item : cpu->named_parameters()) {
      at::Tensor p = item.value();
      if (item.key().ends_with("gamma")) p.normal_(1.0, 0.2);
      else if (p.dim() > 1) p.normal_(0.0, 1.0 / std::sqrt(double(p.numel() / p.size(0))));
      else p.normal_(0.0, 0.1);
    }
  }
  WanVAE gpu(cfg);
  load_state_dict(*gpu, state_dict(*cpu), "cpu copy");
  gpu->to(at::kCUDA);
  at::NoGradGuard ng;
  at::Tensor video = at::rand({1, 3, 9, 32, 48}) * 2 - 1;
  VaeMoments m_cpu = cpu->encode(video), m_gpu = gpu->encode(video.cuda());
  const double enc = rel_err(m_gpu.mean, m_cpu.mean);
  at::Tensor d_cpu = cpu->decode(m_cpu.mean), d_gpu = gpu->decode(m_cpu.mean.cuda());
  const double dec = rel_err(d_gpu, d_cpu);
  std::printf("GPU_PARITY vae_encode_fp32 %.3e vae_decode_fp32 %.3e\n", enc, dec);
  EXPECT_LT(enc, 1e-4);
  EXPECT_LT(dec, 1e-4);
}

}  // namespace
}  // namespace vidit
