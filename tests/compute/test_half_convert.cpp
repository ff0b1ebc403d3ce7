// Every fp32 <-> fp16 array conversion this CPU runs (AVX-512F, F16C, the scalar loop), each
// against the reference scalar conversions of <gpucloud/detail/float_bits.hpp>: every half
// widened, floats of every exponent narrowed (rounding boundaries, subnormals, infinities, NaNs
// with payloads and signs), at lengths that leave every tail size.
#include "kernels/compute/host_convert.hpp"

#include <gpucloud/detail/float_bits.hpp>

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace h = gpucloud::kernels::host;
namespace d = gpucloud::detail;

TEST(HalfConversions, EveryVersionMatchesTheReferenceBitForBit) {
  std::vector<std::uint32_t> bits;
  std::mt19937 rng(5);
  for (std::uint32_t e = 0; e < 256; ++e) {
    for (std::uint32_t sign : {0u, 0x80000000u}) {
      for (std::uint32_t m :
           {0u, 1u, 0xfffu, 0x1000u, 0x1001u, 0x2fffu, 0x3000u, 0x7fffu, 0x8000u, 0x400000u, 0x7fffffu}) {
        bits.push_back(sign | (e << 23) | m);
      }
      for (int k = 0; k < 64; ++k) bits.push_back(sign | (e << 23) | (rng() & 0x7fffffu));
    }
  }
  std::vector<float> floats(bits.size());
  std::memcpy(floats.data(), bits.data(), bits.size() * sizeof(float));
  std::vector<std::uint16_t> halves(65536);
  for (std::uint32_t i = 0; i < 65536; ++i) halves[i] = static_cast<std::uint16_t>(i);

  const auto versions = h::half_conversions();
  ASSERT_FALSE(versions.empty());
  EXPECT_STREQ(versions.back().name, "scalar");
#if defined(__x86_64__) && defined(__GNUC__)
  // The widest the CPU runs is the one in use, and is among those compared here.
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq")) {
    EXPECT_STREQ(versions.front().name, "avx512bf16");
  } else if (__builtin_cpu_supports("avx512f")) {
    EXPECT_STREQ(versions.front().name, "avx512f");
  }
#endif
  for (const auto& v : versions) {
    SCOPED_TRACE(v.name);
    std::vector<float> wide(halves.size());
    v.widen(wide.data(), halves.data(), halves.size());
    int wrong = 0;
    for (std::uint32_t i = 0; i < 65536 && wrong < 10; ++i) {
      const std::uint32_t want = d::float_as_bits(d::half_bits_to_float(halves[i]));
      if (d::float_as_bits(wide[i]) != want) {
        ADD_FAILURE() << "half 0x" << std::hex << i << " widened to 0x" << d::float_as_bits(wide[i]) << ", not 0x"
                      << want;
        ++wrong;
      }
    }
    std::vector<std::uint16_t> narrow(floats.size());
    v.narrow(narrow.data(), floats.data(), floats.size());
    for (std::size_t i = 0; i < floats.size() && wrong < 10; ++i) {
      if (narrow[i] != d::float_to_half_bits(floats[i])) {
        ADD_FAILURE() << "float 0x" << std::hex << bits[i] << " narrowed to 0x" << narrow[i] << ", not 0x"
                      << d::float_to_half_bits(floats[i]);
        ++wrong;
      }
    }
    // Every tail length, and nothing written past the end.
    for (std::size_t n = 0; n <= 40; ++n) {
      std::vector<float> w(n + 1, 7.0f);
      v.widen(w.data(), halves.data() + 0x3c00, n);  // 1.0, 1.000977, ...
      for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(w[i], d::half_bits_to_float(halves[0x3c00 + i])) << n;
      ASSERT_EQ(w[n], 7.0f) << n;
      std::vector<std::uint16_t> o(n + 1, 0xabcd);
      v.narrow(o.data(), floats.data() + 1000, n);
      for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(o[i], d::float_to_half_bits(floats[1000 + i])) << n;
      ASSERT_EQ(o[n], 0xabcd) << n;
    }
  }
}

// Scaling in place (the loss scaler's unscale, the clipping coefficient): every fp16 and bf16
// value times factors that round, overflow and underflow, against widen / multiply / narrow of
// the reference conversions, and the inf-or-NaN flag for arrays with and without one.
TEST(HalfConversions, EveryVersionScalesAsTheReferenceAndFlagsInfAndNan) {
  for (const auto& v : h::half_conversions()) {
    SCOPED_TRACE(v.name);
    for (const bool bf16 : {false, true}) {
      for (const float factor : {1.0f / 65536.0f, 0.5f, 3.0f, 1.0f / 3.0f, 70000.0f}) {
        std::vector<std::uint16_t> x(65536);
        for (std::uint32_t i = 0; i < 65536; ++i) x[i] = static_cast<std::uint16_t>(i);
        const bool bad = bf16 ? v.scale_bf16(x.data(), x.size(), factor) : v.scale_half(x.data(), x.size(), factor);
        EXPECT_TRUE(bad) << "every 16-bit value includes infinities and NaNs";
        int wrong = 0;
        for (std::uint32_t i = 0; i < 65536 && wrong < 10; ++i) {
          const auto in = static_cast<std::uint16_t>(i);
          const std::uint16_t want = bf16 ? d::float_to_bfloat16_bits(d::bfloat16_bits_to_float(in) * factor)
                                          : d::float_to_half_bits(d::half_bits_to_float(in) * factor);
          if (x[i] != want) {
            ADD_FAILURE() << (bf16 ? "bf16" : "fp16") << " 0x" << std::hex << i << " * " << factor << " = 0x" << x[i]
                          << ", not 0x" << want;
            ++wrong;
          }
        }
      }
      // Finite values only (every length's tail too): no flag; one inf or NaN anywhere: the flag.
      for (std::size_t n : {std::size_t{0}, std::size_t{7}, std::size_t{16}, std::size_t{37}}) {
        std::vector<std::uint16_t> x(n, bf16 ? 0x3f80 : 0x3c00);  // 1.0
        EXPECT_FALSE(bf16 ? v.scale_bf16(x.data(), n, 2.0f) : v.scale_half(x.data(), n, 2.0f)) << n;
        for (std::size_t at = 0; at < n; at += 5) {
          std::vector<std::uint16_t> y(n, bf16 ? 0x3f80 : 0x3c00);
          y[at] = bf16 ? 0x7f80 : 0x7c00;  // inf
          EXPECT_TRUE(bf16 ? v.scale_bf16(y.data(), n, 2.0f) : v.scale_half(y.data(), n, 2.0f)) << n << " " << at;
        }
      }
    }
  }
}
