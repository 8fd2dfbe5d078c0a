// Bucket construction, assignment and the resize + centre crop.
#include "loader/buckets.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace vidit {
namespace {

BucketSpec spec() {
  BucketSpec s;
  s.resolutions = {256, 480};
  s.aspect_ratios = {16.0 / 9, 1.0, 9.0 / 16};
  s.frames = {17, 33};
  s.frame_stride = 4;  // Wan VAE: 4k+1 frames
  s.multiple = 16;
  return s;
}

TEST(Buckets, ShapesAreMultiplesAndKeepTheArea) {
  auto b = make_buckets(spec());
  ASSERT_EQ(b.size(), 2u * 3u * 2u);
  for (const auto& x : b) {
    EXPECT_EQ(x.height % 16, 0) << x.name();
    EXPECT_EQ(x.width % 16, 0) << x.name();
    EXPECT_EQ((x.frames - 1) % 4, 0) << x.name();
  }
  // 480p 16:9 is the familiar 480x832 (sqrt(480^2 * 16/9) = 640 -> 480x853 -> snapped).
  bool found = false;
  for (const auto& x : b) found |= (x.height == 368 && x.width == 640) || (x.height == 352 && x.width == 640);
  EXPECT_TRUE(found) << "no 16:9 bucket near 640 wide at the 480 tier";
  for (const auto& x : b) {
    const double tier = std::sqrt(double(x.height * x.width));
    EXPECT_TRUE(std::abs(tier - 256) < 16 || std::abs(tier - 480) < 16) << x.name();
  }
}

TEST(Buckets, BadSpecsNameTheField) {
  BucketSpec s = spec();
  s.frames = {17, 20};
  try {
    make_buckets(s);
    FAIL() << "20 frames accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("buckets.frames"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("17"), std::string::npos) << e.what();
  }
  s = spec();
  s.aspect_ratios.clear();
  EXPECT_THROW(make_buckets(s), Error);
  s = spec();
  s.max_upscale = 0.5;
  EXPECT_THROW(make_buckets(s), Error);
}

TEST(Buckets, LargestBucketWithoutUpscaling) {
  auto b = make_buckets(spec());
  // A 1280x720 clip of 40 frames: 16:9, the 480 tier fits, 33 frames is the longest that fits.
  auto c = assign_bucket(b, 1280, 720, 40, 1.0);
  ASSERT_TRUE(c.ok()) << c.reason;
  EXPECT_EQ(b[c.index].frames, 33);
  EXPECT_GT(b[c.index].width, b[c.index].height);
  EXPECT_GT(b[c.index].width * b[c.index].height, 400 * 400);
  EXPECT_LE(c.scale, 1.0);
  // A 400x225 clip (16:9) is too small for the 480 tier without upscaling: the 256 tier.
  c = assign_bucket(b, 400, 225, 17, 1.0);
  ASSERT_TRUE(c.ok()) << c.reason;
  EXPECT_LT(b[c.index].width * b[c.index].height, 300 * 300);
  EXPECT_EQ(b[c.index].frames, 17);
  // Portrait goes to the portrait bucket.
  c = assign_bucket(b, 720, 1280, 17, 1.0);
  ASSERT_TRUE(c.ok()) << c.reason;
  EXPECT_GT(b[c.index].height, b[c.index].width);
  // With tolerance, a slightly small clip may be upscaled into the bigger tier.
  c = assign_bucket(b, 600, 338, 17, 1.0);
  ASSERT_TRUE(c.ok());
  const int64_t area_strict = b[c.index].width * b[c.index].height;
  c = assign_bucket(b, 600, 338, 17, 1.2);
  ASSERT_TRUE(c.ok());
  EXPECT_GT(b[c.index].width * b[c.index].height, area_strict);
  EXPECT_GT(c.scale, 1.0);
  EXPECT_LE(c.scale, 1.2);
}

TEST(Buckets, RejectionsSayWhy) {
  auto b = make_buckets(spec());
  auto c = assign_bucket(b, 1280, 720, 12, 1.0);
  EXPECT_FALSE(c.ok());
  EXPECT_NE(c.reason.find("too short"), std::string::npos) << c.reason;
  EXPECT_NE(c.reason.find("17"), std::string::npos) << c.reason;
  c = assign_bucket(b, 160, 90, 40, 1.0);
  EXPECT_FALSE(c.ok());
  EXPECT_NE(c.reason.find("too small"), std::string::npos) << c.reason;
  c = assign_bucket(b, 0, 90, 40, 1.0);
  EXPECT_FALSE(c.ok());
  EXPECT_NE(c.reason.find("empty"), std::string::npos) << c.reason;
}

TEST(Buckets, FitResizesAndCentreCrops) {
  // 8 frames of 90x160 (16:9): left half red, right half blue, a green bar in the middle column.
  at::Tensor f = at::zeros({8, 90, 160, 3}, at::kByte);
  f.slice(2, 0, 80).select(3, 0).fill_(200);
  f.slice(2, 80, 160).select(3, 2).fill_(200);
  Bucket b{5, 32, 32, 1.0};  // square: crops the sides
  at::Tensor out = fit_to_bucket(f, b);
  ASSERT_EQ(out.sizes(), (std::vector<int64_t>{5, 32, 32, 3}));
  EXPECT_EQ(out.scalar_type(), at::kByte);
  // Scaled by 32/90, the 160-wide frame becomes 57 wide; the crop keeps the centre 32 columns:
  // red on the left of the crop, blue on the right, each about half.
  EXPECT_GT(out[0][16][2][0].item<int>(), 190);
  EXPECT_LT(out[0][16][2][2].item<int>(), 10);
  EXPECT_GT(out[0][16][29][2].item<int>(), 190);
  EXPECT_LT(out[0][16][29][0].item<int>(), 10);
  // A clip that already has the bucket's size passes through unchanged.
  at::Tensor same = at::randint(0, 256, {5, 32, 32, 3}, at::kByte);
  EXPECT_TRUE(at::equal(fit_to_bucket(same, b), same));
  EXPECT_THROW(fit_to_bucket(f.slice(0, 0, 3), b), Error);
}

}  // namespace
}  // namespace vidit
