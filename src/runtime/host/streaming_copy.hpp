// Internal: copies far larger than the caches, with non-temporal stores (not API).
#pragma once

#include <cstddef>

namespace gpucloud::detail {

/// Copies @p n bytes from @p src to @p dst (not overlapping), writing around the caches
/// (non-temporal stores, four pages read side by side) when @p n is at least
/// kStreamingCopyMin; memcpy below. For pieces of copies many times the caches' size: a plain
/// memcpy of a 4 MiB piece reads every destination line before writing it (~13 GB/s on two
/// cores here, where this runs at ~22).
void streaming_copy(void* dst, const void* src, std::size_t n) noexcept;

/// The size from which streaming_copy bypasses the caches.
inline constexpr std::size_t kStreamingCopyMin = std::size_t{256} << 10;

}  // namespace gpucloud::detail
