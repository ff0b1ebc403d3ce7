/// @file copy.hpp
/// @brief Asynchronous copies between any two kinds of memory.
#pragma once

#include <gpucloud/export.hpp>
#include <gpucloud/memory/buffer.hpp>
#include <gpucloud/runtime/stream.hpp>

namespace gpucloud {

/// @brief Copies @p src into @p dst in the order of @p stream (cudaMemcpyAsync on CUDA).
///
/// Both views must have the same dtype and size, must not overlap, and device or managed memory
/// of a GPU must belong to the stream's device. Host and pinned memory can be used from any stream.
/// On a host stream with nothing queued, a copy of up to 4 MiB has run when the call returns (as
/// CUDA runs a host-to-host cudaMemcpyAsync synchronously); otherwise it runs after earlier work.
/// @throws InvalidArgument before anything is enqueued when a check fails.
GPUCLOUD_API void copy(BufferView dst, BufferView src, StreamView stream);

}  // namespace gpucloud
