// Internal: fp32 (and, on CPUs with bf16 dot products, bf16) host convolutions through oneDNN's
// direct convolution primitives (the kernels PyTorch's CPU convolutions run), where the build has
// oneDNN; the im2col + OpenBLAS model in conv.cpp runs whatever this declines (not API).
#pragma once

#include <gpucloud/memory/buffer.hpp>

#include "compute/conv/conv_plan.hpp"

namespace gpucloud::detail {

/// Runs @p plan (validated, a non-empty batch) on the calling thread: out from in1 and in2 as
/// conv2d_forward / _backward_data / _backward_filter name them. False (nothing written) when
/// oneDNN is not built in or does not take this case: float16, bfloat16 without native bf16
/// products, alpha != 1, beta != 0, or a shape its primitives refuse.
bool onednn_conv(const ConvPlan& plan, BufferView out, BufferView in1, BufferView in2);

/// "oneDNN" or "im2col + GEMM": what a float32 host convolution runs.
const char* host_conv_implementation() noexcept;

}  // namespace gpucloud::detail
