// The profile of a few steps (diagnose/profile.h): op and kernel names sorted into categories,
// and the summary of a made-up timeline, each category's time the own time of its ops. (A real
// run with train.profile_steps is tested in src/train/profile_run_test.cpp.)
#include "diagnose/profile.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace vidit {
namespace {

TEST(Profile, OpsAndKernelsFallIntoCategories) {
  EXPECT_EQ(profile_category("aten::addmm", false), "matmul");
  EXPECT_EQ(profile_category("aten::_scaled_mm", false), "matmul");
  EXPECT_EQ(profile_category("aten::convolution_backward", false), "matmul");
  EXPECT_EQ(profile_category("aten::_scaled_dot_product_flash_attention_for_cpu", false), "attention");
  EXPECT_EQ(profile_category("aten::scaled_dot_product_attention", false), "attention");
  EXPECT_EQ(profile_category("aten::native_layer_norm", false), "elementwise");
  EXPECT_EQ(profile_category("wait all_gather", false), "communication");
  EXPECT_EQ(profile_category("gloo:all_reduce", false), "communication");
  EXPECT_EQ(profile_category("step 3", false), "");
  EXPECT_EQ(profile_category("block 0", false), "");
  EXPECT_EQ(profile_category("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", true), "communication");
  EXPECT_EQ(profile_category("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", true), "matmul");
  EXPECT_EQ(profile_category("nvjet_hsh_128x256_64x4_2x1_v_bz_coopB_TNT", true), "matmul");
  EXPECT_EQ(profile_category("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128>>", true), "attention");
  EXPECT_EQ(profile_category("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3", true), "attention");
  EXPECT_EQ(profile_category("void at::native::vectorized_elementwise_kernel<4, ...>", true), "elementwise");
}

// Two steps on thread 1 (10 ms in all); a matmul with a copy inside it, a norm, a wait; a
// bookkeeping thread that is not counted; kernels on two streams, one overlapping another.
TEST(Profile, SummaryGivesEachOpItsOwnTime) {
  const int64_t ms = 1000000;
  std::vector<ProfiledEvent> ev = {
      {"step 1", false, 1, 0, 6 * ms},
      {"forward", false, 1, 0, 5 * ms},
      {"aten::addmm", false, 1, 1 * ms, 3 * ms},
      {"aten::copy_", false, 1, 2 * ms, 3 * ms},  // inside the matmul: matmul
      {"aten::native_layer_norm", false, 1, 3 * ms, 4 * ms},
      {"wait all_gather", false, 1, 4 * ms, 5 * ms},
      {"step 2", false, 1, 6 * ms, 10 * ms},
      {"aten::mm", false, 1, 7 * ms, 9 * ms},
      {"aten::add", false, 2, 0, 10 * ms},  // another thread (the loader): not the steps'
      {"sm90_xmma_gemm_bf16", true, 0, 1 * ms, 4 * ms},
      {"ncclDevKernel_AllGather", true, 0, 3 * ms, 5 * ms},
      {"vectorized_elementwise_kernel", true, 0, 7 * ms, 8 * ms},
  };
  const ProfileSummary s = summarize_profile(ev);
  EXPECT_DOUBLE_EQ(s.window_s, 0.010);
  EXPECT_NEAR(s.host_s.at("matmul"), 0.004, 1e-12);       // 2 ms addmm (copy included) + 2 ms mm
  EXPECT_NEAR(s.host_s.at("elementwise"), 0.001, 1e-12);  // the norm
  EXPECT_NEAR(s.host_s.at("communication"), 0.001, 1e-12);
  EXPECT_NEAR(s.host_s.at("idle"), 0.004, 1e-12);         // inside the steps, outside any op
  double sum = 0;
  for (const auto& [c, v] : s.host_s) sum += v;
  EXPECT_NEAR(sum, s.window_s, 1e-12);
  ASSERT_TRUE(s.has_device());
  EXPECT_NEAR(s.device_s.at("matmul"), 0.003, 1e-12);
  EXPECT_NEAR(s.device_s.at("communication"), 0.002, 1e-12);  // 1 ms of it behind the GEMM
  EXPECT_NEAR(s.device_s.at("elementwise"), 0.001, 1e-12);
  EXPECT_NEAR(s.device_s.at("idle"), 0.005, 1e-12);           // 10 ms less the 5 ms with a kernel
  EXPECT_NE(s.format(false).find("matmul 40%"), std::string::npos) << s.format(false);
}

}  // namespace
}  // namespace vidit
