// The two on-disk layouts of a Wan 2.1 transformer's weights, read and written.
//
//   wan        the official release: our parameter names (patch_embedding.*, blocks.N.self_attn.q.*,
//              blocks.N.norm3.*, head.head.*, ...), config.json of Wan's WanModel (dim, num_heads,
//              in_dim, ...).
//   diffusers  diffusers' WanTransformer3DModel (a pipeline's transformer/ folder): the same
//              tensors under other names (condition_embedder.*, blocks.N.attn1.to_q.*, blocks.N.norm2.*,
//              proj_out.*, scale_shift_table, ...), config.json of WanTransformer3DModel
//              (num_attention_heads, attention_head_dim, ...).
//
// The two hold the same tensors with the same shapes and values: the layouts differ only in names
// (one to one, listed in weight_layout.cpp), and the one-norm difference of naming is that Wan's
// affine LayerNorm before cross-attention, `norm3`, is diffusers' `norm2` (diffusers' norm1 and
// norm3, the modulated LayerNorms, have no parameters). So a diffusers transformer runs in our DiT
// exactly, given the conventions of its pipeline: timestep sigma*1000, text zero-padded to 512
// tokens (our model.text_len), RoPE theta 10000 (model.rope_theta).
//
// Both layouts store one file (diffusion_pytorch_model.safetensors) or shards
// diffusion_pytorch_model-0000N-of-0000M.safetensors listed by
// diffusion_pytorch_model.safetensors.index.json ({"metadata": {"total_size"}, "weight_map"}).
// The layout of a path is judged by the tensor names found in it, not by file names.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/config.h"
#include "core/safetensors.h"
#include "core/tensor_stream.h"

namespace vidit {

enum class WeightLayout { wan, diffusers };
const char* layout_name(WeightLayout layout);  // "wan" / "diffusers"

// ---- names ---------------------------------------------------------------------------------------
// The diffusers name of an official key, and back. Throw vidit::Error naming the key (and
// `source`, the file it came from) when it maps to nothing in the other layout (e.g. an image
// conditioning tensor, a LoRA tensor, a typo).
std::string diffusers_name(const std::string& official, const std::string& source = "");
std::string official_name(const std::string& diffusers, const std::string& source = "");
// Every key renamed (the tensors are shared, not copied). Throws listing the keys that map to
// nothing (up to a few), naming `source`.
TensorMap to_diffusers_names(const TensorMap& official, const std::string& source = "");
TensorMap to_official_names(const TensorMap& diffusers, const std::string& source = "");

// The layout of a set of tensor names: diffusers when any name is diffusers-only, wan otherwise
// (names of neither layout are left for the strict loader to report). Throws when names of both
// layouts are mixed, naming one of each and `source`.
WeightLayout layout_of_names(const std::vector<std::string>& names, const std::string& source);

// The transformer's official names and shapes for `cfg`, in the model's parameter order (the
// order of DiT's named_parameters(); model_info.h's parameter_shapes). No tensor is allocated.
std::vector<std::pair<std::string, std::vector<int64_t>>> transformer_shapes(const ModelConfig& cfg);
// `official` against transformer_shapes(cfg): throws vidit::Error naming `source`, every missing or
// unexpected key and every mis-shaped key with its expected and found shapes (up to a few of each).
void check_transformer_weights(const TensorMap& official, const ModelConfig& cfg, const std::string& source);

// ---- reading -------------------------------------------------------------------------------------
// What a weights path holds, found without reading any tensor: `path` may be
//   - a .safetensors file, or a *.safetensors.index.json;
//   - a folder with diffusion_pytorch_model.safetensors.index.json (the shards it lists), or else
//     every *.safetensors file in it (an official Wan release, a diffusers transformer/ folder);
//   - a diffusers pipeline root (model_index.json): its transformer/ folder.
struct WeightFiles {
  std::string dir;                 // the folder the weights are in
  std::vector<std::string> files;  // the safetensors files, sorted
  std::string index;               // the index json that lists them, or ""
  std::string config;              // config.json beside them, or ""
  WeightLayout layout = WeightLayout::wan;  // judged by the tensor names (file headers / index)
  std::vector<std::string> names;  // the tensors' names as stored (a ComfyUI prefix dropped)
};
// Throws vidit::Error naming the path when nothing usable is found (no such path, no safetensors
// file, a pipeline root without transformer/), an index that does not parse, or mixed names.
WeightFiles find_transformer_weights(const std::string& path);

// The transformer's tensors in official names, whatever the layout (renamed from diffusers'; a
// "model.diffusion_model." prefix, as in ComfyUI's single files, is dropped). Sharded weights are
// read through the index when there is one: a shard it names that is missing, or a key it lists
// that its shard lacks, is an error naming both. Without an index every *.safetensors file of the
// folder is read and a key found in two of them is an error. Names of neither layout are returned
// as found, for load_state_dict to report. Throws vidit::Error naming the file and key.
// With `mapped`, the files are memory-mapped instead of read (core/safetensors.h map_safetensors):
// the tensors are views that read from disk only what is touched, and the mappings are appended
// to `mapped`.
TensorMap read_transformer_weights(const std::string& path,
                                   std::vector<std::shared_ptr<const MappedFile>>* mapped = nullptr);

// ---- configs -------------------------------------------------------------------------------------
// Our ModelConfig from a diffusers WanTransformer3DModel config.json: dim =
// num_attention_heads * attention_head_dim, ffn_dim, heads, layers, in/out channels, patch,
// text_dim, freq_dim, eps, image conditioning (image_dim; pos_embed_seq_len, first-and-last-frame
// models), and the pipeline's conventions text_len = 512, rope_theta = 10000. Keys left out take
// WanTransformer3DModel's defaults, as diffusers does. Throws vidit::Error naming the file and key
// for what our DiT does not have: added_kv_proj_dim other than the model's width (or without
// image_dim), cross_attn_norm = false, another qk_norm, an unknown key with a value, another
// _class_name.
ModelConfig model_config_from_diffusers(const std::string& config_json);
// Our ModelConfig from an official Wan config.json (WanModel: dim, ffn_dim, freq_dim, in_dim,
// out_dim, num_heads, num_layers, text_len, eps, patch_size, text_dim), rope_theta = 10000;
// model_type "i2v" has CLIP features of width 1280 (image_dim), "flf2v" also a position embedding
// over two images' 514 tokens (Wan 2.2's "i2v" experts have no CLIP: read_transformer_config
// drops image_dim where the weights hold no img_emb). Throws for another model_type, windowed
// attention, or qk_norm / cross_attn_norm off.
ModelConfig model_config_from_wan(const std::string& config_json);
// The config.json that describes a weights path (see find_transformer_weights), read by its
// _class_name (WanTransformer3DModel or WanModel). Throws when there is none.
ModelConfig read_transformer_config(const std::string& path);

// ---- writing -------------------------------------------------------------------------------------
// diffusers' own default shard size for save_pretrained ("10GB").
inline constexpr uint64_t kDefaultMaxShardBytes = 10'000'000'000ull;
// Writes `official` (our names; checked against `cfg` first, by name and shape) as a diffusers
// WanTransformer3DModel folder `out_dir`, loadable by WanTransformer3DModel.from_pretrained:
// config.json and diffusion_pytorch_model.safetensors, or, when the tensors' bytes exceed
// `max_shard_bytes`, shards of at most that size (a larger tensor alone in its shard) in the
// model's parameter order, with the index json. Tensors keep their dtype; any device.
// Refuses an `out_dir` that exists and is not empty (naming it), and cfg.rope_theta other than
// 10000 (both layouts' models hard-code it: the written model would compute something else). Writes into a temporary sibling
// folder renamed to `out_dir` at the end, so a failure leaves no half-written `out_dir`.
// From a stream (core/tensor_stream.h), each tensor is read when its file is written and dropped
// once written, so that no more than one is held at a time (`vidit export` of a checkpoint);
// the folder is byte for byte the one the same tensors in a map give. Only shapes and dtypes
// are checked before the first file is written; what a read throws fails the write as above.
void write_diffusers_transformer(const TensorStream& official, const ModelConfig& cfg, const std::string& out_dir,
                                 uint64_t max_shard_bytes = kDefaultMaxShardBytes);
void write_diffusers_transformer(const TensorMap& official, const ModelConfig& cfg, const std::string& out_dir,
                                 uint64_t max_shard_bytes = kDefaultMaxShardBytes);
// The same in the official layout: official names and Wan's WanModel config.json.
void write_wan_transformer(const TensorStream& official, const ModelConfig& cfg, const std::string& out_dir,
                           uint64_t max_shard_bytes = kDefaultMaxShardBytes);
void write_wan_transformer(const TensorMap& official, const ModelConfig& cfg, const std::string& out_dir,
                           uint64_t max_shard_bytes = kDefaultMaxShardBytes);

}  // namespace vidit
