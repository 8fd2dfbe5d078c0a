// How a release is sampled as it ships: `vidit sample --weights RELEASE` takes the solver and the
// flow shift from the release's own scheduler config (diffusers' scheduler/scheduler_config.json:
// UniPCMultistepScheduler's flow_shift, FlowMatchEulerDiscreteScheduler's shift) and the steps,
// guidance and frame rate from Wan's own defaults for that model, unless the config file or --set
// names the key; the first line `vidit sample` prints says which values came from where.
//
// Wan's defaults (Wan 2.1's generate.py and configs): UniPC, 50 steps (40 for image-to-video),
// guidance 5, 16 fps; shift 5.0, but 3.0 for image-to-video at 480p's area or below and 16 for
// first-and-last-frame. Wan 2.2's two-expert models (model.boundary > 0; its configs): 40 steps,
// 16 fps; text-to-video guidance 4.0 (high-noise expert) and 3.0 (low-noise, sample.cfg_scale_2),
// shift 12.0; image-to-video 3.5 and 3.5, shift 5.0. Wan 2.2 TI2V-5B (48 latent channels, the Wan
// 2.2 VAE): 50 steps, guidance 5.0, shift 5.0, 24 fps (and `vidit sample` makes 121 frames at
// 1280x704 unless asked). An official-layout release has no scheduler
// config: its shift is then Wan's default too (diffusers' conversions ship their own).
#pragma once
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "core/config.h"

namespace vidit {

struct ReleaseSampling {
  std::string model;  // which of Wan's models the defaults are those of, e.g. "Wan 2.1 image-to-video"
  Solver solver = Solver::unipc;
  double shift = 5.0;
  int64_t steps = 50;
  double cfg_scale = 5.0;
  double cfg_scale_2 = 0;  // the low-noise expert's, for two experts; 0: none
  double fps = 16.0;
  std::string scheduler;  // the scheduler config the solver and shift came from; "" when Wan's defaults
};

// The sampling of the release at `root` (a diffusers pipeline folder or an official release) whose
// transformer is `m`, for a video of `pixels` = width x height. Throws vidit::Error naming the file
// when its scheduler config is unreadable or asks for something vidit does not sample (another
// prediction type than flow matching).
ReleaseSampling release_sampling(const std::string& root, const ModelConfig& m, int64_t pixels);

// The sample.* keys (without "sample.") the config file at `config_path` ("" for none) or the
// --set overrides `sets` name.
std::set<std::string> sample_keys_given(const std::string& config_path, const std::vector<std::string>& sets);

// Puts into `s` each of the release's values whose key is not in `given`; returns one line that
// says which values came from the release (and from which file) and which from the config.
std::string apply_release_sampling(SampleConfig& s, const ReleaseSampling& r, const std::set<std::string>& given);

}  // namespace vidit
