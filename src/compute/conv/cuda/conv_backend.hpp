// Internal: the convolution's CUDA backend, cuDNN (src/compute/conv/cuda/conv_cudnn.cpp; a CUDA
// build without cuDNN: conv_without_cudnn.cpp), or its stand-in without CUDA (conv_disabled.cpp).
// Not API.
#pragma once

#include <gpucloud/memory/buffer.hpp>

#include "compute/conv/conv_plan.hpp"
#include "runtime/stream_impl.hpp"

namespace gpucloud::detail::cuda {

/// cuDNN convolution of a validated plan: out = y, dx or dfilter; in1, in2 = (x, filter),
/// (dy, filter) or (x, dy) by the plan's pass.
void conv2d(const ConvPlan& plan, BufferView out, BufferView in1, BufferView in2, StreamImpl& stream);

}  // namespace gpucloud::detail::cuda
