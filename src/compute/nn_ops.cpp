#include <gpucloud/compute/nn_ops.hpp>
#include <gpucloud/runtime/error.hpp>

#include "amp/amp_checks.hpp"
#include "compute/nn_ops_launch.hpp"
#include "memory/workspace.hpp"
#include "runtime/host/host_stream.hpp"

namespace gpucloud {

namespace {
using namespace kernels;

std::uint8_t type_code(BufferView v) {
  return v.dtype() == DType::float16 ? kF16 : v.dtype() == DType::bfloat16 ? kBF16 : kF32;
}

// On the host stream: in place when it is idle and the work (@p bytes of memory traffic) small.
template <class Body>
void run(StreamView s, const Body& body, Grid grid, std::size_t bytes) {
  const Grid walk = host_range_grid(grid);
  detail::run_or_enqueue(*s.impl(), bytes <= detail::kInPlaceBytes, [body, walk] { host_launch(walk, body); });
}
}  // namespace

void mse_loss(BufferView pred, BufferView target, BufferView loss, BufferView grad, StreamView stream,
              const LossScaler* scaler) {
  constexpr const char* call = "mse_loss";
  detail::check_float_tensor(pred, stream, call, "pred");
  detail::check_float_tensor(target, stream, call, "target");
  detail::check_float_tensor(grad, stream, call, "grad");
  GPUCLOUD_EXPECTS(loss.dtype() == DType::float32 && loss.size() == 1, call, "loss: must be one float32");
  detail::check_access(loss, stream, detail::Access::kernel, call, "loss");
  GPUCLOUD_EXPECTS(pred.size() == target.size() && pred.size() == grad.size() && !pred.empty(), call,
                   "target/grad: need pred's " + std::to_string(pred.size()) + " elements (and at least one)");
  GPUCLOUD_EXPECTS(scaler == nullptr || scaler->device() == stream.device(), call, "scaler: on another device");
  const bool gpu = stream.device().is_cuda();
  const Grid grid = gpu ? elementwise_grid(pred.size(), 64) : host_range_grid(elementwise_grid(pred.size(), 64));
  const auto partials = detail::Workspace::floats(grid_size(grid), stream);  // one per thread of the grid
  const MseBody body{pred.data(),
                     target.data(),
                     grad.data(),
                     type_code(pred),
                     type_code(target),
                     type_code(grad),
                     static_cast<std::int64_t>(pred.size()),
                     scaler != nullptr ? static_cast<const float*>(scaler->scale_value().data()) : nullptr,
                     partials.as_floats()};
  float* out = loss.data_as<float>();
  if (gpu) {
    detail::cuda::nn_mse(body, grid, out, *stream.impl());
  } else {
    detail::run_or_enqueue(*stream.impl(),
                           pred.size_bytes() + target.size_bytes() + grad.size_bytes() <= detail::kInPlaceBytes,
                           [body, grid, out] {
                             host_launch(grid, body);
                             finish_mse(body.partials, static_cast<std::int64_t>(grid_size(grid)), body.n, out);
                           });
  }
}

void relu_backward(BufferView grad, BufferView activation, StreamView stream) {
  constexpr const char* call = "relu_backward";
  detail::check_float_tensor(grad, stream, call, "grad");
  detail::check_float_tensor(activation, stream, call, "activation");
  GPUCLOUD_EXPECTS(grad.size() == activation.size(), call,
                   "activation: needs grad's " + std::to_string(grad.size()) + " elements");
  if (grad.empty()) return;
  const Grid grid = elementwise_grid(grad.size());
  const ReluBackwardBody body{grad.data(), activation.data(), type_code(grad), type_code(activation),
                              static_cast<std::int64_t>(grad.size())};
  if (stream.device().is_cuda()) return detail::cuda::nn_relu_backward(body, grid, *stream.impl());
  run(stream, body, grid, grad.size_bytes() * 2 + activation.size_bytes());
}

void bias_grad(BufferView grad, std::int64_t rows, std::int64_t cols, BufferView out, StreamView stream) {
  constexpr const char* call = "bias_grad";
  detail::check_float_tensor(grad, stream, call, "grad");
  detail::check_float_tensor(out, stream, call, "bias_grad");
  GPUCLOUD_EXPECTS(
      rows >= 0 && cols >= 0 && static_cast<std::int64_t>(grad.size()) == rows * cols, call,
      "grad: " + std::to_string(grad.size()) + " elements, not rows * cols = " + std::to_string(rows * cols));
  GPUCLOUD_EXPECTS(static_cast<std::int64_t>(out.size()) == cols, call, "bias_grad: needs cols elements");
  if (cols == 0) return;
  const Grid grid = elementwise_grid(static_cast<std::size_t>(cols));
  const BiasGradBody body{grad.data(), out.data(), type_code(grad), type_code(out), rows, cols};
  if (stream.device().is_cuda()) return detail::cuda::nn_bias_grad(body, grid, *stream.impl());
  run(stream, body, grid, grad.size_bytes() + out.size_bytes());
}

}  // namespace gpucloud
