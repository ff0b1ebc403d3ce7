/// @file detail/float_bits.hpp
/// @brief Bit-exact float <-> fp16 / bf16 / fp8 conversions shared by host and device code.
///
/// Round-to-nearest-even, matching CUDA's __float2half_rn, __float2bfloat16_rn and
/// __nv_cvt_float_to_fp8(x, __NV_SATFINITE, ...) bit for bit, NaNs included. In device code the
/// fp16/bf16 conversions are CUDA's intrinsics themselves (the host code is tested against them).
#pragma once

#include <gpucloud/detail/hd.hpp>

#include <cstdint>
#include <cstring>

#if defined(__CUDA_ARCH__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

namespace gpucloud::detail {

/// @brief Reinterprets a float's bits.
GPUCLOUD_HD inline std::uint32_t float_as_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

/// @brief Reinterprets bits as a float.
GPUCLOUD_HD inline float bits_as_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

/// @brief Rounds @p value (with @p shift low bits to drop) to nearest even.
GPUCLOUD_HD inline std::uint32_t round_shift_rne(std::uint32_t value, unsigned shift) {
  if (shift == 0) return value;
  if (shift >= 32) return 0;
  const std::uint32_t kept = value >> shift;
  const std::uint32_t rest = value & ((1u << shift) - 1u);
  const std::uint32_t half = 1u << (shift - 1u);
  return kept + ((rest > half || (rest == half && (kept & 1u))) ? 1u : 0u);
}

/// @brief float -> IEEE binary16 bits, round to nearest even; NaN -> 0x7fff.
GPUCLOUD_HD inline std::uint16_t float_to_half_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __half_as_ushort(__float2half_rn(f));  // the hardware conversion: the same bits, faster
#endif
  const std::uint32_t x = float_as_bits(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t u = x & 0x7fffffffu;
  if (u > 0x7f800000u) return 0x7fffu;                                      // NaN
  if (u >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // inf or rounds to it
  if (u >= 0x38800000u) {                                                   // normal half
    return static_cast<std::uint16_t>(sign | round_shift_rne(u - 0x38000000u, 13));
  }
  if (u <= 0x33000000u) return static_cast<std::uint16_t>(sign);  // rounds to zero
  const unsigned exponent = u >> 23;                              // subnormal half
  const std::uint32_t mantissa = (u & 0x7fffffu) | 0x800000u;
  return static_cast<std::uint16_t>(sign | round_shift_rne(mantissa, 0x7eu - exponent));
}

/// @brief IEEE binary16 bits -> float (exact).
GPUCLOUD_HD inline float half_bits_to_float(std::uint16_t h) {
#if defined(__CUDA_ARCH__)
  return __half2float(__ushort_as_half(h));
#endif
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  std::uint32_t exponent = (h >> 10) & 0x1fu;
  std::uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1fu) return bits_as_float(sign | 0x7f800000u | (mantissa << 13));
  if (exponent == 0) {
    if (mantissa == 0) return bits_as_float(sign);
    exponent = 1;  // normalise the subnormal
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --exponent;
    }
    mantissa &= 0x3ffu;
  }
  return bits_as_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

/// @brief float -> bfloat16 bits, round to nearest even; NaN -> 0x7fff.
GPUCLOUD_HD inline std::uint16_t float_to_bfloat16_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __bfloat16_as_ushort(__float2bfloat16_rn(f));
#endif
  const std::uint32_t x = float_as_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return 0x7fffu;
  return static_cast<std::uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

/// @brief bfloat16 bits -> float (exact).
GPUCLOUD_HD inline float bfloat16_bits_to_float(std::uint16_t b) {
  return bits_as_float(static_cast<std::uint32_t>(b) << 16);
}

/// @brief Layout of an 8-bit float: exponent bits, mantissa bits, largest finite code.
struct Fp8Format {
  unsigned exponent_bits;
  unsigned mantissa_bits;
  std::uint8_t max_finite;  ///< 0x7e for e4m3 (448), 0x7b for e5m2 (57344)
  bool has_inf;             ///< e5m2 has inf (0x7c); e4m3 has none
};

/// @brief OCP e4m3 ("fn"): no infinities, NaN 0x7f, max 448.
GPUCLOUD_HD constexpr Fp8Format kE4M3() { return Fp8Format{4, 3, 0x7e, false}; }
/// @brief OCP e5m2: IEEE-like, inf 0x7c, max 57344.
GPUCLOUD_HD constexpr Fp8Format kE5M2() { return Fp8Format{5, 2, 0x7b, true}; }

/// @brief float -> fp8 bits, round to nearest even, saturating to the largest finite value.
GPUCLOUD_HD inline std::uint8_t float_to_fp8_bits(float f, Fp8Format fmt) {
  const std::uint32_t x = float_as_bits(f);
  const std::uint32_t u = x & 0x7fffffffu;
  if (u > 0x7f800000u) return 0x7f;  // canonical NaN
  const std::uint32_t sign = (x >> 24) & 0x80u;
  const int bias = (1 << (fmt.exponent_bits - 1)) - 1;
  const int e = static_cast<int>(u >> 23);
  std::uint32_t code = 0;
  if (e != 0) {  // float subnormals are far below any fp8 value
    const int target_exponent = e - 127 + bias;
    const std::uint32_t mantissa = (u & 0x7fffffu) | 0x800000u;
    if (target_exponent >= 1) {
      const std::uint32_t shifted = round_shift_rne(mantissa, 23u - fmt.mantissa_bits);
      // shifted includes the implicit bit; a carry moves into the exponent naturally.
      const std::uint32_t biased = static_cast<std::uint32_t>(target_exponent - 1) << fmt.mantissa_bits;
      code = target_exponent > 0x7f ? 0xffu : biased + shifted;
    } else {
      code = round_shift_rne(mantissa, 23u - fmt.mantissa_bits + static_cast<unsigned>(1 - target_exponent));
    }
  }
  if (code > fmt.max_finite) code = fmt.max_finite;
  return static_cast<std::uint8_t>(sign | code);
}

/// @brief fp8 bits -> float (exact).
GPUCLOUD_HD inline float fp8_bits_to_float(std::uint8_t v, Fp8Format fmt) {
  const std::uint32_t sign = static_cast<std::uint32_t>(v & 0x80u) << 24;
  const std::uint32_t magnitude = v & 0x7fu;
  const std::uint32_t mantissa_mask = (1u << fmt.mantissa_bits) - 1u;
  const std::uint32_t exponent = magnitude >> fmt.mantissa_bits;
  const std::uint32_t mantissa = magnitude & mantissa_mask;
  const std::uint32_t max_exponent = (1u << fmt.exponent_bits) - 1u;
  if (fmt.has_inf && exponent == max_exponent) {
    return bits_as_float(sign | 0x7f800000u | (mantissa == 0 ? 0u : 0x400000u));
  }
  if (!fmt.has_inf && magnitude == 0x7fu) return bits_as_float(sign | 0x7fc00000u);
  const int bias = (1 << (fmt.exponent_bits - 1)) - 1;
  // value = mantissa * 2^(1 - bias - M) for subnormals; (2^M + mantissa) * 2^(e - bias - M) else.
  const int scale_exponent =
      (exponent == 0 ? 1 : static_cast<int>(exponent)) - bias - static_cast<int>(fmt.mantissa_bits);
  const std::uint32_t significand = exponent == 0 ? mantissa : (mantissa | (1u << fmt.mantissa_bits));
  // significand < 16 and |scale_exponent| < 30: both factors are exact floats.
  const float pow2 = bits_as_float(static_cast<std::uint32_t>(scale_exponent + 127) << 23);
  return bits_as_float(sign | float_as_bits(static_cast<float>(significand) * pow2));
}

}  // namespace gpucloud::detail
