// What the GPU parity tests share (the model's, the VAE's and training's): a skip where no CUDA
// device is present, TF32 switched off for a scope so fp32 matmuls and convolutions on the GPU
// are true fp32, and the largest difference relative to the largest reference value. Test-only.
#pragma once
#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#define SKIP_WITHOUT_CUDA() \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device"

namespace vidit::cuda_parity {

// max |a - b| / max |b|, in fp64 on the CPU.
inline double rel_err(const at::Tensor& a, const at::Tensor& b) {
  return ((a.cpu().to(at::kDouble) - b.cpu().to(at::kDouble)).abs().max() /
          b.cpu().to(at::kDouble).abs().max().clamp_min(1e-12))
      .item<double>();
}

// TF32 off while it lives; the settings it found are restored.
struct NoTf32 {
  bool mm = at::globalContext().allowTF32CuBLAS(), conv = at::globalContext().allowTF32CuDNN();
  NoTf32() {
    at::globalContext().setAllowTF32CuBLAS(false);
    at::globalContext().setAllowTF32CuDNN(false);
  }
  ~NoTf32() {
    at::globalContext().setAllowTF32CuBLAS(mm);
    at::globalContext().setAllowTF32CuDNN(conv);
  }
};

}  // namespace vidit::cuda_parity
