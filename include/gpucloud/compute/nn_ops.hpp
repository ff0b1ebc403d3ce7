/// @file nn_ops.hpp
/// @brief The element-wise and reduction pieces of a training step that GEMMs do not cover:
///        the MSE loss and its (loss-scaled) gradient, ReLU's backward, the bias gradient.
#pragma once

#include <gpucloud/amp/loss_scaler.hpp>
#include <gpucloud/export.hpp>
#include <gpucloud/memory/buffer.hpp>
#include <gpucloud/runtime/stream.hpp>

#include <cstdint>

namespace gpucloud {

/// @brief loss = mean((pred - target)^2) (one float32), grad = 2 (pred - target) / N, times the
///        scaler's current scale when @p scaler is given (read on the device), rounded to grad's dtype.
///
/// pred, target and grad have N elements each (float32/float16/bfloat16); loss is one float32.
GPUCLOUD_API void mse_loss(BufferView pred, BufferView target, BufferView loss, BufferView grad, StreamView stream,
                           const LossScaler* scaler = nullptr);

/// @brief grad *= (activation > 0), in place: ReLU's backward given its output.
GPUCLOUD_API void relu_backward(BufferView grad, BufferView activation, StreamView stream);

/// @brief bias_grad[j] = sum over the @p rows rows of grad[i * cols + j] (fp32 accumulation):
///        the gradient of a bias added to every row of a rows x cols matrix.
GPUCLOUD_API void bias_grad(BufferView grad, std::int64_t rows, std::int64_t cols, BufferView bias_grad,
                            StreamView stream);

}  // namespace gpucloud
