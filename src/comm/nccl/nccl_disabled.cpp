// Communicator's NCCL entry points in builds without NCCL (no CUDA, or no NCCL found): a clear
// Unsupported; comm_group() is then a plain call (MPI collectives need no grouping).
#include <gpucloud/runtime/error.hpp>

#include "comm/nccl/nccl_communicator.hpp"

namespace gpucloud {

namespace {
[[noreturn]] void no_nccl(const char* call) {
  GPUCLOUD_FAIL(Unsupported, call,
                "gpucloud was built without NCCL (no CUDA toolkit, GPUCLOUD_CUDA=OFF, or no NCCL found: see "
                "GPUCLOUD_NCCL_LIBRARY in docs/building.md)");
}
}  // namespace

namespace detail {
std::unique_ptr<Communicator::Impl> make_nccl_communicator(const NcclUniqueId&, int, int, Device) {
  no_nccl("Communicator::nccl");
}
}  // namespace detail

NcclUniqueId Communicator::nccl_unique_id() { no_nccl("Communicator::nccl_unique_id"); }
Communicator Communicator::nccl(const NcclUniqueId&, int, int, Device) { no_nccl("Communicator::nccl"); }
std::vector<Communicator> Communicator::nccl_single_process(const std::vector<Device>&) {
  no_nccl("Communicator::nccl_single_process");
}
void comm_group(const std::function<void()>& issue) { issue(); }

}  // namespace gpucloud
