// CUDA launchers of the training-step ops: the bodies of nn_ops.hpp.
#include "kernels/compute/nn_ops.hpp"
#include "runtime/cuda/launch.cuh"

#include "compute/nn_ops_launch.hpp"
#include "runtime/cuda/cuda_check.hpp"
#include "runtime/stream_impl.hpp"

#include <cuda_runtime_api.h>

namespace gpucloud::detail::cuda {

namespace {
using namespace kernels;

struct FinishMse {
  std::int64_t n;
  float* loss;
  __device__ void operator()(double total) const { finish_mse_total(total, n, loss); }
};

}  // namespace

void nn_mse(const MseBody& body, Grid grid, float* loss, StreamImpl& s) {
  launch_body(body, grid, s);
  launch_sum_then(body.partials, static_cast<std::int64_t>(grid_size(grid)), FinishMse{body.n, loss}, s);
}

void nn_relu_backward(const ReluBackwardBody& body, Grid grid, StreamImpl& s) { launch_body(body, grid, s); }

void nn_bias_grad(const BiasGradBody& body, Grid grid, StreamImpl& s) { launch_body(body, grid, s); }

}  // namespace gpucloud::detail::cuda
