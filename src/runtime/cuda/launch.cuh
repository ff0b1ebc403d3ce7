// The launch machinery every capability's .cu file shares: a body over a grid, and a function on
// one device thread, each launched on a stream's cudaStream_t and its launch error checked.
#pragma once

#include "kernels/launch/body_kernel.cuh"
#include "runtime/cuda/cuda_check.hpp"
#include "runtime/cuda/native_stream.hpp"

#include <cuda_runtime_api.h>

namespace gpucloud::detail::cuda {
namespace {  // internal linkage: safe beside other CUDA libraries in one process

template <class Fn>
__global__ void single_thread_kernel(Fn fn) {
  fn();
}

/// @p body over @p grid on @p s (the host backend walks the same grid with host_launch).
template <class Body>
void launch_body(const Body& body, kernels::Grid grid, StreamImpl& s) {
  DeviceGuard guard(s.device().index());
  kernels::run_body<<<grid.blocks, grid.threads, 0, native(s)>>>(body, grid);
  GPUCLOUD_CUDA_CHECK(cudaGetLastError());
}

/// @p fn() on one device thread, in @p s's order (a scalar update between kernels).
template <class Fn>
void launch_single(const Fn& fn, StreamImpl& s) {
  DeviceGuard guard(s.device().index());
  single_thread_kernel<<<1, 1, 0, native(s)>>>(fn);
  GPUCLOUD_CUDA_CHECK(cudaGetLastError());
}

}  // namespace
}  // namespace gpucloud::detail::cuda
