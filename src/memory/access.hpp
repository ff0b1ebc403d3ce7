// Internal: checks that memory can be used by work on a stream (not API).
#pragma once

#include <gpucloud/memory/buffer.hpp>
#include <gpucloud/runtime/stream.hpp>

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

namespace gpucloud::detail {

/// What touches the memory: a copy engine (cudaMemcpyAsync / memcpy) or a kernel.
enum class Access { copy, kernel };

/// @throws InvalidArgument naming @p arg when work of @p access kind on @p stream cannot use @p view.
void check_access(BufferView view, StreamView stream, Access access, const char* call, const char* arg);

/// True when @p a and @p b share at least one byte (empty views share none).
bool overlaps(BufferView a, BufferView b) noexcept;

/// @throws InvalidArgument naming @p arg when @p a and @p b overlap in memory.
void check_no_overlap(BufferView a, BufferView b, const char* call, const char* arg);

/// @throws InvalidArgument naming both when any two of @p views overlap (the same tensor listed
///         twice, a parameter that is its own gradient): a fused pass would update it twice.
///         @p name(i) names view i. O(n log n).
void check_disjoint(const std::vector<BufferView>& views, const std::function<std::string(std::size_t)>& name,
                    const char* call);

}  // namespace gpucloud::detail
