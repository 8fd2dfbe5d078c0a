// `vidit demo`: the embedded end-to-end run. Makes shape videos (H.264 via FFmpeg), decodes
// them, encodes them with the demo codec, trains a tiny DiT on the CPU with flow matching,
// samples the (colour, direction) pairs held out of training, writes the samples as MP4 and the
// loss curve as PNG, and measures prompt adherence.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "core/config.h"
#include "parallel/mesh.h"
#include "model/dit.h"

namespace vidit::demo {

struct DemoReport {
  int correct = 0, total = 0;
  double adherence() const { return total ? double(correct) / total : 0.0; }
  std::vector<double> losses;
  double train_seconds = 0, total_seconds = 0;
};

// Runs everything under cfg.train.out_dir. `resume`: continue from its latest checkpoint.
// `mesh`: the processes of a run under mpirun (every rank trains; rank 0 samples and reports,
// and every rank returns its verdict).
DemoReport run_demo(const Config& cfg, bool resume, std::shared_ptr<const Mesh> mesh = nullptr);

// Generates one clip per caption with the Euler sampler (cfg.sample) and decodes it with the
// demo codec: returns frames [T, H, W, 3] uint8 per caption.
std::vector<at::Tensor> sample_captions(DiT& model, const Config& cfg,
                                        const std::vector<std::string>& captions, uint64_t seed);

}  // namespace vidit::demo
