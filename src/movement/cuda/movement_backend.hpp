// Internal: movement's CUDA backend, managed memory's prefetch and advice
// (src/movement/cuda/movement_backend.cpp), or its stand-in without CUDA (movement_disabled.cpp).
// Copies go through memory's (memory/cuda/memory_backend.hpp). Not API.
#pragma once

#include <gpucloud/memory/managed_memory.hpp>
#include <gpucloud/runtime/device.hpp>

#include "runtime/stream_impl.hpp"

#include <cstddef>

namespace gpucloud::detail::cuda {

/// cudaMemPrefetchAsync of managed memory to @p target on @p stream.
void prefetch(const void* p, std::size_t bytes, Device target, StreamImpl& stream);
/// cudaMemAdvise of managed memory for @p target.
void advise(const void* p, std::size_t bytes, MemoryAdvice advice, Device target);

}  // namespace gpucloud::detail::cuda
