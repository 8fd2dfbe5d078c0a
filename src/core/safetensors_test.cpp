#include "core/safetensors.h"

#include <gtest/gtest.h>

#include <fstream>
#include <random>

#include "../../tests/test_util.h"
#include "core/error.h"

namespace vidit {
namespace {

using test::ScratchDir;

TEST(Safetensors, RoundTripIsBitwiseForEveryDtype) {
  ScratchDir dir("st");
  TensorMap m = {{"f32", at::randn({3, 4})},
                 {"f64", at::randn({2}, at::kDouble)},
                 {"bf16", at::randn({5, 1}).to(at::kBFloat16)},
                 {"f16", at::randn({2, 2}).to(at::kHalf)},
                 {"i64", at::arange(7, at::kLong)},
                 {"u8", at::randint(0, 255, {9}, at::kByte)},
                 {"bool", at::rand({4}) > 0.5},
                 {"f8", at::randn({16}).to(at::kFloat8_e4m3fn)},
                 {"scalar", at::tensor(3.5)},
                 {"empty", at::zeros({0, 3})},
                 {"noncontig", at::randn({4, 6}).t()}};
  std::map<std::string, std::string> meta = {{"format", "pt"}, {"step", "12"}}, meta_in;
  save_safetensors(dir / "a.safetensors", m, meta);
  TensorMap r = load_safetensors(dir / "a.safetensors", &meta_in);
  EXPECT_EQ(meta_in, meta);
  ASSERT_EQ(r.size(), m.size());
  for (auto& [k, v] : m) {
    ASSERT_TRUE(r.count(k)) << k;
    EXPECT_EQ(r[k].scalar_type(), v.scalar_type()) << k;
    EXPECT_EQ(r[k].sizes(), v.sizes()) << k;
    EXPECT_EQ(std::memcmp(r[k].data_ptr(), v.contiguous().data_ptr(), v.numel() * v.element_size()), 0) << k;
  }
  // The header is the documented layout: 8-byte length, JSON, data 8-byte aligned.
  std::ifstream in(dir / "a.safetensors", std::ios::binary);
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  EXPECT_EQ((8 + n) % 8, 0u);
  std::string header(n, ' ');
  in.read(header.data(), static_cast<std::streamsize>(n));
  EXPECT_NE(header.find("\"dtype\":\"BF16\""), std::string::npos);
  EXPECT_NE(header.find("\"__metadata__\""), std::string::npos);
}

TEST(Safetensors, MalformedInputsThrowNamingTheFile) {
  ScratchDir dir("st_bad");
  save_safetensors(dir / "ok.safetensors", {{"w", at::randn({64})}});
  std::ifstream in(dir / "ok.safetensors", std::ios::binary);
  std::string good((std::istreambuf_iterator<char>(in)), {});
  auto expect_error = [&](const std::string& bytes, const std::string& needle) {
    try {
      parse_safetensors(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "f.safetensors");
      ADD_FAILURE() << "accepted: " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("f.safetensors"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error("", "only 0 bytes");
  expect_error(good.substr(0, good.size() - 10), "truncated");
  std::string big = good;
  big[7] = 0x7f;
  expect_error(big, "header claims");
  std::string json = "{\"w\":{\"dtype\":\"Q7\",\"shape\":[1],\"data_offsets\":[0,4]}}";
  std::string len(8, '\0');
  len[0] = char(json.size());
  expect_error(len + json + "abcd", "unsupported dtype 'Q7'");
  json = "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}";
  len[0] = char(json.size());
  expect_error(len + json + "abcd", "dtype and shape need 8");
  json = "not json at all";
  len[0] = char(json.size());
  expect_error(len + json, "not valid JSON");
  EXPECT_THROW(load_safetensors(dir / "missing.safetensors"), Error);
}

TEST(Safetensors, RandomCorruptionNeverCrashes) {
  // Fuzz-style: flip random bytes of a valid file; parsing either succeeds or throws vidit::Error.
  save_safetensors("/tmp/vidit_fuzz_seed.safetensors", {{"a", at::randn({3, 3})}, {"b", at::arange(5)}});
  std::ifstream in("/tmp/vidit_fuzz_seed.safetensors", std::ios::binary);
  std::string good((std::istreambuf_iterator<char>(in)), {});
  std::mt19937 rng(1);
  int errors = 0;
  for (int i = 0; i < 3000; ++i) {
    std::string b = good;
    for (int k = 0; k < 1 + int(rng() % 4); ++k) b[rng() % b.size()] = char(rng());
    if (rng() % 5 == 0) b.resize(rng() % b.size());
    try {
      parse_safetensors(reinterpret_cast<const uint8_t*>(b.data()), b.size(), "fuzz");
    } catch (const Error&) {
      ++errors;
    }
  }
  EXPECT_GT(errors, 100);
}

}  // namespace
}  // namespace vidit
