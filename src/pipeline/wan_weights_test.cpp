// The sampling pipeline's parts found from one folder (WanWeights::fill_from): `--weights
// PIPELINE` on a diffusers pipeline folder gives the VAE in its vae/, in diffusers' layout, as
// the VAE's own search finds it (vae/vae_layout.h).
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "../../tests/test_util.h"
#include "model/state_dict.h"
#include "pipeline/wan_pipeline.h"
#include "vae/vae_layout.h"
#include "vae/vae_test_util.h"
#include "vae/wan_vae.h"

namespace vidit {
namespace {

using WanWeightsTest = test::OneThreadTest;

TEST_F(WanWeightsTest, APipelineFolderGivesTheVaeInItsVaeFolder) {
  test::ScratchDir dir("wan_weights_vae");
  const WanVAEConfig cfg = test::tiny_vae_config();
  WanVAE src = test::random_vae(cfg, 8);
  const std::string pipe = dir / "pipe";
  write_diffusers_vae(state_dict(*src), cfg, pipe + "/vae");
  std::ofstream(pipe + "/model_index.json") << R"({"_class_name": "WanPipeline"})";
  const std::string file = pipe + "/vae/diffusion_pytorch_model.safetensors";
  WanWeights w;
  w.fill_from(pipe);
  EXPECT_EQ(w.vae, file);
}

}  // namespace
}  // namespace vidit
