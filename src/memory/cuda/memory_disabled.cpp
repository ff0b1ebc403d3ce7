// Memory's CUDA backend stand-in for builds without CUDA: a clear error from every entry point
// (which the public layer never reaches, since no CUDA Device exists).
#include "memory/cuda/memory_backend.hpp"
#include "runtime/cuda/unavailable.hpp"

namespace gpucloud::detail::cuda {
void* allocate(MemoryKind, std::size_t, int) { unavailable("allocate"); }
void deallocate(MemoryKind, void*, int) noexcept {}
void* allocate_async(std::size_t, int, StreamImpl*) { unavailable("allocate"); }
void deallocate_async(void*, int, StreamImpl*) noexcept {}
void memcpy_async(void*, const void*, std::size_t, StreamImpl&) { unavailable("copy"); }
PointerInfo pointer_info(const void*) { return PointerInfo{}; }

}  // namespace gpucloud::detail::cuda
