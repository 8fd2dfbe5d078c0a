// Comparisons the kernel tests share: the largest absolute difference of two tensors (on any
// device, compared in fp64 on the CPU), and a gtest assertion that |a - b| <= atol + rtol * |b|
// everywhere (or both undefined), which says by how much it fails.
#pragma once
#include <ATen/ATen.h>
#include <gtest/gtest.h>

namespace vidit::test {

inline double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.detach().to(at::kCPU, at::kDouble) - b.detach().to(at::kCPU, at::kDouble)).abs().max().item<double>();
}

inline ::testing::AssertionResult close(const at::Tensor& a, const at::Tensor& b, double atol, double rtol) {
  if (a.defined() != b.defined()) return ::testing::AssertionFailure() << "one tensor is undefined, the other is not";
  if (!a.defined()) return ::testing::AssertionSuccess();  // e.g. no gradient on either side
  if (a.sizes() != b.sizes()) return ::testing::AssertionFailure() << "shape " << a.sizes() << " vs " << b.sizes();
  const at::Tensor ad = a.detach().to(at::kCPU, at::kDouble);
  const at::Tensor bd = b.detach().to(at::kCPU, at::kDouble);
  const double worst = ((ad - bd).abs() - (atol + rtol * bd.abs())).max().item<double>();
  if (worst <= 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "max |a-b| = " << max_abs_diff(a, b) << " exceeds atol " << atol
                                       << " + rtol " << rtol << " * |b| by " << worst;
}

}  // namespace vidit::test
