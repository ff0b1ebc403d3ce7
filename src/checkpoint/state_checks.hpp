// Checks shared by the load_state_dict() of the optimizers and the loss scaler.
#pragma once

#include <gpucloud/checkpoint/state_dict.hpp>
#include <gpucloud/runtime/stream.hpp>

#include <cstddef>

namespace gpucloud::detail {

/// Every name of @p expected is in @p given with the same dtype and size, and nothing else is.
/// @throws InvalidArgument from @p call naming the entry.
void check_state_entries(const StateDict& expected, const StateDict& given, const char* call);

/// Copies @p bytes of @p src (any memory) to @p out on @p stream and synchronises it.
void read_to_host(BufferView src, void* out, std::size_t bytes, StreamView stream);

}  // namespace gpucloud::detail
