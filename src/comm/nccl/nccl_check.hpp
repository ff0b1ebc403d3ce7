// Internal: the check for NCCL return codes (builds with NCCL only) (not API).
#pragma once

#include <nccl.h>

namespace gpucloud::detail {

/// Throws CommunicationError for @p result != ncclSuccess (InvalidArgument for ncclInvalidArgument
/// and ncclInvalidUsage), with NCCL's string and its last error message.
void check_nccl(ncclResult_t result, const char* call, const char* file, int line);

}  // namespace gpucloud::detail

#define GPUCLOUD_NCCL_CHECK(call) ::gpucloud::detail::check_nccl((call), #call, __FILE__, __LINE__)
