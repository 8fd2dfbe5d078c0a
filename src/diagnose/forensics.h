// The report of a flagged step (diagnose/spike_detector.h): <out_dir>/forensics/step_N.json,
// written by rank 0 once the step's samples were gathered from every data-parallel rank. It
// holds every sample of the step with who it is (its cache key, source file, clip range and
// bucket, or its dataset index), the rank that had it, its σ, its own loss, its σ bin's
// baseline and its z, sorted by z, the highest first; the samples whose own z exceeds the
// threshold are listed as blamed. `vidit doctor` reads these files.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "diagnose/spike_detector.h"

namespace vidit {

struct StepSample {
  nlohmann::json id;  // MicroBatch::ids (null when the source gave none)
  int rank = 0;
  double sigma = 0, loss = 0;
};

// Returns the file written.
std::string write_forensics(const std::string& out_dir, int64_t step, const SpikeVerdict& v,
                            const std::vector<StepSample>& samples, double grad_norm, double z_threshold,
                            const std::string& action, const std::vector<std::string>& hosts);

// The blamed samples' ids, for the console: "source (key) on rank R" per sample.
std::string describe_blamed(const nlohmann::json& report);

}  // namespace vidit
