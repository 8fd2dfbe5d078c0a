#include "vae/wan_vae.h"
#include "vae/vae_test_util.h"

#include <gtest/gtest.h>

#include "../../tests/test_util.h"
#include "core/error.h"
#include "model/state_dict.h"
#include "vae/tiling.h"

namespace vidit {
namespace {

using test::ScratchDir;

using test::random_vae;
using test::tiny_vae_config;

double rel_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>() / std::max(1e-12, b.abs().max().item<double>());
}

using WanVAETest = test::OneThreadTest;

VaeRunOptions whole_clip() {
  VaeRunOptions o;
  o.chunked = false;
  return o;
}

TEST_F(WanVAETest, ShapesOfEncodeAndDecode) {
  WanVAE vae = random_vae(tiny_vae_config(), 1);
  at::NoGradGuard ng;
  for (int64_t T : {1, 5, 9}) {
    at::Tensor video = at::rand({2, 3, T, 16, 24}) * 2 - 1;
    VaeMoments m = vae->encode(video);
    const std::vector<int64_t> latent = {2, 16, 1 + (T - 1) / 4, 2, 3};
    EXPECT_EQ(m.mean.sizes(), latent) << "T=" << T;
    EXPECT_EQ(m.logvar.sizes(), latent) << "T=" << T;
    EXPECT_FALSE(at::allclose(m.mean, m.logvar));  // two different halves of the head
    EXPECT_EQ(vae->decode(m.mean).sizes(), video.sizes()) << "T=" << T;
    at::Tensor pixels = vae->decode_latents(vae->encode_latents(video));
    EXPECT_EQ(pixels.sizes(), video.sizes());
    EXPECT_LE(pixels.abs().max().item<double>(), 1.0);
  }
  try {
    vae->encode(at::zeros({1, 3, 8, 16, 16}));
    ADD_FAILURE() << "8 frames accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("1 + 4k"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[1, 3, 8, 16, 16]"), std::string::npos) << e.what();
  }
  EXPECT_THROW(vae->encode(at::zeros({1, 3, 5, 12, 16})), Error);  // 12 is not a multiple of 8
  EXPECT_THROW(vae->decode(at::zeros({1, 4, 2, 2, 2})), Error);    // 4 latent channels, not 16
}

// Latent frame i covers input frames 4i-3..4i (frame 0 alone): changing later frames must not
// change it, in either run mode; and decoded frames 4i-3..4i must not see latent frames > i.
TEST_F(WanVAETest, EncoderAndDecoderAreCausal) {
  WanVAE vae = random_vae(tiny_vae_config(), 2);
  at::NoGradGuard ng;
  torch::manual_seed(20);
  at::Tensor video = at::rand({1, 3, 9, 16, 16}) * 2 - 1;
  for (const VaeRunOptions& opts : {VaeRunOptions{}, whole_clip()}) {
    at::Tensor base = vae->encode(video, opts).mean;
    for (int64_t from : {1, 5}) {  // first frame of latent 1, of latent 2
      at::Tensor changed = video.clone();
      changed.slice(2, from).uniform_(-1, 1);
      at::Tensor m = vae->encode(changed, opts).mean;
      const int64_t unaffected = from == 1 ? 1 : 2;
      EXPECT_TRUE(at::allclose(m.slice(2, 0, unaffected), base.slice(2, 0, unaffected), 1e-6, 1e-6))
          << "frames >= " << from << " changed earlier latents (chunked=" << opts.chunked << ")";
      EXPECT_GT((m.slice(2, unaffected) - base.slice(2, unaffected)).abs().max().item<double>(), 1e-3)
          << "later latents did not change: the test would not see a leak";
    }
    at::Tensor z = base.clone(), decoded = vae->decode(z, opts);
    z.slice(2, 2).normal_();
    at::Tensor d = vae->decode(z, opts);
    EXPECT_TRUE(at::allclose(d.slice(2, 0, 5), decoded.slice(2, 0, 5), 1e-6, 1e-6)) << "chunked=" << opts.chunked;
    EXPECT_GT((d.slice(2, 5) - decoded.slice(2, 5)).abs().max().item<double>(), 1e-3);
  }
}

// The official chunked run (frame 0, then 4 frames at a time; one latent frame at a time to decode,
// the causal cache carrying the frames between chunks) equals one pass over the whole clip.
// 13 frames = 4 latent frames: the first, second and a steady-state chunk of every cached layer.
TEST_F(WanVAETest, ChunkedRunEqualsWholeClip) {
  WanVAE vae = random_vae(tiny_vae_config(), 3);
  at::NoGradGuard ng;
  torch::manual_seed(30);
  at::Tensor video = at::rand({2, 3, 13, 16, 16}) * 2 - 1;
  VaeMoments chunked = vae->encode(video), whole = vae->encode(video, whole_clip());
  EXPECT_LT(rel_diff(chunked.mean, whole.mean), 1e-5);
  EXPECT_LT(rel_diff(chunked.logvar, whole.logvar), 1e-5);
  EXPECT_GT(chunked.mean.abs().max().item<double>(), 1e-2);  // not trivially zero
  at::Tensor z = at::randn({2, 16, 4, 2, 2});
  at::Tensor dc = vae->decode(z), dw = vae->decode(z, whole_clip());
  EXPECT_EQ(dc.size(2), 13);
  EXPECT_LT(rel_diff(dc, dw), 1e-5);
  // In a chunked run the only path from one chunk to the next is the cache: later chunks must see
  // a change confined to the first chunk (frame 0; latent frame 0), or nothing was carried.
  at::Tensor video2 = video.clone();
  video2.slice(2, 0, 1).uniform_(-1, 1);
  EXPECT_GT(rel_diff(vae->encode(video2).mean.slice(2, 1), chunked.mean.slice(2, 1)), 1e-3);
  at::Tensor z2 = z.clone();
  z2.slice(2, 0, 1).normal_();
  EXPECT_GT(rel_diff(vae->decode(z2).slice(2, 1), dc.slice(2, 1)), 1e-3);
}

// tiled_apply on a function that only sees its own 8x8 cell (average pooling) must reproduce the
// untiled result exactly: the blend weights add to one and every tile lands where it belongs.
TEST_F(WanVAETest, TilingBlendIsExactForLocalFunctions) {
  at::Tensor x = at::randn({2, 3, 40, 56});
  auto pool = [](const at::Tensor& t) { return at::avg_pool2d(t, {8, 8}); };
  for (auto [tile, stride] : std::vector<std::pair<int64_t, int64_t>>{{16, 8}, {24, 16}, {32, 24}, {16, 16}}) {
    EXPECT_TRUE(at::allclose(tiled_apply(x, tile, stride, 1, 8, pool), pool(x), 1e-5, 1e-5))
        << tile << "/" << stride;
    auto up = [](const at::Tensor& t) { return at::upsample_nearest2d(t, {t.size(2) * 8, t.size(3) * 8}); };
    at::Tensor small = x.slice(2, 0, 5).slice(3, 0, 7);
    EXPECT_TRUE(at::allclose(tiled_apply(small, tile / 8, stride / 8, 8, 1, up), up(small), 1e-5, 1e-5));
  }
  // The blend itself: tiles returning constants 0, 1, 2, 3 (in call order) along a 40-pixel row of
  // 16-pixel tiles every 8 give 0, then linear ramps (y+1)/9 across each 8-pixel overlap, then 3.
  int calls = 0;
  at::Tensor ramp = tiled_apply(at::zeros({1, 1, 8, 40}), 16, 8, 1, 1,
                                [&](const at::Tensor& t) { return at::full_like(t, double(calls++)); });
  EXPECT_EQ(calls, 4);
  for (int64_t c = 0; c < 40; ++c) {
    const double want = c < 8 ? 0.0 : c >= 32 ? 3.0 : double(c / 8 - 1) + double(c % 8 + 1) / 9.0;
    EXPECT_NEAR(ramp[0][0][3][c].item<double>(), want, 1e-6) << "column " << c;
  }
  std::vector<TileSpan> spans = tile_spans(40, 16, 8);
  ASSERT_EQ(spans.size(), 4u);  // 0-16, 8-24, 16-32, 24-40: stops once a tile reaches the end
  EXPECT_EQ(spans.back().begin, 24);
  EXPECT_EQ(spans.back().end, 40);
  EXPECT_THROW(tile_spans(40, 8, 16), Error);  // stride > tile leaves gaps
}

// Tiled encode/decode of frames larger than the tile. The VAE sees far past a tile (the encoder's
// receptive field spans ~100 pixels and the middle attention the whole frame), so no tiling is
// exact anywhere; what overlap and blending buy is a much smaller error than cutting the frame
// into disjoint tiles. With random weights (which mix more than trained ones) and 64-pixel tiles
// on 64x96 frames of 5 frames, relative RMS errors measured: overlap 32 px: encode 0.085,
// decode 0.13; disjoint tiles: 0.31 and 0.43. Asserted: blended < 0.2 (encode) / 0.25 (decode)
// and < half the disjoint error. A misplaced or unblended tile fails both. A frame that fits in
// one tile is not tiled (exactly the untiled result).
TEST_F(WanVAETest, TiledRunIsCloseToUntiledAndBeatsDisjointTiles) {
  WanVAE vae = random_vae(tiny_vae_config(), 4);
  at::NoGradGuard ng;
  torch::manual_seed(40);
  // Smooth content, as real video is: a coarse random image upsampled to 64x96.
  at::Tensor video = at::upsample_bilinear2d(at::rand({5, 3, 4, 6}) * 2 - 1, {64, 96}, false)
                         .view({1, 5, 3, 64, 96}).permute({0, 2, 1, 3, 4}).contiguous();
  auto rel_rms = [](const at::Tensor& a, const at::Tensor& b) {
    return ((a - b).pow(2).mean() / b.pow(2).mean()).sqrt().item<double>();
  };
  VaeRunOptions blended, disjoint;
  blended.tiling = {true, 64, 32};
  disjoint.tiling = {true, 64, 64};
  at::Tensor ref = vae->encode(video).mean, got = vae->encode(video, blended).mean;
  ASSERT_EQ(got.sizes(), ref.sizes());
  const double enc_err = rel_rms(got, ref), enc_disjoint = rel_rms(vae->encode(video, disjoint).mean, ref);
  EXPECT_GT(enc_err, 0.0);  // tiles were really used
  EXPECT_LT(enc_err, 0.2);
  EXPECT_LT(enc_err, 0.5 * enc_disjoint);
  at::Tensor dec_ref = vae->decode(ref), dec_got = vae->decode(ref, blended);
  ASSERT_EQ(dec_got.sizes(), dec_ref.sizes());
  const double dec_err = rel_rms(dec_got, dec_ref), dec_disjoint = rel_rms(vae->decode(ref, disjoint), dec_ref);
  EXPECT_GT(dec_err, 0.0);
  EXPECT_LT(dec_err, 0.25);
  EXPECT_LT(dec_err, 0.5 * dec_disjoint);
  VaeRunOptions big_tile;
  big_tile.tiling = {true, 96, 48};
  EXPECT_TRUE(at::equal(vae->encode(video, big_tile).mean, ref));
  VaeRunOptions odd;
  odd.tiling = {true, 60, 30};
  EXPECT_THROW(vae->encode(video, odd), Error);
}

// Facts checked against the official model (wan/modules/vae.py, WanVAE_(dim=96, z_dim=16,
// dim_mult=[1,2,4,4], num_res_blocks=2, temperal_downsample=[False,True,True])): 194 tensors,
// 126,892,531 parameters (the Wan report's "127M"), and these names and shapes.
TEST_F(WanVAETest, OfficialKeyNamesShapesAndParameterCount) {
  WanVAE vae(WanVAEConfig{}, at::TensorOptions().device(at::kMeta));
  TensorMap sd = state_dict(*vae);
  EXPECT_EQ(sd.size(), 194u);
  int64_t total = 0;
  for (const auto& [k, v] : sd) total += v.numel();
  EXPECT_EQ(total, 126892531);
  const std::vector<std::pair<std::string, std::vector<int64_t>>> expected = {
      {"encoder.conv1.weight", {96, 3, 3, 3, 3}},
      {"encoder.conv1.bias", {96}},
      {"encoder.downsamples.0.residual.0.gamma", {96, 1, 1, 1}},
      {"encoder.downsamples.0.residual.2.weight", {96, 96, 3, 3, 3}},
      {"encoder.downsamples.0.residual.3.gamma", {96, 1, 1, 1}},
      {"encoder.downsamples.0.residual.6.bias", {96}},
      {"encoder.downsamples.2.resample.1.weight", {96, 96, 3, 3}},
      {"encoder.downsamples.3.shortcut.weight", {192, 96, 1, 1, 1}},
      {"encoder.downsamples.5.time_conv.weight", {192, 192, 3, 1, 1}},
      {"encoder.downsamples.8.time_conv.weight", {384, 384, 3, 1, 1}},
      {"encoder.middle.1.norm.gamma", {384, 1, 1}},
      {"encoder.middle.1.to_qkv.weight", {1152, 384, 1, 1}},
      {"encoder.middle.1.proj.bias", {384}},
      {"encoder.head.0.gamma", {384, 1, 1, 1}},
      {"encoder.head.2.weight", {32, 384, 3, 3, 3}},
      {"conv1.weight", {32, 32, 1, 1, 1}},
      {"conv2.weight", {16, 16, 1, 1, 1}},
      {"decoder.conv1.weight", {384, 16, 3, 3, 3}},
      {"decoder.middle.2.residual.6.weight", {384, 384, 3, 3, 3}},
      {"decoder.upsamples.3.time_conv.weight", {768, 384, 3, 1, 1}},
      {"decoder.upsamples.3.resample.1.weight", {192, 384, 3, 3}},
      {"decoder.upsamples.4.shortcut.weight", {384, 192, 1, 1, 1}},
      {"decoder.upsamples.7.time_conv.bias", {768}},
      {"decoder.upsamples.11.resample.1.weight", {96, 192, 3, 3}},
      {"decoder.upsamples.12.residual.0.gamma", {96, 1, 1, 1}},
      {"decoder.upsamples.14.residual.6.weight", {96, 96, 3, 3, 3}},
      {"decoder.head.0.gamma", {96, 1, 1, 1}},
      {"decoder.head.2.weight", {3, 96, 3, 3, 3}},
  };
  for (const auto& [key, shape] : expected) {
    ASSERT_TRUE(sd.count(key)) << key;
    EXPECT_EQ(sd.at(key).sizes(), shape) << key;
  }
  // Stages without a temporal step have no time_conv; the decoder has 15 upsample layers.
  EXPECT_FALSE(sd.count("encoder.downsamples.2.time_conv.weight"));
  EXPECT_FALSE(sd.count("decoder.upsamples.11.time_conv.weight"));
  EXPECT_TRUE(sd.count("decoder.upsamples.14.residual.0.gamma"));
  EXPECT_FALSE(sd.count("decoder.upsamples.15.residual.0.gamma"));
}

TEST_F(WanVAETest, LoadsSafetensorsStrictly) {
  ScratchDir dir("wan_vae");
  WanVAE src = random_vae(tiny_vae_config(), 5);
  save_safetensors(dir / "vae.safetensors", state_dict(*src));
  WanVAE dst = random_vae(tiny_vae_config(), 6);
  load_wan_vae(*dst, dir / "vae.safetensors");
  at::NoGradGuard ng;
  at::Tensor video = at::rand({1, 3, 5, 16, 16});
  EXPECT_TRUE(at::equal(dst->encode(video).mean, src->encode(video).mean));

  const TensorMap good = state_dict(*src);
  auto expect_error = [&](TensorMap sd, const std::string& needle) {
    try {
      load_wan_vae(*dst, sd, "Wan2.1_VAE.safetensors");
      ADD_FAILURE() << "no error for " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("Wan2.1_VAE.safetensors"), std::string::npos) << e.what();
    }
  };
  TensorMap missing = good;
  missing.erase("decoder.upsamples.3.time_conv.weight");
  expect_error(missing, "missing key(s): decoder.upsamples.3.time_conv.weight");
  TensorMap extra = good;
  extra["encoder.downsamples.2.time_conv.weight"] = at::zeros({8, 8, 3, 1, 1});
  expect_error(extra, "unexpected key(s): encoder.downsamples.2.time_conv.weight");
  TensorMap bad = good;
  bad["encoder.middle.1.norm.gamma"] = at::ones({32, 1, 1, 1});
  expect_error(bad, "mis-shaped key(s): encoder.middle.1.norm.gamma");
  TensorMap diffusers = good;
  diffusers["quant_conv.weight"] = at::zeros({32, 32, 1, 1, 1});
  expect_error(diffusers, "AutoencoderKLWan");
  // Nothing was written by the failed loads.
  EXPECT_TRUE(at::equal(dst->encode(video).mean, src->encode(video).mean));
}

TEST_F(WanVAETest, LatentNormalisationUsesOfficialStatistics) {
  WanVAE vae(tiny_vae_config());
  at::Tensor mean = at::tensor(std::vector<float>(kWan21LatentMean.begin(), kWan21LatentMean.end())).view({1, 16, 1, 1, 1});
  at::Tensor std = at::tensor(std::vector<float>(kWan21LatentStd.begin(), kWan21LatentStd.end())).view({1, 16, 1, 1, 1});
  EXPECT_FLOAT_EQ(kWan21LatentMean[0], -0.7571f);
  EXPECT_FLOAT_EQ(kWan21LatentMean[7], 1.5508f);
  EXPECT_FLOAT_EQ(kWan21LatentStd[8], 3.2687f);
  EXPECT_FLOAT_EQ(kWan21LatentStd[15], 1.9160f);
  EXPECT_TRUE(at::allclose(vae->normalize_latents(mean), at::zeros_like(mean), 0, 1e-6));
  EXPECT_TRUE(at::allclose(vae->normalize_latents(mean + std), at::ones_like(mean), 1e-6, 1e-6));
  at::Tensor z = at::randn({2, 16, 3, 2, 2});
  EXPECT_TRUE(at::allclose(vae->normalize_latents(vae->denormalize_latents(z)), z, 1e-5, 1e-5));
  at::NoGradGuard ng;
  EXPECT_TRUE(at::allclose(vae->decode_latents(z), vae->decode(z * std + mean).clamp(-1, 1), 1e-5, 1e-5));
  WanVAEConfig bad = tiny_vae_config();
  bad.z_dim = 4;  // statistics for 16 channels
  EXPECT_THROW(WanVAE{bad}, Error);
}

}  // namespace
}  // namespace vidit
