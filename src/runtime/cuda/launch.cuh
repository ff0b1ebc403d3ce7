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

constexpr unsigned kSumThreads = 256;

// One block: each thread sums a stride of the partials in double, then a tree in shared memory;
// thread 0 hands the total to fn.
template <class Fn>
__global__ void __launch_bounds__(kSumThreads) sum_then_kernel(const float* partials, std::int64_t count, Fn fn) {
  __shared__ double sums[kSumThreads];
  double sum = 0.0;
  for (std::int64_t i = threadIdx.x; i < count; i += kSumThreads) sum += partials[i];
  sums[threadIdx.x] = sum;
  __syncthreads();
  for (unsigned half = kSumThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) sums[threadIdx.x] += sums[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) fn(sums[0]);
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

/// The sum of @p count partials (one block of 256 threads, not one thread: tens of thousands of
/// partials would take that thread hundreds of µs), then @p fn(total) on one device thread.
template <class Fn>
void launch_sum_then(const float* partials, std::int64_t count, const Fn& fn, StreamImpl& s) {
  DeviceGuard guard(s.device().index());
  sum_then_kernel<<<1, kSumThreads, 0, native(s)>>>(partials, count, fn);
  GPUCLOUD_CUDA_CHECK(cudaGetLastError());
}

}  // namespace
}  // namespace gpucloud::detail::cuda
