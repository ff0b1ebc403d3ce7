// Convolution on every device against a float64 direct convolution: random shapes, strides,
// paddings, dilations, groups, both layouts and every dtype, with the GEMM's tolerances; the
// three passes checked against each other by the adjoint identities; outputs poisoned with NaN
// before each run; bad input rejected before any work, leaving the outputs untouched.
#include <gpucloud/compute/conv.hpp>
#include <gpucloud/memory/buffer.hpp>
#include <gpucloud/runtime/error.hpp>
#include <gpucloud/runtime/stream.hpp>

#include <gtest/gtest.h>

#include "buffer_values.hpp"
#include "device_cases.hpp"
#include "kernels/compute/conv_geometry.hpp"

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace gc = gpucloud;

namespace {

using gc::testing::make;
using gc::testing::read;

struct DTypeCase {
  gc::DType dtype;
  double tolerance;
};
const DTypeCase kDTypes[] = {{gc::DType::float32, 1e-5}, {gc::DType::float16, 1e-2}, {gc::DType::bfloat16, 1e-2}};

// The library's own index math, reused only for addressing: the reference sums directly.
gc::kernels::ConvGeometry geometry_of(const gc::ConvArgs& a) {
  const gc::ConvOutputSize o = gc::conv2d_output_size(a);
  return {a.n,
          a.c,
          a.h,
          a.w,
          a.k,
          a.r,
          a.s,
          o.h,
          o.w,
          a.pad_h,
          a.pad_w,
          a.stride_h,
          a.stride_w,
          a.dilation_h,
          a.dilation_w,
          a.groups,
          a.layout == gc::ConvLayout::nhwc};
}

// Calls f(img, k, oy, ox, c, r, s, x_offset, y_offset, filter_offset) for every tap that reads
// inside the image: the definition of the convolution, in float64 by the callers.
template <class F>
void for_each_tap(const gc::kernels::ConvGeometry& g, F f) {
  for (std::int64_t img = 0; img < g.n; ++img) {
    for (std::int64_t kk = 0; kk < g.k; ++kk) {
      const std::int64_t grp = kk / g.kg();
      for (std::int64_t oy = 0; oy < g.oh; ++oy) {
        for (std::int64_t ox = 0; ox < g.ow; ++ox) {
          for (std::int64_t cc = 0; cc < g.cg(); ++cc) {
            for (std::int64_t rr = 0; rr < g.r; ++rr) {
              const std::int64_t iy = oy * g.stride_h - g.pad_h + rr * g.dilation_h;
              if (iy < 0 || iy >= g.h) continue;
              for (std::int64_t ss = 0; ss < g.s; ++ss) {
                const std::int64_t ix = ox * g.stride_w - g.pad_w + ss * g.dilation_w;
                if (ix < 0 || ix >= g.w) continue;
                f(g.x_at(img, grp * g.cg() + cc, iy, ix), g.y_at(img, kk, oy * g.ow + ox),
                  kk * g.taps() + g.tap(cc, rr, ss));
              }
            }
          }
        }
      }
    }
  }
}

double rel_error(const std::vector<float>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double d = static_cast<double>(got[i]) - want[i];
    num += d * d;
    den += want[i] * want[i];
  }
  if (std::isnan(num)) return std::numeric_limits<double>::infinity();  // NaN never passes
  return std::sqrt(num / (den > 0 ? den : 1));
}

std::vector<float> random_values(std::size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

// Values rounded to @p t, as the kernels see them (read back from a buffer of that dtype).
std::vector<float> rounded(const std::vector<float>& v, gc::DType t) {
  gc::Stream s;
  return read(make(v, t, gc::Device::host(), s), s);
}

std::vector<std::int64_t> counts(const gc::ConvArgs& a) {
  const auto o = gc::conv2d_output_size(a);
  return {a.n * a.c * a.h * a.w, a.n * a.k * o.h * o.w, a.k * (a.c / a.groups) * a.r * a.s};
}

// A random convolution: small sizes, primes, 1x1 and 3x3 and 5x2 filters, stride 1-3, padding,
// dilation 1-2, groups 1, 2 or depthwise.
gc::ConvArgs random_args(std::mt19937& rng) {
  auto pick = [&](std::initializer_list<std::int64_t> options) {
    return options.begin()[std::uniform_int_distribution<std::size_t>(0, options.size() - 1)(rng)];
  };
  gc::ConvArgs a;
  a.groups = pick({1, 1, 2, 3});
  a.c = a.groups * pick({1, 2, 3, 5});
  a.k = a.groups * pick({1, 2, 4, 7});
  if (pick({0, 0, 0, 1}) == 1) a.k = a.c = a.groups = pick({3, 4});  // depthwise
  a.n = pick({1, 2, 3});
  a.h = pick({1, 5, 8, 11});
  a.w = pick({1, 4, 7, 13});
  a.r = pick({1, 3, 5});
  a.s = pick({1, 2, 3});
  a.stride_h = pick({1, 2, 3});
  a.stride_w = pick({1, 2});
  a.dilation_h = pick({1, 2});
  a.dilation_w = pick({1, 2});
  a.pad_h = pick({0, 1, 2});
  a.pad_w = pick({0, 1, 2});
  // Grow the input until the dilated filter fits in the padded input.
  while (a.h + 2 * a.pad_h < a.dilation_h * (a.r - 1) + 1) ++a.h;
  while (a.w + 2 * a.pad_w < a.dilation_w * (a.s - 1) + 1) ++a.w;
  a.layout = pick({0, 1}) == 1 ? gc::ConvLayout::nhwc : gc::ConvLayout::nchw;
  return a;
}

std::string describe(const gc::ConvArgs& a, gc::DType t) {
  return std::string(gc::dtype_name(t)) + (a.layout == gc::ConvLayout::nhwc ? " nhwc" : " nchw") + " n" +
         std::to_string(a.n) + " c" + std::to_string(a.c) + " " + std::to_string(a.h) + "x" + std::to_string(a.w) +
         " k" + std::to_string(a.k) + " " + std::to_string(a.r) + "x" + std::to_string(a.s) + " stride " +
         std::to_string(a.stride_h) + "," + std::to_string(a.stride_w) + " pad " + std::to_string(a.pad_h) + "," +
         std::to_string(a.pad_w) + " dil " + std::to_string(a.dilation_h) + "," + std::to_string(a.dilation_w) +
         " groups " + std::to_string(a.groups);
}

}  // namespace

class ConvTest : public gc::testing::OnEveryDevice {};

TEST_P(ConvTest, ThreePassesMatchAFloat64DirectConvolution) {
  std::mt19937 rng(2024);
  gc::Stream s(device());
  std::vector<gc::ConvArgs> cases;
  for (int trial = 0; trial < 40; ++trial) cases.push_back(random_args(rng));
  // The host model's shortcuts, each in both layouts: a 1x1 stride-1 unpadded convolution reads
  // the input as its col matrix (grouped, a batch of 3: NHWC makes the batch one product), and a
  // strided, padded, dilated one large enough that im2col and col2im split across the cores.
  for (auto layout : {gc::ConvLayout::nchw, gc::ConvLayout::nhwc}) {
    gc::ConvArgs direct;
    direct.n = 3, direct.c = 6, direct.h = 5, direct.w = 7, direct.k = 4, direct.r = 1, direct.s = 1;
    direct.groups = 2, direct.layout = layout;
    cases.push_back(direct);
    gc::ConvArgs big;
    big.n = 2, big.c = 8, big.h = 29, big.w = 31, big.k = 6, big.r = 3, big.s = 3, big.stride_h = 1;
    big.stride_w = 2, big.pad_h = 1, big.pad_w = 2, big.dilation_w = 2, big.layout = layout;
    cases.push_back(big);
  }
  for (const gc::ConvArgs& a : cases) {
    for (const DTypeCase& t : kDTypes) {
      SCOPED_TRACE(describe(a, t.dtype));
      const auto g = geometry_of(a);
      const auto n = counts(a);
      const auto x = rounded(random_values(n[0], rng), t.dtype);
      const auto dy = rounded(random_values(n[1], rng), t.dtype);
      const auto f = rounded(random_values(n[2], rng), t.dtype);
      std::vector<double> y_ref(n[1], 0.0), dx_ref(n[0], 0.0), df_ref(n[2], 0.0);
      for_each_tap(g, [&](std::int64_t xi, std::int64_t yi, std::int64_t fi) {
        y_ref[yi] += static_cast<double>(x[xi]) * f[fi];
        dx_ref[xi] += static_cast<double>(dy[yi]) * f[fi];
        df_ref[fi] += static_cast<double>(x[xi]) * dy[yi];
      });
      const float nan = std::numeric_limits<float>::quiet_NaN();
      gc::Buffer xb = make(x, t.dtype, device(), s), fb = make(f, t.dtype, device(), s),
                 dyb = make(dy, t.dtype, device(), s);
      gc::Buffer y = make(std::vector<float>(n[1], nan), t.dtype, device(), s);
      gc::Buffer dx = make(std::vector<float>(n[0], nan), t.dtype, device(), s);
      gc::Buffer df = make(std::vector<float>(n[2], nan), t.dtype, device(), s);
      gc::conv2d_forward(y, xb, fb, a, s);
      gc::conv2d_backward_data(dx, dyb, fb, a, s);
      gc::conv2d_backward_filter(df, xb, dyb, a, s);
      const auto yv = read(y, s), dxv = read(dx, s), dfv = read(df, s);
      EXPECT_LT(rel_error(yv, y_ref), t.tolerance) << "forward";
      EXPECT_LT(rel_error(dxv, dx_ref), t.tolerance) << "backward data";
      EXPECT_LT(rel_error(dfv, df_ref), t.tolerance) << "backward filter";
      // Adjoint identities, from the kernels' own outputs: <conv(x), dy> = <x, dx> = <f, df>.
      double y_dy = 0, x_dx = 0, f_df = 0, scale = 0;
      for (std::size_t i = 0; i < yv.size(); ++i) y_dy += static_cast<double>(yv[i]) * dy[i];
      for (std::size_t i = 0; i < dxv.size(); ++i) x_dx += static_cast<double>(x[i]) * dxv[i];
      for (std::size_t i = 0; i < dfv.size(); ++i) f_df += static_cast<double>(f[i]) * dfv[i];
      for (std::size_t i = 0; i < y_ref.size(); ++i) scale += std::abs(y_ref[i] * dy[i]);
      EXPECT_NEAR(x_dx, y_dy, t.tolerance * (scale + 1)) << "<conv(x), dy> = <x, backward_data(dy)>";
      EXPECT_NEAR(f_df, y_dy, t.tolerance * (scale + 1)) << "<conv(x), dy> = <f, backward_filter(x, dy)>";
    }
  }
}

TEST_P(ConvTest, AlphaBetaBiasAndReluFollowCudnnsOrder) {
  gc::Stream s(device());
  gc::ConvArgs a;
  a.n = 2, a.c = 3, a.h = 6, a.w = 5, a.k = 4, a.r = 3, a.s = 3, a.pad_h = 1, a.pad_w = 1;
  std::mt19937 rng(7);
  const auto n = counts(a);
  const auto x = random_values(n[0], rng), f = random_values(n[2], rng), y0 = random_values(n[1], rng);
  const std::vector<float> bias = {0.5f, -0.25f, 2.0f, -3.0f};
  gc::Buffer xb = make(x, gc::DType::float32, device(), s), fb = make(f, gc::DType::float32, device(), s);
  gc::Buffer plain = make(std::vector<float>(n[1], 0.0f), gc::DType::float32, device(), s);
  gc::conv2d_forward(plain, xb, fb, a, s);
  const auto conv = read(plain, s);
  gc::Buffer y = make(y0, gc::DType::float32, device(), s), bb = make(bias, gc::DType::float32, device(), s);
  a.alpha = 0.5f, a.beta = 2.0f, a.epilogue = gc::Epilogue::bias_relu, a.bias = bb;
  gc::conv2d_forward(y, xb, fb, a, s);
  const auto got = read(y, s);
  const auto o = gc::conv2d_output_size(a);
  std::size_t wrong = 0;
  for (std::int64_t i = 0; i < n[1]; ++i) {
    const std::int64_t channel = (i / (o.h * o.w)) % a.k;
    const float want = std::max(0.0f, 0.5f * conv[i] + 2.0f * y0[i] + bias[channel]);
    wrong += std::abs(got[i] - want) > 1e-5f * (1 + std::abs(want));
  }
  EXPECT_EQ(wrong, 0u);
  // The plain scales (alpha 1, beta 0: oneDNN's fused bias and ReLU on the host), both epilogues.
  for (auto e : {gc::Epilogue::bias, gc::Epilogue::bias_relu}) {
    gc::ConvArgs fused = a;
    fused.alpha = 1, fused.beta = 0, fused.epilogue = e;
    gc::Buffer yf = make(std::vector<float>(n[1], std::nanf("")), gc::DType::float32, device(), s);
    gc::conv2d_forward(yf, xb, fb, fused, s);
    const auto got_fused = read(yf, s);
    std::size_t off = 0;
    for (std::int64_t i = 0; i < n[1]; ++i) {
      const std::int64_t channel = (i / (o.h * o.w)) % a.k;
      const float biased = conv[i] + bias[channel];
      const float want = e == gc::Epilogue::bias_relu ? std::max(0.0f, biased) : biased;
      off += !(std::abs(got_fused[i] - want) <= 1e-5f * (1 + std::abs(want)));  // NaN counts
    }
    EXPECT_EQ(off, 0u) << "epilogue " << int(e);
  }
  // The gradients accumulate with beta = 1: twice the same pass is twice the gradient.
  gc::ConvArgs b = a;
  b.alpha = 1, b.beta = 1, b.epilogue = gc::Epilogue::none, b.bias = {};
  gc::Buffer dy = make(random_values(n[1], rng), gc::DType::float32, device(), s);
  gc::Buffer df = make(std::vector<float>(n[2], 0.0f), gc::DType::float32, device(), s);
  gc::conv2d_backward_filter(df, xb, dy, b, s);
  const auto once = read(df, s);
  gc::conv2d_backward_filter(df, xb, dy, b, s);
  const auto twice = read(df, s);
  for (std::size_t i = 0; i < once.size(); ++i) EXPECT_NEAR(twice[i], 2 * once[i], 1e-5 * (1 + std::abs(once[i])));
  // An empty batch: forward writes nothing; the filter gradient is beta * dfilter.
  b.n = 0, b.beta = 0.5f;
  gc::conv2d_forward(plain, xb, fb, b, s);
  gc::conv2d_backward_filter(df, xb, dy, b, s);
  const auto halved = read(df, s);
  for (std::size_t i = 0; i < once.size(); ++i) EXPECT_FLOAT_EQ(halved[i], 0.5f * twice[i]);
  EXPECT_EQ(read(plain, s), conv);
}

// The bias and bias+ReLU epilogues in every dtype the convolution takes: on a GPU, float32 and
// float16 run cuDNN's fused call and bfloat16 (which the fused call does not take) the convolution,
// cudnnAddTensor and the activation; on the host oneDNN or the model. Against the same dtype's
// plain convolution with the epilogue added in float.
TEST_P(ConvTest, BiasEpiloguesInEveryDtype) {
  gc::Stream s(device());
  gc::ConvArgs a;
  a.n = 2, a.c = 8, a.h = 7, a.w = 6, a.k = 8, a.r = 3, a.s = 3, a.pad_h = 1, a.pad_w = 1;
  std::mt19937 rng(11);
  const auto n = counts(a);
  const auto x = random_values(n[0], rng), f = random_values(n[2], rng);
  std::vector<float> bias(static_cast<std::size_t>(a.k));
  for (std::size_t i = 0; i < bias.size(); ++i) bias[i] = 0.25f * static_cast<float>(i) - 1.0f;
  const auto o = gc::conv2d_output_size(a);
  for (gc::DType t : {gc::DType::float32, gc::DType::float16, gc::DType::bfloat16}) {
    const double tolerance = t == gc::DType::float32 ? 1e-5 : 2e-2;
    gc::Buffer xb = make(x, t, device(), s), fb = make(f, t, device(), s), bb = make(bias, t, device(), s);
    gc::Buffer plain = make(std::vector<float>(n[1], 0.0f), t, device(), s);
    gc::conv2d_forward(plain, xb, fb, a, s);
    const auto conv = read(plain, s);
    const auto stored_bias = read(bb, s);
    for (auto e : {gc::Epilogue::bias, gc::Epilogue::bias_relu}) {
      gc::ConvArgs with = a;
      with.epilogue = e, with.bias = bb;
      gc::Buffer y = make(std::vector<float>(n[1], std::nanf("")), t, device(), s);
      gc::conv2d_forward(y, xb, fb, with, s);
      const auto got = read(y, s);
      std::size_t off = 0;
      for (std::int64_t i = 0; i < n[1]; ++i) {
        const std::int64_t channel = (i / (o.h * o.w)) % a.k;
        const float biased = conv[static_cast<std::size_t>(i)] + stored_bias[static_cast<std::size_t>(channel)];
        const float want = e == gc::Epilogue::bias_relu ? std::max(0.0f, biased) : biased;
        off += !(std::abs(got[static_cast<std::size_t>(i)] - want) <= tolerance * (1 + std::abs(want)));
      }
      EXPECT_EQ(off, 0u) << gc::dtype_name(t) << ", epilogue " << int(e);
    }
  }
}

TEST_P(ConvTest, BadInputIsRejectedBeforeAnyWorkAndNamesTheArgument) {
  gc::Stream s(device());
  gc::ConvArgs a;
  a.n = 1, a.c = 4, a.h = 5, a.w = 5, a.k = 6, a.r = 3, a.s = 3;
  const auto n = counts(a);
  gc::Buffer x = make(std::vector<float>(n[0], 1.0f), gc::DType::float32, device(), s);
  gc::Buffer f = make(std::vector<float>(n[2], 1.0f), gc::DType::float32, device(), s);
  gc::Buffer y = make(std::vector<float>(n[1], 42.0f), gc::DType::float32, device(), s);
  auto message = [&](gc::ConvArgs bad, gc::BufferView yv, gc::BufferView xv, gc::BufferView fv) -> std::string {
    try {
      gc::conv2d_forward(yv, xv, fv, bad, s);
    } catch (const gc::InvalidArgument& e) {
      return e.what();
    }
    return "no error";
  };
  auto with = [&](auto change) {
    gc::ConvArgs b = a;
    change(b);
    return b;
  };
  EXPECT_NE(
      message(with([](auto& b) { b.groups = 3; }), y, x, f).find("c: 4 input channels do not divide into 3 groups"),
      std::string::npos);
  EXPECT_NE(message(with([](auto& b) { b.r = 7; }), y, x, f).find("smaller than one element"), std::string::npos);
  EXPECT_NE(message(with([](auto& b) { b.stride_w = 0; }), y, x, f).find("stride_w"), std::string::npos);
  EXPECT_NE(message(with([](auto& b) { b.pad_h = -1; }), y, x, f).find("pad_h"), std::string::npos);
  EXPECT_NE(message(with([](auto& b) { b.c = std::int64_t{1} << 33; }), y, x, f).find("32 bits"), std::string::npos);
  EXPECT_NE(message(with([](auto& b) { b.n = std::int64_t{1} << 28; }), y, x, f).find("exceed 2^31-1"),
            std::string::npos);  // 2^28 x 4 x 5 x 5 elements: more than cuDNN's and the BLAS's int
  EXPECT_NE(message(with([](auto& b) { b.n = 2; }), y, x, f).find("y: 54 elements, the shape needs 108"),
            std::string::npos);
  EXPECT_NE(message(a, y.view().slice(0, 5), x, f).find("y: 5 elements"), std::string::npos);
  EXPECT_NE(message(a, x, x, f).find("y: aliases x"), std::string::npos);
  EXPECT_NE(message(with([](auto& b) { b.epilogue = gc::Epilogue::gelu; }), y, x, f).find("epilogue"),
            std::string::npos);
  EXPECT_NE(message(with([](auto& b) { b.epilogue = gc::Epilogue::bias; }), y, x, f).find("bias: 0 elements"),
            std::string::npos);
  gc::Buffer half = make(std::vector<float>(n[2], 1.0f), gc::DType::float16, device(), s);
  EXPECT_NE(message(a, y, x, half).find("filter: dtype float16 differs from y's float32"), std::string::npos);
  gc::Buffer ints(n[1], gc::DType::int32, device());
  EXPECT_NE(message(a, ints, x, f).find("y: dtype int32"), std::string::npos);
  gc::ConvArgs bwd = with([](auto& b) { b.epilogue = gc::Epilogue::bias_relu; });
  EXPECT_THROW(gc::conv2d_backward_data(x, y, f, bwd, s), gc::InvalidArgument);
  // Nothing ran: y still holds what it held.
  for (float v : read(y, s)) ASSERT_EQ(v, 42.0f);
  EXPECT_THROW(gc::conv2d_output_size(with([](auto& b) { b.k = 0; })), gc::InvalidArgument);
}

TEST_P(ConvTest, NhwcIsNchwWithItsAxesPermuted) {
  // Independent of the shared index math: permute by hand, convolve in both layouts, compare.
  gc::Stream s(device());
  gc::ConvArgs a;
  a.n = 2, a.c = 4, a.h = 7, a.w = 6, a.k = 6, a.r = 3, a.s = 2, a.pad_h = 1, a.stride_w = 2, a.groups = 2;
  const auto o = gc::conv2d_output_size(a);
  const std::int64_t cg = a.c / a.groups;
  std::mt19937 rng(5);
  const auto x = random_values(a.n * a.c * a.h * a.w, rng), f = random_values(a.k * cg * a.r * a.s, rng);
  std::vector<float> x_nhwc(x.size()), f_krsc(f.size());
  for (std::int64_t n = 0; n < a.n; ++n)
    for (std::int64_t c = 0; c < a.c; ++c)
      for (std::int64_t y = 0; y < a.h; ++y)
        for (std::int64_t z = 0; z < a.w; ++z)
          x_nhwc[((n * a.h + y) * a.w + z) * a.c + c] = x[((n * a.c + c) * a.h + y) * a.w + z];
  for (std::int64_t k = 0; k < a.k; ++k)
    for (std::int64_t c = 0; c < cg; ++c)
      for (std::int64_t r = 0; r < a.r; ++r)
        for (std::int64_t q = 0; q < a.s; ++q)
          f_krsc[((k * a.r + r) * a.s + q) * cg + c] = f[((k * cg + c) * a.r + r) * a.s + q];
  const std::size_t ny = static_cast<std::size_t>(a.n * a.k * o.h * o.w);
  gc::Buffer y1 = make(std::vector<float>(ny, 0.0f), gc::DType::float32, device(), s);
  gc::Buffer y2 = make(std::vector<float>(ny, 0.0f), gc::DType::float32, device(), s);
  gc::Buffer xb = make(x, gc::DType::float32, device(), s), fb = make(f, gc::DType::float32, device(), s);
  gc::Buffer xb2 = make(x_nhwc, gc::DType::float32, device(), s), fb2 = make(f_krsc, gc::DType::float32, device(), s);
  gc::conv2d_forward(y1, xb, fb, a, s);
  gc::ConvArgs b = a;
  b.layout = gc::ConvLayout::nhwc;
  gc::conv2d_forward(y2, xb2, fb2, b, s);
  const auto nchw = read(y1, s), nhwc = read(y2, s);
  for (std::int64_t n = 0; n < a.n; ++n)
    for (std::int64_t k = 0; k < a.k; ++k)
      for (std::int64_t p = 0; p < o.h * o.w; ++p)
        ASSERT_NEAR(nchw[(n * a.k + k) * o.h * o.w + p], nhwc[(n * o.h * o.w + p) * a.k + k], 1e-5);
  // One hand-computed value: output (0, 0, 0, 0) with the top padding row.
  double want = 0;
  for (std::int64_t c = 0; c < cg; ++c)
    for (std::int64_t r = 1; r < a.r; ++r)
      for (std::int64_t q = 0; q < a.s; ++q) want += x[(c * a.h + r - 1) * a.w + q] * f[(c * a.r + r) * a.s + q];
  EXPECT_NEAR(nchw[0], want, 1e-5);
}

TEST(ConvBackends, CudnnAgreesWithTheHostModel) {
  if (gc::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: " << gc::cuda_unavailable_reason();
  std::mt19937 rng(99);
  gc::Stream host, gpu(gc::Device::cuda(0));
  for (int trial = 0; trial < 10; ++trial) {
    const gc::ConvArgs a = random_args(rng);
    for (const DTypeCase& t : kDTypes) {
      SCOPED_TRACE(describe(a, t.dtype));
      const auto n = counts(a);
      const auto x = random_values(n[0], rng), f = random_values(n[2], rng), dy = random_values(n[1], rng);
      const auto y0 = random_values(n[1], rng), bias = random_values(static_cast<std::size_t>(a.k), rng);
      std::vector<float> results[2][4];
      int side = 0;
      for (gc::Stream* s : {&host, &gpu}) {
        const gc::Device d = s->device();
        gc::Buffer xb = make(x, t.dtype, d, *s), fb = make(f, t.dtype, d, *s), dyb = make(dy, t.dtype, d, *s);
        gc::Buffer y(n[1], t.dtype, d), dx(n[0], t.dtype, d), df(n[2], t.dtype, d);
        gc::conv2d_forward(y, xb, fb, a, *s);
        gc::conv2d_backward_data(dx, dyb, fb, a, *s);
        gc::conv2d_backward_filter(df, xb, dyb, a, *s);
        results[side][0] = read(y, *s), results[side][1] = read(dx, *s), results[side][2] = read(df, *s);
        // The fused epilogue (cudnnConvolutionBiasActivationForward on the GPU), with alpha and beta.
        gc::Buffer fused = make(y0, t.dtype, d, *s), bb = make(bias, t.dtype, d, *s);
        gc::ConvArgs e = a;
        e.alpha = 0.75f, e.beta = 0.5f, e.epilogue = gc::Epilogue::bias_relu, e.bias = bb;
        gc::conv2d_forward(fused, xb, fb, e, *s);
        results[side][3] = read(fused, *s);
        ++side;
      }
      for (int pass = 0; pass < 4; ++pass) {
        std::vector<double> host_values(results[0][pass].begin(), results[0][pass].end());
        EXPECT_LT(rel_error(results[1][pass], host_values), t.tolerance) << "pass " << pass;
      }
    }
  }
}

TEST(ConvHost, BuffersOnAnotherDeviceAreRejected) {
  if (gc::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: " << gc::cuda_unavailable_reason();
  gc::Stream host;
  gc::ConvArgs a;
  a.n = 1, a.c = 1, a.h = 3, a.w = 3, a.k = 1;
  gc::Buffer x(9, gc::DType::float32), f(1, gc::DType::float32), y(9, gc::DType::float32, gc::Device::cuda(0));
  EXPECT_THROW(gc::conv2d_forward(y, x, f, a, host), gc::InvalidArgument);
}

GPUCLOUD_INSTANTIATE_ON_EVERY_DEVICE(ConvTest);
