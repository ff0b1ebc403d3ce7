// Index math of a 2-D convolution, shared by the host model and any device code: where element
// (n, channel, y, x) of an activation and tap (k, c, r, s) of a filter live in each layout, and
// which input pixel a filter tap reads for an output pixel.
#pragma once

#include <gpucloud/detail/hd.hpp>

#include <cstdint>

namespace gpucloud::kernels {

/// The resolved shape of a convolution (every dimension positive, output size computed).
struct ConvGeometry {
  std::int64_t n, c, h, w;  // input
  std::int64_t k, r, s;     // filters
  std::int64_t oh, ow;      // output
  std::int64_t pad_h, pad_w, stride_h, stride_w, dilation_h, dilation_w;
  std::int64_t groups;
  bool nhwc;

  GPUCLOUD_HD std::int64_t cg() const { return c / groups; }      // input channels per group
  GPUCLOUD_HD std::int64_t kg() const { return k / groups; }      // output channels per group
  GPUCLOUD_HD std::int64_t taps() const { return cg() * r * s; }  // one filter's elements (the GEMM's K)
  GPUCLOUD_HD std::int64_t pixels() const { return oh * ow; }     // output pixels of one image

  /// Offset of x[n][ch][y][x] (NCHW) or x[n][y][x][ch] (NHWC).
  GPUCLOUD_HD std::int64_t x_at(std::int64_t img, std::int64_t ch, std::int64_t y, std::int64_t x) const {
    return nhwc ? ((img * h + y) * w + x) * c + ch : ((img * c + ch) * h + y) * w + x;
  }
  /// Offset of the output element of image img, channel kk, output pixel p = oy * ow + ox.
  GPUCLOUD_HD std::int64_t y_at(std::int64_t img, std::int64_t kk, std::int64_t p) const {
    return nhwc ? (img * pixels() + p) * k + kk : (img * k + kk) * pixels() + p;
  }
  /// Position of tap (cc, rr, ss) inside one filter: KCRS order for NCHW, KRSC for NHWC. A
  /// filter is row kk of a k x taps() matrix, so a group's filters are one contiguous matrix.
  GPUCLOUD_HD std::int64_t tap(std::int64_t cc, std::int64_t rr, std::int64_t ss) const {
    return nhwc ? (rr * s + ss) * cg() + cc : (cc * r + rr) * s + ss;
  }
  /// Input row read by filter row rr for output row oy (may fall in the padding: < 0 or >= h).
  GPUCLOUD_HD std::int64_t in_y(std::int64_t oy, std::int64_t rr) const {
    return oy * stride_h - pad_h + rr * dilation_h;
  }
  /// Input column read by filter column ss for output column ox.
  GPUCLOUD_HD std::int64_t in_x(std::int64_t ox, std::int64_t ss) const {
    return ox * stride_w - pad_w + ss * dilation_w;
  }
};

}  // namespace gpucloud::kernels
