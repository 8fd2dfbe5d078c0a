// The two on-disk layouts of the Wan 2.1 VAE's weights, and where to find them.
//
//   wan        the official release (Wan2.1_VAE.pth of Wan-Video/Wan2.1, as safetensors): our
//              WanVAE's own parameter names: encoder.conv1.*, encoder.downsamples.N.residual.2.*,
//              encoder.middle.{0,1,2}.*, encoder.head.{0,2}.*, conv1.*, conv2.*, decoder.conv1.*,
//              decoder.upsamples.N.*, decoder.head.*.
//   diffusers  diffusers' AutoencoderKLWan (a pipeline's vae/ folder: config.json and
//              diffusion_pytorch_model.safetensors): the same tensors, same shapes and values, under
//              other names: quant_conv / post_quant_conv for conv1 / conv2, conv_in / norm_out /
//              conv_out for conv1 / head.0 / head.2, mid_block.{resnets.0, attentions.0, resnets.1}
//              for middle.{0,1,2}, norm1 / conv1 / norm2 / conv2 / conv_shortcut inside a residual
//              block for residual.{0,2,3,6} / shortcut, encoder.down_blocks.N for downsamples.N (the
//              same flat list), and the decoder's flat upsamples.N regrouped per stage as
//              up_blocks.S.resnets.J (J <= num_res_blocks) and up_blocks.S.upsamplers.0.
// The names map one to one for a given WanVAEConfig (the decoder's regrouping depends on
// num_res_blocks); the layout of a file is judged by its tensor names, not its file name.
//
// diffusers' latents_mean / latents_std sit in config.json (the pipeline, not the VAE, applies
// them); ours are WanVAEConfig::latent_mean / latent_std. A config.json is checked against the
// WanVAE it is loaded into, so a VAE of another shape or with other statistics is refused, never
// half-loaded or silently normalised with the wrong numbers.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/safetensors.h"
#include "vae/wan_vae.h"

namespace vidit {

enum class VaeLayout { wan, diffusers };

// ---- names ---------------------------------------------------------------------------------------
// One parameter of a WanVAE of some config, under both names.
struct VaeParam {
  std::string official, diffusers;
  std::vector<int64_t> shape;
};
// Every parameter of WanVAE(cfg), in the module's parameter order (no tensor is allocated).
std::vector<VaeParam> vae_params(const WanVAEConfig& cfg);

// The layout of a state dict: diffusers when any name is diffusers-only, wan otherwise (names of
// neither are left for the strict loader to report). Throws vidit::Error naming `source` and one
// name of each layout when they are mixed.
VaeLayout vae_layout_of(const TensorMap& tensors, const std::string& source);

// Renamed (tensors shared, not copied), strictly against vae_params(cfg): throws vidit::Error
// naming `source` and every missing, unexpected or mis-shaped key in the input's own names.
TensorMap vae_to_official_names(const TensorMap& diffusers, const WanVAEConfig& cfg, const std::string& source);
TensorMap vae_to_diffusers_names(const TensorMap& official, const WanVAEConfig& cfg, const std::string& source);

// ---- files ---------------------------------------------------------------------------------------
struct VaeFiles {
  std::string weights;  // a .safetensors file
  std::string config;   // its AutoencoderKLWan config.json, or "" (an official file has none)
};
// Where the VAE of `path` is: `path` may be
//   - a .safetensors file (either layout; a config.json beside it is used when it describes an
//     AutoencoderKLWan);
//   - a diffusers vae/ folder (config.json + diffusion_pytorch_model.safetensors, or its fp16
//     variant; without config.json only the names and shapes are checked), or a folder holding
//     Wan2.1_VAE.safetensors (an official release);
//   - a diffusers pipeline root (model_index.json): its vae/ folder.
// Throws vidit::Error naming the path and what to give instead: no such path, a pickle
// (Wan2.1_VAE.pth, *.bin: with the one-line conversion), a folder of some other model, a folder
// without VAE weights.
VaeFiles find_vae_files(const std::string& path);

// ---- configs -------------------------------------------------------------------------------------
// Our WanVAEConfig from a diffusers AutoencoderKLWan config.json (base_dim, z_dim, dim_mult,
// num_res_blocks, temperal_downsample, latents_mean, latents_std; keys left out take
// AutoencoderKLWan's defaults, which are Wan 2.1's). `dropout` has no parameters and no effect on
// a VAE in eval mode (how vidit runs it) and is ignored. Throws vidit::Error naming the file and
// key for what WanVAE does not build: another _class_name, decoder_base_dim != base_dim,
// attn_scales, is_residual or patch_size (Wan 2.2's VAE), in/out channels other than 3,
// scale factors that disagree with the stages, an unknown key with a value, a bad value.
WanVAEConfig vae_config_from_diffusers(const std::string& config_json);
// A VAE's config.json as a JSON object. Throws vidit::Error naming the file when it cannot be read
// or is not a JSON object.
nlohmann::json read_vae_config_json(const std::string& path);
// Refuses `found` (read from `source`) unless it describes the VAE `built` is: every shape key
// and the latent statistics. The message names the key, both values and `source`.
void check_vae_config(const WanVAEConfig& found, const WanVAEConfig& built, const std::string& source);

// ---- writing -------------------------------------------------------------------------------------
// Writes `official` (our names, checked against `cfg`) as a diffusers AutoencoderKLWan folder
// `out_dir` (config.json + diffusion_pytorch_model.safetensors), loadable by
// AutoencoderKLWan.from_pretrained. Tensors keep their dtype. Refuses an `out_dir` that exists and
// is not empty.
void write_diffusers_vae(const TensorMap& official, const WanVAEConfig& cfg, const std::string& out_dir);

}  // namespace vidit
