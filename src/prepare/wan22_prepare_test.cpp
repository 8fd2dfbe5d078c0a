// vidit prepare with the Wan 2.2 VAE (data.codec = "wan22_vae") on real clips made by ffmpeg,
// against the VAE itself (tests/reference/diffusers_vae22_reference.py's small random VAE).
#include <gtest/gtest.h>

#include <string>

#include "../../tests/mpi_test_util.h"
#include "../../tests/test_util.h"
#include "loader/latent_cache.h"
#include "prepare/demo_codec.h"
#include "prepare/prepared_cache_test_util.h"
#include "vae/wan22_vae.h"
#include "video/video_test_util.h"

namespace vidit {
namespace {

double relative_deviation(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>() / b.abs().max().item<double>();
}

// vidit prepare with data.codec = "wan22_vae" on real clips: each cached latent is the Wan 2.2
// VAE's normalised posterior of the frames prepare decoded for it. Those frames come back exactly
// from the lossless demo codec's cache of the same manifest and buckets (the same keys).
TEST(Wan22Prepare, CachesTheVaesPosteriorOfTheClips) {
  SKIP_WITHOUT_DECODING();
  test::ScratchDir ref("wan22_prepare_vae");
  const auto made_vae = test::run_process(test::python() + " " + test::reference_script("diffusers_vae22_reference.py") +
                                          " " + ref.path() + " 2>&1");
  if (made_vae.status == 3) GTEST_SKIP() << made_vae.output;
  ASSERT_EQ(made_vae.status, 0) << made_vae.output;
  const std::string vae_dir = ref / "vae";
  prepare_test::PreparedCache p;
  const std::string buckets = " buckets.multiple=16 buckets.resolutions=[32] data.cache_dtype=\"fp32\"";
  ASSERT_EQ(prepare_test::run(p.vidit("prepare") + " --set" + buckets + " data.cache_dir=\"" + (p.dir / "demo") +
                              "\" > /dev/null 2>&1"),
            0);
  const std::string wan22 = p.dir / "wan22";
  auto made = test::run_process(p.vidit("prepare") + " --set" + buckets + " data.codec=\"wan22_vae\" data.vae_weights=\"" +
                                vae_dir + "\" model.in_channels=8 model.out_channels=8 data.cache_dir=\"" +
                                wan22 + "\"");
  ASSERT_EQ(made.status, 0) << made.output;
  EXPECT_NE(made.output.find("codec wan22_vae"), std::string::npos) << made.output;
  LatentCache demo(p.dir / "demo"), ours(wan22);
  ASSERT_GT(ours.size(), 0);
  ASSERT_EQ(ours.size(), demo.size());
  Wan22VAE vae = open_wan22_vae(vae_dir);
  at::NoGradGuard ng;
  for (int64_t i = 0; i < ours.size(); ++i) {
    const CacheIndexEntry& e = ours.entry(i);
    ASSERT_EQ(demo.entry(i).key, e.key);
    const at::Tensor frames = demo::codec_decode(demo.load(i).mean.to(at::kFloat), 2);  // [T, H, W, 3]
    const at::Tensor video = frames.permute({3, 0, 1, 2}).unsqueeze(0).to(at::kFloat).div(127.5).sub(1.0);
    const VaeMoments m = vae->encode(video);
    const at::Tensor want = vae->normalize_latents(m.mean)[0];
    const at::Tensor got = ours.load(i).mean.to(at::kFloat);
    ASSERT_EQ(got.sizes(), want.sizes()) << e.key;
    EXPECT_EQ(e.shape[0], 8) << e.key;
    // A 16x16-pixel cell per latent: the bucket's pixels over 16.
    EXPECT_EQ(got.size(2) * 16, frames.size(1)) << e.key;
    EXPECT_LE(relative_deviation(got, want), 1e-5) << e.key;
    EXPECT_GT(ours.load(i).std.abs().max().item<double>(), 0) << e.key;  // a real posterior spread
  }
  // A model of other latent channels is refused before anything is encoded.
  auto other = test::run_process(p.vidit("prepare") + " --set" + buckets + " data.codec=\"wan22_vae\" data.vae_weights=\"" +
                                 vae_dir + "\" model.in_channels=16 model.out_channels=16 data.cache_dir=\"" +
                                 (p.dir / "other") + "\"");
  EXPECT_NE(other.status, 0);
  EXPECT_NE(other.output.find("Wan 2.2 VAE of 8 latent channels but model.out_channels is 16"), std::string::npos)
      << other.output;
  // The Wan 2.2 VAE wants 16-pixel buckets: a config with 8 is refused by key.
  auto refused = test::run_process(p.vidit("prepare") + " --set buckets.multiple=8 data.codec=\"wan22_vae\"");
  EXPECT_NE(refused.status, 0);
  EXPECT_NE(refused.output.find("buckets.multiple (8) must be a multiple of 16"), std::string::npos) << refused.output;
}

}  // namespace
}  // namespace vidit
