// Cast and fill's CUDA stand-ins for builds without CUDA: a clear error from every entry point
// (which the public layer never reaches, since no CUDA Device exists).
#include "compute/cuda/cast_backend.hpp"
#include "runtime/cuda/unavailable.hpp"

namespace gpucloud::detail::cuda {
void cast(BufferView, BufferView, StreamImpl&) { unavailable("cast"); }
void fill(BufferView, double, StreamImpl&) { unavailable("fill"); }
void fill(BufferView, std::int64_t, StreamImpl&) { unavailable("fill"); }

}  // namespace gpucloud::detail::cuda
