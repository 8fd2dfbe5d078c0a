// `vidit doctor RUN_DIR`: the story of a run, read back from what it left in its out_dir —
// events.jsonl (attempts, skipped updates, spikes, replica divergence, stragglers, failed
// saves), forensics/step_N.json, saves.jsonl, metrics.jsonl and the checkpoints — as a short
// readable report that ends with the hosts worth a look.
#pragma once
#include <string>

namespace vidit {

// Throws vidit::Error when `run_dir` holds nothing a run writes.
std::string doctor_report(const std::string& run_dir);

}  // namespace vidit
