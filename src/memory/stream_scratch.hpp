// Internal: the temporaries of one call (partial sums, coefficients), released in the stream's
// order without synchronising anything: CUDA's stream-ordered pool on a GPU (a cudaFree there
// would wait for the whole device, a hidden synchronisation per call), host memory handed back
// once the stream has passed on the host (not API).
#pragma once

#include <gpucloud/memory/buffer.hpp>
#include <gpucloud/runtime/stream.hpp>

#include "runtime/cuda/cuda_backend.hpp"

#include <cstddef>
#include <optional>

namespace gpucloud::detail {

class StreamScratch {
 public:
  /// @p count floats (at least one) usable by work enqueued on @p stream from now on.
  StreamScratch(std::size_t count, StreamView stream) {
    const std::size_t n = count > 0 ? count : 1;
    if (stream.device().is_cuda()) {
      gpu_.emplace(n * sizeof(float), stream.device().index(), *stream.impl());
    } else {
      host_ = Buffer(n, DType::float32, stream.device(), MemoryKind::device, stream);
    }
  }
  /// The floats.
  float* get() const { return gpu_ ? static_cast<float*>(gpu_->get()) : host_.data_as<float>(); }

 private:
  std::optional<cuda::AsyncScratch> gpu_;
  Buffer host_;
};

}  // namespace gpucloud::detail
