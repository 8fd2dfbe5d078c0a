// The MPI communicator's entry points (comm_mpi.cpp; only in builds with VIDIT_HAVE_MPI).
// Callers use make_world_comm() and abort_world() from comm.h instead.
#pragma once
#include <memory>

#include "dist/comm.h"

namespace vidit {

// Initialises MPI once per process (MPI_Finalize runs at exit) and returns MPI_COMM_WORLD.
std::shared_ptr<Comm> make_mpi_world_comm();
// MPI_Abort(MPI_COMM_WORLD, code) when MPI is initialised with more than one process.
void mpi_abort(int code);

}  // namespace vidit
