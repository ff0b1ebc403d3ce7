// The MPI backend's element-wise reduction and an average's division (src/comm/host_reduce.cpp, internal: compiled into
// this test with the library's flags), against the scalar arithmetic it replaced: every dtype and op, random bit
// patterns (NaN, infinities, subnormals, integer extremes), lengths around every vector width, buffers not aligned to
// the element, and in place on either input.
#include "comm/host_reduce.hpp"

#include <gpucloud/detail/float_bits.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

namespace gc = gpucloud;
namespace gd = gpucloud::detail;

namespace {

// The reference, one element: what the scalar loop computed (fp16/bf16 through fp32, rounded once;
// integer sums wrap).
template <class T>
T apply(T x, T y, gc::ReduceOp op) {
  if (op == gc::ReduceOp::max) return x > y ? x : y;
  if (op == gc::ReduceOp::min) return x < y ? x : y;
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(x) + static_cast<U>(y));
  } else {
    return x + y;
  }
}

std::uint16_t apply_narrow(std::uint16_t x, std::uint16_t y, bool half, gc::ReduceOp op) {
  const float a = half ? gd::half_bits_to_float(x) : gd::bfloat16_bits_to_float(x);
  const float b = half ? gd::half_bits_to_float(y) : gd::bfloat16_bits_to_float(y);
  const float r = apply(a, b, op);
  return half ? gd::float_to_half_bits(r) : gd::float_to_bfloat16_bits(r);
}

template <class T>
bool nan_bits(const unsigned char* p) {
  if constexpr (std::is_floating_point_v<T>) {
    T v;
    std::memcpy(&v, p, sizeof v);
    return std::isnan(v);
  } else {
    return false;
  }
}

// One case: n elements of T at byte offset `skew` in each buffer; out separate, on mine, or on partial.
template <class T>
void check(gc::DType t, gc::ReduceOp op, std::int64_t n, std::size_t skew, int where, std::mt19937_64& rng) {
  const std::size_t bytes = static_cast<std::size_t>(n) * sizeof(T);
  std::vector<unsigned char> partial(bytes + skew), mine(bytes + skew), out(bytes + skew, 0xa5);
  for (auto& b : partial) b = static_cast<unsigned char>(rng());
  for (auto& b : mine) b = static_cast<unsigned char>(rng());
  // Some equal pairs and some ordinary values between the random bits, so max/min ties and finite sums occur.
  for (std::int64_t i = 0; i < n; i += 3) {
    std::memcpy(mine.data() + skew + static_cast<std::size_t>(i) * sizeof(T),
                partial.data() + skew + static_cast<std::size_t>(i) * sizeof(T), sizeof(T));
  }
  // Zeros of opposite signs (equal, but not the same bits): which one max and min keep shows their order.
  if constexpr (!std::is_integral_v<T> || std::is_same_v<T, std::uint16_t>) {
    const T negative_zero = std::is_same_v<T, std::uint16_t> ? T(0x8000) : T(-0.0);
    for (std::int64_t i = 1; i < n; i += 5) {
      const std::size_t at = skew + static_cast<std::size_t>(i) * sizeof(T);
      const T zero{};
      std::memcpy(partial.data() + at, i % 2 ? &zero : &negative_zero, sizeof(T));
      std::memcpy(mine.data() + at, i % 2 ? &negative_zero : &zero, sizeof(T));
    }
  }
  std::vector<unsigned char> expected(bytes);
  for (std::int64_t i = 0; i < n; ++i) {
    const std::size_t at = static_cast<std::size_t>(i) * sizeof(T);
    T a, b, r;
    std::memcpy(&a, partial.data() + skew + at, sizeof(T));
    std::memcpy(&b, mine.data() + skew + at, sizeof(T));
    if constexpr (std::is_same_v<T, std::uint16_t>) {
      r = apply_narrow(a, b, t == gc::DType::float16, op);
    } else {
      r = apply(a, b, op);
    }
    std::memcpy(expected.data() + at, &r, sizeof(T));
  }
  unsigned char* target = where == 0 ? out.data() : where == 1 ? mine.data() : partial.data();
  gd::reduce_elements(partial.data() + skew, mine.data() + skew, target + skew, n, t, op);
  const std::string what = "dtype " + std::to_string(static_cast<int>(t)) + " op " +
                           std::to_string(static_cast<int>(op)) + " n " + std::to_string(n) + " skew " +
                           std::to_string(skew) + " into " + std::to_string(where);
  for (std::int64_t i = 0; i < n; ++i) {
    const unsigned char* got = target + skew + static_cast<std::size_t>(i) * sizeof(T);
    const unsigned char* want = expected.data() + static_cast<std::size_t>(i) * sizeof(T);
    // Two NaNs added: x86 returns one of them, which depends on the operand order the compiler chose.
    if (nan_bits<T>(want) && nan_bits<T>(got)) continue;
    ASSERT_EQ(0, std::memcmp(got, want, sizeof(T))) << what << " element " << i;
  }
  if (where == 0) {  // nothing written outside the n elements
    for (std::size_t k = 0; k < skew; ++k) ASSERT_EQ(out[k], 0xa5) << what;
  }
}

template <class T>
void check_all(gc::DType t) {
  std::mt19937_64 rng(static_cast<unsigned>(t) * 7919u + 1);
  const gc::ReduceOp ops[] = {gc::ReduceOp::sum, gc::ReduceOp::average, gc::ReduceOp::max, gc::ReduceOp::min};
  const std::int64_t lengths[] = {0, 1, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 1000, 4099};
  for (const auto op : ops) {
    for (const auto n : lengths) {
      for (const std::size_t skew : {std::size_t{0}, std::size_t{1}, sizeof(T) + 2}) {
        for (int where = 0; where < 3; ++where) check<T>(t, op, n, skew, where, rng);
      }
    }
  }
}

}  // namespace

TEST(HostReduce, Float32) { check_all<float>(gc::DType::float32); }
TEST(HostReduce, Float64) { check_all<double>(gc::DType::float64); }
TEST(HostReduce, Int32) { check_all<std::int32_t>(gc::DType::int32); }
TEST(HostReduce, Int64) { check_all<std::int64_t>(gc::DType::int64); }
TEST(HostReduce, Float16) { check_all<std::uint16_t>(gc::DType::float16); }
TEST(HostReduce, BFloat16) { check_all<std::uint16_t>(gc::DType::bfloat16); }

// Every fp16 and bf16 pair from a spread of bit patterns (all exponents, both signs, NaN, inf), summed.
TEST(HostReduce, NarrowSumsOfEveryExponent) {
  for (const bool half : {true, false}) {
    std::vector<std::uint16_t> a, b;
    for (std::uint32_t x = 0; x < 65536; x += 97) {
      for (std::uint32_t y = 0; y < 65536; y += 1031) {
        a.push_back(static_cast<std::uint16_t>(x));
        b.push_back(static_cast<std::uint16_t>(y));
      }
    }
    std::vector<std::uint16_t> out(a.size());
    gd::reduce_elements(reinterpret_cast<const unsigned char*>(a.data()),
                        reinterpret_cast<const unsigned char*>(b.data()), reinterpret_cast<unsigned char*>(out.data()),
                        static_cast<std::int64_t>(a.size()), half ? gc::DType::float16 : gc::DType::bfloat16,
                        gc::ReduceOp::sum);
    for (std::size_t i = 0; i < a.size(); ++i) {
      ASSERT_EQ(out[i], apply_narrow(a[i], b[i], half, gc::ReduceOp::sum))
          << (half ? "fp16 " : "bf16 ") << a[i] << " + " << b[i];
    }
  }
}

// An average's division: every floating dtype, random bits and every exponent, against the element
// times 1 / size in fp64 rounded once (fp16/bf16 through fp32), as the scalar loop computed.
TEST(HostReduce, DivideByTheRanks) {
  std::mt19937_64 rng(42);
  for (const int size : {2, 3, 7, 8}) {
    for (const std::int64_t n : {std::int64_t{0}, std::int64_t{1}, std::int64_t{17}, std::int64_t{4099}}) {
      std::vector<float> f(static_cast<std::size_t>(n));
      std::vector<double> d(static_cast<std::size_t>(n));
      std::vector<std::uint16_t> h(static_cast<std::size_t>(n)), b(static_cast<std::size_t>(n));
      for (std::int64_t i = 0; i < n; ++i) {
        const auto bits = rng();
        const auto f32 = static_cast<std::uint32_t>(bits);
        std::memcpy(&f[static_cast<std::size_t>(i)], &f32, sizeof f32);
        std::memcpy(&d[static_cast<std::size_t>(i)], &bits, sizeof bits);
        h[static_cast<std::size_t>(i)] = static_cast<std::uint16_t>(bits >> 16);
        b[static_cast<std::size_t>(i)] = static_cast<std::uint16_t>(bits >> 32);
      }
      const auto f0 = f;
      const auto d0 = d;
      const auto h0 = h;
      const auto b0 = b;
      gd::divide_elements(reinterpret_cast<unsigned char*>(f.data()), n, gc::DType::float32, size);
      gd::divide_elements(reinterpret_cast<unsigned char*>(d.data()), n, gc::DType::float64, size);
      gd::divide_elements(reinterpret_cast<unsigned char*>(h.data()), n, gc::DType::float16, size);
      gd::divide_elements(reinterpret_cast<unsigned char*>(b.data()), n, gc::DType::bfloat16, size);
      const double inv = 1.0 / size;
      for (std::size_t i = 0; i < static_cast<std::size_t>(n); ++i) {
        const float fw = static_cast<float>(f0[i] * inv);
        const double dw = d0[i] * inv;
        if (!(std::isnan(fw) && std::isnan(f[i]))) {
          ASSERT_EQ(0, std::memcmp(&fw, &f[i], sizeof fw)) << i;
        }
        if (!(std::isnan(dw) && std::isnan(d[i]))) {
          ASSERT_EQ(0, std::memcmp(&dw, &d[i], sizeof dw)) << i;
        }
        ASSERT_EQ(h[i], gd::float_to_half_bits(static_cast<float>(gd::half_bits_to_float(h0[i]) * inv))) << i;
        ASSERT_EQ(b[i], gd::float_to_bfloat16_bits(static_cast<float>(gd::bfloat16_bits_to_float(b0[i]) * inv))) << i;
      }
    }
  }
  std::int32_t ints[3] = {7, -9, 11};  // integer dtypes are left alone
  gd::divide_elements(reinterpret_cast<unsigned char*>(ints), 3, gc::DType::int32, 2);
  EXPECT_EQ(ints[0], 7);
  EXPECT_EQ(ints[1], -9);
  EXPECT_EQ(ints[2], 11);
}
