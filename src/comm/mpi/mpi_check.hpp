// Internal: checks for MPI return codes (not API).
#pragma once

#include <mpi.h>

namespace gpucloud::detail {

/// Throws CommunicationError for @p code != MPI_SUCCESS, with MPI's error class and string.
void check_mpi(int code, const char* call, const char* file, int line);

}  // namespace gpucloud::detail

#define GPUCLOUD_MPI_CHECK(call) ::gpucloud::detail::check_mpi((call), #call, __FILE__, __LINE__)
