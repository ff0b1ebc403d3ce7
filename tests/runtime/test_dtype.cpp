// fp16 / bf16 / fp8 conversions: exhaustive over every narrow value, round-to-nearest-even
// characterised independently (midpoints between neighbours), and bit-for-bit against CUDA's own
// host implementations of __float2half_rn, __float2bfloat16_rn and __nv_cvt_float_to_fp8.
#include <gpucloud/runtime/dtype.hpp>
#include <gpucloud/runtime/error.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#if GPUCLOUD_TEST_CUDA_REFERENCE
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#endif

namespace gc = gpucloud;
using gc::detail::bits_as_float;
using gc::detail::float_as_bits;

namespace {

float next_up(float f) { return std::nextafter(f, std::numeric_limits<float>::infinity()); }
float next_down(float f) { return std::nextafter(f, -std::numeric_limits<float>::infinity()); }

// For every pair of adjacent finite positive narrow values a < b: values strictly inside round
// to the nearer, the exact midpoint to the one with an even code. Signs are symmetric.
template <class Encode, class Decode>
int check_rne_between_neighbours(unsigned max_code, Encode encode, Decode decode) {
  int wrong = 0;
  for (unsigned code = 0; code < max_code; ++code) {
    const float a = decode(code), b = decode(code + 1);
    const float mid = a + (b - a) / 2;  // exact: narrow formats have few mantissa bits
    const unsigned even = (code % 2 == 0) ? code : code + 1;
    for (float sign : {1.0f, -1.0f}) {
      const unsigned s = sign < 0 ? (max_code > 0xff ? 0x8000u : 0x80u) : 0u;
      wrong += encode(sign * a) != (code | s);
      wrong += encode(sign * next_down(mid)) != (code | s);
      wrong += encode(sign * mid) != (even | s);
      wrong += encode(sign * next_up(mid)) != ((code + 1) | s);
    }
  }
  return wrong;
}

}  // namespace

TEST(DType, SizesAndNames) {
  EXPECT_EQ(gc::dtype_size(gc::DType::float64), 8u);
  EXPECT_EQ(gc::dtype_size(gc::DType::int64), 8u);
  EXPECT_EQ(gc::dtype_size(gc::DType::float32), 4u);
  EXPECT_EQ(gc::dtype_size(gc::DType::int32), 4u);
  EXPECT_EQ(gc::dtype_size(gc::DType::float16), 2u);
  EXPECT_EQ(gc::dtype_size(gc::DType::bfloat16), 2u);
  EXPECT_EQ(gc::dtype_size(gc::DType::uint8), 1u);
  EXPECT_EQ(gc::dtype_size(gc::DType::float8_e4m3), 1u);
  EXPECT_EQ(gc::dtype_size(gc::DType::float8_e5m2), 1u);
  for (int i = 0; i < gc::kDTypeCount; ++i) {
    const auto t = static_cast<gc::DType>(i);
    EXPECT_EQ(gc::dtype_from_name(gc::dtype_name(t)), t);
  }
  EXPECT_EQ(gc::dtype_from_name("bf16"), gc::DType::bfloat16);
  EXPECT_EQ(gc::dtype_from_name("FP16"), gc::DType::float16);
  EXPECT_THROW(gc::dtype_from_name("float17"), gc::InvalidArgument);
  EXPECT_FALSE(gc::is_floating(gc::DType::int32));
  EXPECT_TRUE(gc::is_floating(gc::DType::float8_e4m3));
  static_assert(gc::dtype_of<gc::BFloat16>() == gc::DType::bfloat16);
  static_assert(sizeof(gc::Half) == 2 && sizeof(gc::Float8E4M3) == 1);
}

TEST(Half, EveryValueRoundTrips) {
  int wrong = 0;
  for (unsigned bits = 0; bits <= 0xffff; ++bits) {
    const float f = gc::detail::half_bits_to_float(static_cast<std::uint16_t>(bits));
    const bool nan = (bits & 0x7c00u) == 0x7c00u && (bits & 0x3ffu) != 0;
    if (nan) {
      wrong += !std::isnan(f);
      wrong += gc::detail::float_to_half_bits(f) != 0x7fffu;
    } else {
      wrong += gc::detail::float_to_half_bits(f) != bits;
    }
  }
  EXPECT_EQ(wrong, 0);
  EXPECT_EQ(static_cast<float>(gc::Half::from_bits(0x3c00)), 1.0f);
  EXPECT_EQ(static_cast<float>(gc::Half::from_bits(0x7bff)), 65504.0f);
  EXPECT_EQ(static_cast<float>(gc::Half::from_bits(0x0001)), std::ldexp(1.0f, -24));
}

TEST(Half, RoundsToNearestEven) {
  auto encode = [](float f) { return unsigned{gc::detail::float_to_half_bits(f)}; };
  auto decode = [](unsigned c) { return gc::detail::half_bits_to_float(static_cast<std::uint16_t>(c)); };
  EXPECT_EQ(check_rne_between_neighbours(0x7bff, encode, decode), 0);
  // Beyond the largest finite value: the midpoint 65520 and above round to infinity.
  EXPECT_EQ(encode(65519.996f), 0x7bffu);
  EXPECT_EQ(encode(65520.0f), 0x7c00u);
  EXPECT_EQ(encode(-1e30f), 0xfc00u);
  EXPECT_EQ(encode(std::numeric_limits<float>::infinity()), 0x7c00u);
  EXPECT_EQ(encode(std::nanf("")), 0x7fffu);
  // Below half the smallest subnormal: signed zero.
  EXPECT_EQ(encode(std::ldexp(1.0f, -25)), 0x0000u);
  EXPECT_EQ(encode(-std::ldexp(1.0f, -25)), 0x8000u);
  EXPECT_EQ(encode(next_up(std::ldexp(1.0f, -25))), 0x0001u);
}

TEST(BFloat16, EveryValueRoundTripsAndRoundsToNearestEven) {
  int wrong = 0;
  for (unsigned bits = 0; bits <= 0xffff; ++bits) {
    const float f = gc::detail::bfloat16_bits_to_float(static_cast<std::uint16_t>(bits));
    wrong += std::isnan(f) ? gc::detail::float_to_bfloat16_bits(f) != 0x7fffu
                           : gc::detail::float_to_bfloat16_bits(f) != bits;
  }
  EXPECT_EQ(wrong, 0);
  auto encode = [](float f) { return unsigned{gc::detail::float_to_bfloat16_bits(f)}; };
  auto decode = [](unsigned c) { return gc::detail::bfloat16_bits_to_float(static_cast<std::uint16_t>(c)); };
  EXPECT_EQ(check_rne_between_neighbours(0x7f7f, encode, decode), 0);
  EXPECT_EQ(encode(std::numeric_limits<float>::max()), 0x7f80u);  // rounds up to infinity
}

TEST(Float8, EveryCodeRoundTripsAndRoundsToNearestEvenWithSaturation) {
  for (auto fmt : {gc::detail::kE4M3(), gc::detail::kE5M2()}) {
    int wrong = 0;
    for (unsigned code = 0; code <= 0xff; ++code) {
      const float f = gc::detail::fp8_bits_to_float(static_cast<std::uint8_t>(code), fmt);
      if (std::isnan(f)) {
        wrong += gc::detail::float_to_fp8_bits(f, fmt) != 0x7f;
      } else if (std::isinf(f)) {
        wrong += gc::detail::float_to_fp8_bits(f, fmt) != (fmt.max_finite | (code & 0x80u));  // SATFINITE
      } else {
        wrong += gc::detail::float_to_fp8_bits(f, fmt) != code;
      }
    }
    EXPECT_EQ(wrong, 0) << "exponent bits " << fmt.exponent_bits;
    auto encode = [fmt](float f) { return unsigned{gc::detail::float_to_fp8_bits(f, fmt)}; };
    auto decode = [fmt](unsigned c) { return gc::detail::fp8_bits_to_float(static_cast<std::uint8_t>(c), fmt); };
    EXPECT_EQ(check_rne_between_neighbours(fmt.max_finite, encode, decode), 0) << "exponent bits " << fmt.exponent_bits;
    EXPECT_EQ(encode(1e9f), fmt.max_finite);
    EXPECT_EQ(encode(-1e9f), fmt.max_finite | 0x80u);
  }
  EXPECT_EQ(static_cast<float>(gc::Float8E4M3(448.0f)), 448.0f);
  EXPECT_EQ(static_cast<float>(gc::Float8E5M2(57344.0f)), 57344.0f);
  EXPECT_EQ(static_cast<float>(gc::Float8E4M3(0.0f)), 0.0f);
}

#if GPUCLOUD_TEST_CUDA_REFERENCE
// Every float whose top 24 bits take each value (all exponents, signs and leading mantissa
// bits) with several low-bit patterns, which hit every rounding case of every target format.
template <class Check>
int sweep_floats(Check check) {
  int wrong = 0;
  for (std::uint32_t high = 0; high < (1u << 24); ++high) {
    for (std::uint32_t low : {0x00u, 0x01u, 0x7fu, 0x80u, 0x81u, 0xffu}) {
      const std::uint32_t bits = (high << 8) | low;
      wrong += check(bits_as_float(bits)) ? 0 : 1;
    }
  }
  return wrong;
}

TEST(Half, MatchesCudaFloat2HalfRnBitForBit) {
  int wrong = sweep_floats([](float f) {
    const __half h = __float2half_rn(f);
    std::uint16_t ref;
    std::memcpy(&ref, &h, 2);
    return gc::detail::float_to_half_bits(f) == ref;
  });
  EXPECT_EQ(wrong, 0);
  for (unsigned bits = 0; bits <= 0xffff; ++bits) {
    const auto b = static_cast<std::uint16_t>(bits);
    __half_raw raw;
    raw.x = b;
    const __half h(raw);
    const float ref = __half2float(h), ours = gc::detail::half_bits_to_float(b);
    wrong += std::isnan(ref) ? !std::isnan(ours) : float_as_bits(ref) != float_as_bits(ours);
  }
  EXPECT_EQ(wrong, 0);
}

TEST(BFloat16, MatchesCudaFloat2Bfloat16RnBitForBit) {
  const int wrong = sweep_floats([](float f) {
    const __nv_bfloat16 h = __float2bfloat16_rn(f);
    std::uint16_t ref;
    std::memcpy(&ref, &h, 2);
    return gc::detail::float_to_bfloat16_bits(f) == ref;
  });
  EXPECT_EQ(wrong, 0);
}

TEST(Float8, MatchesCudaSatfiniteConversionBitForBit) {
  const int wrong = sweep_floats([](float f) {
    return gc::detail::float_to_fp8_bits(f, gc::detail::kE4M3()) ==
               __nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E4M3) &&
           gc::detail::float_to_fp8_bits(f, gc::detail::kE5M2()) == __nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E5M2);
  });
  EXPECT_EQ(wrong, 0);
  int decode_wrong = 0;
  for (unsigned code = 0; code <= 0xff; ++code) {
    for (auto [fmt, interp] : {std::pair{gc::detail::kE4M3(), __NV_E4M3}, std::pair{gc::detail::kE5M2(), __NV_E5M2}}) {
      const __half_raw raw = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(code), interp);
      const float ref = gc::detail::half_bits_to_float(raw.x);
      const float ours = gc::detail::fp8_bits_to_float(static_cast<std::uint8_t>(code), fmt);
      decode_wrong += std::isnan(ref) ? !std::isnan(ours) : ref != ours;
    }
  }
  EXPECT_EQ(decode_wrong, 0);
}
#endif
