// GPU parity: the model's forward and gradients on CUDA are those on the CPU. The test skips
// where no CUDA device is present (CI); bench/gpu/run.sh runs it on a GPU. TF32 is switched off
// so fp32 matmuls on the GPU are true fp32 and the tolerances stay tight. (The VAE's parity is in
// src/vae/vae_cuda_parity_test.cpp, a training step's in src/train/cuda_training_parity_test.cpp.)
#include <gtest/gtest.h>

#include <cstdio>

#include "../../tests/test_util.h"
#include "core/cuda_parity_test_util.h"
#include "model/dit.h"
#include "model/state_dict.h"

namespace vidit {
namespace {

using cuda_parity::NoTf32;
using cuda_parity::rel_err;
using test::tiny_config;

TEST(CudaParity, DiTForwardAndGradientsMatchCpu) {
  SKIP_WITHOUT_CUDA();
  NoTf32 fp32;
  Config c = tiny_config({"model.dim=64", "model.heads=4", "model.ffn_dim=128"});
  torch::manual_seed(0);
  DiT cpu(c.model);
  cpu->init_weights();
  {
    torch::NoGradGuard ng;
    cpu->head->head->weight.normal_(0, 0.1);
  }
  DiT gpu(c.model);
  load_state_dict(*gpu, state_dict(*cpu), "cpu copy");
  gpu->to(at::kCUDA);
  at::Tensor x = at::randn({2, 4, 2, 4, 4}), t = at::tensor({100.f, 700.f}), text = at::randn({2, 4, 8});
  at::Tensor out_cpu = cpu->forward(x, t, text);
  at::Tensor out_gpu = gpu->forward(x.cuda(), t.cuda(), text.cuda());
  const double fwd = rel_err(out_gpu, out_cpu);
  std::printf("GPU_PARITY dit_forward_fp32 %.3e\n", fwd);
  EXPECT_LT(fwd, 1e-4);

  out_cpu.square().mean().backward();
  out_gpu.square().mean().backward();
  auto pc = cpu->named_parameters(), pg = gpu->named_parameters();
  double worst = 0;
  std::string worst_name;
  for (const auto& item : pc) {
    const at::Tensor& g_cpu = item.value().grad();
    const at::Tensor& g_gpu = pg[item.key()].grad();
    ASSERT_TRUE(g_cpu.defined() && g_gpu.defined()) << item.key();
    if (g_cpu.abs().max().item<double>() < 1e-8) continue;  // e.g. zero-initialised paths
    const double e = rel_err(g_gpu, g_cpu);
    if (e > worst) worst = e, worst_name = item.key();
  }
  std::printf("GPU_PARITY dit_grad_fp32 %.3e (%s)\n", worst, worst_name.c_str());
  EXPECT_LT(worst, 1e-3) << worst_name;
}

}  // namespace
}  // namespace vidit
