// Internal: a convolution's arguments after validation (not API).
#pragma once

#include <gpucloud/compute/conv.hpp>

#include "kernels/compute/conv_geometry.hpp"

namespace gpucloud::detail {

enum class ConvPass : std::uint8_t { forward, backward_data, backward_filter };

struct ConvPlan {
  ConvArgs args;
  kernels::ConvGeometry g{};
  ConvPass pass = ConvPass::forward;
  DType dtype = DType::float32;
  bool has_bias = false;
};

}  // namespace gpucloud::detail
