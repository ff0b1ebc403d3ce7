/// @file managed_memory.hpp
/// @brief Prefetch and advice for managed (unified) memory.
#pragma once

#include <gpucloud/export.hpp>
#include <gpucloud/memory/buffer.hpp>
#include <gpucloud/runtime/device.hpp>
#include <gpucloud/runtime/stream.hpp>

namespace gpucloud {

/// @brief Hints for managed memory (cudaMemAdvise).
enum class MemoryAdvice {
  read_mostly,               ///< mostly read: devices may keep read-only copies
  unset_read_mostly,         ///< undo read_mostly
  preferred_location,        ///< prefer to keep the pages on the given device
  unset_preferred_location,  ///< undo preferred_location
  accessed_by,               ///< the given device maps the pages to avoid faults
  unset_accessed_by,         ///< undo accessed_by
};

/// @brief Migrates managed memory to @p target (a GPU or the host) in the order of @p stream.
///
/// A hint: on the host backend, or on a GPU without concurrent managed access, nothing moves.
/// @throws InvalidArgument if @p view is not managed memory, or @p stream is on another GPU.
GPUCLOUD_API void prefetch(BufferView view, Device target, StreamView stream);

/// @brief Applies @p advice for @p target to managed memory; no effect on the host backend.
/// @throws InvalidArgument if @p view is not managed memory.
GPUCLOUD_API void advise(BufferView view, MemoryAdvice advice, Device target);

}  // namespace gpucloud
