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
#include <cstdlib>
#include <cstring>

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

/// True when the host backend walks the GPU's own grid shapes (GPUCLOUD_HOST_GPU_GRID=1, read once:
/// CTest runs the kernel tests so, to execute the GPU's thread indexing). By default it walks one
/// thread per block: the bodies are grid-stride loops, correct for any block size, and one thread
/// visits its range in memory order, as a CPU wants (a GPU-shaped walk strides across it).
inline bool host_walks_gpu_grid() {
  static const bool on = [] {
    const char* v = std::getenv("GPUCLOUD_HOST_GPU_GRID");
    return v != nullptr && std::strcmp(v, "1") == 0;
  }();
  return on;
}

/// The grid the host walks for a grid-stride kernel over one range launched as @p gpu: a single
/// thread over the whole range, or @p gpu itself (host_walks_gpu_grid()).
inline Grid host_range_grid(Grid gpu) { return host_walks_gpu_grid() ? gpu : Grid{1, 1}; }

/// The grid the host walks for a kernel whose blocks own separate ranges (multi-tensor chunks)
/// launched as @p gpu: the same blocks, one thread each, or @p gpu itself (host_walks_gpu_grid()).
inline Grid host_block_grid(Grid gpu) { return host_walks_gpu_grid() ? gpu : Grid{gpu.blocks, 1}; }

/// Runs @p body for every thread of @p grid, block by block, on the calling thread.
template <class Body>
void host_launch(Grid grid, const Body& body) {
  for (std::uint32_t b = 0; b < grid.blocks; ++b) {
    for (std::uint32_t t = 0; t < grid.threads; ++t) body(ThreadIndex{b, t}, grid);
  }
}

}  // namespace gpucloud::kernels
