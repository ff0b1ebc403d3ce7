// The GEMM's CUDA backend stand-in for builds without CUDA: a clear error from every entry point
// (which the public layer never reaches, since no CUDA Device exists).
#include "compute/gemm/cuda/gemm_backend.hpp"
#include "runtime/cuda/unavailable.hpp"

namespace gpucloud::detail::cuda {
void gemm(BufferView, BufferView, BufferView, const GemmPlan&, StreamImpl&) { unavailable("gemm"); }

}  // namespace gpucloud::detail::cuda
