/// @file dtype.hpp
/// @brief Element types, their sizes and names, and the host-side 16/8-bit float types.
#pragma once

#include <gpucloud/detail/float_bits.hpp>
#include <gpucloud/detail/hd.hpp>
#include <gpucloud/export.hpp>

#include <cstddef>
#include <cstdint>
#include <string>

namespace gpucloud {

/// @brief The element types a buffer can hold.
enum class DType : std::uint8_t {
  float32,      ///< IEEE binary32
  float64,      ///< IEEE binary64
  float16,      ///< IEEE binary16
  bfloat16,     ///< brain float: 8 exponent bits, 7 mantissa bits
  int32,        ///< 32-bit signed integer
  int64,        ///< 64-bit signed integer
  uint8,        ///< 8-bit unsigned integer
  float8_e4m3,  ///< OCP fp8 e4m3 (storage type; arithmetic needs sm_89+)
  float8_e5m2,  ///< OCP fp8 e5m2 (storage type; arithmetic needs sm_89+)
};

/// @brief Number of DType values, for iteration.
inline constexpr int kDTypeCount = 9;

/// @brief Bytes per element of @p t.
constexpr std::size_t dtype_size(DType t) noexcept {
  switch (t) {
    case DType::float64:
    case DType::int64:
      return 8;
    case DType::float32:
    case DType::int32:
      return 4;
    case DType::float16:
    case DType::bfloat16:
      return 2;
    default:
      return 1;
  }
}

/// @brief Canonical lower-case name ("float32", "bfloat16", ...), as used in Python and docs.
GPUCLOUD_API const char* dtype_name(DType t) noexcept;

/// @brief Parses a canonical name (or the short forms "fp32", "fp16", "bf16", "fp8_e4m3", ...).
/// @throws InvalidArgument for an unknown name.
GPUCLOUD_API DType dtype_from_name(const std::string& name);

/// @brief True for the floating-point dtypes.
constexpr bool is_floating(DType t) noexcept { return !(t == DType::int32 || t == DType::int64 || t == DType::uint8); }

/// @brief IEEE half on the host: storage plus round-to-nearest-even conversions.
struct Half {
  std::uint16_t bits = 0;  ///< raw binary16 bits
  Half() = default;
  /// @brief Rounds @p f to nearest even, as __float2half_rn does.
  GPUCLOUD_HD explicit Half(float f) : bits(detail::float_to_half_bits(f)) {}
  /// @brief Exact widening to float.
  GPUCLOUD_HD explicit operator float() const { return detail::half_bits_to_float(bits); }
  /// @brief Builds a value from raw bits.
  GPUCLOUD_HD static Half from_bits(std::uint16_t b) {
    Half h;
    h.bits = b;
    return h;
  }
};

/// @brief bfloat16 on the host: storage plus round-to-nearest-even conversions.
struct BFloat16 {
  std::uint16_t bits = 0;  ///< raw bfloat16 bits
  BFloat16() = default;
  /// @brief Rounds @p f to nearest even, as __float2bfloat16_rn does.
  GPUCLOUD_HD explicit BFloat16(float f) : bits(detail::float_to_bfloat16_bits(f)) {}
  /// @brief Exact widening to float.
  GPUCLOUD_HD explicit operator float() const { return detail::bfloat16_bits_to_float(bits); }
  /// @brief Builds a value from raw bits.
  GPUCLOUD_HD static BFloat16 from_bits(std::uint16_t b) {
    BFloat16 h;
    h.bits = b;
    return h;
  }
};

/// @brief fp8 e4m3 storage; conversions round to nearest even and saturate (SATFINITE).
struct Float8E4M3 {
  std::uint8_t bits = 0;  ///< raw bits
  Float8E4M3() = default;
  /// @brief Rounds and saturates @p f.
  GPUCLOUD_HD explicit Float8E4M3(float f) : bits(detail::float_to_fp8_bits(f, detail::kE4M3())) {}
  /// @brief Exact widening to float.
  GPUCLOUD_HD explicit operator float() const { return detail::fp8_bits_to_float(bits, detail::kE4M3()); }
};

/// @brief fp8 e5m2 storage; conversions round to nearest even and saturate (SATFINITE).
struct Float8E5M2 {
  std::uint8_t bits = 0;  ///< raw bits
  Float8E5M2() = default;
  /// @brief Rounds and saturates @p f.
  GPUCLOUD_HD explicit Float8E5M2(float f) : bits(detail::float_to_fp8_bits(f, detail::kE5M2())) {}
  /// @brief Exact widening to float.
  GPUCLOUD_HD explicit operator float() const { return detail::fp8_bits_to_float(bits, detail::kE5M2()); }
};

/// @brief Maps a C++ element type to its DType: dtype_of<float>() == DType::float32.
template <class T>
constexpr DType dtype_of() noexcept;
/// @cond
template <>
constexpr DType dtype_of<float>() noexcept {
  return DType::float32;
}
template <>
constexpr DType dtype_of<double>() noexcept {
  return DType::float64;
}
template <>
constexpr DType dtype_of<Half>() noexcept {
  return DType::float16;
}
template <>
constexpr DType dtype_of<BFloat16>() noexcept {
  return DType::bfloat16;
}
template <>
constexpr DType dtype_of<std::int32_t>() noexcept {
  return DType::int32;
}
template <>
constexpr DType dtype_of<std::int64_t>() noexcept {
  return DType::int64;
}
template <>
constexpr DType dtype_of<std::uint8_t>() noexcept {
  return DType::uint8;
}
template <>
constexpr DType dtype_of<Float8E4M3>() noexcept {
  return DType::float8_e4m3;
}
template <>
constexpr DType dtype_of<Float8E5M2>() noexcept {
  return DType::float8_e5m2;
}
/// @endcond

}  // namespace gpucloud
