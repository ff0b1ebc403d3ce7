#include "comm/mpi/mpi_check.hpp"

#include <gpucloud/runtime/error.hpp>

#include <string>

namespace gpucloud::detail {

void check_mpi(int code, const char* call, const char* file, int line) {
  if (code == MPI_SUCCESS) return;
  std::string reason = "MPI error " + std::to_string(code);
  // OpenMPI aborts the process if its error strings are asked for outside MPI_Init..Finalize.
  int initialized = 0, finalized = 0;
  (void)MPI_Initialized(&initialized);
  (void)MPI_Finalized(&finalized);
  if (initialized && !finalized) {
    char text[MPI_MAX_ERROR_STRING] = {};
    int length = 0;
    if (MPI_Error_string(code, text, &length) == MPI_SUCCESS && length > 0) {
      reason += ": " + std::string(text, static_cast<std::size_t>(length));
    }
  } else {
    reason += " (MPI is not initialised: no error string)";
  }
  throw CommunicationError(call, reason, file, line);
}

}  // namespace gpucloud::detail
