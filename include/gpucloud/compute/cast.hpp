/// @file cast.hpp
/// @brief Element-wise dtype conversion and fill, on the stream's device.
#pragma once

#include <gpucloud/export.hpp>
#include <gpucloud/memory/buffer.hpp>
#include <gpucloud/runtime/stream.hpp>

namespace gpucloud {

/// @brief dst[i] = convert(src[i]) in the order of @p stream.
///
/// Floating conversions round to nearest even (narrow floats saturate as CUDA's SATFINITE for
/// fp8); float to integer truncates toward zero, saturating, NaN to 0. Sources wider than
/// float32 (float64, int64) convert to fp16/bf16/fp8 through float32.
/// @throws InvalidArgument for different sizes, overlapping views, or memory of another device.
GPUCLOUD_API void cast(BufferView dst, BufferView src, StreamView stream);

/// @brief dst[i] = @p value converted to dst's dtype (as cast does), in the order of @p stream.
GPUCLOUD_API void fill(BufferView dst, double value, StreamView stream);

}  // namespace gpucloud
