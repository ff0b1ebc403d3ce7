/// @file plain_resource.hpp
/// @brief The non-pooling resource: one system allocation per request.
#pragma once

#include <gpucloud/memory/memory_resource.hpp>

namespace gpucloud {

/// @brief Allocates straight from the system: cudaMalloc / cudaMallocHost / cudaMallocManaged
/// on CUDA, 256-byte aligned host allocations on the host.
///
/// A deallocation with a stream is deferred until the stream's earlier work has finished.
class GPUCLOUD_API PlainResource final : public MemoryResource {
 public:
  /// @brief A resource for @p kind on @p device. @throws InvalidArgument for host/pinned on a GPU.
  PlainResource(MemoryKind kind, Device device);

 private:
  void* do_allocate(std::size_t bytes, std::optional<StreamView> stream) override;
  void do_deallocate(void* p, std::size_t bytes, std::optional<StreamView> stream) noexcept override;
};

}  // namespace gpucloud
