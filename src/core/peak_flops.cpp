#include "core/peak_flops.h"

#include <utility>
#include <vector>

namespace vidit {

double peak_tflops(const std::string& name, Precision precision) {
  // Name fragments, most specific first: {fragment, bf16, tf32}.
  struct Entry {
    const char* fragment;
    double bf16, tf32;
  };
  static const std::vector<Entry> table = {
      {"GB200", 2500, 1250}, {"B200", 2250, 1100}, {"H200", 989.4, 494.7}, {"H100 PCIe", 756, 378},
      {"H100", 989.4, 494.7}, {"H800", 989.4, 494.7}, {"A100", 312, 156}, {"A800", 312, 156},
      {"L40S", 362.05, 183}, {"A10G", 70, 35}, {"RTX 4090", 165.2, 82.6}};
  for (const Entry& e : table)
    if (name.find(e.fragment) != std::string::npos) return precision == Precision::fp32 ? e.tf32 : e.bf16;
  return 0;
}

#ifndef VIDIT_HAVE_CUDA
std::string cuda_device_name(int) { return ""; }
#endif

}  // namespace vidit
