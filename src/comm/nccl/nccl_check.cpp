#include "comm/nccl/nccl_check.hpp"

#include <gpucloud/runtime/error.hpp>

#include <string>

namespace gpucloud::detail {

void check_nccl(ncclResult_t result, const char* call, const char* file, int line) {
  if (result == ncclSuccess) return;
  std::string reason = std::string(ncclGetErrorString(result));
  if (const char* last = ncclGetLastError(nullptr); last != nullptr && *last != '\0')
    reason += ": " + std::string(last);
  if (result == ncclInvalidArgument || result == ncclInvalidUsage) throw InvalidArgument(call, reason, file, line);
  throw CommunicationError(call, reason, file, line);
}

}  // namespace gpucloud::detail
