// The CLIP image encoder (Hugging Face's CLIPVisionModel: the vision tower only), inference only.
// Wan 2.1's image-to-video models condition on its penultimate hidden state: for ViT-H/14 at 224
// pixels, 257 tokens (one class token and a 16 x 16 grid of patches) of width 1280.
//
// A pre-norm Vision Transformer over image patches:
//   x = [class_embedding; patch_embedding(pixels)] + position_embedding   (patch_embedding is a
//       convolution without bias whose stride is its kernel: one token per patch, row by row)
//   x = pre_layrnorm(x)                                        -> hidden_states[0]
//   per layer:  x += out_proj(attention(q, k, v of layer_norm1(x)))   (softmax(q·kᵀ / sqrt(head
//                                                                       dim)); every token sees
//                                                                       every token, no mask)
//               x += fc2(act(fc1(layer_norm2(x))))                 -> hidden_states[n + 1]
//   pooled = post_layernorm(x[:, 0])     (the final norm touches the class token only; the last
//                                         hidden state is returned un-normed, as transformers does)
// The norms are LayerNorms with weight and bias; q, k, v, out, fc1 and fc2 are Linear with bias.
// `act` is the config's hidden_act: "gelu" (exact, erf: ViT-H/14), "quick_gelu" (x·σ(1.702x):
// OpenAI's CLIP) or "gelu_new" / "gelu_pytorch_tanh" (the tanh GELU).
//
// Precision: "fp32" computes everything in fp32 (equal to transformers' eager model to ~1e-6).
// "bf16" stores the convolution and projection weights in bf16 and multiplies in bf16, while the
// embeddings, the residual stream and the norms stay in fp32; hidden states come out in fp32.
#pragma once
#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "core/safetensors.h"

namespace vidit::vision {

// The encoder's shape: the names of transformers' CLIPVisionConfig, with its defaults for fields a
// config.json leaves out (transformers writes only the fields that differ from its defaults in a
// CLIPConfig's nested vision_config).
struct ClipVisionConfig {
  int64_t hidden_size = 768;
  int64_t intermediate_size = 3072;   // width of the MLP (fc1's outputs)
  int64_t num_hidden_layers = 12;
  int64_t num_attention_heads = 12;
  int64_t num_channels = 3;
  int64_t image_size = 224;           // pixels on each side of the (square) input
  int64_t patch_size = 32;
  double layer_norm_eps = 1e-5;
  std::string hidden_act = "quick_gelu";  // gelu | quick_gelu | gelu_new | gelu_pytorch_tanh

  int64_t head_dim() const { return hidden_size / num_attention_heads; }
  int64_t grid() const { return image_size / patch_size; }      // patches on each side
  int64_t tokens() const { return grid() * grid() + 1; }        // patches and the class token

  // Reads a transformers config.json: a CLIPVisionConfig (model_type "clip_vision_model"), or a
  // CLIPConfig (model_type "clip") whose vision_config is used. Throws vidit::Error naming the
  // file and the field on a malformed or inconsistent value (hidden_size not a multiple of the
  // heads, an image smaller than a patch, an activation this encoder lacks, another model type).
  static ClipVisionConfig from_json_file(const std::string& path);
  // open-clip's ViT-H/14 (1280 wide, 32 layers, 224-pixel pictures in 14-pixel patches: 257
  // tokens), the image encoder of Wan 2.1's image-to-video releases.
  static ClipVisionConfig vit_h_14();
  // Its parameters, as the encoder holds them (every tensor of the checkpoint it reads).
  int64_t parameters() const;
};

// What forward() returns.
struct ClipVisionOutput {
  // num_hidden_layers + 1 tensors, fp32 [B, tokens, hidden_size] on the encoder's device: the
  // embeddings after pre_layrnorm, then each layer's output (transformers' hidden_states with
  // output_hidden_states=True; the last one is its last_hidden_state).
  std::vector<at::Tensor> hidden_states;
  at::Tensor pooled;  // fp32 [B, hidden_size]: post_layernorm of the last hidden state's class token
};

class ClipVisionEncoder {
 public:
  // Builds the encoder from weights under transformers' names, with or without the leading
  // "vision_model." (transformers 4 and the Hugging Face hub write it, transformers 5 does not);
  // tensors of other models in the same map (a whole CLIPModel's text_model.*, logit_scale,
  // visual_projection) are ignored. Every tensor's presence and shape is checked against `cfg`.
  // `dtype`: at::kFloat or at::kBFloat16. `device`: where weights live and compute runs (CPU, or
  // a CUDA device in a CUDA build). Throws vidit::Error naming `source` and the tensor (expected
  // and found shape).
  ClipVisionEncoder(const ClipVisionConfig& cfg, const TensorMap& hf_weights, at::ScalarType dtype, at::Device device,
                    const std::string& source = "<weights>");

  // Opens `path`:
  //  - a Hugging Face / diffusers image_encoder folder: config.json, and model.safetensors or the
  //    shards named by model.safetensors.index.json (its weight_map);
  //  - a diffusers pipeline root (its image_encoder/ is used);
  //  - a single .safetensors file, with the config.json beside it (the shapes of the tensors do not
  //    tell the number of heads nor the activation).
  // Only the tensors the encoder needs are read (the files are memory-mapped). Throws vidit::Error
  // naming the file, and the key or tensor (expected and found shape).
  static ClipVisionEncoder load(const std::string& path, at::ScalarType dtype, at::Device device);

  // pixel_values: [B, num_channels, image_size, image_size], any floating dtype and device, as
  // the image processor makes them (image_input.h: clip_pixel_values). Other sizes are a
  // vidit::Error (position embeddings are not interpolated). Runs without autograd.
  ClipVisionOutput forward(const at::Tensor& pixel_values) const;
  // forward(pixel_values).hidden_states.
  std::vector<at::Tensor> hidden_states(const at::Tensor& pixel_values) const;
  // hidden_states[index] alone (index in [-(L + 1), L], negative counting from the end, L =
  // num_hidden_layers), running only the layers it needs; the same values as forward()'s.
  at::Tensor hidden_state(const at::Tensor& pixel_values, int64_t index) const;
  // hidden_states[-2]: the image tokens Wan 2.1 I2V feeds its image projection (img_emb); fp32
  // [B, tokens, hidden_size]. The last layer is not run. Needs num_hidden_layers >= 1.
  at::Tensor penultimate(const at::Tensor& pixel_values) const { return hidden_state(pixel_values, -2); }

  const ClipVisionConfig& config() const { return cfg_; }
  at::Device device() const { return device_; }
  at::ScalarType dtype() const { return dtype_; }

 private:
  struct Norm {
    at::Tensor weight, bias;  // [hidden_size] fp32
  };
  struct Layer {
    Norm norm1, norm2;
    at::Tensor qkv_w, qkv_b;  // [3 * hidden, hidden], [3 * hidden]: q, k, v stacked
    at::Tensor out_w, out_b;  // [hidden, hidden], [hidden]
    at::Tensor fc1_w, fc1_b;  // [intermediate, hidden], [intermediate]
    at::Tensor fc2_w, fc2_b;  // [hidden, intermediate], [hidden]
  };
  at::Tensor embed(const at::Tensor& pixel_values) const;          // -> hidden_states[0]
  at::Tensor run_layer(const Layer& l, const at::Tensor& x) const;  // fp32 [B, T, hidden]
  at::Tensor norm(const Norm& n, const at::Tensor& x) const;
  at::Tensor activation(const at::Tensor& x) const;

  ClipVisionConfig cfg_;
  at::ScalarType dtype_;
  at::Device device_;
  at::Tensor patch_w_;   // [hidden, channels, patch, patch] (compute dtype)
  at::Tensor class_;     // [hidden] fp32
  at::Tensor position_;  // [tokens, hidden] fp32
  Norm pre_norm_, post_norm_;
  std::vector<Layer> layers_;
};

}  // namespace vidit::vision
