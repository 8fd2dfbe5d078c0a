// Tensors read one at a time (core/tensor_stream.h) and the safetensors file written from them:
// byte for byte the file the same tensors in a map give, whose bytes are the documented format;
// each tensor read once and dropped before the next; a read that breaks its announcement fails
// naming the tensor and leaves no file.
#include "core/tensor_stream.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "../../tests/test_util.h"
#include "core/error.h"
#include "core/host_peak.h"
#include "core/safetensors.h"

namespace vidit {
namespace {

using test::ScratchDir;

std::string bytes_of(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// A stream whose tensors do not exist until read: each read makes a fresh copy of the map's.
TensorStream fresh_copies(const TensorMap& m, std::map<std::string, int>* reads) {
  TensorStream s;
  for (const auto& [key, t] : m) s.info.emplace(key, TensorInfo::of(t));
  s.read = [m, reads](const std::string& key) {
    ++(*reads)[key];
    return m.at(key).clone();  // the source's strides (a transposed tensor stays transposed)
  };
  return s;
}

TEST(TensorStream, SafetensorsFromAStreamIsTheMapsFileByteForByte) {
  ScratchDir dir("tensor_stream");
  const TensorMap m = {{"f32", at::randn({3, 4})},
                       {"bf16", at::randn({5, 1}).to(at::kBFloat16)},
                       {"i64", at::arange(7, at::kLong)},
                       {"bool", at::rand({4}) > 0.5},
                       {"f8", at::randn({16}).to(at::kFloat8_e4m3fn)},
                       {"scalar", at::tensor(3.5)},
                       {"empty", at::zeros({0, 3})},
                       {"noncontig", at::randn({4, 6}).t()}};
  const std::map<std::string, std::string> meta = {{"format", "pt"}};
  save_safetensors(dir / "map.safetensors", m, meta);
  std::map<std::string, int> reads;
  save_safetensors(dir / "stream.safetensors", fresh_copies(m, &reads), meta);
  save_safetensors(dir / "shared.safetensors", stream_of(m), meta);
  const std::string want = bytes_of(dir / "map.safetensors");
  EXPECT_EQ(bytes_of(dir / "stream.safetensors"), want);
  EXPECT_EQ(bytes_of(dir / "shared.safetensors"), want);
  for (const auto& [key, t] : m) EXPECT_EQ(reads[key], 1) << key << " read " << reads[key] << " times";
  EXPECT_EQ(stream_of(m).bytes(), uint64_t(3 * 4 * 4 + 5 * 2 + 7 * 8 + 4 + 16 + 8 + 0 + 24 * 4));
}

// The bytes themselves, spelled out: the length, the JSON header (keys sorted, metadata first),
// the spaces that align the data to 8 bytes, the tensors' bytes in key order.
TEST(TensorStream, FileIsTheDocumentedFormat) {
  ScratchDir dir("tensor_stream_golden");
  const at::Tensor a = at::tensor({1.0f, 2.0f}), b = at::tensor({int64_t(7)});
  std::map<std::string, int> reads;
  save_safetensors(dir / "g.safetensors", fresh_copies({{"b", b}, {"a", a}}, &reads), {{"format", "pt"}});
  std::string json =
      "{\"__metadata__\":{\"format\":\"pt\"},\"a\":{\"data_offsets\":[0,8],\"dtype\":\"F32\",\"shape\":[2]},"
      "\"b\":{\"data_offsets\":[8,16],\"dtype\":\"I64\",\"shape\":[1]}}";
  while ((8 + json.size()) % 8 != 0) json.push_back(' ');
  std::string want(8, '\0');
  for (int i = 0; i < 8; ++i) want[size_t(i)] = char((uint64_t(json.size()) >> (8 * i)) & 0xff);
  want += json;
  want.append(static_cast<const char*>(a.data_ptr()), 8);
  want.append(static_cast<const char*>(b.data_ptr()), 8);
  EXPECT_EQ(bytes_of(dir / "g.safetensors"), want);
}

// Writing holds one tensor at a time: 16 tensors of 1 MiB, none of them existing before it is
// read, never more than about one at once.
TEST(TensorStream, WritingHoldsOneTensorAtATime) {
  ScratchDir dir("tensor_stream_peak");
  TensorStream s;
  for (int i = 0; i < 16; ++i) s.info.emplace("t" + std::to_string(100 + i), TensorInfo{{256, 1024}, at::kFloat});
  s.read = [](const std::string& key) { return at::full({256, 1024}, float(std::stoi(key.substr(1))), at::kFloat); };
  HostPeak peak;
  ASSERT_TRUE(peak.active());
  save_safetensors(dir / "p.safetensors", s);
  EXPECT_GE(peak.peak(), 1 << 20) << "the measure saw no tensor";
  EXPECT_LT(peak.peak(), 2 << 20) << "more than one tensor of 1 MiB held at once";
  const TensorMap back = load_safetensors(dir / "p.safetensors");
  ASSERT_EQ(back.size(), 16u);
  EXPECT_TRUE(at::equal(back.at("t107"), at::full({256, 1024}, 107.0f)));
}

TEST(TensorStream, AReadThatBreaksItsAnnouncementFailsNamingTheTensor) {
  ScratchDir dir("tensor_stream_bad");
  TensorStream s;
  s.info.emplace("fine", TensorInfo{{2}, at::kFloat});
  s.info.emplace("wrong", TensorInfo{{3}, at::kFloat});
  s.read = [](const std::string& key) { return at::zeros({key == "wrong" ? 4 : 2}); };
  const std::string msg = test::message_of([&] { save_safetensors(dir / "x.safetensors", s); });
  EXPECT_NE(msg.find("'wrong'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[3]"), std::string::npos) << msg;
  EXPECT_FALSE(std::filesystem::exists(dir / "x.safetensors"));
  EXPECT_FALSE(std::filesystem::exists(dir / "x.safetensors.tmp"));
  s.read = [](const std::string&) { return at::zeros({2}, at::kDouble); };
  EXPECT_NE(test::message_of([&] { s.get("fine"); }).find("Double"), std::string::npos);
  EXPECT_NE(test::message_of([&] { s.get("absent"); }).find("'absent'"), std::string::npos);
  // The shapes alone, as meta tensors; the whole set read at once.
  const TensorMap meta = meta_tensors(s);
  EXPECT_TRUE(meta.at("wrong").is_meta());
  EXPECT_EQ(meta.at("wrong").sizes(), at::IntArrayRef({3}));
  const TensorMap all = read_all(stream_of({{"x", at::ones({2})}}));
  EXPECT_TRUE(at::equal(all.at("x"), at::ones({2})));
}

}  // namespace
}  // namespace vidit
