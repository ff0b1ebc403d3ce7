/// @file mpi_interop.hpp
/// @brief Communicators from the caller's own MPI communicators (includes <mpi.h>; the rest of
///        gpucloud's headers do not).
#pragma once

#include <gpucloud/comm/communicator.hpp>

#include <mpi.h>

namespace gpucloud {

/// @brief A gpucloud Communicator over the processes of @p comm (duplicated; yours stays yours).
inline Communicator communicator_from_mpi(MPI_Comm comm) {
  return Communicator::mpi(static_cast<std::int64_t>(MPI_Comm_c2f(comm)));
}

}  // namespace gpucloud
