// A tiny Wan release folder for the pipeline's tests: the umT5 reference's text_encoder/ and
// tokenizer/ (linked from tests/reference/umt5_reference.py's output), a transformer/ of random
// weights in diffusers' names, a random Wan VAE, and model_index.json.
#pragma once
#include <filesystem>
#include <fstream>
#include <string>

#include "model/dit.h"
#include "model/state_dict.h"
#include "model/weight_layout.h"
#include "../../tests/test_util.h"
#include "vae/wan_vae.h"

namespace vidit::pipeline_test {

// The tiny transformer: text_dim 64 is the reference umT5's width.
inline ModelConfig tiny_wan() {
  ModelConfig m;
  m.dim = 32, m.ffn_dim = 64, m.heads = 2, m.layers = 2, m.in_channels = 16, m.out_channels = 16;
  m.patch = {1, 2, 2}, m.text_dim = 64, m.text_len = 512, m.freq_dim = 16, m.rope_theta = 10000;
  return m;
}

// Makes <dir>/pipe from the umT5 reference folder `ref`; returns its path.
inline std::string make_release(const test::ScratchDir& dir, const std::string& ref) {
  namespace fs = std::filesystem;
  const std::string root = dir / "pipe";
  fs::create_directories(root);
  fs::create_directory_symlink(ref + "/pipe/text_encoder", root + "/text_encoder");
  fs::create_directory_symlink(ref + "/pipe/tokenizer", root + "/tokenizer");
  torch::manual_seed(3);
  DiT model(tiny_wan());
  model->init_weights();
  // Wan initialises the output head (and gates) at zero; random values make every weight matter.
  for (auto& p : model->parameters()) p.data().normal_(0, 0.05);
  write_diffusers_transformer(state_dict(*model), tiny_wan(), root + "/transformer");
  WanVAE vae;
  for (auto& p : vae->parameters()) p.data().normal_(0, 0.02);
  fs::create_directories(root + "/vae");
  save_safetensors(root + "/vae/Wan2.1_VAE.safetensors", state_dict(*vae));
  std::ofstream(root + "/model_index.json")
      << R"({"_class_name": "WanPipeline", "transformer": ["diffusers", "WanTransformer3DModel"]})";
  return root;
}

}  // namespace vidit::pipeline_test
