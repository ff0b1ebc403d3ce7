// Internal: building NCCL communicators (src/comm/nccl/nccl_communicator.cpp, or src/comm/nccl/nccl_disabled.cpp
// in builds without CUDA). Not API.
#pragma once

#include "comm/communicator_impl.hpp"

#include <memory>

namespace gpucloud::detail {

/// Rank @p rank of @p size on @p device joined through @p id; nodes from the ranks' host names
/// (or GPUCLOUD_LOCAL_SIZE's blocks). A collective over the @p size ranks.
std::unique_ptr<Communicator::Impl> make_nccl_communicator(const NcclUniqueId& id, int rank, int size, Device device);

}  // namespace gpucloud::detail
