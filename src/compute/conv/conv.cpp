// 2-D convolution: validation shared by every backend, and dispatch: cuDNN on a GPU; on a host
// stream oneDNN where it takes the plan, else the host model (host/conv_host.hpp).
#include <gpucloud/compute/conv.hpp>
#include <gpucloud/runtime/error.hpp>

#include "compute/conv/conv_plan.hpp"
#include "compute/conv/cuda/conv_backend.hpp"
#include "compute/conv/host/conv_host.hpp"
#include "compute/conv/host/onednn_conv.hpp"
#include "memory/access.hpp"
#include "runtime/stream_impl.hpp"

#include <algorithm>
#include <climits>
#include <limits>
#include <string>
#include <utility>
#include <vector>

namespace gpucloud {

namespace {

using detail::ConvPass;
using detail::ConvPlan;
using kernels::ConvGeometry;

std::string str(std::int64_t v) { return std::to_string(v); }

// a * b, or an InvalidArgument naming @p what when it overflows int64.
std::int64_t times(std::int64_t a, std::int64_t b, const char* call, const std::string& what) {
  std::int64_t out = 0;
  GPUCLOUD_EXPECTS(!__builtin_mul_overflow(a, b, &out), call, what + ": the element count overflows 64 bits");
  return out;
}

ConvGeometry geometry(const ConvArgs& a, const char* call) {
  const auto positive = [&](std::int64_t v, const char* name) {
    GPUCLOUD_EXPECTS(v >= 1, call, std::string(name) + ": " + str(v) + " must be at least 1");
    // cuDNN's descriptors (and OpenBLAS) take 32-bit dimensions.
    GPUCLOUD_EXPECTS(v <= INT_MAX, call, std::string(name) + ": " + str(v) + " does not fit in 32 bits");
  };
  GPUCLOUD_EXPECTS(a.n >= 0 && a.n <= INT_MAX, call, "n: " + str(a.n) + " must be between 0 and 2^31 - 1");
  positive(a.c, "c");
  positive(a.h, "h");
  positive(a.w, "w");
  positive(a.k, "k");
  positive(a.r, "r");
  positive(a.s, "s");
  positive(a.stride_h, "stride_h");
  positive(a.stride_w, "stride_w");
  positive(a.dilation_h, "dilation_h");
  positive(a.dilation_w, "dilation_w");
  positive(a.groups, "groups");
  GPUCLOUD_EXPECTS(a.pad_h >= 0 && a.pad_h <= INT_MAX, call, "pad_h: " + str(a.pad_h) + " must be non-negative");
  GPUCLOUD_EXPECTS(a.pad_w >= 0 && a.pad_w <= INT_MAX, call, "pad_w: " + str(a.pad_w) + " must be non-negative");
  GPUCLOUD_EXPECTS(a.c % a.groups == 0, call,
                   "c: " + str(a.c) + " input channels do not divide into " + str(a.groups) + " groups");
  GPUCLOUD_EXPECTS(a.k % a.groups == 0, call,
                   "k: " + str(a.k) + " output channels do not divide into " + str(a.groups) + " groups");
  ConvGeometry g{};
  g.n = a.n, g.c = a.c, g.h = a.h, g.w = a.w, g.k = a.k, g.r = a.r, g.s = a.s;
  g.pad_h = a.pad_h, g.pad_w = a.pad_w, g.stride_h = a.stride_h, g.stride_w = a.stride_w;
  g.dilation_h = a.dilation_h, g.dilation_w = a.dilation_w, g.groups = a.groups;
  g.nhwc = a.layout == ConvLayout::nhwc;
  const std::int64_t span_h = a.dilation_h * (a.r - 1) + 1, span_w = a.dilation_w * (a.s - 1) + 1;
  const std::int64_t room_h = a.h + 2 * a.pad_h, room_w = a.w + 2 * a.pad_w;
  GPUCLOUD_EXPECTS(room_h >= span_h && room_w >= span_w, call,
                   "r/s: the dilated filter (" + str(span_h) + " x " + str(span_w) +
                       ") is larger than the padded input (" + str(room_h) + " x " + str(room_w) +
                       "): the output would be smaller than one element");
  g.oh = (room_h - span_h) / a.stride_h + 1;
  g.ow = (room_w - span_w) / a.stride_w + 1;
  return g;
}

void check_size(BufferView v, std::int64_t needed, const char* call, const char* arg) {
  GPUCLOUD_EXPECTS(
      static_cast<std::int64_t>(v.size()) >= needed, call,
      std::string(arg) + ": " + str(static_cast<std::int64_t>(v.size())) + " elements, the shape needs " + str(needed));
}

// out: the written tensor; in1, in2: the read ones, named for messages.
ConvPlan validate(ConvPass pass, BufferView out, const char* out_name, BufferView in1, const char* in1_name,
                  BufferView in2, const char* in2_name, const ConvArgs& args, StreamView s, const char* call) {
  ConvPlan plan;
  plan.args = args;
  plan.pass = pass;
  plan.g = geometry(args, call);
  const ConvGeometry& g = plan.g;
  const std::int64_t x_count = times(times(g.n, g.c, call, "x"), times(g.h, g.w, call, "x"), call, "x");
  const std::int64_t y_count = times(times(g.n, g.k, call, "y"), times(g.oh, g.ow, call, "y"), call, "y");
  const std::int64_t f_count =
      times(g.k, times(g.cg(), times(g.r, g.s, call, "filter"), call, "filter"), call, "filter");
  // cuDNN's descriptors and the host BLAS count in int: every tensor's elements (hence its
  // strides, pixels and taps) must fit one.
  for (auto [count, name] : {std::pair{x_count, "x"}, std::pair{y_count, "y"}, std::pair{f_count, "filter"}}) {
    GPUCLOUD_EXPECTS(count <= std::numeric_limits<int>::max(), call,
                     std::string(name) + ": " + str(count) +
                         " elements exceed 2^31-1, the int that cuDNN and the host BLAS count in; split the batch");
  }
  const DType t = out.dtype();
  GPUCLOUD_EXPECTS(t == DType::float32 || t == DType::float16 || t == DType::bfloat16, call,
                   std::string(out_name) + ": dtype " + dtype_name(t) + " is not float32, float16 or bfloat16");
  GPUCLOUD_EXPECTS(in1.dtype() == t, call,
                   std::string(in1_name) + ": dtype " + dtype_name(in1.dtype()) + " differs from " + out_name + "'s " +
                       dtype_name(t));
  GPUCLOUD_EXPECTS(in2.dtype() == t, call,
                   std::string(in2_name) + ": dtype " + dtype_name(in2.dtype()) + " differs from " + out_name + "'s " +
                       dtype_name(t));
  plan.dtype = t;
  const std::int64_t counts[3] = {pass == ConvPass::forward         ? y_count
                                  : pass == ConvPass::backward_data ? x_count
                                                                    : f_count,
                                  pass == ConvPass::backward_data ? y_count : x_count,
                                  pass == ConvPass::backward_filter ? y_count : f_count};
  check_size(out, counts[0], call, out_name);
  check_size(in1, counts[1], call, in1_name);
  check_size(in2, counts[2], call, in2_name);
  GPUCLOUD_EXPECTS(!detail::overlaps(out, in1), call, std::string(out_name) + ": aliases " + in1_name);
  GPUCLOUD_EXPECTS(!detail::overlaps(out, in2), call, std::string(out_name) + ": aliases " + in2_name);
  plan.has_bias = args.epilogue == Epilogue::bias || args.epilogue == Epilogue::bias_relu;
  if (pass == ConvPass::forward) {
    GPUCLOUD_EXPECTS(
        args.epilogue == Epilogue::none || plan.has_bias, call,
        "epilogue: a convolution fuses bias or bias_relu (cuDNN's), not " + str(static_cast<int>(args.epilogue)));
  } else {
    GPUCLOUD_EXPECTS(args.epilogue == Epilogue::none, call, "epilogue: only the forward pass has one");
  }
  if (plan.has_bias) {
    GPUCLOUD_EXPECTS(static_cast<std::int64_t>(args.bias.size()) == g.k, call,
                     "bias: " + str(static_cast<std::int64_t>(args.bias.size())) + " elements, the output has " +
                         str(g.k) + " channels");
    GPUCLOUD_EXPECTS(
        args.bias.dtype() == t, call,
        std::string("bias: dtype ") + dtype_name(args.bias.dtype()) + " differs from the output's " + dtype_name(t));
    detail::check_access(args.bias, s, detail::Access::kernel, call, "bias");
  } else {
    GPUCLOUD_EXPECTS(args.bias.empty(), call, "bias: given, but the epilogue adds none");
  }
  detail::check_access(out, s, detail::Access::kernel, call, out_name);
  detail::check_access(in1, s, detail::Access::kernel, call, in1_name);
  detail::check_access(in2, s, detail::Access::kernel, call, in2_name);
  const Precision precision = gemm_precision(t, false);
  if (!supports(s.device(), precision)) {
    GPUCLOUD_FAIL(Unsupported, call,
                  std::string(precision_name(precision)) + " convolutions need a newer GPU than " +
                      device_properties(s.device()).name);
  }
  return plan;
}

// Runs a validated plan: nothing for an empty batch (but the filter gradient, which is then
// beta * dfilter), cuDNN on a GPU, the host model on a host stream.
template <class Host>
void run(const ConvPlan& plan, BufferView out, BufferView in1, BufferView in2, StreamView stream, Host host) {
  if (stream.device().is_cuda()) {
    detail::cuda::conv2d(plan, out, in1, in2, *stream.impl());
    return;
  }
  stream.impl()->launch_host_func(
      [plan, out, in1, in2, host] {
        if (!detail::onednn_conv(plan, out, in1, in2)) host(out, in1, in2, plan);
      },
      /*always_run=*/false);
}

}  // namespace

ConvOutputSize conv2d_output_size(const ConvArgs& args) {
  const ConvGeometry g = geometry(args, "conv2d_output_size");
  return {g.oh, g.ow};
}

void conv2d_forward(BufferView y, BufferView x, BufferView filter, const ConvArgs& args, StreamView stream) {
  const ConvPlan plan = validate(ConvPass::forward, y, "y", x, "x", filter, "filter", args, stream, "conv2d_forward");
  if (plan.g.n == 0) return;
  run(plan, y, x, filter, stream, detail::host_forward);
}

void conv2d_backward_data(BufferView dx, BufferView dy, BufferView filter, const ConvArgs& args, StreamView stream) {
  const ConvPlan plan =
      validate(ConvPass::backward_data, dx, "dx", dy, "dy", filter, "filter", args, stream, "conv2d_backward_data");
  if (plan.g.n == 0) return;
  run(plan, dx, dy, filter, stream, detail::host_backward_data);
}

void conv2d_backward_filter(BufferView dfilter, BufferView x, BufferView dy, const ConvArgs& args, StreamView stream) {
  const ConvPlan plan =
      validate(ConvPass::backward_filter, dfilter, "dfilter", x, "x", dy, "dy", args, stream, "conv2d_backward_filter");
  run(plan, dfilter, x, dy, stream, detail::host_backward_filter);
}

}  // namespace gpucloud
