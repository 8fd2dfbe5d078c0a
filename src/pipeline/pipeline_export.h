// A trained transformer as a whole diffusers pipeline folder: what `vidit export --pipeline
// RELEASE` writes, so that WanPipeline / WanImageToVideoPipeline.from_pretrained(out) (and
// `vidit sample --weights out`) open the run's model as they open the release.
//
// transformer/ is written from the checkpoint's weights (streamed, one tensor at a time); every
// other component the release's model_index.json names (text encoder, tokenizer, VAE, scheduler,
// image encoder and processor) is hard-linked from the release, so that a 14B export does not
// copy 11 GB of umT5; where the two folders are on different file systems the files are copied.
// The release must fit the model: the same pipeline class (image-to-video or not), and where the
// release has a transformer/, the same input and output channels, text width and image width.
// The folder is built beside `out` and renamed into place when whole: a failed export leaves
// nothing at `out`.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/tensor_stream.h"

namespace vidit {

struct PipelineExport {
  std::string pipeline_class;           // model_index.json's _class_name
  std::string transformer = "transformer";  // the folder written from the checkpoint
  std::vector<std::string> components;  // taken from the release, in model_index.json's order
  int64_t linked_files = 0, copied_files = 0;
  uint64_t linked_bytes = 0, copied_bytes = 0;
};

// The pipeline class a diffusers release of model `m` has: WanImageToVideoPipeline for a
// conditioned model (model.condition), else WanPipeline.
std::string pipeline_class_for(const ModelConfig& m);

// Writes `out` (which must not exist, or be empty) as described above; `official`: the
// transformer's weights under official names. A two-expert release (model/experts.h) takes the
// run's expert (`expert`: the run's train.expert) into its own folder, transformer/ for the
// high-noise expert or transformer_2/ for the low-noise one, and links the other: the runs of both
// experts, exported one after the other (the second with the first's output as the release),
// make a release. Throws vidit::Error naming the release, the key or the setting that does not
// fit, before anything is written.
PipelineExport write_diffusers_pipeline(const TensorStream& official, const ModelConfig& m, const std::string& release,
                                        const std::string& out, uint64_t max_shard_bytes, Expert expert = Expert::none);

// The same into Wan 2.2's own two-expert layout (model/experts.h): the run's expert written under
// official names into high_noise_model/ or low_noise_model/ (the release's config.json kept
// beside it), and every other file and folder of the release hard-linked (else copied): Wan's
// generate.py reads `out` as it reads the release. Throws vidit::Error naming the release and the
// key when it is not such a release, the run is not one of its experts (train.expert), the
// boundary or the experts' shape differs, or `out` exists and is not empty.
PipelineExport write_official_expert_release(const TensorStream& official, const ModelConfig& m,
                                            const std::string& release, const std::string& out,
                                            uint64_t max_shard_bytes, Expert expert);

}  // namespace vidit
