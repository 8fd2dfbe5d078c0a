// The whole transformer weights a path names, for starting a run (train.init_from), sampling and
// exporting:
//   - a release or an exported folder, in either layout (model/weight_layout.h);
//   - a vidit run (its newest committed checkpoint) or a checkpoint folder: its EMA weights (or the
//     raw ones), put together from however many ranks saved them. A LoRA run's checkpoint holds
//     its adapters only (model/lora.h); they are merged onto the weights that run started from
//     (its own train.init_from, read the same way; or, when that was empty, the random init its
//     train.seed gives, rebuilt as the trainer built it).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/safetensors.h"
#include "core/tensor_stream.h"

namespace vidit {

// Whether `path` is a vidit run folder (with checkpoints/) or a checkpoint (with meta.json).
bool is_vidit_checkpoint_path(const std::string& path);

// Where a checkpoint's weights come from, beside the weights themselves.
struct CheckpointSource {
  std::string checkpoint;  // the checkpoint folder read
  int64_t step = 0;
  bool ema = false;        // the EMA weights were taken
  Config config;           // the run's resolved config (its model shape, its [lora], ...)
  TensorMap adapters;      // a LoRA run's adapters (whole), else empty
  double lora_scale = 0;   // their alpha / rank
};

// The weights read one whole tensor at a time (core/tensor_stream.h), for `vidit export`: at
// most one whole tensor of the model is held at once (with LoRA, the adapters too, and while a
// tensor's adapter is merged up to two fp32 tensors of its size), whatever the model's size and
// however many ranks saved it.
//   - a full run's tensor: put together from the checkpoint's parts and verified
//     (CheckpointReader::whole), from its memory-mapped files;
//   - a LoRA run's: the base tensor (read from its release's memory-mapped files, from the base
//     run's checkpoint the same way, or computed by the run's seeded init for that tensor alone,
//     model/init.h) with its adapter merged (model/lora.h merge_lora_weight).
// The stream's reads throw what CheckpointReader::whole throws (CheckpointCorrupt naming the
// file and tensor) and what reading a release throws.
struct CheckpointStream : CheckpointSource {
  TensorStream weights;    // whole shapes, official names; with LoRA, the base's keys and dtypes
};
// A run folder or a checkpoint; `use_ema`: the EMA weights when the checkpoint has them. Reads
// meta.json, the manifest and the adapters only. Throws vidit::Error naming the path when it
// holds no committed checkpoint, and naming the base when a LoRA run's base cannot be opened
// (moved or deleted: the message says which key to point at it), or its adapters do not fit it.
CheckpointStream open_checkpoint_weights(const std::string& run_or_checkpoint, bool use_ema = true);

struct CheckpointWeights : CheckpointSource {
  // Whole, official names; with LoRA, the base with the adapters merged (with a release as the
  // base, the tensors no adapter changes are read-only views of its memory-mapped files).
  TensorMap weights;
};
// The same weights all in memory: open_checkpoint_weights' stream read whole. Throws as it does.
CheckpointWeights read_checkpoint_weights(const std::string& run_or_checkpoint, bool use_ema = true);

// Weights in official names from any path above (a checkpoint's EMA weights).
TensorMap read_any_weights(const std::string& path);

// train.init_from as the trainer opens it. A release's files are memory-mapped, so that a rank
// that copies out only its part of each tensor (FSDP's shard, tensor parallel's slice) reads only
// that part from disk; a vidit run's checkpoint is read whole (its parts are put together first).
struct InitWeights {
  std::string from;
  TensorMap weights;                                     // whole shapes, official names
  std::vector<std::shared_ptr<const MappedFile>> files;  // the mappings (empty when read whole)
  int64_t file_bytes() const;  // the mapped files' sizes
  int64_t read_bytes() const;  // of those, the bytes this process has touched so far (-1: unknown)
};
// Throws vidit::Error naming the path when it holds no weights, and naming both keys when the
// weights' own config disagrees with cfg.model on what their shapes cannot show (rope_theta,
// text_len).
InitWeights open_init_weights(const Config& cfg);

class ParallelModel;
// This rank's part of each parameter of `pm` (FSDP's shard, tensor parallel's slice, or the whole),
// cut from the whole tensors by the parameter's layout and copied in: of mapped files only the
// parts are read. Names and whole shapes are checked first, as load_state_dict checks them.
void load_init_parts(const ParallelModel& pm, const InitWeights& w);

}  // namespace vidit
