// CLIP's image preprocessing and image files against PIL and transformers' CLIPImageProcessor
// (tests/reference/clip_vision_reference.py): PIL's resize bit for bit, the processor's
// pixel_values within one 8-bit level (its settings read from preprocessor_config.json, with
// variants), and decode_image_file against PIL's decode of PNG, JPEG (4:2:0, 4:2:2, 4:4:4, odd
// sizes, greyscale, EXIF orientation) and WebP pictures made by the ffmpeg CLI.
#include "vision/image_input.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include "../../tests/test_util.h"
#include "core/error.h"
#include "core/safetensors.h"
#include "vision/image_file.h"
#include "vision/jpeg_file.h"
#include "vision/vision_test_util.h"

namespace fs = std::filesystem;

namespace vidit::vision {
namespace {

using vidit::test::message_of;
using vidit::test::ScratchDir;
using test::reference_pictures;

// The largest difference between two pixel_values tensors [3, h, w], in 8-bit levels of the
// picture before normalisation (one level is rescale_factor / std of the channel).
double max_levels_off(const at::Tensor& a, const at::Tensor& b, const ClipImageConfig& cfg) {
  EXPECT_EQ(a.sizes(), b.sizes());
  at::Tensor level = at::full({3, 1, 1}, cfg.do_rescale ? cfg.rescale_factor : 1.0, at::kDouble);
  if (cfg.do_normalize)
    level = level / at::tensor(std::vector<double>(cfg.image_std.begin(), cfg.image_std.end()), at::kDouble).view({3, 1, 1});
  return ((a.to(at::kDouble) - b.to(at::kDouble)).abs() / level).max().item<double>();
}

// Largest difference of two uint8 pictures, in levels, and the share of values off by more than one.
std::pair<int64_t, double> pixel_difference(const at::Tensor& a, const at::Tensor& b) {
  EXPECT_EQ(a.sizes(), b.sizes());
  const at::Tensor d = (a.to(at::kInt) - b.to(at::kInt)).abs();
  return {d.max().item<int64_t>(), d.gt(1).to(at::kDouble).mean().item<double>()};
}

TEST(ClipImageInput, ResizedSizeFollowsTheShorterSide) {
  const ClipImageConfig cfg;
  EXPECT_EQ(clip_resized_size(cfg, 200, 320), std::make_pair(int64_t{224}, int64_t{358}));  // int(224 * 1.6)
  EXPECT_EQ(clip_resized_size(cfg, 320, 200), std::make_pair(int64_t{358}, int64_t{224}));
  EXPECT_EQ(clip_resized_size(cfg, 203, 321), std::make_pair(int64_t{224}, int64_t{354}));  // truncated
  EXPECT_EQ(clip_resized_size(cfg, 50, 50), std::make_pair(int64_t{224}, int64_t{224}));
  ClipImageConfig exact;
  exact.shortest_edge = 0;
  exact.resize_height = 30;
  exact.resize_width = 40;
  EXPECT_EQ(clip_resized_size(exact, 200, 320), std::make_pair(int64_t{30}, int64_t{40}));
  exact.do_resize = false;
  EXPECT_EQ(clip_resized_size(exact, 200, 320), std::make_pair(int64_t{200}, int64_t{320}));
}

TEST(ClipImageInput, CenterCropPadsWithZeros) {
  const at::Tensor img = at::arange(1, 1 + 5 * 4, at::kByte).view({5, 4, 1});
  // 5 x 4 -> 3 x 2: top floor(2 / 2) = 1, left 1
  EXPECT_TRUE(at::equal(center_crop(img, 3, 2), img.narrow(0, 1, 3).narrow(1, 1, 2)));
  // 5 x 4 -> 8 x 4: top floor(-3 / 2) = -2: two rows of zeros above, one below
  const at::Tensor padded = center_crop(img, 8, 4);
  EXPECT_EQ(padded.sizes(), (std::vector<int64_t>{8, 4, 1}));
  EXPECT_EQ(padded.narrow(0, 0, 2).sum().item<int64_t>(), 0);
  EXPECT_TRUE(at::equal(padded.narrow(0, 2, 5), img));
  EXPECT_EQ(padded.narrow(0, 7, 1).sum().item<int64_t>(), 0);
}

TEST(ClipImageInput, ResizeKeepsASizeAndRefusesBadInput) {
  const at::Tensor img = at::randint(0, 256, {7, 9, 3}, at::kByte);
  const at::Tensor same = resize_like_pil(img, 7, 9, Resample::bicubic);
  EXPECT_TRUE(at::equal(same, img));
  EXPECT_NE(same.data_ptr(), img.data_ptr());  // a copy
  // A flat picture stays flat (the weights sum to one in fixed point, rounding included).
  const at::Tensor flat = at::full({5, 6, 3}, 77, at::kByte);
  EXPECT_TRUE(at::equal(resize_like_pil(flat, 13, 3, Resample::bicubic), at::full({13, 3, 3}, 77, at::kByte)));
  std::string msg = message_of([&] { resize_like_pil(img.to(at::kFloat), 4, 4, Resample::bicubic); });
  EXPECT_NE(msg.find("uint8"), std::string::npos) << msg;
  msg = message_of([&] { preprocess_clip_image(at::zeros({8, 8, 4}, at::kByte), ClipImageConfig{}); });
  EXPECT_NE(msg.find("RGB uint8 [H, W, 3]"), std::string::npos) << msg;
}

TEST(ClipImageInput, ConfigFieldsAndErrors) {
  ScratchDir tmp("clip_proc");
  std::ofstream(tmp / "preprocessor_config.json") << R"({"size": 256, "crop_size": 240, "resample": 2,
      "image_mean": 0.5, "image_std": [0.25, 0.5, 1.0], "do_center_crop": false})";
  const ClipImageConfig c = ClipImageConfig::load(tmp.path());
  EXPECT_EQ(c.shortest_edge, 256);
  EXPECT_EQ(c.crop_height, 240);
  EXPECT_EQ(c.crop_width, 240);
  EXPECT_EQ(c.resample, Resample::bilinear);
  EXPECT_EQ(c.image_mean[2], 0.5);
  EXPECT_EQ(c.image_std[0], 0.25);
  EXPECT_FALSE(c.do_center_crop);
  EXPECT_TRUE(c.do_normalize);
  auto error_for = [&](const std::string& text) {
    std::ofstream(tmp / "preprocessor_config.json") << text;
    return message_of([&] { ClipImageConfig::load(tmp.path()); });
  };
  std::ofstream(tmp / "preprocessor_config.json") << R"({"resample": 1})";  // PIL's LANCZOS
  EXPECT_EQ(ClipImageConfig::load(tmp.path()).resample, Resample::lanczos);
  std::string msg = error_for(R"({"resample": 0})");  // NEAREST: not implemented
  EXPECT_NE(msg.find("resample 0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("preprocessor_config.json"), std::string::npos) << msg;
  msg = error_for(R"({"size": {"longest_edge": 500}})");
  EXPECT_NE(msg.find("longest_edge"), std::string::npos) << msg;
  msg = error_for(R"({"image_std": [0.2, 0.0, 0.3]})");
  EXPECT_NE(msg.find("image_std"), std::string::npos) << msg;
  msg = message_of([&] { ClipImageConfig::load(tmp / "absent"); });
  EXPECT_NE(msg.find("no preprocessor_config.json"), std::string::npos) << msg;
}

// The processor that goes with an encoder, as sampling and prepare find it: the encoder folder's
// own file, a pipeline root's image_processor/, the image_processor/ beside image_encoder/, else
// CLIP's defaults.
TEST(ClipImageInput, ProcessorBesideTheEncoderIsFound) {
  ScratchDir tmp("clip_beside");
  namespace fs = std::filesystem;
  fs::create_directories(tmp / "pipe/image_encoder");
  fs::create_directories(tmp / "pipe/image_processor");
  fs::create_directories(tmp / "lone");
  EXPECT_EQ(ClipImageConfig::beside_encoder(tmp / "lone").shortest_edge, 224);  // the defaults
  std::ofstream(tmp / "pipe/image_processor/preprocessor_config.json") << R"({"size": {"shortest_edge": 48}})";
  EXPECT_EQ(ClipImageConfig::beside_encoder(tmp / "pipe/image_encoder").shortest_edge, 48);
  EXPECT_EQ(ClipImageConfig::beside_encoder(tmp / "pipe").shortest_edge, 48);
  std::ofstream(tmp / "pipe/image_encoder/preprocessor_config.json") << R"({"size": {"shortest_edge": 64}})";
  EXPECT_EQ(ClipImageConfig::beside_encoder(tmp / "pipe/image_encoder").shortest_edge, 64);
}

TEST(ClipImageReference, PipelineFolderGivesTheProcessorConfig) {
  VIDIT_CLIP_REFERENCE(dir);
  const ClipImageConfig c = ClipImageConfig::load(dir + "/pipe");
  EXPECT_EQ(c.shortest_edge, 224);
  EXPECT_EQ(c.crop_height, 224);
  EXPECT_EQ(c.resample, Resample::bicubic);
  EXPECT_DOUBLE_EQ(c.image_std[2], 0.27577711);
}

// On the pixels PIL decoded (so only the preprocessing is compared): the resize equals PIL's bit
// for bit, and pixel_values are within one 8-bit level of the processor's.
TEST(ClipImageReference, PreprocessingEqualsTheProcessor) {
  VIDIT_CLIP_REFERENCE(dir);
  const nlohmann::json info = reference_pictures(dir);
  if (!info["available"].get<bool>()) GTEST_SKIP() << "no reference pictures: " << info["why"].get<std::string>();
  const TensorMap ref = load_safetensors(dir + "/images/images.safetensors");
  const ClipImageConfig cfg = ClipImageConfig::from_json_file(dir + "/images/preprocessor_config.json");
  for (const auto& pic : info["pictures"]) {
    const std::string name = pic["name"].get<std::string>();
    const at::Tensor pil = ref.at(name + ".pil");
    const at::Tensor want_resized = ref.at(name + ".resized");
    const auto [h, w] = clip_resized_size(cfg, pil.size(0), pil.size(1));
    ASSERT_EQ(h, want_resized.size(0)) << name;
    ASSERT_EQ(w, want_resized.size(1)) << name;
    const at::Tensor resized = resize_like_pil(pil, h, w, Resample::bicubic);
    const auto [max_off, share] = pixel_difference(resized, want_resized);
    EXPECT_EQ(max_off, 0) << name << ": the resize is not PIL's (" << share * 100 << "% of values off by more than 1)";
    EXPECT_LE(max_levels_off(preprocess_clip_image(pil, cfg), ref.at(name + ".pixels"), cfg), 1.0) << name;
  }
}

TEST(ClipImageReference, ProcessorVariantsAreFollowed) {
  VIDIT_CLIP_REFERENCE(dir);
  const nlohmann::json info = reference_pictures(dir);
  if (!info["available"].get<bool>()) GTEST_SKIP() << "no reference pictures: " << info["why"].get<std::string>();
  const TensorMap ref = load_safetensors(dir + "/images/images.safetensors");
  const at::Tensor pil = ref.at("rgb.png.pil");
  ASSERT_FALSE(info["variants"].empty());
  for (const auto& v : info["variants"]) {
    const std::string name = v.get<std::string>();
    const ClipImageConfig cfg = ClipImageConfig::from_json_file(dir + "/images/variant_" + name + ".json");
    const at::Tensor got = preprocess_clip_image(pil, cfg);
    const at::Tensor& want = ref.at(name + ".pixels");
    ASSERT_EQ(got.sizes(), want.sizes()) << name;
    EXPECT_LE(max_levels_off(got, want, cfg), 1.0) << name;
  }
}

// From the file: decode_image_file against PIL's decode, and the whole path against the processor.
// PNG, lossless WebP and (with libjpeg, PIL's own library) JPEG decode to the same pixels; FFmpeg's
// JPEG decoder differs in its inverse DCT, lossy WebP ones in their Y'CbCr rounding too: a few
// levels on a small share of values. (Converted by
// libswscale instead, 4:2:0 JPEGs come out up to 160 levels off at colour edges.)
TEST(ClipImageReference, ImageFilesDecodeAsPilDoes) {
  VIDIT_CLIP_REFERENCE(dir);
  if (!image_decoding_available()) GTEST_SKIP() << "this build has no FFmpeg decode support";
  const nlohmann::json info = reference_pictures(dir);
  if (!info["available"].get<bool>()) GTEST_SKIP() << "no reference pictures: " << info["why"].get<std::string>();
  const TensorMap ref = load_safetensors(dir + "/images/images.safetensors");
  const ClipImageConfig cfg = ClipImageConfig::from_json_file(dir + "/images/preprocessor_config.json");
  for (const auto& pic : info["pictures"]) {
    const std::string name = pic["name"].get<std::string>(), kind = pic["kind"].get<std::string>();
    const std::string file = dir + "/images/" + name;
    const at::Tensor rgb = decode_image_file(file);
    ASSERT_EQ(rgb.sizes(), ref.at(name + ".pil").sizes()) << name;
    EXPECT_EQ(rgb.scalar_type(), at::kByte);
    EXPECT_TRUE(rgb.is_contiguous());
    const auto [max_off, share] = pixel_difference(rgb, ref.at(name + ".pil"));
    const double end_to_end = max_levels_off(load_clip_pixel_values({file}, cfg)[0], ref.at(name + ".pixels"), cfg);
    if (kind == "exact") {
      EXPECT_EQ(max_off, 0) << name;
      EXPECT_LE(end_to_end, 1.0) << name;
    } else if (kind == "cmyk_jpeg" && !jpeg_decoding_available()) {
      continue;  // FFmpeg's CMYK is not PIL's: read only with libjpeg
    } else if ((kind == "jpeg" || kind == "cmyk_jpeg") && jpeg_decoding_available()) {  // libjpeg, as PIL: the same pixels
      EXPECT_EQ(max_off, 0) << name;
      EXPECT_LE(end_to_end, 1.0) << name;
    } else if (kind == "jpeg") {  // FFmpeg's decoder; measured: at most 3 levels, 0.26% of values off by more than 1
      EXPECT_LE(max_off, 3) << name;
      EXPECT_LT(share, 0.005) << name;
      EXPECT_LE(end_to_end, 3.5) << name;
    } else {  // lossy WebP; measured: 3 levels, 1.1% of values off by more than 1
      EXPECT_LE(max_off, 4) << name;
      EXPECT_LT(share, 0.02) << name;
      EXPECT_LE(end_to_end, 4.5) << name;
    }
  }
}

// EXIF orientation as PIL reads it from a JPEG's APP1: IFD0's tag 0x0112 in either byte order.
TEST(ClipImageFiles, ExifOrientationIsReadInBothByteOrders) {
  auto app1 = [](bool little, uint16_t orientation, bool other_tag_first) {
    std::vector<uint8_t> b = {'E', 'x', 'i', 'f', 0, 0};
    auto put16 = [&](uint16_t v) { little ? (b.push_back(v & 0xFF), b.push_back(v >> 8)) : (b.push_back(v >> 8), b.push_back(v & 0xFF)); };
    auto put32 = [&](uint32_t v) { little ? (put16(v & 0xFFFF), put16(v >> 16)) : (put16(v >> 16), put16(v & 0xFFFF)); };
    b.push_back(little ? 'I' : 'M'), b.push_back(little ? 'I' : 'M');
    put16(42), put32(8);
    put16(other_tag_first ? 2 : 1);
    if (other_tag_first) put16(0x010F), put16(2), put32(4), put32(0);  // Make, ASCII
    put16(0x0112), put16(3), put32(1), put16(orientation), put16(0);
    return b;
  };
  for (bool little : {true, false})
    for (uint16_t o = 1; o <= 8; ++o) {
      const auto b = app1(little, o, o % 2 == 0);
      EXPECT_EQ(exif_orientation_of(b.data(), b.size()), o) << little;
    }
  const auto bad = app1(true, 9, false);  // out of range: as stored
  EXPECT_EQ(exif_orientation_of(bad.data(), bad.size()), 1);
  const auto cut = app1(false, 6, true);
  EXPECT_EQ(exif_orientation_of(cut.data(), 20), 1);  // cut short: as stored, no read past the end
}

// A JPEG cut short is refused by name (PIL refuses it too), not padded with grey.
TEST(ClipImageFiles, TruncatedJpegIsNamed) {
  if (!jpeg_decoding_available() && !image_decoding_available()) GTEST_SKIP() << "no picture decoding in this build";
  ScratchDir tmp("clip_jpeg");
  ASSERT_EQ(0, std::system(("ffmpeg -v error -y -f lavfi -i testsrc2=size=160x96 -frames:v 1 " + (tmp / "whole.jpg")).c_str()));
  const at::Tensor whole = decode_image_file(tmp / "whole.jpg");
  EXPECT_EQ(whole.sizes(), (std::vector<int64_t>{96, 160, 3}));
  std::ifstream in(tmp / "whole.jpg", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::ofstream(tmp / "cut.jpg", std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  const std::string msg = message_of([&] { decode_image_file(tmp / "cut.jpg"); });
  EXPECT_NE(msg.find(tmp / "cut.jpg"), std::string::npos) << msg;
}

TEST(ClipImageFiles, MissingAndBadFilesAreNamed) {
  if (!image_decoding_available()) GTEST_SKIP() << "this build has no FFmpeg decode support";
  ScratchDir tmp("clip_files");
  std::string msg = message_of([&] { decode_image_file(tmp / "absent.png"); });
  EXPECT_NE(msg.find(tmp / "absent.png"), std::string::npos) << msg;
  std::ofstream(tmp / "garbage.png") << "this is not a picture at all";
  msg = message_of([&] { decode_image_file(tmp / "garbage.png"); });
  EXPECT_NE(msg.find(tmp / "garbage.png"), std::string::npos) << msg;
  msg = message_of([&] { load_clip_pixel_values({tmp / "garbage.png"}); });
  EXPECT_NE(msg.find(tmp / "garbage.png"), std::string::npos) << msg;
}

}  // namespace
}  // namespace vidit::vision
