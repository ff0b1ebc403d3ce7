#include "compute/conv/cuda/cudnn_check.hpp"

#include <gpucloud/runtime/error.hpp>

#include <string>

namespace gpucloud::detail {

void check_cudnn(cudnnStatus_t status, const char* call, const char* file, int line) {
  if (status == CUDNN_STATUS_SUCCESS) return;
  std::string reason = cudnnGetErrorString(status);
  char last[512] = {};
  cudnnGetLastErrorString(last, sizeof last);
  if (last[0] != '\0') reason += ": " + std::string(last);
  const int code = static_cast<int>(status);
  if (code == CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED ||
      code == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED) {
    throw OutOfMemory(call, reason, 0, file, line);
  }
  switch (code / 1000) {
    case 2:
      throw InvalidArgument(call, reason, file, line);
    case 3:
      throw Unsupported(call, reason, file, line);
    default:
      throw DeviceError(call, reason, false, file, line);
  }
}

}  // namespace gpucloud::detail
