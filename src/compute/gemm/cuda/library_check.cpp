#include "compute/gemm/cuda/library_check.hpp"

#include <cublasLt.h>

#include <gpucloud/runtime/error.hpp>

#include <string>

namespace gpucloud::detail {

void check_cublas(cublasStatus_t status, const char* call, const char* file, int line) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  const std::string reason = std::string(cublasLtGetStatusName(status)) + ": " + cublasLtGetStatusString(status);
  switch (status) {
    case CUBLAS_STATUS_ALLOC_FAILED:
      throw OutOfMemory(call, reason, 0, file, line);
    case CUBLAS_STATUS_NOT_SUPPORTED:
    case CUBLAS_STATUS_ARCH_MISMATCH:
      throw Unsupported(call, reason, file, line);
    case CUBLAS_STATUS_INVALID_VALUE:
      throw InvalidArgument(call, reason, file, line);
    default:
      throw DeviceError(call, reason, false, file, line);
  }
}

}  // namespace gpucloud::detail
