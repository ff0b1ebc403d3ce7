/// @file conv.hpp
/// @brief Mixed-precision 2-D convolution (forward, backward-data, backward-filter), NCHW or NHWC,
///        with stride, padding, dilation, groups and a fused bias/ReLU; cuDNN on a GPU, an exact
///        host model (im2col + the GEMM's host model) elsewhere.
#pragma once

#include <gpucloud/compute/gemm.hpp>
#include <gpucloud/export.hpp>
#include <gpucloud/memory/buffer.hpp>
#include <gpucloud/runtime/stream.hpp>

#include <cstdint>

namespace gpucloud {

/// @brief Memory order of activations; filters follow (cuDNN's convention).
enum class ConvLayout : std::uint8_t {
  nchw,  ///< x[n][c][h][w], y[n][k][oh][ow], filter[k][c/groups][r][s]
  nhwc,  ///< x[n][h][w][c], y[n][oh][ow][k], filter[k][r][s][c/groups]
};

/// @brief The shape and options of a convolution (cross-correlation, as cuDNN and PyTorch compute).
struct ConvArgs {
  std::int64_t n = 0;                    ///< images in the batch (0: nothing to do)
  std::int64_t c = 0;                    ///< input channels
  std::int64_t h = 0;                    ///< input height
  std::int64_t w = 0;                    ///< input width
  std::int64_t k = 0;                    ///< output channels (filters)
  std::int64_t r = 1;                    ///< filter height
  std::int64_t s = 1;                    ///< filter width
  std::int64_t pad_h = 0;                ///< zero rows added above and below
  std::int64_t pad_w = 0;                ///< zero columns added left and right
  std::int64_t stride_h = 1;             ///< vertical step of the filter
  std::int64_t stride_w = 1;             ///< horizontal step of the filter
  std::int64_t dilation_h = 1;           ///< vertical spacing of filter taps
  std::int64_t dilation_w = 1;           ///< horizontal spacing of filter taps
  std::int64_t groups = 1;               ///< channel groups (c and k divide by it; c == k == groups: depthwise)
  ConvLayout layout = ConvLayout::nchw;  ///< memory order of x, y and the filter
  float alpha = 1.0f;                    ///< scales the convolution
  float beta = 0.0f;                     ///< scales the output's previous value (not read when 0)
  Epilogue epilogue = Epilogue::none;    ///< forward only: none, bias or bias_relu
  BufferView bias;                       ///< k values of the output's dtype, for the bias epilogues
};

/// @brief Output height and width of a convolution.
struct ConvOutputSize {
  std::int64_t h = 0;  ///< output height
  std::int64_t w = 0;  ///< output width
};

/// @brief (h + 2 pad_h - dilation_h (r - 1) - 1) / stride_h + 1, and likewise for w.
/// @throws InvalidArgument for a bad shape, or an output smaller than one element.
GPUCLOUD_API ConvOutputSize conv2d_output_size(const ConvArgs& args);

/// @brief y = epilogue(alpha * conv(x, filter) + beta * y [+ bias]) in the order of @p stream.
///
/// x, filter and y share one dtype: float32, float16 or bfloat16; accumulation is fp32 and the
/// output is rounded once. On a GPU: cuDNN (fp32 without TF32; fp16/bf16 on tensor cores), its
/// algorithm chosen once per shape and cached, the workspace from CUDA's stream-ordered pool. On
/// the host: im2col and OpenBLAS in fp32 over the stored (already rounded) values.
/// @throws InvalidArgument naming the argument (channels that do not divide by groups, an output
///         smaller than one element, buffers too small, dtypes that differ, an output aliasing an
///         input, buffers on other devices, dimensions beyond 32 bits), Unsupported for a
///         precision the GPU lacks; all before any work.
GPUCLOUD_API void conv2d_forward(BufferView y, BufferView x, BufferView filter, const ConvArgs& args,
                                 StreamView stream);

/// @brief dx = alpha * conv_backward_data(dy, filter) + beta * dx: the gradient with respect to x
///        (the adjoint of the forward pass: <conv(x), dy> = <x, dx>). No epilogue.
GPUCLOUD_API void conv2d_backward_data(BufferView dx, BufferView dy, BufferView filter, const ConvArgs& args,
                                       StreamView stream);

/// @brief dfilter = alpha * conv_backward_filter(x, dy) + beta * dfilter: the gradient with
///        respect to the filter, summed over the batch. No epilogue.
GPUCLOUD_API void conv2d_backward_filter(BufferView dfilter, BufferView x, BufferView dy, const ConvArgs& args,
                                         StreamView stream);

}  // namespace gpucloud
