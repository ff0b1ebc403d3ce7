// Internal: checks for cuBLAS / cuBLASLt return codes (not API). NCCL's: comm/nccl/nccl_check.hpp.
#pragma once

#include <cublas_api.h>

namespace gpucloud::detail {

/// Throws for @p status != CUBLAS_STATUS_SUCCESS: OutOfMemory for CUBLAS_STATUS_ALLOC_FAILED,
/// Unsupported for CUBLAS_STATUS_NOT_SUPPORTED / ARCH_MISMATCH, InvalidArgument for
/// CUBLAS_STATUS_INVALID_VALUE, DeviceError otherwise.
void check_cublas(cublasStatus_t status, const char* call, const char* file, int line);

}  // namespace gpucloud::detail

#define GPUCLOUD_CUBLAS_CHECK(call) ::gpucloud::detail::check_cublas((call), #call, __FILE__, __LINE__)
