// Internal: checks for cuBLAS / cuBLASLt and NCCL return codes (not API).
#pragma once

#include <cublas_api.h>
#include <nccl.h>

namespace gpucloud::detail {

/// Throws for @p status != CUBLAS_STATUS_SUCCESS: OutOfMemory for CUBLAS_STATUS_ALLOC_FAILED,
/// Unsupported for CUBLAS_STATUS_NOT_SUPPORTED / ARCH_MISMATCH, InvalidArgument for
/// CUBLAS_STATUS_INVALID_VALUE, DeviceError otherwise.
void check_cublas(cublasStatus_t status, const char* call, const char* file, int line);
/// Throws CommunicationError for @p result != ncclSuccess (InvalidArgument for ncclInvalidArgument
/// and ncclInvalidUsage), with NCCL's string and its last error message.
void check_nccl(ncclResult_t result, const char* call, const char* file, int line);

}  // namespace gpucloud::detail

#define GPUCLOUD_CUBLAS_CHECK(call) ::gpucloud::detail::check_cublas((call), #call, __FILE__, __LINE__)
#define GPUCLOUD_NCCL_CHECK(call) ::gpucloud::detail::check_nccl((call), #call, __FILE__, __LINE__)
