// Internal: the fp32 <-> fp16 / bf16 conversions of the host cast loops, written without branches
// so the compiler vectorises whole arrays. The array loops are compiled once, in
// src/compute/host/host_loops.cpp (the collectives' reductions in src/comm/host_reduce.cpp), for
// AVX-512, AVX2 and the baseline, chosen at load time. Bit for bit
// the scalar conversions of <gpucloud/detail/float_bits.hpp> (round to nearest even, NaN -> 0x7fff,
// subnormals exact); tests/movement/test_copy_cast.cpp compares them over every half and bfloat16 and over
// floats of every exponent. Host only.
#pragma once

#include <gpucloud/runtime/dtype.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

// Inlined into each instruction-set version of the loops that call it (host_loops.cpp).
#if defined(__GNUC__)
#define GPUCLOUD_ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define GPUCLOUD_ALWAYS_INLINE inline
#endif

namespace gpucloud::kernels::host {

/// float bits -> binary16 bits. Subnormal halves come from one float addition, which rounds to
/// nearest even as the FPU does by default (F. Giesen's method); normal ones from integer rounding.
GPUCLOUD_ALWAYS_INLINE std::uint16_t to_half_bits(std::uint32_t x) {
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t u = x & 0x7fffffffu;
  // Below 2^-14 the result is subnormal (or zero): add 0.5f, whose ulp is the half's 2^-24.
  float f;
  std::memcpy(&f, &u, sizeof f);
  f += 0.5f;
  std::uint32_t sub;
  std::memcpy(&sub, &f, sizeof sub);
  sub -= 0x3f000000u;
  const std::uint32_t normal = (u - 0x38000000u + 0xfffu + ((u >> 13) & 1u)) >> 13;
  std::uint32_t r = u < 0x38800000u ? sub : normal;
  r = u >= 0x477ff000u ? 0x7c00u : r;  // infinity, or rounds to it
  r |= sign;
  return static_cast<std::uint16_t>(u > 0x7f800000u ? 0x7fffu : r);
}

/// binary16 bits -> float bits (exact): subnormals renormalised by one float subtraction.
GPUCLOUD_ALWAYS_INLINE std::uint32_t from_half_bits(std::uint16_t h) {
  const std::uint32_t shifted = (static_cast<std::uint32_t>(h) & 0x7fffu) << 13;
  const std::uint32_t exponent = shifted & 0x0f800000u;
  std::uint32_t o = shifted + 0x38000000u;        // rebias 15 -> 127
  const std::uint32_t special = o + 0x38000000u;  // inf / NaN: exponent all ones
  float sub;                                      // zero / subnormal: o + 2^23, minus 2^-14
  const std::uint32_t sub_bits = o + 0x00800000u;
  std::memcpy(&sub, &sub_bits, sizeof sub);
  sub -= 6.103515625e-05f;  // 2^-14
  std::uint32_t sub_result;
  std::memcpy(&sub_result, &sub, sizeof sub_result);
  o = exponent == 0x0f800000u ? special : exponent == 0 ? sub_result : o;
  return o | ((static_cast<std::uint32_t>(h) & 0x8000u) << 16);
}

/// float bits -> bfloat16 bits, round to nearest even, NaN -> 0x7fff.
GPUCLOUD_ALWAYS_INLINE std::uint16_t to_bfloat16_bits(std::uint32_t x) {
  const std::uint32_t r = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  return static_cast<std::uint16_t>((x & 0x7fffffffu) > 0x7f800000u ? 0x7fffu : r);
}

/// An fp32 / fp16 / bf16 element as fp32 (exact), as kernels::load does.
GPUCLOUD_ALWAYS_INLINE float widen(float v) { return v; }
GPUCLOUD_ALWAYS_INLINE float widen(Half v) {
  const std::uint32_t b = from_half_bits(v.bits);
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}
GPUCLOUD_ALWAYS_INLINE float widen(BFloat16 v) {
  const std::uint32_t b = static_cast<std::uint32_t>(v.bits) << 16;
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}

/// fp32 as an element of @p T (fp32, Half, BFloat16), rounded to nearest even, NaN -> 0x7fff, as
/// kernels::store does.
template <class T>
GPUCLOUD_ALWAYS_INLINE T narrow(float v) {
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else {
    std::uint32_t b;
    std::memcpy(&b, &v, sizeof b);
    return T::from_bits(std::is_same_v<T, Half> ? to_half_bits(b) : to_bfloat16_bits(b));
  }
}

/// True for the dtype pairs cast() converts with these loops.
template <class Dst, class Src>
inline constexpr bool has_array_cast = (std::is_same_v<Src, float> &&
                                        (std::is_same_v<Dst, Half> || std::is_same_v<Dst, BFloat16>)) ||
                                       (std::is_same_v<Dst, float> &&
                                        (std::is_same_v<Src, Half> || std::is_same_v<Src, BFloat16>));

/// dst[i] = the half bits of src[i], to_half_bits's results, in the CPU's conversion instructions
/// (AVX-512F or F16C) where it has them (src/compute/host/half_convert.cpp).
void floats_to_halves(std::uint16_t* dst, const float* src, std::size_t n);
/// dst[i] = the float of half bits src[i], from_half_bits's results, likewise.
void halves_to_floats(float* dst, const std::uint16_t* src, std::size_t n);

/// x[i] = x[i] * factor for fp16 bits x, through fp32 and rounded once (scale_array's fp16 case),
/// in registers; true when an x[i] was inf or NaN.
bool scale_halves(std::uint16_t* x, std::size_t n, float factor);
/// The same for bfloat16 bits.
bool scale_bfloat16s(std::uint16_t* x, std::size_t n, float factor);

/// One implementation of the four above (its instruction set's name); the tests compare each.
struct HalfConversion {
  const char* name;
  void (*narrow)(std::uint16_t* dst, const float* src, std::size_t n);
  void (*widen)(float* dst, const std::uint16_t* src, std::size_t n);
  bool (*scale_half)(std::uint16_t* x, std::size_t n, float factor);
  bool (*scale_bf16)(std::uint16_t* x, std::size_t n, float factor);
};
/// Every implementation this CPU runs, the one in use first.
std::vector<HalfConversion> half_conversions();

/// dst[i] = src[i] converted, for i in [0, n): the pairs of has_array_cast (host_loops.cpp).
void cast_array(Half* dst, const float* src, std::size_t n);
void cast_array(BFloat16* dst, const float* src, std::size_t n);
void cast_array(float* dst, const Half* src, std::size_t n);
void cast_array(float* dst, const BFloat16* src, std::size_t n);

}  // namespace gpucloud::kernels::host
