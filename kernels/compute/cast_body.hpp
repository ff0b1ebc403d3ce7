// Bodies of the cast and fill kernels: grid-stride loops over explicit thread indices.
#pragma once

#include "kernels/compute/convert.hpp"
#include "kernels/launch/launch.hpp"

#if !defined(__CUDA_ARCH__)
#include "kernels/compute/host_convert.hpp"
#endif

#include <cstddef>

namespace gpucloud::kernels {

/// dst[i] = convert<Dst>(src[i]). A host thread that walks the whole range (one thread in all)
/// converts fp32 <-> fp16 / bf16 as arrays (host_convert.hpp: the same bits, vectorised).
template <class Dst, class Src>
struct CastBody {
  Dst* dst;
  const Src* src;
  std::size_t n;
  GPUCLOUD_HD void operator()(ThreadIndex t, Grid g) const {
#if !defined(__CUDA_ARCH__)
    if constexpr (host::has_array_cast<Dst, Src>) {
      if (grid_size(g) == 1) {
        host::cast_array(dst, src, n);
        return;
      }
    }
#endif
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
