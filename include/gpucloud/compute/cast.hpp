/// @file cast.hpp
/// @brief Element-wise dtype conversion and fill, on the stream's device.
#pragma once

#include <gpucloud/export.hpp>
#include <gpucloud/memory/buffer.hpp>
#include <gpucloud/runtime/stream.hpp>

#include <cstdint>
#include <type_traits>

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

/// @brief dst[i] = @p value converted to dst's dtype, exactly for integer dtypes (int64 values
///        beyond 2^53 do not pass through a double), in the order of @p stream.
GPUCLOUD_API void fill_integer(BufferView dst, std::int64_t value, StreamView stream);

/// @brief fill() of an integer value: exact (fill_integer), never through a double.
template <class Int, std::enable_if_t<std::is_integral_v<Int>, int> = 0>
void fill(BufferView dst, Int value, StreamView stream) {
  fill_integer(dst, static_cast<std::int64_t>(value), stream);
}

}  // namespace gpucloud
