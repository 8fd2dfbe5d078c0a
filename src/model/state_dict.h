// Named tensors of a module (its parameters, official Wan 2.1 key names) to and from a map,
// with a strict loader: every missing, unexpected or mis-shaped key is reported by name.
#pragma once
#include <torch/nn/module.h>

#include "core/safetensors.h"

namespace vidit {

// Parameters by name, detached views of the live tensors (not copies).
TensorMap state_dict(const torch::nn::Module& module);

// Copies `tensors` into `module`'s parameters (casting dtype). Throws vidit::Error listing all
// missing / unexpected / mis-shaped keys (up to a few of each) and naming `source`; nothing
// is written to the module unless every key matches.
void load_state_dict(torch::nn::Module& module, const TensorMap& tensors, const std::string& source);
// The check alone: `tensors` against the names and shapes of `expected`.
void check_state_dict(const TensorMap& expected, const TensorMap& tensors, const std::string& source);

// Reads a transformer's weights, in official Wan 2.1 names, from a .safetensors file, a folder of
// them (a sharded release such as diffusion_pytorch_model-0000N-of-0000M.safetensors, read
// through its index json when there is one), or a diffusers transformer / pipeline folder (renamed
// from diffusers' layout): model/weight_layout.h's read_transformer_weights, which says how each
// case fails. Throws vidit::Error when nothing is found or a key appears in two shards.
TensorMap read_weights(const std::string& file_or_folder);

}  // namespace vidit
