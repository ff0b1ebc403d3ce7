// Internal: checks for CUDA runtime return codes, and DeviceGuard (not API). cuBLAS/cuBLASLt's are
// in compute/gemm/cuda/library_check.hpp, cuDNN's in compute/conv/cuda/cudnn_check.hpp, NCCL's in
// comm/nccl/nccl_check.hpp, MPI's in comm/mpi/mpi_check.hpp.
//
// Throwing checks turn a failure into a typed gpucloud error naming the call, file:line, the
// error's name and string; the no-throw variant (for destructors) reports to stderr and
// tolerates the runtime being unloaded at process exit.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace gpucloud::detail {

/// Throws for @p status != cudaSuccess: OutOfMemory for allocation failures, DeviceError
/// (sticky or not) otherwise. Clears a non-sticky error from the runtime's last-error slot.
void check_cuda(cudaError_t status, const char* call, const char* file, int line, std::size_t bytes = 0);
/// Reports @p status != cudaSuccess to stderr; never throws.
void check_cuda_nothrow(cudaError_t status, const char* call, const char* file, int line) noexcept;
/// True for errors after which the CUDA context is unusable.
bool is_sticky(cudaError_t status) noexcept;

/// Makes @p device current for the guard's lifetime.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
  int device_;
};

}  // namespace gpucloud::detail

#define GPUCLOUD_CUDA_CHECK(call) ::gpucloud::detail::check_cuda((call), #call, __FILE__, __LINE__)
#define GPUCLOUD_CUDA_CHECK_ALLOC(call, bytes) \
  ::gpucloud::detail::check_cuda((call), #call, __FILE__, __LINE__, (bytes))
#define GPUCLOUD_CUDA_CHECK_NOTHROW(call) ::gpucloud::detail::check_cuda_nothrow((call), #call, __FILE__, __LINE__)
