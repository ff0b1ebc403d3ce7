// Internal: cast and fill's CUDA kernels (src/compute/cuda/cast.cu), or their stand-ins without
// CUDA (cast_disabled.cpp). Not API.
#pragma once

#include <gpucloud/memory/buffer.hpp>

#include "runtime/stream_impl.hpp"

#include <cstdint>

namespace gpucloud::detail::cuda {

/// dst = src converted to dst's dtype, on a GPU stream.
void cast(BufferView dst, BufferView src, StreamImpl& stream);
/// Every element of dst = @p value (converted once to dst's dtype), on a GPU stream.
void fill(BufferView dst, double value, StreamImpl& stream);
/// Every element of dst = @p value (converted once to dst's dtype), on a GPU stream.
void fill(BufferView dst, std::int64_t value, StreamImpl& stream);

}  // namespace gpucloud::detail::cuda
