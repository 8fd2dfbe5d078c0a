// The MPI communicator's entry points (comm_mpi.cpp; only in builds with VIDIT_HAVE_MPI).
// Callers use make_world_comm() and abort_world() from comm.h instead.
#pragma once
#include <chrono>
#include <memory>

#include "parallel/comm.h"

namespace vidit {

// Initialises MPI once per process (MPI_Finalize runs at exit) and returns MPI_COMM_WORLD. A
// wait on it, or on a communicator split from it, throws after `timeout` without completion.
std::shared_ptr<Comm> make_mpi_world_comm(std::chrono::milliseconds timeout);
// MPI_Abort(MPI_COMM_WORLD, code) when MPI is initialised with more than one process.
void mpi_abort(int code);

}  // namespace vidit
