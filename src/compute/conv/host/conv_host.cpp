// The convolution's host backend where oneDNN does not take it (host/onednn_conv.hpp), the
// reference the cuDNN path is tested against.
//
// Every tensor is read as fp32 (float32 in place; float16/bfloat16 widened once, exactly), and
// each (image, group) is one OpenBLAS product oriented so that its result lands in the output's
// own layout: NCHW computes out (kg x pixels) = filters (kg x taps) * colT (taps x pixels), NHWC
// computes out (pixels x kg, row stride k) = col (pixels x taps) * filters^T. A float32 output
// without an epilogue is written in place (alpha and beta applied by the GEMM); otherwise the
// product goes to fp32 scratch and is biased, clamped and rounded once.
#include "compute/conv/host/conv_host.hpp"

#include "compute/gemm/host/host_sgemm.hpp"
#include "compute/host_values.hpp"
#include "kernels/compute/host_convert.hpp"
#include "runtime/host/parallel_for.hpp"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <utility>
#include <vector>

namespace gpucloud::detail {

namespace {

using kernels::ConvGeometry;

// A tensor as fp32: the buffer itself for float32, a widened copy otherwise (the vectorised
// conversions of cast(), exact).
struct Fp32 {
  const float* data = nullptr;
  std::vector<float> copy;
  Fp32(BufferView v, std::int64_t count) {
    if (v.dtype() == DType::float32) {
      data = static_cast<const float*>(v.data());
      return;
    }
    copy.resize(static_cast<std::size_t>(count));
    const auto n = static_cast<std::size_t>(count);
    if (v.dtype() == DType::float16) {
      kernels::host::cast_array(copy.data(), static_cast<const Half*>(v.data()), n);
    } else {
      kernels::host::cast_array(copy.data(), static_cast<const BFloat16*>(v.data()), n);
    }
    data = copy.data();
  }
};

int i32(std::int64_t v) { return static_cast<int>(v); }  // validated to fit

// Elements of im2col/col2im work worth a hand-off to another core.
constexpr std::int64_t kParallelGrain = 1 << 14;

// A 1x1 filter at stride 1 without padding reads every input pixel once, in order: the input
// itself is the col matrix (no im2col, no col2im).
bool direct(const ConvGeometry& g) {
  return g.r == 1 && g.s == 1 && g.stride_h == 1 && g.stride_w == 1 && g.pad_h == 0 && g.pad_w == 0;
}

// Output columns [lo, hi) whose input column for filter column ss is inside the image; the
// others read the padding.
std::pair<std::int64_t, std::int64_t> inside_x(const ConvGeometry& g, std::int64_t ss) {
  const std::int64_t off = ss * g.dilation_w - g.pad_w;  // ix = ox * stride_w + off
  const std::int64_t lo = std::min(g.ow, off >= 0 ? 0 : (-off + g.stride_w - 1) / g.stride_w);
  const std::int64_t hi = g.w - off > 0 ? std::min(g.ow, (g.w - off + g.stride_w - 1) / g.stride_w) : 0;
  return {lo, std::max(lo, hi)};
}

// The taps each output pixel of images [img, img + images), group grp reads (0 in the padding):
// colT (taps x pixels) for NCHW (one image), col (images * pixels x taps) for NHWC, taps in the
// filter's own order. Every element is written (the buffer is not cleared first).
void im2col(const float* x, const ConvGeometry& g, std::int64_t img, std::int64_t images, std::int64_t grp,
            std::vector<float>& col) {
  const std::int64_t pixels = g.pixels(), cg = g.cg(), taps = g.taps();
  const auto need = static_cast<std::size_t>(images * pixels * taps);
  if (col.size() < need) col.resize(need);
  float* const out = col.data();
  if (!g.nhwc) {  // one row per (cc, rr, ss), split across the cores
    detail::parallel_for(taps, std::max<std::int64_t>(1, kParallelGrain / pixels),
                         [&](std::int64_t t0, std::int64_t t1) {
                           for (std::int64_t t = t0; t < t1; ++t) {
                             const std::int64_t cc = t / (g.r * g.s), rr = t / g.s % g.r, ss = t % g.s;
                             const float* plane = x + g.x_at(img, grp * cg + cc, 0, 0);
                             const auto [lo, hi] = inside_x(g, ss);
                             const std::int64_t off = ss * g.dilation_w - g.pad_w;
                             float* row = out + t * pixels;
                             for (std::int64_t oy = 0; oy < g.oh; ++oy) {
                               const std::int64_t iy = g.in_y(oy, rr);
                               float* dst = row + oy * g.ow;
                               if (iy < 0 || iy >= g.h) {
                                 std::fill(dst, dst + g.ow, 0.0f);
                                 continue;
                               }
                               const float* src = plane + iy * g.w + off;
                               std::fill(dst, dst + lo, 0.0f);
                               if (g.stride_w == 1) {
                                 std::copy(src + lo, src + hi, dst + lo);
                               } else {
                                 for (std::int64_t ox = lo; ox < hi; ++ox) dst[ox] = src[ox * g.stride_w];
                               }
                               std::fill(dst + hi, dst + g.ow, 0.0f);
                             }
                           }
                         });
    return;
  }
  // NHWC: one row of taps per output pixel, split across the cores.
  detail::parallel_for(images * pixels, std::max<std::int64_t>(1, kParallelGrain / taps),
                       [&](std::int64_t p0, std::int64_t p1) {
                         for (std::int64_t p = p0; p < p1; ++p) {
                           const std::int64_t i = img + p / pixels, oy = p % pixels / g.ow, ox = p % g.ow;
                           float* row = out + p * taps;
                           for (std::int64_t rr = 0; rr < g.r; ++rr) {
                             const std::int64_t iy = g.in_y(oy, rr);
                             for (std::int64_t ss = 0; ss < g.s; ++ss, row += cg) {
                               const std::int64_t ix = g.in_x(ox, ss);
                               if (iy < 0 || iy >= g.h || ix < 0 || ix >= g.w) {
                                 std::fill(row, row + cg, 0.0f);
                               } else {
                                 const float* src = x + g.x_at(i, grp * cg, iy, ix);
                                 std::copy(src, src + cg, row);
                               }
                             }
                           }
                         }
                       });
}

// The inverse scatter: adds col's values (laid out as im2col's for one image) into acc, one
// fp32 image. NCHW splits the channels across the cores (their planes are disjoint).
void col2im(const std::vector<float>& col, const ConvGeometry& g, std::int64_t grp, float* acc) {
  const std::int64_t pixels = g.pixels(), cg = g.cg();
  if (!g.nhwc) {
    detail::parallel_for(cg, std::max<std::int64_t>(1, kParallelGrain / (pixels * g.r * g.s)),
                         [&](std::int64_t c0, std::int64_t c1) {
                           for (std::int64_t cc = c0; cc < c1; ++cc) {
                             float* plane = acc + g.x_at(0, grp * cg + cc, 0, 0);
                             const float* in = col.data() + cc * g.r * g.s * pixels;
                             for (std::int64_t rr = 0; rr < g.r; ++rr) {
                               for (std::int64_t ss = 0; ss < g.s; ++ss, in += pixels) {
                                 const auto [lo, hi] = inside_x(g, ss);
                                 const std::int64_t off = ss * g.dilation_w - g.pad_w;
                                 for (std::int64_t oy = 0; oy < g.oh; ++oy) {
                                   const std::int64_t iy = g.in_y(oy, rr);
                                   if (iy < 0 || iy >= g.h) continue;
                                   float* dst = plane + iy * g.w + off;
                                   const float* src = in + oy * g.ow;
                                   for (std::int64_t ox = lo; ox < hi; ++ox) dst[ox * g.stride_w] += src[ox];
                                 }
                               }
                             }
                           }
                         });
    return;
  }
  const float* in = col.data();
  for (std::int64_t oy = 0; oy < g.oh; ++oy) {
    for (std::int64_t ox = 0; ox < g.ow; ++ox) {
      for (std::int64_t rr = 0; rr < g.r; ++rr) {
        const std::int64_t iy = g.in_y(oy, rr);
        for (std::int64_t ss = 0; ss < g.s; ++ss, in += cg) {
          const std::int64_t ix = g.in_x(ox, ss);
          if (iy < 0 || iy >= g.h || ix < 0 || ix >= g.w) continue;
          float* dst = acc + g.x_at(0, grp * cg, iy, ix);
          for (std::int64_t cc = 0; cc < cg; ++cc) dst[cc] += in[cc];
        }
      }
    }
  }
}

// The col matrix of images [img, img + images), group grp, and its row stride: colT (taps x
// pixels, NCHW) or col (images * pixels x taps, NHWC). A direct convolution's is the input itself
// (row stride the channel count in NHWC, the pixel count in NCHW); otherwise im2col fills @p col.
std::pair<const float*, int> col_matrix(const float* x, const ConvGeometry& g, std::int64_t img, std::int64_t images,
                                        std::int64_t grp, std::vector<float>& col) {
  if (direct(g)) return {x + g.x_at(img, grp * g.cg(), 0, 0), i32(g.nhwc ? g.c : g.pixels())};
  im2col(x, g, img, images, grp, col);
  return {col.data(), i32(g.nhwc ? g.taps() : g.pixels())};
}

// Where the (image, group) block of y / dy sits: a rows x cols matrix with row stride ld.
struct Block {
  std::int64_t offset, rows, cols, ld;
};
Block y_block(const ConvGeometry& g, std::int64_t img, std::int64_t grp) {
  if (g.nhwc) return {img * g.pixels() * g.k + grp * g.kg(), g.pixels(), g.kg(), g.k};  // (pixel, channel)
  return {(img * g.k + grp * g.kg()) * g.pixels(), g.kg(), g.pixels(), g.pixels()};     // (channel, pixel)
}

// Images per NHWC im2col batch: their col matrices stacked make one taller GEMM (the output rows
// of consecutive images are consecutive in NHWC), within a scratch budget of 64 MiB.
std::int64_t nhwc_images_per_batch(const ConvGeometry& g) {
  const std::int64_t per_image = std::max<std::int64_t>(1, g.pixels() * g.taps());
  return std::clamp<std::int64_t>((std::int64_t{16} << 20) / per_image, 1, g.n);
}

// y[at] = epilogue(alpha * v + beta * y[at] + bias[channel]) over a block computed into scratch.
template <class T>
void epilogue_block(T* y, const float* scratch, const Block& b, std::int64_t rows, const ConvGeometry& g,
                    std::int64_t grp, const ConvPlan& plan) {
  const ConvArgs& a = plan.args;
  const bool relu = a.epilogue == Epilogue::bias_relu;
  for (std::int64_t i = 0; i < rows; ++i) {
    for (std::int64_t j = 0; j < b.cols; ++j) {
      const std::int64_t at = b.offset + i * b.ld + j, channel = grp * g.kg() + (g.nhwc ? j : i);
      float v = a.alpha * scratch[i * b.cols + j];
      if (a.beta != 0.0f) v += a.beta * static_cast<float>(y[at]);
      if (plan.has_bias) v += load_as_float(a.bias.data(), channel, a.bias.dtype());
      if (relu) v = v > 0.0f ? v : 0.0f;
      y[at] = T(v);
    }
  }
}

void epilogue(BufferView y, const float* scratch, const Block& b, std::int64_t rows, const ConvGeometry& g,
              std::int64_t grp, const ConvPlan& plan) {
  switch (y.dtype()) {
    case DType::float32:
      return epilogue_block(static_cast<float*>(y.data()), scratch, b, rows, g, grp, plan);
    case DType::float16:
      return epilogue_block(static_cast<Half*>(y.data()), scratch, b, rows, g, grp, plan);
    default:
      return epilogue_block(static_cast<BFloat16*>(y.data()), scratch, b, rows, g, grp, plan);
  }
}

}  // namespace

void host_forward(BufferView y, BufferView x, BufferView f, const ConvPlan& plan) {
  const ConvGeometry& g = plan.g;
  const ConvArgs& a = plan.args;
  const Fp32 xs(x, g.n * g.c * g.h * g.w), fs(f, g.k * g.taps());
  const std::int64_t taps = g.taps(), kg = g.kg(), pixels = g.pixels();
  const bool in_place = y.dtype() == DType::float32 && !plan.has_bias;
  const bool is_direct = direct(g);
  // NHWC: a batch of images is one GEMM (their output rows are consecutive); NCHW: one image.
  const std::int64_t batch = g.nhwc ? (is_direct ? g.n : nhwc_images_per_batch(g)) : 1;
  std::vector<float> col, scratch(in_place ? 0 : static_cast<std::size_t>(batch * pixels * kg));
  for (std::int64_t img = 0; img < g.n; img += batch) {
    const std::int64_t images = std::min(batch, g.n - img);
    for (std::int64_t grp = 0; grp < g.groups; ++grp) {
      const auto [cols, ld_col] = col_matrix(xs.data, g, img, images, grp, col);
      const Block b = y_block(g, img, grp);
      const float* filters = fs.data + grp * kg * taps;
      float* out = in_place ? y.data_as<float>() + b.offset : scratch.data();
      const std::int64_t ld = in_place ? b.ld : b.cols;
      const float alpha = in_place ? a.alpha : 1.0f, beta = in_place ? a.beta : 0.0f;
      if (g.nhwc) {  // out (images * pixels x kg) = col (images * pixels x taps) * filters^T
        detail::host_sgemm(false, true, i32(images * pixels), i32(kg), i32(taps), alpha, cols, ld_col, filters,
                           i32(taps), beta, out, i32(ld));
      } else {  // out (kg x pixels) = filters (kg x taps) * colT (taps x pixels)
        detail::host_sgemm(false, false, i32(kg), i32(pixels), i32(taps), alpha, filters, i32(taps), cols, ld_col, beta,
                           out, i32(ld));
      }
      if (!in_place) epilogue(y, scratch.data(), b, g.nhwc ? images * pixels : b.rows, g, grp, plan);
    }
  }
}

namespace {

// out[offset + i] = alpha * acc[i] + beta * out[offset + i], rounded once.
template <class T>
void finish_as(T* out, const float* acc, std::size_t n, float alpha, float beta) {
  if (beta == 0.0f) {
    for (std::size_t i = 0; i < n; ++i) out[i] = T(alpha * acc[i]);
  } else {
    for (std::size_t i = 0; i < n; ++i) out[i] = T(alpha * acc[i] + beta * static_cast<float>(out[i]));
  }
}

void finish(BufferView out, std::int64_t offset, const std::vector<float>& acc, float alpha, float beta) {
  switch (out.dtype()) {
    case DType::float32:
      return finish_as(static_cast<float*>(out.data()) + offset, acc.data(), acc.size(), alpha, beta);
    case DType::float16:
      return finish_as(static_cast<Half*>(out.data()) + offset, acc.data(), acc.size(), alpha, beta);
    default:
      return finish_as(static_cast<BFloat16*>(out.data()) + offset, acc.data(), acc.size(), alpha, beta);
  }
}

}  // namespace

void host_backward_data(BufferView dx, BufferView dy, BufferView f, const ConvPlan& plan) {
  const ConvGeometry& g = plan.g;
  const Fp32 dys(dy, g.n * g.k * g.pixels()), fs(f, g.k * g.taps());
  const std::int64_t taps = g.taps(), kg = g.kg(), pixels = g.pixels();
  const bool is_direct = direct(g);
  std::vector<float> col(is_direct ? 0 : static_cast<std::size_t>(pixels * taps)), acc;
  for (std::int64_t img = 0; img < g.n; ++img) {
    acc.assign(static_cast<std::size_t>(g.c * g.h * g.w), 0.0f);
    for (std::int64_t grp = 0; grp < g.groups; ++grp) {
      const Block b = y_block(g, img, grp);
      const float* filters = fs.data + grp * kg * taps;
      // A direct (1x1) convolution's col matrix is the image gradient itself: the GEMM writes it.
      float* cols = is_direct ? acc.data() + g.x_at(0, grp * g.cg(), 0, 0) : col.data();
      const int ld_col = i32(is_direct ? (g.nhwc ? g.c : pixels) : (g.nhwc ? taps : pixels));
      if (g.nhwc) {  // col (pixels x taps) = dy_g (pixels x kg) * filters (kg x taps)
        detail::host_sgemm(false, false, i32(pixels), i32(taps), i32(kg), 1.0f, dys.data + b.offset, i32(b.ld), filters,
                           i32(taps), 0.0f, cols, ld_col);
      } else {  // colT (taps x pixels) = filters^T (taps x kg) * dy_g (kg x pixels)
        detail::host_sgemm(true, false, i32(taps), i32(pixels), i32(kg), 1.0f, filters, i32(taps), dys.data + b.offset,
                           i32(b.ld), 0.0f, cols, ld_col);
      }
      if (!is_direct) col2im(col, g, grp, acc.data());
    }
    finish(dx, img * g.c * g.h * g.w, acc, plan.args.alpha, plan.args.beta);
  }
}

void host_backward_filter(BufferView df, BufferView x, BufferView dy, const ConvPlan& plan) {
  const ConvGeometry& g = plan.g;
  const std::int64_t taps = g.taps(), kg = g.kg(), pixels = g.pixels();
  std::vector<float> col, acc(static_cast<std::size_t>(g.k * taps), 0.0f);
  if (g.n > 0) {
    const Fp32 xs(x, g.n * g.c * g.h * g.w), dys(dy, g.n * g.k * pixels);
    const bool is_direct = direct(g);
    // NHWC: a batch of images is one GEMM, its K the batch's pixels; NCHW: one image.
    const std::int64_t batch = g.nhwc ? (is_direct ? g.n : nhwc_images_per_batch(g)) : 1;
    for (std::int64_t img = 0; img < g.n; img += batch) {
      const std::int64_t images = std::min(batch, g.n - img);
      for (std::int64_t grp = 0; grp < g.groups; ++grp) {
        const auto [cols, ld_col] = col_matrix(xs.data, g, img, images, grp, col);
        const Block b = y_block(g, img, grp);
        float* dfilters = acc.data() + grp * kg * taps;
        if (g.nhwc) {  // dfilters (kg x taps) += dy_g^T (kg x images * pixels) * col (images * pixels x taps)
          detail::host_sgemm(true, false, i32(kg), i32(taps), i32(images * pixels), 1.0f, dys.data + b.offset,
                             i32(b.ld), cols, ld_col, 1.0f, dfilters, i32(taps));
        } else {  // dfilters (kg x taps) += dy_g (kg x pixels) * colT^T (pixels x taps)
          detail::host_sgemm(false, true, i32(kg), i32(taps), i32(pixels), 1.0f, dys.data + b.offset, i32(b.ld), cols,
                             ld_col, 1.0f, dfilters, i32(taps));
        }
      }
    }
  }
  finish(df, 0, acc, plan.args.alpha, plan.args.beta);
}

}  // namespace gpucloud::detail
