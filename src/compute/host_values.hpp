// Internal: reading and writing one element of a floating buffer as fp32 on the host (the host
// models of GEMM and convolution; not API).
#pragma once

#include <gpucloud/runtime/dtype.hpp>

#include <cstdint>

namespace gpucloud::detail {

/// Element @p i of @p p (float32, float16, bfloat16 or fp8) as fp32: exact.
inline float load_as_float(const void* p, std::int64_t i, DType t) {
  switch (t) {
    case DType::float16:
      return half_bits_to_float(static_cast<const std::uint16_t*>(p)[i]);
    case DType::bfloat16:
      return bfloat16_bits_to_float(static_cast<const std::uint16_t*>(p)[i]);
    case DType::float8_e4m3:
      return fp8_bits_to_float(static_cast<const std::uint8_t*>(p)[i], kE4M3());
    case DType::float8_e5m2:
      return fp8_bits_to_float(static_cast<const std::uint8_t*>(p)[i], kE5M2());
    default:
      return static_cast<const float*>(p)[i];
  }
}

/// Stores @p v into element @p i of @p p (float32, float16 or bfloat16), rounded to nearest even.
inline void store_from_float(void* p, std::int64_t i, DType t, float v) {
  switch (t) {
    case DType::float16:
      static_cast<std::uint16_t*>(p)[i] = float_to_half_bits(v);
      break;
    case DType::bfloat16:
      static_cast<std::uint16_t*>(p)[i] = float_to_bfloat16_bits(v);
      break;
    default:
      static_cast<float*>(p)[i] = v;
  }
}

}  // namespace gpucloud::detail
