// Internal: the host backend's use of the machine's cores for large element-wise work (im2col,
// col2im, widening copies): one process-wide pool of worker threads (not API).
#pragma once

#include <cstdint>
#include <functional>

namespace gpucloud::detail {

/// Runs fn(begin, end) over [0, n) split into contiguous ranges of at least @p grain on the
/// host's cores, the calling thread taking its share; returns when every range has run and
/// rethrows the first exception. Serial when n < 2 * grain, on one core, inside another
/// parallel_for, or while the pool serves another caller (it never waits for a second job).
void parallel_for(std::int64_t n, std::int64_t grain, const std::function<void(std::int64_t, std::int64_t)>& fn);

/// Threads parallel_for uses, the caller's included (thread_budget().pool).
int parallel_for_threads() noexcept;

}  // namespace gpucloud::detail
