// The shipped model presets (configs/) have the parameter counts of the releases they describe.
#include "model/model_info.h"

#include <gtest/gtest.h>

#include <cmath>

#include "core/config.h"

namespace vidit {
namespace {

TEST(ModelInfo, ShippedConfigsHaveTheReleasesParameterCounts) {
  const std::string dir = std::string(VIDIT_SOURCE_DIR) + "/configs/";
  const std::pair<const char*, double> presets[] = {{"wan2.1-1.3b.toml", 1.419e9}, {"wan2.1-14b.toml", 14.288e9},
                                                    // T2V 14B's blocks with image keys and values, img_emb, 36 channels
                                                    {"wan2.1-i2v-14b.toml", 16.395e9},
                                                    {"wan2.2-t2v-a14b.toml", 14.288e9},  // one expert
                                                    {"wan2.2-ti2v-5b.toml", 5.0e9}};
  for (auto [file, want] : presets) {
    Config c = load_config(dir + file);
    const double n = double(count_parameters(c.model));
    EXPECT_LT(std::abs(n - want) / want, 0.005) << file << ": " << n;
  }
}

}  // namespace
}  // namespace vidit
