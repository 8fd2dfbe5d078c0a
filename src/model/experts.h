// Two experts split by noise level (Wan 2.2 T2V-A14B and I2V-A14B): two DiTs of one shape, the
// high-noise expert run where the noise level sigma (the timestep / 1000, on the shifted schedule
// the sampler walks) is at or above model.boundary, the low-noise one below it.
//
// A release holds them as
//   - diffusers: transformer/ (high noise) and transformer_2/ (low noise), and boundary_ratio in
//     model_index.json (0.875 for T2V, 0.9 for I2V);
//   - official Wan 2.2: high_noise_model/ and low_noise_model/, the boundary then Wan's own for the
//     model (0.9 where the experts take 36 input channels, image-to-video; else 0.875).
// Sampling switches expert once (the noise level only falls); training trains one expert on
// exactly the noise levels it serves (train.expert, diffusion/flow_matching.h's range).
#pragma once
#include <optional>
#include <string>

#include "core/config.h"

namespace vidit {

struct ExpertRelease {
  std::string high, low;   // the experts' weight paths
  double boundary = 0;     // in (0, 1)
  std::string boundary_from;  // "model_index.json", or Wan's default it came from
  ModelConfig model;       // the experts' shape (the same for both), with model.boundary set
};

// The two experts of the release at `root`, or nullopt when it is not a two-expert release.
// Throws vidit::Error naming the file or folder for a release with transformer_2 and no (or an
// out-of-range) boundary_ratio, an expert folder missing, or experts of different shapes.
std::optional<ExpertRelease> find_experts(const std::string& root);

// Which expert a weights path is by its folder beside a two-expert release (transformer/ or
// high_noise_model/: high; transformer_2/ or low_noise_model/: low), or Expert::none.
Expert expert_of_path(const std::string& path);

// The weights train.init_from names for this run: with train.expert and a two-expert release, the
// expert's own folder; else init_from as given (one expert's folder, a file in it, or a run of
// one expert). Throws vidit::Error when the release's boundary is not model.boundary, when
// init_from is one expert's folder and train.expert the other (an expert's weights, or its LoRA,
// on the other expert), or a two-expert release without train.expert.
std::string expert_init_path(const Config& cfg);

}  // namespace vidit
