// Internal: memory's CUDA backend, allocation, stream-ordered scratch, pointer queries and byte
// copies (src/memory/cuda/memory_backend.cpp), or its stand-in without CUDA (memory_disabled.cpp).
// Not API.
#pragma once

#include <gpucloud/memory/memory_resource.hpp>

#include "runtime/stream_impl.hpp"

#include <cstddef>

namespace gpucloud::detail::cuda {

/// cudaMalloc / cudaHostAlloc (portable) / cudaMallocManaged on @p device (-1: the calling
/// thread's current device, for pinned memory: no context is made on another GPU).
/// @throws OutOfMemory naming the request.
void* allocate(MemoryKind kind, std::size_t bytes, int device);
/// Frees what allocate() returned (@p device as given to it); errors are reported, never thrown.
void deallocate(MemoryKind kind, void* p, int device) noexcept;
/// cudaMallocAsync on @p stream (nullptr: allocate and wait on an internal stream).
void* allocate_async(std::size_t bytes, int device, StreamImpl* stream);
/// cudaFreeAsync on @p stream (nullptr: an internal stream).
void deallocate_async(void* p, int device, StreamImpl* stream) noexcept;

/// Stream-ordered scratch from CUDA's async pool, handed back in stream order when it goes out of
/// scope (after the work enqueued on the stream meanwhile). Empty for 0 bytes.
class AsyncScratch {
 public:
  AsyncScratch(std::size_t bytes, int device, StreamImpl& stream)
      : p_(bytes > 0 ? allocate_async(bytes, device, &stream) : nullptr), device_(device), stream_(&stream) {}
  ~AsyncScratch() {
    if (p_ != nullptr) deallocate_async(p_, device_, stream_);
  }
  AsyncScratch(const AsyncScratch&) = delete;
  AsyncScratch& operator=(const AsyncScratch&) = delete;
  void* get() const noexcept { return p_; }

 private:
  void* p_;
  int device_;
  StreamImpl* stream_;
};

/// cudaMemcpyAsync of @p bytes on @p stream, any direction.
void memcpy_async(void* dst, const void* src, std::size_t bytes, StreamImpl& stream);

/// cudaPointerGetAttributes; host memory when the pointer is unknown to CUDA.
PointerInfo pointer_info(const void* p);

}  // namespace gpucloud::detail::cuda
