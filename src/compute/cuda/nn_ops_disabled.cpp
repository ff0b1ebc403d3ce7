// The nn ops' CUDA stand-ins for builds without CUDA: a clear error from every entry point
// (which the public layer never reaches, since no CUDA Device exists).
#include "compute/nn_ops_launch.hpp"
#include "runtime/cuda/unavailable.hpp"

namespace gpucloud::detail::cuda {
void nn_mse(const kernels::MseBody&, kernels::Grid, float*, StreamImpl&) { unavailable("mse_loss"); }
void nn_relu_backward(const kernels::ReluBackwardBody&, kernels::Grid, StreamImpl&) { unavailable("relu_backward"); }
void nn_bias_grad(const kernels::BiasGradBody&, kernels::Grid, StreamImpl&) { unavailable("bias_grad"); }

}  // namespace gpucloud::detail::cuda
