/// @file memory_resource.hpp
/// @brief Memory kinds and the stream-ordered memory-resource interface (RMM style).
#pragma once

#include <gpucloud/export.hpp>
#include <gpucloud/runtime/device.hpp>
#include <gpucloud/runtime/stream.hpp>

#include <cstddef>
#include <optional>

namespace gpucloud {

/// @brief Where the bytes of a buffer live.
enum class MemoryKind {
  host,     ///< pageable host memory
  pinned,   ///< page-locked host memory a GPU can DMA (plain host memory without a GPU)
  device,   ///< memory of the buffer's device (host memory for the host device)
  managed,  ///< unified memory, migrating between host and GPU (host memory on the host device)
};

/// @brief "host", "pinned", "device" or "managed".
GPUCLOUD_API const char* memory_kind_name(MemoryKind kind) noexcept;

/// @brief Where a pointer's memory lives, as the CUDA driver sees it.
struct PointerInfo {
  Device device = Device::host();      ///< owning device (the host for host and pinned memory)
  MemoryKind kind = MemoryKind::host;  ///< host (pageable or unknown), pinned, device or managed
};

/// @brief Device and kind of the memory at @p ptr (cudaPointerGetAttributes); host when unknown.
///
/// Lets a wrapper of memory owned elsewhere (a NumPy array, a tensor) build a correct BufferView.
GPUCLOUD_API PointerInfo pointer_info(const void* ptr);

/// @brief Every allocation is aligned to at least this many bytes.
inline constexpr std::size_t kAllocationAlignment = 256;

/// @brief Allocates memory of one kind on one device; optionally stream-ordered.
///
/// allocate(bytes, stream) returns memory usable by work enqueued on @p stream from now on;
/// deallocate(p, bytes, stream) lets the memory be reused once the work enqueued on @p stream so
/// far has finished. Without a stream both are immediate. Zero bytes give nullptr.
class GPUCLOUD_API MemoryResource {
 public:
  virtual ~MemoryResource() = default;
  MemoryResource(const MemoryResource&) = delete;
  MemoryResource& operator=(const MemoryResource&) = delete;

  /// @brief Allocates @p bytes. @throws OutOfMemory (naming bytes, kind, device, free/total),
  ///        InvalidArgument for sizes beyond any memory or a stream on the wrong device.
  void* allocate(std::size_t bytes, std::optional<StreamView> stream = std::nullopt);
  /// @brief Returns @p p (from allocate with the same @p bytes); never throws.
  void deallocate(void* p, std::size_t bytes, std::optional<StreamView> stream = std::nullopt) noexcept;

  /// @brief Kind of memory handed out.
  MemoryKind kind() const noexcept { return kind_; }
  /// @brief Device the memory belongs to.
  Device device() const noexcept { return device_; }

 protected:
  /// @brief Sets the kind and device this resource serves.
  MemoryResource(MemoryKind kind, Device device) noexcept : kind_(kind), device_(device) {}
  /// @brief Allocates @p bytes > 0 (validated); must honour kAllocationAlignment.
  virtual void* do_allocate(std::size_t bytes, std::optional<StreamView> stream) = 0;
  /// @brief Frees @p p != nullptr; must not throw.
  virtual void do_deallocate(void* p, std::size_t bytes, std::optional<StreamView> stream) noexcept = 0;

 private:
  MemoryKind kind_;
  Device device_;
};

/// @brief The resource buffers of @p kind on @p device use when none is given.
///
/// Initially a PlainResource; pinned and host memory belong to Device::host().
/// @throws InvalidArgument for host/pinned memory on a CUDA device.
GPUCLOUD_API MemoryResource& default_resource(MemoryKind kind, Device device);

/// @brief Replaces the default resource for (@p kind, @p device); returns the previous one.
///
/// @p mr must serve that kind and device and outlive its use; nullptr restores the built-in one.
GPUCLOUD_API MemoryResource* set_default_resource(MemoryKind kind, Device device, MemoryResource* mr);

}  // namespace gpucloud
