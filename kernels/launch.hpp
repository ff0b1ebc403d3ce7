// Launch geometry shared by the CUDA kernels and their host loops.
//
// A kernel body takes its block and thread index explicitly. On the GPU a thin __global__
// wrapper passes blockIdx/threadIdx; on the host, host_launch() walks the very same grid, so
// the indexing code that runs on the GPU is executed and tested on a CPU.
#pragma once

#include <gpucloud/detail/hd.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace gpucloud::kernels {

/// Grid shape: blocks of threads, one dimension.
struct Grid {
  std::uint32_t blocks;
  std::uint32_t threads;
};

/// Position of one thread in the grid.
struct ThreadIndex {
  std::uint32_t block;
  std::uint32_t thread;
};

/// Global linear index of @p t.
GPUCLOUD_HD inline std::size_t global_index(ThreadIndex t, Grid g) {
  return static_cast<std::size_t>(t.block) * g.threads + t.thread;
}

/// Total threads in @p g (the grid-stride step).
GPUCLOUD_HD inline std::size_t grid_size(Grid g) { return static_cast<std::size_t>(g.blocks) * g.threads; }

/// A grid-stride grid for @p n elements: 256 threads, at most @p max_blocks blocks, at least one.
inline Grid elementwise_grid(std::size_t n, std::uint32_t max_blocks = 4096) {
  constexpr std::uint32_t threads = 256;
  const std::size_t wanted = (n + threads - 1) / threads;
  return Grid{static_cast<std::uint32_t>(std::max<std::size_t>(1, std::min<std::size_t>(wanted, max_blocks))), threads};
}

/// Runs @p body for every thread of @p grid, block by block, on the calling thread.
template <class Body>
void host_launch(Grid grid, const Body& body) {
  for (std::uint32_t b = 0; b < grid.blocks; ++b) {
    for (std::uint32_t t = 0; t < grid.threads; ++t) body(ThreadIndex{b, t}, grid);
  }
}

}  // namespace gpucloud::kernels
