// The communicator over PyTorch's c10d process groups, for processes started by torchrun (or any
// launcher that sets RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT): a c10d::TCPStore on rank 0
// at MASTER_ADDR:MASTER_PORT is the control plane (every member connects to it; process groups
// exchange their addresses, and NCCL its unique id, through it), and the collectives run on
//  - "gloo": ProcessGroupGloo, CPU tensors (network interface: GLOO_SOCKET_IFNAME, else the
//    host name's address, else loopback);
//  - "nccl": ProcessGroupNCCL, CUDA tensors (built only against a CUDA torch).
// Sub-communicators (split) are new process groups of the same engine over a PrefixStore of the
// same TCPStore. bf16 / fp16 tensors are reduced in an fp32 copy and Avg is a sum divided by the
// size, as in the MPI engine, so every engine gives the same numbers.
//
// A member that dies makes the others' next collective fail with an error (the connection
// closes; otherwise the collective times out after VIDIT_COMM_TIMEOUT_S seconds, 600 by default),
// which ends the process; torchrun then stops the rest of the job.
#pragma once
#include <chrono>
#include <memory>
#include <string>

#include "parallel/comm.h"

namespace vidit {

// True when this build has the engine ("gloo" or "nccl").
bool have_c10d_engine(const std::string& engine);

// The world communicator of `env` over `engine`; collective over the world (everyone connects to
// the store). `timeout`: how long a collective or the rendezvous may wait for a member. `gpu`:
// this process's GPU, where NCCL's own small tensors (barriers, splits) go.
std::shared_ptr<Comm> make_c10d_world_comm(const LaunchEnv& env, const std::string& engine,
                                           std::chrono::milliseconds timeout, at::Device gpu);

}  // namespace vidit
