// The fingerprint of a rank's weights (diagnose/replica_check.h): equal weights agree, whatever
// their memory order, and any one flipped bit, in any dtype, disagrees. (The check in real jobs
// is tested in src/train/replica_check_run_test.cpp.)
#include <gtest/gtest.h>

#include "diagnose/replica_check.h"

namespace vidit {
namespace {

TEST(WeightsFingerprint, EqualWeightsAgreeAndAnyFlippedBitDisagrees) {
  TensorMap a = {{"w", at::randn({33, 17})}, {"b", at::randn({5}).to(at::kBFloat16)}, {"d", at::randn({3}, at::kDouble)}};
  TensorMap b;
  for (const auto& [k, t] : a) b[k] = t.clone();
  const uint64_t fa = weights_fingerprint({&a});
  EXPECT_EQ(fa, weights_fingerprint({&b}));
  // A transposed copy made contiguous holds other bytes in memory order: the fingerprint is of
  // the values, in order, not of the storage.
  TensorMap c = {{"w", a.at("w").t().contiguous().t()}, {"b", a.at("b")}, {"d", a.at("d")}};
  EXPECT_EQ(fa, weights_fingerprint({&c}));
  // Every bit of a few words, in each dtype.
  for (const char* key : {"w", "b", "d"}) {
    at::Tensor& t = b[key];
    const int bits = int(t.element_size()) * 8;
    for (int64_t i : {int64_t(0), t.numel() - 1})
      for (int bit = 0; bit < bits; ++bit) {
        at::Tensor raw = t.view(-1).narrow(0, i, 1).view(t.element_size() == 2 ? at::kShort
                                                          : t.element_size() == 4 ? at::kInt : at::kLong);
        raw.bitwise_xor_(int64_t(1) << bit);
        EXPECT_NE(fa, weights_fingerprint({&b})) << key << "[" << i << "] bit " << bit;
        raw.bitwise_xor_(int64_t(1) << bit);
      }
  }
  EXPECT_EQ(fa, weights_fingerprint({&b}));
}

}  // namespace
}  // namespace vidit
