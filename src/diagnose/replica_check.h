// Silent data corruption between replicas. Ranks that differ only in their replicate, ring or
// ulysses coordinate hold the same weights (the same shard of them, under FSDP or tensor
// parallel) and take the same update, so their weights must be equal bit for bit. A bit that
// flips in one GPU's memory, or an update computed wrongly on one rank, makes that replica
// drift away from the others while the loss looks fine.
//
// weights_fingerprint() reduces a rank's weights to 64 bits where they are (on the GPU: no copy
// to the host): each tensor's raw words summed as integers, which is exact and independent of
// the order of the sum, so equal weights give equal fingerprints on every device, and any one
// flipped bit changes it. check_replicas() gathers every rank's fingerprint (one all-gather of
// 32 bytes per rank) and, in each group of replicas, names the ranks that disagree with the
// majority; with two replicas there is no majority and both are named.
//
// The trainer checks every train.replica_check_every steps and before every save, so a
// checkpoint is never written from replicas that disagree (trainer.cpp).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/safetensors.h"
#include "parallel/mesh.h"

namespace vidit {

// The exit status of `vidit train` when replicas disagree: the launcher ends the job, and a
// restart (on other hardware) resumes from the last checkpoint, checked when it was written.
inline constexpr int kCorruptionStatus = 87;

// Thrown on every rank at once (every rank computes the same verdict).
// `report`: this rank prints it (rank 0; the others end quietly with the same status).
class ReplicasDiverged : public Error {
 public:
  ReplicasDiverged(const std::string& what, bool report) : Error(what), report(report) {}
  bool report;
};

// Over every tensor of every map, in order.
uint64_t weights_fingerprint(const std::vector<const TensorMap*>& maps);

struct ReplicaVerdict {
  bool consistent = true;
  std::vector<int> suspects;  // ranks that disagree with their group's majority (all of a tie)
  std::string message;        // for the console: which ranks on which hosts, and what to do
  nlohmann::json detail;      // for events.jsonl: each group's ranks and fingerprints
};

// Collective over the mesh's world. `hosts`: gather_hosts() (diagnose/rank_hosts.h).
ReplicaVerdict check_replicas(const Mesh& mesh, const std::vector<const TensorMap*>& state, const std::vector<std::string>& hosts,
                              int64_t step);

}  // namespace vidit
