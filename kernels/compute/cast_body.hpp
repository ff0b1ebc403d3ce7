// Bodies of the cast and fill kernels: grid-stride loops over explicit thread indices.
#pragma once

#include "kernels/compute/convert.hpp"
#include "kernels/launch/launch.hpp"

#include <cstddef>

namespace gpucloud::kernels {

/// dst[i] = convert<Dst>(src[i]).
template <class Dst, class Src>
struct CastBody {
  Dst* dst;
  const Src* src;
  std::size_t n;
  GPUCLOUD_HD void operator()(ThreadIndex t, Grid g) const {
    for (std::size_t i = global_index(t, g); i < n; i += grid_size(g)) dst[i] = convert<Dst>(src[i]);
  }
};

/// dst[i] = value.
template <class Dst>
struct FillBody {
  Dst* dst;
  Dst value;
  std::size_t n;
  GPUCLOUD_HD void operator()(ThreadIndex t, Grid g) const {
    for (std::size_t i = global_index(t, g); i < n; i += grid_size(g)) dst[i] = value;
  }
};

}  // namespace gpucloud::kernels
