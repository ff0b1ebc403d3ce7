// comm_group over NCCL: ncclGroupStart / ncclGroupEnd around the caller's collectives, their
// tracking deferred to the group's end, and the non-blocking group end waited out per member.
#include "comm/nccl/nccl_communicator_impl.hpp"

#include "comm/nccl/nccl_check.hpp"
#include "runtime/cuda/cuda_libraries.hpp"

#include <algorithm>
#include <exception>
#include <utility>

namespace gpucloud {
namespace detail {

NcclGroupState& nccl_group() noexcept {
  thread_local NcclGroupState state;
  return state;
}

// This communicator has a call in the open group: its abort waits for the group's end.
void NcclCommunicator::join_group() {
  std::vector<NcclCommunicator*>& members = nccl_group().members;
  if (std::find(members.begin(), members.end(), this) != members.end()) return;
  std::lock_guard<std::mutex> lock(comms->mutex());
  comms->group_opened();
  members.push_back(this);
}

namespace {

// Closes the outermost group: ncclGroupEnd under every member's NCCL lock (taken in one order),
// then each member's communicators waited out against its timeout (non-blocking: the group end
// answers ncclInProgress). Returns the first member's error, after every member is settled.
void end_group(std::vector<NcclCommunicator*> members) {
  std::sort(members.begin(), members.end());
  ncclResult_t result;
  {
    std::vector<std::unique_lock<std::mutex>> locks;
    for (NcclCommunicator* m : members) locks.emplace_back(m->comms->mutex());
    result = ncclGroupEnd();
    for (NcclCommunicator* m : members) m->comms->group_closed();
  }
  if (result != ncclSuccess && result != ncclInProgress) {
    for (NcclCommunicator* m : members)
      m->comms->abort(std::string("ncclGroupEnd failed: ") + ncclGetErrorString(result));
    GPUCLOUD_NCCL_CHECK(result);
  }
  std::exception_ptr first;
  for (NcclCommunicator* m : members) {
    try {
      m->comms->settle("comm_group: ncclGroupEnd");
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

}  // namespace
}  // namespace detail

void comm_group(const std::function<void()>& issue) {
  // Without NCCL no NCCL communicator exists: the group is the plain call (as for MPI alone).
  if (!detail::cuda::available(detail::cuda::Library::nccl)) {
    issue();
    return;
  }
  detail::NcclGroupState& group = detail::nccl_group();
  GPUCLOUD_NCCL_CHECK(ncclGroupStart());
  ++group.depth;
  try {
    issue();
  } catch (...) {
    --group.depth;
    if (group.depth == 0) {
      group.deferred.clear();
      try {
        detail::end_group(std::exchange(group.members, {}));
      } catch (...) {  // the issue's own error is the one to report
      }
    } else {
      ncclGroupEnd();
    }
    throw;
  }
  --group.depth;
  if (group.depth > 0) {
    GPUCLOUD_NCCL_CHECK(ncclGroupEnd());  // nested: NCCL launches at the outermost end
    return;
  }
  std::vector<std::function<void()>> deferred = std::exchange(group.deferred, {});
  detail::end_group(std::exchange(group.members, {}));
  for (auto& track : deferred) track();
}

}  // namespace gpucloud
