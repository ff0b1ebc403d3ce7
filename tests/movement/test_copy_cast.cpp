// Copies between every pair of memory kinds, and the cast/fill kernels, on every device.
#include <gpucloud/compute/cast.hpp>
#include <gpucloud/compute/gemm.hpp>
#include <gpucloud/compute/nn_ops.hpp>
#include <gpucloud/memory/buffer.hpp>
#include <gpucloud/movement/copy.hpp>
#include <gpucloud/runtime/error.hpp>
#include <gpucloud/runtime/stream.hpp>

#include <gtest/gtest.h>

#include "buffer_values.hpp"
#include "device_cases.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <future>
#include <limits>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

namespace gc = gpucloud;

namespace {
std::vector<gc::MemoryKind> kinds_on(gc::Device d) {
  if (d.is_host())
    return {gc::MemoryKind::host, gc::MemoryKind::pinned, gc::MemoryKind::device, gc::MemoryKind::managed};
  return {gc::MemoryKind::device, gc::MemoryKind::managed};
}

gc::Device home_of(gc::MemoryKind kind, gc::Device d) {
  return kind == gc::MemoryKind::host || kind == gc::MemoryKind::pinned ? gc::Device::host() : d;
}

// Host-readable staging for any device.
gc::Buffer staging(std::size_t n, gc::DType t) { return gc::Buffer(n, t, gc::Device::host(), gc::MemoryKind::pinned); }

}  // namespace

using gc::testing::download;
using gc::testing::upload;

class CopyTest : public gc::testing::OnEveryDevice {};

TEST_P(CopyTest, EveryPairOfKindsIsByteIdentical) {
  gc::Stream s(device());
  std::vector<gc::MemoryKind> all = kinds_on(device());
  if (device().is_cuda()) all.push_back(gc::MemoryKind::pinned);
  std::mt19937 rng(42);
  for (std::size_t n : {0u, 1u, 1000u, (1u << 20) + 3u}) {
    std::vector<std::uint8_t> data(n);
    for (auto& x : data) x = static_cast<std::uint8_t>(rng());
    int wrong = 0;
    for (auto from : all) {
      for (auto to : all) {
        gc::Buffer a(n, gc::DType::uint8, home_of(from, device()), from);
        gc::Buffer b(n, gc::DType::uint8, home_of(to, device()), to);
        gc::Buffer in = staging(n, gc::DType::uint8);
        if (n) std::memcpy(in.data(), data.data(), n);
        gc::copy(a, in, s);
        gc::copy(b, a, s);
        wrong += download<std::uint8_t>(b, s) != data;
      }
    }
    EXPECT_EQ(wrong, 0) << "n=" << n;
  }
}

TEST_P(CopyTest, BadCopiesAreRejectedBeforeAnythingIsEnqueued) {
  gc::Stream s(device());
  gc::TypedBuffer<float> a(10, device()), b(10, device()), shorter(9, device());
  gc::TypedBuffer<std::int32_t> ints(10, device());
  auto message = [&](gc::BufferView dst, gc::BufferView src) {
    try {
      gc::copy(dst, src, s);
    } catch (const gc::InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message(a, ints).find("dtype"), std::string::npos);
  EXPECT_NE(message(a, shorter).find("9 elements"), std::string::npos);
  EXPECT_NE(message(gc::BufferView(a).slice(0, 6), gc::BufferView(a).slice(4, 6)).find("overlaps"), std::string::npos);
  EXPECT_TRUE(s.query());  // nothing was enqueued
  if (device().is_cuda()) {
    gc::Stream host_stream;
    EXPECT_NE(message(a, b).find("no error"), std::string::npos);
    try {
      gc::copy(a, b, host_stream);
      FAIL() << "GPU memory on a host stream";
    } catch (const gc::InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("cuda:0"), std::string::npos) << e.what();
    }
  }
  s.synchronize();
}

GPUCLOUD_INSTANTIATE_ON_EVERY_DEVICE(CopyTest);

// Host copies of up to 4 MiB on an idle stream run on the calling thread (as CUDA runs a
// host-to-host cudaMemcpyAsync); behind queued work, or an error, they wait their turn.
TEST(HostCopy, OnAnIdleStreamASmallCopyHasRunWhenCopyReturns) {
  gc::Stream s;
  for (std::size_t bytes : {std::size_t{1}, std::size_t{4096}, std::size_t{4} << 20}) {
    gc::Buffer src(bytes, gc::DType::uint8, gc::Device::host()), dst(bytes, gc::DType::uint8, gc::Device::host());
    std::memset(src.data(), 7, bytes);
    std::memset(dst.data(), 0, bytes);
    gc::copy(dst, src, s);
    EXPECT_TRUE(s.query()) << bytes;
    EXPECT_EQ(std::memcmp(dst.data(), src.data(), bytes), 0) << bytes;
  }
  s.synchronize();
}

TEST(HostCopy, ACopyBehindQueuedWorkWaitsForItAndSeesWhatItWrote) {
  gc::Stream s;
  constexpr std::size_t n = 1 << 16;
  gc::TypedBuffer<float> src(n, gc::Device::host()), dst(n, gc::Device::host());
  std::fill(src.begin(), src.end(), 1.0f);
  std::fill(dst.begin(), dst.end(), 0.0f);
  std::promise<void> release;
  std::shared_future<void> gate = release.get_future().share();
  gc::launch_host_func(s, [gate, &src] {
    gate.wait();
    std::fill(src.begin(), src.end(), 2.0f);  // the copy behind must see this
  });
  gc::copy(dst, src, s);  // the stream is busy: queued, not run in place
  EXPECT_FALSE(s.query());
  EXPECT_EQ(dst[0], 0.0f);
  release.set_value();
  s.synchronize();
  EXPECT_EQ(dst[0], 2.0f);
  EXPECT_EQ(dst[n - 1], 2.0f);
}

// Small fills, casts, GEMMs and the nn kernels run in place on an idle host stream too, and
// queue behind earlier work like any other.
TEST(HostInPlace, SmallKernelsOnAnIdleStreamHaveRunWhenTheCallReturnsAndQueueBehindWork) {
  gc::Stream s;
  constexpr std::int64_t n = 64;
  gc::TypedBuffer<float> a(n * n, gc::Device::host()), b(n * n, gc::Device::host()), c(n * n, gc::Device::host());
  gc::TypedBuffer<float> loss(1, gc::Device::host()), grad(n * n, gc::Device::host()), bias(n, gc::Device::host());
  gc::Buffer half(static_cast<std::size_t>(n * n), gc::DType::float16, gc::Device::host());
  gc::GemmArgs g;
  g.m = g.n = g.k = n;
  auto all_calls = [&] {
    gc::fill(a, 0.5, s);
    gc::fill(b, 2.0, s);
    gc::gemm(c, a, b, g, s);  // each entry: 64 * 0.5 * 2 = 64
    gc::cast(half, c, s);
    gc::mse_loss(c, a, loss, grad, s);
    gc::relu_backward(grad, c, s);
    gc::bias_grad(grad, n, n, bias, s);
  };
  all_calls();
  EXPECT_TRUE(s.query());  // everything ran before the calls returned
  EXPECT_EQ(c[0], 64.0f);
  EXPECT_EQ(static_cast<const std::uint16_t*>(half.data())[0], 0x5400);  // 64 in fp16
  EXPECT_GT(loss[0], 0.0f);
  const float first_loss = loss[0], first_bias = bias[0];
  // Behind queued work the same calls wait their turn and give the same answers.
  std::fill(c.begin(), c.end(), 0.0f);
  loss[0] = 0.0f;
  bias[0] = 0.0f;
  std::promise<void> release;
  std::shared_future<void> gate = release.get_future().share();
  gc::launch_host_func(s, [gate] { gate.wait(); });
  all_calls();
  EXPECT_FALSE(s.query());
  EXPECT_EQ(c[0], 0.0f);
  release.set_value();
  s.synchronize();
  EXPECT_EQ(c[0], 64.0f);
  EXPECT_EQ(loss[0], first_loss);
  EXPECT_EQ(bias[0], first_bias);
}

TEST(HostCopy, ACopyBehindAFailureIsSkippedNotRunInPlace) {
  gc::Stream s;
  gc::TypedBuffer<int> src(16, gc::Device::host()), dst(16, gc::Device::host());
  std::fill(src.begin(), src.end(), 5);
  std::fill(dst.begin(), dst.end(), 0);
  gc::launch_host_func(s, [] { throw std::runtime_error("the step before failed"); });
  while (!s.query()) std::this_thread::yield();  // the failure has happened; the stream is idle
  gc::copy(dst, src, s);
  EXPECT_THROW(s.synchronize(), std::runtime_error);
  EXPECT_EQ(dst[0], 0);   // discarded with the work behind the failure
  gc::copy(dst, src, s);  // the error was reported: copies run again
  s.synchronize();
  EXPECT_EQ(dst[0], 5);
}

class CastTest : public gc::testing::OnEveryDevice {};

TEST_P(CastTest, FloatToIntegerTruncatesAndSaturates) {
  gc::Stream s(device());
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> x = {-2.7f, 2.7f, 1e10f, -1e10f, std::nanf(""), inf, -inf, 300.0f, -5.0f, 0.0f};
  gc::Buffer src = upload(x, device(), s);
  gc::Buffer i32(x.size(), gc::DType::int32, device(), gc::MemoryKind::device, s);
  gc::Buffer u8(x.size(), gc::DType::uint8, device(), gc::MemoryKind::device, s);
  gc::cast(i32, src, s);
  gc::cast(u8, src, s);
  const auto imax = std::numeric_limits<std::int32_t>::max(), imin = std::numeric_limits<std::int32_t>::min();
  EXPECT_EQ(download<std::int32_t>(i32, s), (std::vector<std::int32_t>{-2, 2, imax, imin, 0, imax, imin, 300, -5, 0}));
  EXPECT_EQ(download<std::uint8_t>(u8, s), (std::vector<std::uint8_t>{0, 2, 255, 0, 0, 255, 0, 255, 0, 0}));
}

TEST_P(CastTest, IntegersSaturateAndWidenExactly) {
  gc::Stream s(device());
  const std::vector<std::int64_t> x = {std::int64_t{1} << 40, -(std::int64_t{1} << 40), 123, -1,
                                       (std::int64_t{1} << 24) + 1};
  gc::Buffer src = upload(x, device(), s);
  gc::Buffer i32(x.size(), gc::DType::int32, device(), gc::MemoryKind::device, s);
  gc::Buffer f64(x.size(), gc::DType::float64, device(), gc::MemoryKind::device, s);
  gc::Buffer f32(x.size(), gc::DType::float32, device(), gc::MemoryKind::device, s);
  gc::cast(i32, src, s);
  gc::cast(f64, src, s);
  gc::cast(f32, src, s);
  const auto imax = std::numeric_limits<std::int32_t>::max(), imin = std::numeric_limits<std::int32_t>::min();
  EXPECT_EQ(download<std::int32_t>(i32, s), (std::vector<std::int32_t>{imax, imin, 123, -1, (1 << 24) + 1}));
  EXPECT_EQ(download<double>(f64, s), (std::vector<double>{1099511627776.0, -1099511627776.0, 123, -1, 16777217.0}));
  // 2^24 + 1 is a tie between 2^24 and 2^24 + 2: even mantissa wins.
  EXPECT_EQ(download<float>(f32, s)[4], 16777216.0f);
}

TEST_P(CastTest, NarrowFloatsRoundOnceToNearestEven) {
  gc::Stream s(device());
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-70000.0f, 70000.0f);
  std::vector<float> x(100003);  // not a multiple of the block size
  for (auto& v : x) v = dist(rng) * std::ldexp(1.0f, static_cast<int>(rng() % 40) - 30);
  x[0] = 65520.0f;                     // rounds to fp16 infinity
  x[1] = 1.0f + std::ldexp(1.0f, -8);  // bf16 tie: stays 1.0
  gc::Buffer src = upload(x, device(), s);
  gc::Buffer h(x.size(), gc::DType::float16, device(), gc::MemoryKind::device, s);
  gc::Buffer b(x.size(), gc::DType::bfloat16, device(), gc::MemoryKind::device, s);
  gc::Buffer e4(x.size(), gc::DType::float8_e4m3, device(), gc::MemoryKind::device, s);
  gc::Buffer back(x.size(), gc::DType::float32, device(), gc::MemoryKind::device, s);
  gc::cast(h, src, s);
  gc::cast(b, src, s);
  gc::cast(e4, src, s);
  gc::cast(back, h, s);
  const auto hv = download<gc::Half>(h, s);
  const auto bv = download<gc::BFloat16>(b, s);
  const auto ev = download<gc::Float8E4M3>(e4, s);
  const auto backv = download<float>(back, s);
  int wrong = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float f = x[i];
    // Within half an ulp of the format (relative 2^-11 for fp16, 2^-8 bf16, 2^-4 e4m3) or saturated.
    const float hf = static_cast<float>(hv[i]);
    wrong += !(std::isinf(hf) ? std::fabs(f) >= 65520.0f
                              : std::fabs(hf - f) <= std::ldexp(std::fabs(f), -11) + std::ldexp(1.0f, -25));
    wrong += !(std::fabs(static_cast<float>(bv[i]) - f) <= std::ldexp(std::fabs(f), -8));
    const float ef = static_cast<float>(ev[i]);
    wrong += !(std::fabs(f) >= 448.0f ? std::fabs(ef) == 448.0f
                                      : std::fabs(ef - f) <= std::ldexp(std::fabs(f), -4) + std::ldexp(1.0f, -10));
    wrong += backv[i] != hf && !(std::isnan(backv[i]) && std::isnan(hf));
  }
  EXPECT_EQ(wrong, 0);
  EXPECT_EQ(hv[0].bits, 0x7c00u);
  EXPECT_EQ(bv[1].bits, 0x3f80u);
}

// Every fp16 and bf16 value widened, and floats of every exponent (random mantissas, the rounding
// boundaries, subnormals, infinities and NaNs with payloads) narrowed: bit for bit the scalar
// conversions (the host converts whole arrays with branch-free loops; the GPU with its own).
TEST_P(CastTest, SixteenBitConversionsMatchTheScalarOnesBitForBit) {
  gc::Stream s(device());
  std::vector<gc::Half> halves(65536);
  std::vector<gc::BFloat16> bf16s(65536);
  for (std::uint32_t i = 0; i < 65536; ++i) {
    halves[i] = gc::Half::from_bits(static_cast<std::uint16_t>(i));
    bf16s[i] = gc::BFloat16::from_bits(static_cast<std::uint16_t>(i));
  }
  std::vector<std::uint32_t> bits;
  std::mt19937 rng(11);
  for (std::uint32_t e = 0; e < 256; ++e) {
    for (std::uint32_t sign : {0u, 0x80000000u}) {
      for (std::uint32_t m : {0u, 1u, 0xfffu, 0x1000u, 0x1001u, 0x2fffu, 0x7fffu, 0x8000u, 0x8001u, 0x7fffffu}) {
        bits.push_back(sign | (e << 23) | m);
      }
      for (int k = 0; k < 64; ++k) bits.push_back(sign | (e << 23) | (rng() & 0x7fffffu));
    }
  }
  for (std::uint32_t b : {0x33000000u, 0x33000001u, 0x387fffffu, 0x38800000u, 0x477fefffu, 0x477ff000u, 0x7f800001u,
                          0x7fc00000u, 0xffc12345u}) {
    bits.push_back(b);
  }
  std::vector<float> floats(bits.size());
  std::memcpy(floats.data(), bits.data(), bits.size() * sizeof(float));
  gc::Buffer h = upload(halves, device(), s), b = upload(bf16s, device(), s), f = upload(floats, device(), s);
  gc::Buffer wide_h(65536, gc::DType::float32, device(), gc::MemoryKind::device, s);
  gc::Buffer wide_b(65536, gc::DType::float32, device(), gc::MemoryKind::device, s);
  gc::Buffer narrow_h(floats.size(), gc::DType::float16, device(), gc::MemoryKind::device, s);
  gc::Buffer narrow_b(floats.size(), gc::DType::bfloat16, device(), gc::MemoryKind::device, s);
  gc::cast(wide_h, h, s);
  gc::cast(wide_b, b, s);
  gc::cast(narrow_h, f, s);
  gc::cast(narrow_b, f, s);
  const auto wh = download<float>(wide_h, s), wb = download<float>(wide_b, s);
  const auto nh = download<gc::Half>(narrow_h, s);
  const auto nb = download<gc::BFloat16>(narrow_b, s);
  int wrong = 0;
  for (std::uint32_t i = 0; i < 65536; ++i) {
    const auto x = static_cast<std::uint16_t>(i);
    wrong += gc::detail::float_as_bits(wh[i]) != gc::detail::float_as_bits(gc::detail::half_bits_to_float(x));
    wrong += gc::detail::float_as_bits(wb[i]) != gc::detail::float_as_bits(gc::detail::bfloat16_bits_to_float(x));
  }
  for (std::size_t i = 0; i < floats.size(); ++i) {
    const bool h_ok = nh[i].bits == gc::detail::float_to_half_bits(floats[i]);
    const bool b_ok = nb[i].bits == gc::detail::float_to_bfloat16_bits(floats[i]);
    if (!h_ok || !b_ok) {
      ADD_FAILURE() << "float bits 0x" << std::hex << bits[i] << ": fp16 0x" << nh[i].bits << " bf16 0x" << nb[i].bits;
      if (++wrong > 10) break;
    }
  }
  EXPECT_EQ(wrong, 0);
}

TEST_P(CastTest, FillConvertsTheValueOnce) {
  gc::Stream s(device());
  gc::Buffer h(1000, gc::DType::float16, device(), gc::MemoryKind::device, s);
  gc::Buffer i(1000, gc::DType::int32, device(), gc::MemoryKind::device, s);
  gc::fill(h, 1.5, s);
  gc::fill(i, -3.9, s);
  for (const auto& v : download<gc::Half>(h, s)) ASSERT_EQ(v.bits, 0x3e00u);
  for (const auto& v : download<std::int32_t>(i, s)) ASSERT_EQ(v, -3);
}

TEST_P(CastTest, IntegerFillIsExactBeyondTwoToThe53) {
  gc::Stream s(device());
  gc::Buffer big(100, gc::DType::int64, device(), gc::MemoryKind::device, s);
  gc::Buffer small(100, gc::DType::int32, device(), gc::MemoryKind::device, s);
  const std::int64_t v = (std::int64_t{1} << 53) + 1;  // a double would round it to 2^53
  gc::fill(big, v, s);
  gc::fill(small, std::int64_t{1} << 40, s);  // saturates, as cast does
  for (auto x : download<std::int64_t>(big, s)) ASSERT_EQ(x, v);
  for (auto x : download<std::int32_t>(small, s)) ASSERT_EQ(x, std::numeric_limits<std::int32_t>::max());
  gc::fill(big, std::numeric_limits<std::int64_t>::min(), s);
  for (auto x : download<std::int64_t>(big, s)) ASSERT_EQ(x, std::numeric_limits<std::int64_t>::min());
}

TEST_P(CastTest, LargeInputsUseTheWholeGridStrideLoop) {
  gc::Stream s(device());
  const std::size_t n = 4096u * 256u * 2u + 17u;  // more elements than the grid has threads
  gc::Buffer a(n, gc::DType::int32, device(), gc::MemoryKind::device, s);
  gc::Buffer b(n, gc::DType::int64, device(), gc::MemoryKind::device, s);
  gc::fill(a, 9.0, s);
  gc::cast(b, a, s);
  const auto v = download<std::int64_t>(b, s);
  std::size_t wrong = 0;
  for (auto x : v) wrong += x != 9;
  EXPECT_EQ(wrong, 0u);
}

TEST_P(CastTest, BadCastsAreRejected) {
  gc::Stream s(device());
  gc::TypedBuffer<float> a(8, device()), b(7, device());
  EXPECT_THROW(gc::cast(a, b, s), gc::InvalidArgument);
  EXPECT_THROW(gc::cast(gc::BufferView(a).slice(0, 4), gc::BufferView(a).slice(2, 4), s), gc::InvalidArgument);
  if (device().is_cuda()) {
    // Pageable host memory is not reachable by a kernel.
    gc::TypedBuffer<float> pageable(8, gc::Device::host(), gc::MemoryKind::host);
    EXPECT_THROW(gc::cast(a, pageable, s), gc::InvalidArgument);
  }
  EXPECT_TRUE(s.query());
}

GPUCLOUD_INSTANTIATE_ON_EVERY_DEVICE(CastTest);

// On a GPU the two backends must agree bit for bit: the same bodies run on both.
TEST(CastBackends, CudaAndHostAgreeForEveryDtypePair) {
  if (gc::cuda_device_count() == 0) GTEST_SKIP() << "needs a CUDA device: " << gc::cuda_unavailable_reason();
  gc::Stream hs, cs(gc::Device::cuda(0));
  std::mt19937 rng(3);
  const std::size_t n = 4099;
  // Finite values over many magnitudes (NaN payloads legitimately differ between CPU and GPU).
  gc::Buffer base(n, gc::DType::float64, gc::Device::host(), gc::MemoryKind::pinned);
  std::uniform_real_distribution<double> dist(-1.0, 1.0);
  for (std::size_t i = 0; i < n; ++i)
    base.data_as<double>()[i] = dist(rng) * std::ldexp(1.0, static_cast<int>(rng() % 60) - 30);
  int wrong = 0;
  for (int from = 0; from < gc::kDTypeCount; ++from) {
    for (int to = 0; to < gc::kDTypeCount; ++to) {
      const auto ft = static_cast<gc::DType>(from), tt = static_cast<gc::DType>(to);
      gc::Buffer src_h(n, ft, gc::Device::host(), gc::MemoryKind::pinned);
      gc::cast(src_h, base, hs);
      gc::Buffer dst_h(n, tt, gc::Device::host(), gc::MemoryKind::pinned);
      gc::cast(dst_h, src_h, hs);
      hs.synchronize();
      gc::Buffer src_d(n, ft, gc::Device::cuda(0), gc::MemoryKind::device);
      gc::Buffer dst_d(n, tt, gc::Device::cuda(0), gc::MemoryKind::device);
      gc::Buffer out(n, tt, gc::Device::host(), gc::MemoryKind::pinned);
      gc::copy(src_d, src_h, cs);
      gc::cast(dst_d, src_d, cs);
      gc::copy(out, dst_d, cs);
      cs.synchronize();
      wrong += std::memcmp(out.data(), dst_h.data(), out.size_bytes()) != 0;
    }
  }
  EXPECT_EQ(wrong, 0);
}
