// Internal: the scratch of one library call (cuBLASLt/cuDNN workspaces, partial sums, padded
// shards), usable by work enqueued on a stream from now on and released in that stream's order
// without synchronising anything (not API).
//
// Drawn from the user's default device resource for the stream's device when one is set
// (set_default_resource), so statistics and limiting adaptors see library scratch too, as RMM's
// current device resource does. Otherwise CUDA's stream-ordered pool on a GPU (a cudaFree would
// wait for the whole device: a hidden synchronisation per call) and the built-in resource on the
// host. Either way it counts under the device's memory quota.
#pragma once

#include <gpucloud/memory/buffer.hpp>
#include <gpucloud/runtime/stream.hpp>

#include "memory/cuda/memory_backend.hpp"
#include "memory/quota_ledger.hpp"

#include <cstddef>
#include <optional>

namespace gpucloud::detail {

/// The resource set_default_resource() installed for (kind, device), or nullptr for the built-in.
MemoryResource* user_default_resource(MemoryKind kind, Device device);

/// The built-in resource for (kind, device), never destroyed: for the small buffers a library
/// object keeps for its whole life (allocated on first use), which must not point to a user's
/// resource that may be gone before the object is (a statistics adaptor local to main).
MemoryResource& builtin_resource(MemoryKind kind, Device device);

class Workspace {
 public:
  /// @p bytes (none: get() is nullptr) for work enqueued on @p stream from now on.
  Workspace(std::size_t bytes, StreamView stream) {
    if (bytes == 0) return;
    const Device d = stream.device();
    if (MemoryResource* user = user_default_resource(MemoryKind::device, d)) {
      buffer_ = Buffer(bytes, DType::uint8, d, MemoryKind::device, stream, *user);
    } else if (d.is_cuda()) {
      held_.emplace(d, MemoryKind::device, bytes);  // under the device's memory quota
      gpu_.emplace(bytes, d.index(), *stream.impl());
    } else {
      buffer_ = Buffer(bytes, DType::uint8, d, MemoryKind::device, stream);
    }
  }
  /// @p count floats (at least one).
  static Workspace floats(std::size_t count, StreamView stream) {
    return Workspace((count > 0 ? count : 1) * sizeof(float), stream);
  }
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  /// The memory.
  void* get() const noexcept { return gpu_ ? gpu_->get() : buffer_.data(); }
  /// The memory as floats.
  float* as_floats() const noexcept { return static_cast<float*>(get()); }

 private:
  std::optional<QuotaHold> held_;  // given back after gpu_'s memory
  std::optional<cuda::AsyncScratch> gpu_;
  Buffer buffer_;
};

}  // namespace gpucloud::detail
