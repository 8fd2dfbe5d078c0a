// The condition mask's layout at the VAE's temporal stride, checked against the pixel-frame mask
// it packs (diffusion/frame_condition.h), and the DiT input assembled from it.
#include "diffusion/frame_condition.h"

#include <gtest/gtest.h>

#include "../../tests/test_util.h"

namespace vidit {
namespace {

// The packing spelled out: frame 0 four times, then every later frame, viewed [T, 4].
at::Tensor packed_from_pixel_mask(const at::Tensor& m) {
  const at::Tensor expanded = at::cat({m.slice(0, 0, 1).repeat({4}), m.slice(0, 1)});
  return expanded.view({-1, 4}).t();  // [4, T]
}

TEST(FrameCondition, TheMaskPacksThePixelFramesAtTheVaeStride) {
  for (int64_t frames : {1, 5, 9, 21})
    for (bool last : {false, true}) {
      if (last && frames == 1) continue;
      at::Tensor m = at::zeros({frames});
      m[0] = 1;
      if (last) m[frames - 1] = 1;
      const at::Tensor mask = frame_condition_mask(frames, 2, 3, last);
      ASSERT_EQ(mask.sizes(), (std::vector<int64_t>{1, 4, (frames - 1) / 4 + 1, 2, 3}));
      EXPECT_TRUE(at::equal(mask[0].select(3, 2).select(2, 1), packed_from_pixel_mask(m)))
          << frames << " frames, last " << last;
    }
}

TEST(FrameCondition, TheConditionVideoHoldsTheGivenFramesAndZeros) {
  const at::Tensor first = at::rand({3, 4, 6}), last = at::rand({3, 4, 6});
  const at::Tensor v = condition_video(first, last, 9);
  ASSERT_EQ(v.sizes(), (std::vector<int64_t>{1, 3, 9, 4, 6}));
  EXPECT_TRUE(at::equal(v[0].select(1, 0), first));
  EXPECT_TRUE(at::equal(v[0].select(1, 8), last));
  EXPECT_EQ(v[0].slice(1, 1, 8).abs().sum().item<double>(), 0);
  EXPECT_EQ(condition_video(first, {}, 9)[0].slice(1, 1).abs().sum().item<double>(), 0);
  EXPECT_NE(test::message_of([&] { condition_video(first, at::rand({3, 2, 2}), 9); }).find("resized"),
            std::string::npos);
  EXPECT_NE(test::message_of([&] { frame_condition_mask(8, 1, 1, false); }).find("1 + 4k"), std::string::npos);
}

TEST(FrameCondition, TheDiTInputIsNoisyThenMaskThenLatent) {
  const at::Tensor noisy = at::rand({2, 16, 3, 4, 6}), latent = at::rand({1, 16, 3, 4, 6});
  const at::Tensor mask = frame_condition_mask(9, 4, 6, false);
  const at::Tensor x = with_frame_condition(noisy, frame_condition(mask, latent));
  ASSERT_EQ(x.sizes(), (std::vector<int64_t>{2, 36, 3, 4, 6}));
  EXPECT_TRUE(at::equal(x.slice(1, 0, 16), noisy));
  EXPECT_TRUE(at::equal(x[1].slice(0, 16, 20), mask[0]));
  EXPECT_TRUE(at::equal(x[1].slice(0, 20), latent[0]));
  EXPECT_TRUE(at::equal(with_frame_condition(noisy, {}), noisy));
}

}  // namespace
}  // namespace vidit
