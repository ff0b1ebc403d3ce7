// GEMM on every device against a float64 reference: random shapes (1, primes, non-multiples of 8,
// K = 0), every transpose combination, strided batches, every epilogue and precision; outputs
// poisoned with NaN before each run so unwritten elements fail; bad input rejected up front.
#include <gpucloud/compute/cast.hpp>
#include <gpucloud/compute/gemm.hpp>
#include <gpucloud/memory/buffer.hpp>
#include <gpucloud/movement/copy.hpp>
#include <gpucloud/runtime/error.hpp>
#include <gpucloud/runtime/gpu_specs.hpp>
#include <gpucloud/runtime/stream.hpp>

#include <gtest/gtest.h>

#include "buffer_values.hpp"
#include "compute/gemm/alignment.hpp"
#include "compute/gemm/host/host_sgemm.hpp"
#include "device_cases.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace gc = gpucloud;

namespace {

struct Precision {
  gc::DType in;
  gc::DType out;
  bool tf32;
  double tolerance;
  const char* name;
};

const Precision kPrecisions[] = {
    {gc::DType::float32, gc::DType::float32, false, 1e-5, "fp32"},
    {gc::DType::float32, gc::DType::float32, true, 2e-3, "tf32"},
    {gc::DType::float16, gc::DType::float32, false, 1e-2, "fp16->fp32"},
    {gc::DType::float16, gc::DType::float16, false, 1e-2, "fp16->fp16"},
    {gc::DType::bfloat16, gc::DType::bfloat16, false, 1e-2, "bf16->bf16"},
    {gc::DType::bfloat16, gc::DType::float32, false, 1e-2, "bf16->fp32"},
};

using gc::testing::make;
using gc::testing::read;

double gelu(double x) { return 0.5 * x * (1 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }

struct Problem {
  gc::GemmArgs args;
  std::vector<float> a, b, c0, bias;  // as generated (C's previous value, bias)
};

// Float64 reference of the whole (batched) product, from @p a and @p b (which may be the
// inputs rounded to their dtype), and relative Frobenius error of @p got against it.
double relative_error(const Problem& p, const std::vector<float>& a, const std::vector<float>& b,
                      const std::vector<float>& got) {
  const auto& g = p.args;
  double diff = 0, norm = 0;
  for (std::int64_t q = 0; q < g.batch; ++q) {
    for (std::int64_t i = 0; i < g.m; ++i) {
      for (std::int64_t j = 0; j < g.n; ++j) {
        double acc = 0;
        for (std::int64_t l = 0; l < g.k; ++l) {
          const double av =
              g.trans_a == gc::Transpose::none ? a[q * g.stride_a + i * g.lda + l] : a[q * g.stride_a + l * g.lda + i];
          const double bv =
              g.trans_b == gc::Transpose::none ? b[q * g.stride_b + l * g.ldb + j] : b[q * g.stride_b + j * g.ldb + l];
          acc += av * bv;
        }
        const std::int64_t ci = q * g.stride_c + i * g.ldc + j;
        double v = g.alpha * acc + (g.beta != 0 ? g.beta * p.c0[ci] : 0.0);
        if (!p.bias.empty()) v += p.bias[j];
        if (g.epilogue == gc::Epilogue::relu || g.epilogue == gc::Epilogue::bias_relu) v = std::max(v, 0.0);
        if (g.epilogue == gc::Epilogue::gelu || g.epilogue == gc::Epilogue::bias_gelu) v = gelu(v);
        if (std::isnan(got[ci])) return INFINITY;  // an unwritten (poisoned) or NaN element never passes
        diff += (got[ci] - v) * (got[ci] - v);
        norm += v * v;
      }
    }
  }
  return norm == 0 ? std::sqrt(diff) : std::sqrt(diff / norm);
}

Problem random_problem(std::mt19937& rng, std::int64_t m, std::int64_t n, std::int64_t k, gc::Transpose ta,
                       gc::Transpose tb, std::int64_t batch, gc::Epilogue epilogue, float beta) {
  Problem p;
  auto& g = p.args;
  g.m = m;
  g.n = n;
  g.k = k;
  g.trans_a = ta;
  g.trans_b = tb;
  g.batch = batch;
  g.alpha = 0.75f;
  g.beta = beta;
  g.epilogue = epilogue;
  const std::int64_t rows_a = ta == gc::Transpose::none ? m : k, cols_a = ta == gc::Transpose::none ? k : m;
  const std::int64_t rows_b = tb == gc::Transpose::none ? k : n, cols_b = tb == gc::Transpose::none ? n : k;
  g.lda = cols_a + (rng() % 2) * 3;  // sometimes padded rows
  g.ldb = cols_b + (rng() % 2) * 5;
  g.ldc = n + (rng() % 2) * 2;
  g.stride_a = rows_a * g.lda + 7;
  g.stride_b = rows_b * g.ldb;
  g.stride_c = m * g.ldc + 3;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto fill = [&](std::vector<float>& v, std::size_t count) {
    v.resize(count);
    for (auto& x : v) x = normal(rng);
  };
  fill(p.a, static_cast<std::size_t>(std::max<std::int64_t>(1, batch * g.stride_a)));
  fill(p.b, static_cast<std::size_t>(std::max<std::int64_t>(1, batch * g.stride_b)));
  fill(p.c0, static_cast<std::size_t>(batch * g.stride_c));
  if (epilogue == gc::Epilogue::bias || epilogue == gc::Epilogue::bias_relu || epilogue == gc::Epilogue::bias_gelu) {
    fill(p.bias, static_cast<std::size_t>(n));
  }
  return p;
}

// Runs @p p in @p prec on @p d; returns C as float.
std::vector<float> run(const Problem& p, const Precision& prec, gc::Device d, gc::StreamView s, float scale_a = 1,
                       float scale_b = 1, gc::DType in_override = gc::DType::uint8) {
  const gc::DType in = in_override == gc::DType::uint8 ? prec.in : in_override;
  gc::Buffer a = make(p.a, in, d, s), b = make(p.b, in, d, s);
  gc::Buffer c = make(p.c0, prec.out, d, s);
  if (p.args.beta == 0.0f) gc::fill(c, std::nan(""), s);  // poison: C must not be read, every element written
  gc::Buffer bias;
  gc::GemmArgs args = p.args;
  args.tf32 = prec.tf32;
  args.scale_a = scale_a;
  args.scale_b = scale_b;
  if (!p.bias.empty()) {
    bias = make(p.bias, gc::DType::float32, d, s);
    args.bias = bias;
  }
  gc::gemm(c, a, b, args, s);
  return read(c, s);
}

}  // namespace

class GemmTest : public gc::testing::OnEveryDevice {};

TEST_P(GemmTest, RandomShapesEveryOpAndPrecisionMeetTheTolerances) {
  gc::Stream s(device());
  std::mt19937 rng(17);
  const std::int64_t dims[] = {1, 2, 7, 13, 31, 64, 97};
  int runs = 0;
  for (const Precision& prec : kPrecisions) {
    if (!gc::supports(device(), gc::gemm_precision(prec.in, prec.tf32))) continue;
    for (auto ta : {gc::Transpose::none, gc::Transpose::transpose}) {
      for (auto tb : {gc::Transpose::none, gc::Transpose::transpose}) {
        const std::int64_t m = dims[rng() % 7], n = dims[rng() % 7], k = dims[rng() % 7];
        const std::int64_t batch = 1 + rng() % 3;
        const Problem p = random_problem(rng, m, n, k, ta, tb, batch, gc::Epilogue::none, rng() % 2 ? 0.5f : 0.0f);
        const auto got = run(p, prec, device(), s);
        EXPECT_LT(relative_error(p, p.a, p.b, got), prec.tolerance)
            << prec.name << " m=" << m << " n=" << n << " k=" << k << " batch=" << batch << " ta=" << int(ta)
            << " tb=" << int(tb);
        ++runs;
      }
    }
  }
  EXPECT_GE(runs, 4);
}

TEST_P(GemmTest, EpiloguesBiasReluGelu) {
  gc::Stream s(device());
  std::mt19937 rng(23);
  for (auto e :
       {gc::Epilogue::bias, gc::Epilogue::relu, gc::Epilogue::bias_relu, gc::Epilogue::gelu, gc::Epilogue::bias_gelu}) {
    for (const Precision& prec : {kPrecisions[0], kPrecisions[3]}) {
      const Problem p = random_problem(rng, 33, 17, 40, gc::Transpose::none, gc::Transpose::transpose, 2, e, 0.0f);
      const auto got = run(p, prec, device(), s);
      EXPECT_LT(relative_error(p, p.a, p.b, got), prec.tolerance) << prec.name << " epilogue " << int(e);
    }
  }
}

TEST_P(GemmTest, KZeroStillAppliesBeta) {
  gc::Stream s(device());
  std::mt19937 rng(29);
  Problem p = random_problem(rng, 5, 9, 0, gc::Transpose::none, gc::Transpose::none, 2, gc::Epilogue::none, 2.0f);
  const auto got = run(p, kPrecisions[0], device(), s);
  EXPECT_LT(relative_error(p, p.a, p.b, got), 1e-6);
}

// Views one element into larger buffers: cuBLASLt must not run an algorithm chosen for 256-byte
// aligned matrices on them, and a plan cached for aligned buffers must not be reused for these.
TEST_P(GemmTest, ViewsAtUnalignedOffsets) {
  gc::Stream s(device());
  std::mt19937 rng(37);
  const Problem p =
      random_problem(rng, 24, 40, 64, gc::Transpose::none, gc::Transpose::transpose, 1, gc::Epilogue::bias, 0.0f);
  for (const Precision& prec : {kPrecisions[0], kPrecisions[3]}) {
    const auto aligned = run(p, prec, device(), s);  // caches the aligned plan first
    EXPECT_LT(relative_error(p, p.a, p.b, aligned), prec.tolerance) << prec.name;
    auto shifted = [&](const std::vector<float>& v, gc::DType t) {
      std::vector<float> padded(v.size() + 1, 0.0f);
      std::copy(v.begin(), v.end(), padded.begin() + 1);
      return make(padded, t, device(), s);
    };
    gc::Buffer a = shifted(p.a, prec.in), b = shifted(p.b, prec.in), c = shifted(p.c0, prec.out);
    gc::Buffer bias = make(p.bias, gc::DType::float32, device(), s);
    const gc::BufferView cv = gc::BufferView(c).slice(1, p.c0.size());
    gc::fill(cv, std::nan(""), s);
    gc::GemmArgs args = p.args;
    args.bias = bias;
    gc::gemm(cv, gc::BufferView(a).slice(1, p.a.size()), gc::BufferView(b).slice(1, p.b.size()), args, s);
    EXPECT_LT(relative_error(p, p.a, p.b, read(cv, s)), prec.tolerance) << prec.name << " at an offset";
  }
}

// The bias at every element offset into a larger buffer, in fp32 and in C's dtype: whatever its
// address (down to 2-byte aligned), the epilogue reads it right. On a GPU, cuBLASLt reads the bias
// with vector loads, so a bias under 16-byte alignment is staged into aligned scratch
// (gpu-check runs this under compute-sanitizer memcheck).
TEST_P(GemmTest, BiasAtAnyOffset) {
  gc::Stream s(device());
  std::mt19937 rng(43);
  const Problem p =
      random_problem(rng, 16, 24, 32, gc::Transpose::none, gc::Transpose::none, 1, gc::Epilogue::bias_relu, 0.0f);
  for (const Precision& prec : {kPrecisions[0], kPrecisions[3], kPrecisions[4]}) {
    if (!gc::supports(device(), gc::gemm_precision(prec.in, prec.tf32))) continue;
    for (gc::DType bias_t : {gc::DType::float32, prec.out}) {
      for (std::size_t offset = 0; offset < 9; ++offset) {
        std::vector<float> padded(p.bias.size() + offset + 3, 1e30f);
        std::copy(p.bias.begin(), p.bias.end(), padded.begin() + static_cast<std::ptrdiff_t>(offset));
        gc::Buffer whole = make(padded, bias_t, device(), s);
        Problem q = p;
        if (bias_t != gc::DType::float32) q.bias = read(make(p.bias, bias_t, device(), s), s);  // as stored
        gc::Buffer a = make(p.a, prec.in, device(), s), b = make(p.b, prec.in, device(), s);
        gc::Buffer c = make(p.c0, prec.out, device(), s);
        gc::fill(c, std::nan(""), s);
        gc::GemmArgs args = p.args;
        args.bias = gc::BufferView(whole).slice(offset, p.bias.size());
        gc::gemm(c, a, b, args, s);
        EXPECT_LT(relative_error(q, p.a, p.b, read(c, s)), prec.tolerance)
            << prec.name << ", bias " << gc::dtype_name(bias_t) << " at element " << offset;
      }
    }
  }
}

// bf16 operands accumulate in fp32 on every path (oneDNN's native product where the CPU has one,
// the widened fp32 product elsewhere): against the fp32 product of the same bf16-rounded values,
// only fp32 rounding separates them, for every transpose, a deep k, alpha, beta and the epilogues,
// each shape run twice (the second from the per-thread primitive cache), on two streams at once.
TEST_P(GemmTest, Bf16AccumulatesInFp32LikeTheFp32ProductOfTheRoundedValues) {
  std::mt19937 rng(41);
  std::vector<Problem> problems;
  for (auto ta : {gc::Transpose::none, gc::Transpose::transpose}) {
    for (auto tb : {gc::Transpose::none, gc::Transpose::transpose}) {
      problems.push_back(random_problem(rng, 37, 53, 700, ta, tb, 2, gc::Epilogue::none, 0.0f));
    }
  }
  problems.push_back(
      random_problem(rng, 64, 96, 130, gc::Transpose::none, gc::Transpose::none, 1, gc::Epilogue::bias_relu, 0.5f));
  problems.push_back(
      random_problem(rng, 19, 8, 33, gc::Transpose::transpose, gc::Transpose::none, 3, gc::Epilogue::bias, 0.0f));
  auto check = [&](gc::StreamView s, std::size_t first) {
    for (std::size_t i = first; i < problems.size(); i += 2) {
      Problem p = problems[i];
      const Precision bf16_in{gc::DType::bfloat16, gc::DType::float32, false, 0, "bf16"};
      // The inputs as bf16 holds them: the fp32 product of these is the reference.
      p.a = read(make(p.a, gc::DType::bfloat16, device(), s), s);
      p.b = read(make(p.b, gc::DType::bfloat16, device(), s), s);
      const auto reference = run(p, kPrecisions[0], device(), s);
      for (int round = 0; round < 2; ++round) {
        const auto got = run(p, bf16_in, device(), s);
        double diff = 0, norm = 0;
        for (std::size_t j = 0; j < got.size(); ++j) {
          if (std::isnan(reference[j])) continue;  // the gaps between rows and batches (poisoned, never written)
          diff += (double(got[j]) - reference[j]) * (double(got[j]) - reference[j]);
          norm += double(reference[j]) * reference[j];
        }
        EXPECT_LT(std::sqrt(diff / norm), 1e-5) << "problem " << i << " round " << round;
      }
    }
  };
  gc::Stream s0(device()), s1(device());
  std::thread other([&] { check(s1, 1); });
  check(s0, 0);
  other.join();
}

// alpha 1, beta 0 and a bias and/or ReLU (a linear layer: oneDNN fuses them on bf16-capable CPUs)
// into fp32 and bf16 C, the bias in fp32 and in C's dtype: as the fp32 product of the rounded
// values with the same epilogue (bf16 C: within its rounding).
TEST_P(GemmTest, Bf16LinearLayerEpiloguesIntoFp32AndBf16) {
  gc::Stream s(device());
  std::mt19937 rng(43);
  for (auto e : {gc::Epilogue::bias, gc::Epilogue::relu, gc::Epilogue::bias_relu}) {
    for (gc::DType out : {gc::DType::float32, gc::DType::bfloat16}) {
      for (gc::DType bias_t : {gc::DType::float32, out}) {
        Problem p = random_problem(rng, 45, 70, 96, gc::Transpose::none, gc::Transpose::transpose, 2, e, 0.0f);
        p.args.alpha = 1.0f;
        p.a = read(make(p.a, gc::DType::bfloat16, device(), s), s);
        p.b = read(make(p.b, gc::DType::bfloat16, device(), s), s);
        if (!p.bias.empty()) p.bias = read(make(p.bias, bias_t, device(), s), s);
        const auto reference = run(p, kPrecisions[0], device(), s);
        gc::Buffer a = make(p.a, gc::DType::bfloat16, device(), s), b = make(p.b, gc::DType::bfloat16, device(), s);
        gc::Buffer c = make(std::vector<float>(p.c0.size(), std::nanf("")), out, device(), s);
        gc::Buffer bias;
        gc::GemmArgs args = p.args;
        if (!p.bias.empty()) {
          bias = make(p.bias, bias_t, device(), s);
          args.bias = bias;
        }
        gc::gemm(c, a, b, args, s);
        const auto got = read(c, s);
        double diff = 0, norm = 0;
        for (std::size_t j = 0; j < got.size(); ++j) {
          if (std::isnan(reference[j])) continue;  // the gaps between rows and batches
          diff += (double(got[j]) - reference[j]) * (double(got[j]) - reference[j]);
          norm += double(reference[j]) * reference[j];
        }
        const double tolerance = out == gc::DType::float32 ? 1e-5 : 4e-3;  // bf16: half an ulp is 2^-9
        EXPECT_LT(std::sqrt(diff / norm), tolerance)
            << "epilogue " << int(e) << " into " << gc::dtype_name(out) << ", bias " << gc::dtype_name(bias_t);
      }
    }
  }
}

TEST(PointerAlignment, LargestPowerOfTwoUpToTheCap) {
  alignas(256) static unsigned char bytes[512];
  EXPECT_EQ(gc::detail::pointer_alignment(bytes), 256u);
  EXPECT_EQ(gc::detail::pointer_alignment(bytes + 256), 256u);
  EXPECT_EQ(gc::detail::pointer_alignment(bytes + 1), 1u);
  EXPECT_EQ(gc::detail::pointer_alignment(bytes + 2), 2u);
  EXPECT_EQ(gc::detail::pointer_alignment(bytes + 12), 4u);
  EXPECT_EQ(gc::detail::pointer_alignment(bytes + 48), 16u);
  EXPECT_EQ(gc::detail::pointer_alignment(bytes + 128), 128u);
  EXPECT_EQ(gc::detail::pointer_alignment(bytes + 64, 16), 16u);
  EXPECT_EQ(gc::detail::pointer_alignment(nullptr), 256u);
}

// fp8 in the pairings cuBLASLt's table has (e4m3 x e4m3, e4m3 x e5m2, e5m2 x e4m3), into bf16 and
// into float32 with a float32 bias (cuBLASLt reads it as bf16 there), against the product of the
// values fp8 holds, dequantised. e5m2 x e5m2: the host model computes it; on a GPU it is
// Unsupported before anything is enqueued (C untouched).
TEST_P(GemmTest, Fp8WithPerTensorScales) {
  gc::Stream s(device());
  if (!gc::supports(device(), gc::Precision::fp8))
    GTEST_SKIP() << "fp8 needs sm_89+: " << gc::device_properties(device()).name;
  std::mt19937 rng(31);
  const gc::DType e4 = gc::DType::float8_e4m3, e5 = gc::DType::float8_e5m2;
  for (gc::Epilogue e : {gc::Epilogue::none, gc::Epilogue::bias}) {
    const Problem p = random_problem(rng, 24, 40, 64, gc::Transpose::none, gc::Transpose::transpose, 1, e, 0.0f);
    for (auto [ta, tb] : {std::pair{e4, e4}, std::pair{e4, e5}, std::pair{e5, e4}, std::pair{e5, e5}}) {
      for (gc::DType out : {gc::DType::bfloat16, gc::DType::float32}) {
        auto dequantised = [&](const std::vector<float>& v, gc::DType t, float scale) {
          std::vector<float> r = read(make(v, t, gc::Device::host(), gc::Stream().view()), gc::Stream().view());
          for (auto& x : r) x *= scale;
          return r;
        };
        gc::Buffer a = make(p.a, ta, device(), s), b = make(p.b, tb, device(), s), c = make(p.c0, out, device(), s);
        gc::fill(c, std::nan(""), s);
        gc::Buffer bias;
        gc::GemmArgs args = p.args;
        args.scale_a = 0.5f;
        args.scale_b = 2.0f;
        if (!p.bias.empty()) {
          bias = make(p.bias, gc::DType::float32, device(), s);
          args.bias = bias;
        }
        const std::string what = std::string(gc::dtype_name(ta)) + " x " + gc::dtype_name(tb) + " -> " +
                                 gc::dtype_name(out) + (p.bias.empty() ? "" : " + bias");
        if (device().is_cuda() && ta == e5 && tb == e5) {
          EXPECT_THROW(gc::gemm(c, a, b, args, s), gc::Unsupported) << what;
          for (float v : read(c, s)) ASSERT_TRUE(std::isnan(v)) << what << ": C was written";
          continue;
        }
        gc::gemm(c, a, b, args, s);
        // The bias as cuBLASLt reads it into float32 (bf16): far inside the fp8 tolerance.
        EXPECT_LT(relative_error(p, dequantised(p.a, ta, 0.5f), dequantised(p.b, tb, 2.0f), read(c, s)), 1e-2) << what;
      }
    }
  }
}

TEST_P(GemmTest, BadInputIsRejectedNamingTheArgument) {
  gc::Stream s(device());
  auto buf = [&](std::size_t n, gc::DType t = gc::DType::float32) { return gc::Buffer(n, t, device()); };
  gc::Buffer a = buf(6 * 4), b = buf(4 * 5), c = buf(6 * 5);
  gc::GemmArgs g;
  g.m = 6;
  g.n = 5;
  g.k = 4;
  auto message = [&](gc::BufferView cc, gc::BufferView aa, gc::BufferView bb, const gc::GemmArgs& args) {
    try {
      gc::gemm(cc, aa, bb, args, s);
    } catch (const gc::InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message(c, a, b, g), "no error");
  s.synchronize();
  gc::GemmArgs inner = g;
  inner.k = 5;  // A holds 6 x 4: the inner dimensions disagree
  EXPECT_NE(message(c, a, b, inner).find("a: 24 elements, the shape needs 30"), std::string::npos);
  gc::GemmArgs short_ld = g;
  short_ld.lda = 3;
  EXPECT_NE(message(c, a, b, short_ld).find("lda: 3 is shorter than a row of a"), std::string::npos);
  gc::GemmArgs overlap = g;
  overlap.batch = 2;
  overlap.stride_a = 0;
  overlap.stride_b = 0;
  overlap.stride_c = 10;
  gc::Buffer c2 = buf(100);
  EXPECT_NE(message(c2, a, b, overlap).find("stride_c: 10 makes batches of C overlap"), std::string::npos);
  gc::Buffer shared = buf(64);  // A in [0, 24), C in [20, 50): the output would overwrite the input
  EXPECT_NE(
      message(gc::BufferView(shared).slice(20, 30), gc::BufferView(shared).slice(0, 24), b, g).find("c: aliases a"),
      std::string::npos);
  EXPECT_NE(message(c, buf(24, gc::DType::float16), b, g).find("does not pair"), std::string::npos);
  EXPECT_NE(message(buf(30, gc::DType::float16), a, b, g).find("float32 inputs need a float32 output"),
            std::string::npos);
  gc::GemmArgs bad_bias = g;
  bad_bias.epilogue = gc::Epilogue::bias;
  gc::Buffer bias4 = buf(4);
  bad_bias.bias = bias4;
  EXPECT_NE(message(c, a, b, bad_bias).find("bias: 4 elements"), std::string::npos);
  gc::GemmArgs neg = g;
  neg.m = -1;
  EXPECT_NE(message(c, a, b, neg).find("negative"), std::string::npos);
  // Sizes that overflow: a batch x stride product beyond int64 (it passed the size check and
  // wrote outside C), and dimensions beyond the int the libraries count in.
  gc::GemmArgs huge_stride = g;
  huge_stride.batch = 1 << 30;
  huge_stride.stride_a = huge_stride.stride_b = 0;  // A and B broadcast over the batch
  huge_stride.stride_c = std::int64_t{1} << 40;
  EXPECT_NE(message(c, a, b, huge_stride).find("overflows int64"), std::string::npos);
  gc::GemmArgs huge_batch = g;
  huge_batch.batch = std::int64_t{1} << 31;
  EXPECT_NE(message(c, a, b, huge_batch).find("batch: 2147483648 exceeds"), std::string::npos);
  if (device().is_host()) {
    gc::GemmArgs wide = g;
    wide.n = std::int64_t{1} << 31;  // cblas_sgemm would print "illegal value" and leave C alone
    EXPECT_NE(message(c, a, b, wide).find("n: 2147483648 exceeds the host BLAS's int"), std::string::npos);
  }
  if (device().is_cuda()) {
    gc::Buffer host_a(24, gc::DType::float32, gc::Device::host(), gc::MemoryKind::host);
    EXPECT_NE(message(c, host_a, b, g).find("a:"), std::string::npos);
  }
  EXPECT_TRUE(s.query());  // nothing enqueued
}

GPUCLOUD_INSTANTIATE_ON_EVERY_DEVICE(GemmTest);

TEST(GemmBackends, CudaAgreesWithTheHostModel) {
  if (gc::cuda_device_count() == 0) GTEST_SKIP() << "needs a CUDA device: " << gc::cuda_unavailable_reason();
  gc::Stream hs, cs(gc::Device::cuda(0));
  std::mt19937 rng(41);
  for (const Precision& prec : kPrecisions) {
    if (!gc::supports(gc::Device::cuda(0), gc::gemm_precision(prec.in, prec.tf32))) continue;
    const Problem p = random_problem(rng, 64, 48, 80, gc::Transpose::transpose, gc::Transpose::none, 2,
                                     gc::Epilogue::bias_relu, 0.25f);
    const auto host = run(p, prec, gc::Device::host(), hs);
    const auto gpu = run(p, prec, gc::Device::cuda(0), cs);
    double diff = 0, norm = 0;
    for (std::size_t i = 0; i < host.size(); ++i) {
      diff += (host[i] - gpu[i]) * (host[i] - gpu[i]);
      norm += host[i] * host[i];
    }
    EXPECT_LT(std::sqrt(diff / norm), prec.tolerance) << prec.name;
  }
}

TEST(GpuSpecs, TableAndLookup) {
  EXPECT_EQ(gc::gpu_specs().size(), 9u);
  const auto h100 = gc::find_gpu_spec("NVIDIA H100 80GB HBM3");
  ASSERT_TRUE(h100.has_value());
  EXPECT_EQ(h100->name, "H100 SXM");
  EXPECT_EQ(gc::peak_tflops(*h100, gc::Precision::bf16), 989);
  EXPECT_EQ(gc::peak_tflops(*h100, gc::Precision::fp8), 1979);
  EXPECT_EQ(gc::find_gpu_spec("NVIDIA A100-SXM4-80GB")->memory_bw_gbs, 2039);
  EXPECT_EQ(gc::find_gpu_spec("NVIDIA A10")->name, "A10");
  EXPECT_EQ(gc::find_gpu_spec("NVIDIA H200")->memory_gb, 141);
  EXPECT_TRUE(gc::find_gpu_spec("Tesla V100-SXM2-32GB")->needs_cuda12);
  EXPECT_EQ(gc::peak_tflops(*gc::find_gpu_spec("Tesla T4"), gc::Precision::bf16), 0);
  EXPECT_FALSE(gc::find_gpu_spec("AMD EPYC").has_value());
  EXPECT_TRUE(gc::supports(gc::Device::host(), gc::Precision::fp8));
}

// OpenBLAS falling back to pre-AVX kernels on a CPU it does not recognise is named, with the
// core type to set; a recognised core, a CPU without AVX2, or OPENBLAS_CORETYPE set say nothing.
TEST(BlasCoreAdvice, NamesTheFallbackAndTheCoreTypeToSet) {
  namespace d = gpucloud::detail;
  const std::string skx = d::blas_core_advice("Prescott", true, true, false);
  EXPECT_NE(skx.find("Prescott kernels on this AVX-512 CPU"), std::string::npos) << skx;
  EXPECT_NE(skx.find("OPENBLAS_CORETYPE=SkylakeX"), std::string::npos) << skx;
  const std::string hsw = d::blas_core_advice("Nehalem", true, false, false);
  EXPECT_NE(hsw.find("OPENBLAS_CORETYPE=Haswell"), std::string::npos) << hsw;
  EXPECT_EQ(d::blas_core_advice("Cooperlake", true, true, false), "");
  EXPECT_EQ(d::blas_core_advice("SkylakeX", true, true, false), "");
  EXPECT_EQ(d::blas_core_advice("Haswell", true, false, false), "");
  EXPECT_EQ(d::blas_core_advice("Prescott", false, false, false), "");  // an old CPU: the right kernels
  EXPECT_EQ(d::blas_core_advice("Prescott", true, true, true), "");     // the user chose
  EXPECT_EQ(d::blas_core_advice(nullptr, true, true, false), "");
}
