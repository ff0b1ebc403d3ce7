// Communicator's MPI entry points in builds without MPI: a clear Unsupported.
#include <gpucloud/comm/communicator.hpp>
#include <gpucloud/runtime/error.hpp>

#include "comm/communicator_impl.hpp"

#include <cstdlib>

namespace gpucloud {

namespace {
[[noreturn]] void no_mpi(const char* call) {
  GPUCLOUD_FAIL(Unsupported, call, "gpucloud was built without MPI (install libopenmpi-dev)");
}
}  // namespace

Communicator Communicator::mpi_world() { no_mpi("Communicator::mpi_world"); }
Communicator Communicator::mpi(std::int64_t) { no_mpi("Communicator::mpi"); }
Communicator Communicator::nccl_from_mpi(Device) { no_mpi("Communicator::nccl_from_mpi"); }

void detail::abort_job(int code) noexcept { std::_Exit(code); }

}  // namespace gpucloud
