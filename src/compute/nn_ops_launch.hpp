// Internal: CUDA launchers of the training-step ops (src/compute/cuda/nn_ops.cu, or stand-ins).
#pragma once

#include "kernels/compute/nn_ops.hpp"
#include "runtime/stream_impl.hpp"

namespace gpucloud::detail::cuda {
void nn_mse(const kernels::MseBody& body, kernels::Grid grid, float* loss, StreamImpl& s);
void nn_relu_backward(const kernels::ReluBackwardBody& body, kernels::Grid grid, StreamImpl& s);
void nn_bias_grad(const kernels::BiasGradBody& body, kernels::Grid grid, StreamImpl& s);
}  // namespace gpucloud::detail::cuda
