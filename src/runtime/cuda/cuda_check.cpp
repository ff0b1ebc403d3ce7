#include "runtime/cuda/cuda_check.hpp"

#include <gpucloud/runtime/error.hpp>

#include <cstdio>
#include <string>

namespace gpucloud::detail {

bool is_sticky(cudaError_t status) noexcept {
  switch (status) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorAssert:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorLaunchTimeout:
    case cudaErrorECCUncorrectable:
    case cudaErrorContextIsDestroyed:
    // driver_types.h: "the process must be terminated and relaunched" / "an inconsistent state"
    case cudaErrorContained:
    case cudaErrorNvlinkUncorrectable:
    case cudaErrorMpsClientTerminated:
    case cudaErrorTensorMemoryLeak:
    case cudaErrorExternalDevice:
      return true;
    default:
      return false;
  }
}

void check_cuda(cudaError_t status, const char* call, const char* file, int line, std::size_t bytes) {
  if (status == cudaSuccess) return;
  const bool sticky = is_sticky(status);
  if (!sticky) (void)cudaGetLastError();  // clear the non-sticky error so later calls are clean
  std::string reason = std::string(cudaGetErrorName(status)) + ": " + cudaGetErrorString(status);
  if (status == cudaErrorMemoryAllocation) {
    if (bytes != 0) reason += " (requested " + std::to_string(bytes) + " bytes)";
    throw OutOfMemory(call, reason + "; recoverable", bytes, file, line);
  }
  reason += sticky ? "; sticky: the CUDA context is lost and the process must restart"
                   : "; not sticky: the device remains usable";
  throw DeviceError(call, reason, sticky, file, line);
}

void check_cuda_nothrow(cudaError_t status, const char* call, const char* file, int line) noexcept {
  if (status == cudaSuccess || status == cudaErrorCudartUnloading) return;
  (void)cudaGetLastError();
  std::fprintf(stderr, "gpucloud: %s failed: %s: %s (%s:%d)\n", call, cudaGetErrorName(status),
               cudaGetErrorString(status), file, line);
}

DeviceGuard::DeviceGuard(int device) : device_(device) {
  GPUCLOUD_CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ != device_) GPUCLOUD_CUDA_CHECK(cudaSetDevice(device_));
}

DeviceGuard::~DeviceGuard() {
  if (previous_ >= 0 && previous_ != device_) GPUCLOUD_CUDA_CHECK_NOTHROW(cudaSetDevice(previous_));
}

}  // namespace gpucloud::detail
