// Element conversions shared by the CUDA kernels and the host loops: one rounding wherever the
// source is exactly representable in float32 (all the narrow floats), saturating integers.
#pragma once

#include <gpucloud/detail/hd.hpp>
#include <gpucloud/runtime/dtype.hpp>

#include <cstdint>
#include <limits>
#include <type_traits>

namespace gpucloud::kernels {

/// Types converted through float32 without loss.
template <class T>
inline constexpr bool widens_to_float =
    std::is_same_v<T, float> || std::is_same_v<T, Half> || std::is_same_v<T, BFloat16> ||
    std::is_same_v<T, Float8E4M3> || std::is_same_v<T, Float8E5M2> || std::is_same_v<T, std::uint8_t>;

/// The intermediate a Src value travels through: itself for double and the wide integers, float else.
template <class Src>
using Intermediate = std::conditional_t<widens_to_float<Src>, float, Src>;

/// Src -> its intermediate, exactly.
template <class Src>
GPUCLOUD_HD Intermediate<Src> to_intermediate(Src v) {
  if constexpr (widens_to_float<Src>) {
    return static_cast<float>(v);
  } else {
    return v;
  }
}

/// Saturating conversion to an integer: truncates toward zero, NaN -> 0.
template <class I, class M>
GPUCLOUD_HD I saturate_to(M m) {
  constexpr I lo = std::numeric_limits<I>::lowest();
  constexpr I hi = std::numeric_limits<I>::max();
  if constexpr (std::is_integral_v<M>) {
    if constexpr (std::is_signed_v<M>) {
      if (static_cast<std::int64_t>(m) < static_cast<std::int64_t>(lo)) return lo;
    }
    if (m > 0 && static_cast<std::uint64_t>(m) > static_cast<std::uint64_t>(hi)) return hi;
    return static_cast<I>(m);
  } else {
    if (!(m == m)) return 0;
    // lo is 0 or a power of two, exact in M; a hi that rounds up in M still bounds correctly.
    if (m <= static_cast<M>(lo)) return lo;
    if (m >= static_cast<M>(hi)) return hi;
    return static_cast<I>(m);
  }
}

/// Intermediate -> Dst with one rounding (RNE for floats, SATFINITE for fp8).
template <class Dst, class M>
GPUCLOUD_HD Dst from_intermediate(M m) {
  if constexpr (std::is_same_v<Dst, float> || std::is_same_v<Dst, double>) {
    return static_cast<Dst>(m);
  } else if constexpr (std::is_integral_v<Dst>) {
    return saturate_to<Dst>(m);
  } else {
    return Dst(static_cast<float>(m));
  }
}

/// Converts one element.
template <class Dst, class Src>
GPUCLOUD_HD Dst convert(Src v) {
  return from_intermediate<Dst>(to_intermediate(v));
}

}  // namespace gpucloud::kernels
