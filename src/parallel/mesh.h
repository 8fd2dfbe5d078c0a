// The device mesh: the processes of a run arranged as replicate x shard x ring x ulysses x tensor
// (parallel.* in the config; the product is the number of processes). Ranks are laid out
// row-major in that order, tensor varying fastest: tensor parallel exchanges activations in every
// layer, so its members are neighbours (the same node); replicas talk least and are farthest apart.
//
// Every member holds a sub-communicator per named group (made with Comm::split in one fixed
// order, so construction is collective): one per dimension ("replicate", "shard", "tensor",
// "ulysses", "ring") and three composites, "dp" (replicate x shard: who hold different samples),
// "sp" (ring x ulysses: who split a sample's tokens) and "dpsp" (both: who reduce gradients).
//
// The world communicator is wrapped in a TimedComm (parallel/timed_comm.h), so every group reports
// how long its callers waited and, by its name, what it moved: comm_times(). Members of one group
// share its instance() number (a group of each kind per instance: the "shard" groups of two
// replicas are instances 0 and 1), which is how the slow one among them is named.
//
// validate_mesh() refuses a mesh that cannot train this config before any work starts, with a
// message naming the keys to change.
#pragma once
#include <array>
#include <map>
#include <memory>
#include <string>

#include "core/config.h"
#include "parallel/comm.h"
#include "parallel/timed_comm.h"

namespace vidit {

// The mesh dimensions, slowest-varying first.
inline constexpr std::array<const char*, 5> kMeshDims = {"replicate", "shard", "ring", "ulysses", "tensor"};

// Throws vidit::Error when cfg.parallel does not fit `world` processes or the model / data shapes.
void validate_mesh(const Config& cfg, int world);

class Mesh {
 public:
  // Collective over `world`; validates first (validate_mesh).
  Mesh(const Config& cfg, std::shared_ptr<Comm> world);

  int rank() const { return world_->rank(); }
  int size() const { return world_->size(); }
  // Degree of a dimension ("replicate", ..., or "dp", "sp") and this rank's coordinate along it.
  int degree(const std::string& group) const;
  int coord(const std::string& group) const;
  // The named sub-communicator; throws for an unknown name (listing the known ones).
  const std::shared_ptr<Comm>& group(const std::string& name) const;
  const std::shared_ptr<Comm>& world() const { return world_; }
  // Which of the groups of this kind this member belongs to (the same on all its members).
  int instance(const std::string& group) const;
  // Time blocked in collectives on this member, over every group, since construction.
  CommTimes comm_times() const { return timed_->times(); }
  double take_gpu_stall_s() const { return timed_->take_gpu_stall_s(); }  // TimedComm::take_gpu_stall_s
  // Collectives entered by this member so far (any thread may ask).
  int64_t collectives_issued() const { return timed_->issued(); }
  // How long the collective this member waits in now has lasted (0: none).
  double blocked_s() const { return timed_->blocked_s(); }

 private:
  std::shared_ptr<Comm> world_;
  TimedComm* timed_ = nullptr;  // world_ itself
  std::array<int, 5> degrees_{}, coords_{};
  std::map<std::string, std::shared_ptr<Comm>> groups_;
  std::map<std::string, int> instances_;
};

// The groups every mesh has, in the order they are made.
inline constexpr std::array<const char*, 8> kMeshGroups = {"replicate", "shard", "ring", "ulysses",
                                                           "tensor", "dp", "sp", "dpsp"};

}  // namespace vidit
