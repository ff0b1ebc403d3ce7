// Internal: a convolution's arguments after validation (not API).
#pragma once

#include <gpucloud/compute/conv.hpp>

#include "kernels/compute/conv_geometry.hpp"

#include <array>
#include <cstdint>

namespace gpucloud::detail {

enum class ConvPass : std::uint8_t { forward, backward_data, backward_filter };

struct ConvPlan {
  ConvArgs args;
  kernels::ConvGeometry g{};
  ConvPass pass = ConvPass::forward;
  DType dtype = DType::float32;
  bool has_bias = false;
};

/// Everything a backend's cached plan for @p p depends on (cuDNN's, oneDNN's): the geometry and
/// layout, the pass, dtype, epilogue and bias (alpha and beta are arguments of each call).
using ConvKey = std::array<std::int64_t, 19>;
inline ConvKey conv_key(const ConvPlan& p) {
  const kernels::ConvGeometry& g = p.g;
  return {g.n,
          g.c,
          g.h,
          g.w,
          g.k,
          g.r,
          g.s,
          g.pad_h,
          g.pad_w,
          g.stride_h,
          g.stride_w,
          g.dilation_h,
          g.dilation_w,
          g.groups,
          g.nhwc ? 1 : 0,
          static_cast<std::int64_t>(p.pass),
          static_cast<std::int64_t>(p.dtype),
          static_cast<std::int64_t>(p.args.epilogue),
          p.has_bias ? 1 : 0};
}

}  // namespace gpucloud::detail
