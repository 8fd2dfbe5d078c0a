// `vidit prepare` with umT5 captions (text.encoder), end to end on real files: videos made by the
// ffmpeg CLI with sidecar captions, one caption longer than model.text_len and one that is not
// UTF-8, and a small umT5 made by transformers (tests/reference/umt5_reference.py). Each cached
// sample holds exactly what the text encoder gives for its caption (its real tokens), the long
// caption is cut and counted, the bad one's clip is rejected with the reason while the others are
// cached, the null text is stored beside them, and a rerun embeds nothing again.
#include "prepare/caption_store.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include "loader/latent_cache.h"
#include "../../tests/mpi_test_util.h"
#include "text/text_encoder.h"
#include "text/text_test_util.h"
#include "video/video_test_util.h"
#include "../../tests/test_util.h"

namespace vidit {
namespace {

namespace fs = std::filesystem;

TEST(CaptionStore, PrepareEmbedsCaptionsWithUmt5BeforeTheVideos) {
  SKIP_WITHOUT_DECODING();
  VIDIT_UMT5_REFERENCE(ref);
  test::ScratchDir dir("caption_store");
  const std::string v = dir / "videos";
  fs::create_directories(v);
  const std::map<std::string, std::string> captions = {
      {"cat", "a cat walks slowly across the wooden floor"},
      {"long", "drone shot of mountains at dawn, then the camera pans left over the ocean waves while the city "
               "street lights come on one by one in the rain"},
      {"bad", std::string("caf\xc3\xa9 \xff\xfe broken")}};
  for (const auto& [name, caption] : captions) {
    video_test::ffmpeg("-f lavfi -i testsrc2=size=64x48:rate=8 -frames:v 12 -pix_fmt yuv420p -c:v libx264 " + v + "/" +
                       name + ".mp4");
    std::ofstream(v + "/" + name + ".txt", std::ios::binary) << caption;
  }
  const std::string config = dir / "prepare.toml";
  std::ofstream(config) << "[model]\nin_channels = 12\nout_channels = 12\npatch = [1, 2, 2]\ntext_dim = 64\ntext_len = 16\n"
                        << "[data]\nsource = \"cache\"\nmanifest = \"" << v << "\"\ncache_dir = \"" << (dir / "cache")
                        << "\"\ncodec = \"demo\"\ncache_dtype = \"fp32\"\ndecode_threads = 1\n"
                        << "[buckets]\nresolutions = [48]\naspect_ratios = [1.3333333]\nframes = [9]\nframe_stride = 4\n"
                        << "multiple = 8\n[text]\nencoder = \"" << (ref + "/pipe") << "\"\ndtype = \"fp32\"\n"
                        << "device = \"cpu\"\n";
  const std::string prepare = std::string(VIDIT_BINARY) + " prepare --config " + config + " 2>&1";
  auto r = test::run_process(prepare);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("captions: 3 distinct, 2 embedded now"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("1 cut to 16 tokens, 1 not embeddable"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("2 written"), std::string::npos) << r.output;

  // The clip of the bad caption is rejected, naming why.
  std::ifstream rj(dir / "cache/rejects.jsonl");
  std::string rejects((std::istreambuf_iterator<char>(rj)), std::istreambuf_iterator<char>());
  EXPECT_NE(rejects.find("bad.mp4"), std::string::npos) << rejects;
  EXPECT_NE(rejects.find("UTF-8"), std::string::npos) << rejects;

  // Every cached sample's text is the encoder's output for its caption, real tokens only.
  Config cfg = load_config(config);
  text::TextEncoderOptions opt = text::text_encoder_options(cfg);
  opt.device = at::kCPU;
  text::TextEncoder enc(opt);
  LatentCache cache(dir / "cache");
  ASSERT_EQ(cache.size(), 2);
  for (int64_t i = 0; i < cache.size(); ++i) {
    const std::string name = fs::path(cache.entry(i).meta["source"].get<std::string>()).stem().string();
    const text::EncodedCaptions want = enc.encode_captions({captions.at(name)});
    const at::Tensor got = cache.load(i).text;
    ASSERT_EQ(got.size(0), want.lengths[0]) << name;
    EXPECT_TRUE(at::allclose(got, want.embedding[0].slice(0, 0, want.lengths[0]), 1e-6, 1e-6)) << name;
    if (name == "long") EXPECT_EQ(got.size(0), 16);
  }
  // The null text (the empty prompt: EOS alone) is there, zero-padded to text_len for training.
  const at::Tensor null_text = cached_null_text(dir / "cache", 16);
  ASSERT_TRUE(null_text.defined());
  EXPECT_TRUE(at::allclose(null_text, enc.encode_captions({""}).embedding[0], 1e-6, 1e-6));

  // A rerun embeds nothing again and writes nothing new.
  auto again = test::run_process(prepare);
  ASSERT_EQ(again.status, 0) << again.output;
  EXPECT_NE(again.output.find("0 embedded now"), std::string::npos) << again.output;
  EXPECT_NE(again.output.find("0 written, 2 already cached"), std::string::npos) << again.output;

  // Another text encoder (here its compute dtype, part of its identity): the store's embeddings
  // are another encoder's, so every caption is embedded again, and the cached clips get the new
  // text without their videos being encoded again (the cache's records name the encoder too).
  auto other = test::run_process(std::string(VIDIT_BINARY) + " prepare --config " + config +
                                 " --set 'text.dtype=\"bf16\"' 2>&1");
  ASSERT_EQ(other.status, 0) << other.output;
  EXPECT_NE(other.output.find("were embedded by another text encoder: embedded again"), std::string::npos) << other.output;
  EXPECT_NE(other.output.find("captions: 3 distinct, 2 embedded now"), std::string::npos) << other.output;
  EXPECT_NE(other.output.find("0 written, 0 already cached, 2 re-embedded"), std::string::npos) << other.output;
  cfg.text.dtype = Precision::bf16;
  text::TextEncoderOptions bf16 = text::text_encoder_options(cfg);
  bf16.device = at::kCPU;
  text::TextEncoder enc16(bf16);
  LatentCache after(dir / "cache");
  ASSERT_EQ(after.size(), 2);
  for (int64_t i = 0; i < after.size(); ++i) {
    const std::string name = fs::path(after.entry(i).meta["source"].get<std::string>()).stem().string();
    const text::EncodedCaptions want = enc16.encode_captions({captions.at(name)});
    EXPECT_TRUE(at::allclose(after.load(i).text, want.embedding[0].slice(0, 0, want.lengths[0]).to(at::kFloat), 1e-6, 1e-6))
        << name << ": the text is not the new encoder's";
  }
}

}  // namespace
}  // namespace vidit
