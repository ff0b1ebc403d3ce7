// Internal: the convolution's host backend, im2col + OpenBLAS in fp32 over the stored values with
// one rounding of the output (src/compute/conv/host/conv_host.cpp; not API). Each runs a validated
// plan on the calling thread.
#pragma once

#include <gpucloud/memory/buffer.hpp>

#include "compute/conv/conv_plan.hpp"

namespace gpucloud::detail {

/// y = epilogue(alpha conv(x, f) + beta y).
void host_forward(BufferView y, BufferView x, BufferView f, const ConvPlan& plan);
/// dx = alpha conv_transpose(dy, f) + beta dx.
void host_backward_data(BufferView dx, BufferView dy, BufferView f, const ConvPlan& plan);
/// df = alpha (x correlated with dy) + beta df.
void host_backward_filter(BufferView df, BufferView x, BufferView dy, const ConvPlan& plan);

}  // namespace gpucloud::detail
