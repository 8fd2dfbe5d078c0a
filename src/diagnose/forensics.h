// The report of a flagged step (diagnose/spike_detector.h): <out_dir>/forensics/step_N.json,
// written by rank 0 once the step's samples were gathered from every data-parallel rank. It
// holds every sample of the step with who it is (its cache key, source file, clip range and
// bucket, or its dataset index), the rank that had it, its σ, its own loss, its σ bin's
// baseline and its z, sorted by z, the highest first; the samples whose own z exceeds the
// threshold are listed as blamed. With train.spike_rerun each sample also has its loss when the
// step's forward passes were re-run on the same ranks, and the report says whether the spike was
// the data's (it reproduced) or the device's (it did not). `vidit doctor` reads these files.
#pragma once
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "diagnose/spike_detector.h"

namespace vidit {

struct StepSample {
  nlohmann::json id;  // MicroBatch::ids (null when the source gave none)
  int rank = 0;
  double sigma = 0, loss = 0;
  double rerun_loss = std::numeric_limits<double>::quiet_NaN();  // its loss when the step was re-run (NaN: not re-run)
};

// The samples to blame: those whose own z exceeds the threshold (or whose loss is not finite).
std::vector<size_t> blamed_samples(const SpikeVerdict& v, const std::vector<StepSample>& samples, double z_threshold);

// Whether a re-run reproduced a sample's loss (to 1e-3 of it: bitwise on the CPU, a GPU's
// reductions may reorder).
bool reproduced(const StepSample& s);

// Returns the file written. `extra` is merged into the report: the cause ("data", "device" or
// "unknown") with what the re-run found, the parts of the model whose gradient norms jumped
// ("parts"), the samples quarantined.
std::string write_forensics(const std::string& out_dir, int64_t step, const SpikeVerdict& v,
                            const std::vector<StepSample>& samples, double grad_norm, double z_threshold,
                            const std::string& action, const std::vector<std::string>& hosts,
                            const nlohmann::json& extra = nlohmann::json::object());

// The blamed samples' ids, for the console: "source (key) on rank R" per sample.
std::string describe_blamed(const nlohmann::json& report);

}  // namespace vidit
