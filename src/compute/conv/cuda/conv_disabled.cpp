// The convolution's CUDA backend stand-in for builds without CUDA: a clear error from every entry point
// (which the public layer never reaches, since no CUDA Device exists).
#include "compute/conv/cuda/conv_backend.hpp"
#include "runtime/cuda/unavailable.hpp"

namespace gpucloud::detail::cuda {
void conv2d(const ConvPlan&, BufferView, BufferView, BufferView, StreamImpl&) { unavailable("conv2d"); }

}  // namespace gpucloud::detail::cuda
