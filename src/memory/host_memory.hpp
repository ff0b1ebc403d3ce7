// Internal: aligned host allocation with typed out-of-memory errors (not API).
#pragma once

#include <gpucloud/memory/memory_resource.hpp>

#include <cstddef>
#include <functional>
#include <optional>
#include <string>

namespace gpucloud::detail {

/// 256-byte aligned host memory for a buffer of @p kind on the host device.
/// @throws OutOfMemory naming bytes, kind and free/total host memory.
void* host_allocate(std::size_t bytes, MemoryKind kind);
void host_deallocate(void* p) noexcept;

/// Bytes as "N bytes (X.Y GiB)".
std::string describe_bytes(std::size_t bytes);

/// Runs @p free_fn once the work enqueued on @p stream so far has finished (without a stream: on
/// every host stream, as cudaFree waits for the device); falls back to synchronising the stream if
/// it cannot enqueue. Never throws.
void release_after(std::optional<StreamView> stream, std::function<void()> free_fn) noexcept;

}  // namespace gpucloud::detail
