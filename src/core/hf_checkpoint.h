// Where the weights of a Hugging Face model component are: transformers' and diffusers' folder
// conventions, shared by the frozen encoders read from them (umT5's text_encoder/, CLIP's
// image_encoder/). A path may be the weight file itself (config.json beside it, if any), the
// component's folder (config.json with model.safetensors, or shards listed by
// model.safetensors.index.json, or one weight file under another name), or a pipeline root
// holding the component's folder.
#pragma once
#include <ATen/ATen.h>

#include <string>
#include <vector>

namespace vidit {

struct HfWeightFiles {
  std::vector<std::string> files;  // every weight file (the shards, in name order)
  std::string config;              // config.json, or "" when there is none
  std::string index;               // model.safetensors.index.json when sharded
};

// `component`: the pipeline's folder name ("text_encoder"); `what`: the model in messages
// ("umT5 weights"); `allow_pth`: a lone .pth / .pt file is taken where no .safetensors is.
// Throws vidit::Error naming the path and what to pass when nothing is found, an index that
// cannot be read, or a shard it names that is missing.
HfWeightFiles find_hf_weight_files(const std::string& path, const std::string& component, const std::string& what,
                                   bool allow_pth);

// "[2, 3, 4]": a shape for messages.
std::string shape_str(at::IntArrayRef shape);

}  // namespace vidit
