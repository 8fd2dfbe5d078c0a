// MFU: the peak table by device name and precision. (The MFU a training run logs is tested in
// src/train/mfu_test.cpp.)
#include "core/peak_flops.h"

#include <gtest/gtest.h>

namespace vidit {
namespace {

TEST(PeakFlops, TableByNameAndPrecision) {
  EXPECT_DOUBLE_EQ(peak_tflops("NVIDIA H100 80GB HBM3", Precision::bf16), 989.4);
  EXPECT_DOUBLE_EQ(peak_tflops("NVIDIA H100 80GB HBM3", Precision::fp32), 494.7);
  EXPECT_DOUBLE_EQ(peak_tflops("NVIDIA H100 80GB HBM3", Precision::fp8), 989.4);  // against bf16
  EXPECT_DOUBLE_EQ(peak_tflops("NVIDIA H100 PCIe", Precision::bf16), 756);
  EXPECT_DOUBLE_EQ(peak_tflops("NVIDIA H200", Precision::bf16), 989.4);
  EXPECT_DOUBLE_EQ(peak_tflops("NVIDIA A100-SXM4-80GB", Precision::bf16), 312);
  EXPECT_DOUBLE_EQ(peak_tflops("NVIDIA GB200", Precision::bf16), 2500);
  EXPECT_DOUBLE_EQ(peak_tflops("NVIDIA B200", Precision::bf16), 2250);
  EXPECT_EQ(peak_tflops("Some Unknown Accelerator", Precision::bf16), 0);
  EXPECT_EQ(peak_tflops("", Precision::bf16), 0);
}

}  // namespace
}  // namespace vidit
