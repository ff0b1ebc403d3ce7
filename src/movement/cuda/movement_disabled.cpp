// Movement's CUDA backend stand-in for builds without CUDA: a clear error from every entry point
// (which the public layer never reaches, since no CUDA Device exists).
#include "movement/cuda/movement_backend.hpp"
#include "runtime/cuda/unavailable.hpp"

namespace gpucloud::detail::cuda {
void prefetch(const void*, std::size_t, Device, StreamImpl&) { unavailable("prefetch"); }
void advise(const void*, std::size_t, MemoryAdvice, Device) { unavailable("advise"); }

}  // namespace gpucloud::detail::cuda
