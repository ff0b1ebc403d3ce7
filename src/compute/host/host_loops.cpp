// The host's vectorised array loops (casts, relu_backward, bias_grad, scaling), each compiled for
// AVX-512, AVX2 and the baseline x86-64 with GCC's target_clones; the dynamic loader picks the version the
// CPU runs (an ifunc), as NumPy and oneDNN dispatch at run time. The typed loops are inlined into
// every version. Elsewhere (another compiler or CPU) one portable version is built.
#include "kernels/compute/host_convert.hpp"
#include "kernels/compute/host_nn_ops.hpp"
#include "kernels/launch/multi_tensor.hpp"

#include "runtime/host/target_clones.hpp"

#include <cstdint>
#include <cstring>
#include <type_traits>

#define GPUCLOUD_SIMD _Pragma("omp simd")

namespace gpucloud::kernels::host {

namespace {

template <class Dst, class Src>
GPUCLOUD_ALWAYS_INLINE void cast_loop(Dst* dst, const Src* src, std::size_t n) {
  GPUCLOUD_SIMD
  for (std::size_t i = 0; i < n; ++i) dst[i] = narrow<Dst>(widen(src[i]));
}

template <class G, class A>
GPUCLOUD_ALWAYS_INLINE void relu_loop(void* grad, const void* act, std::int64_t n) {
  G* g = static_cast<G*>(grad);
  const A* a = static_cast<const A*>(act);
  GPUCLOUD_SIMD
  for (std::int64_t i = 0; i < n; ++i) g[i] = narrow<G>(widen(a[i]) > 0.0f ? widen(g[i]) : 0.0f);
}

// A 16-bit gradient masked by an activation of the same type, in the bits (32 lanes a vector, no
// conversion): act > 0 is 0 < bits <= +inf's bits (sign clear, not zero, not NaN), and a NaN
// gradient becomes 0x7fff, as narrowing it back would make it: the bits of
// narrow(widen(act) > 0 ? widen(grad) : 0).
template <std::uint16_t kInfBits>
GPUCLOUD_ALWAYS_INLINE void relu_bits_loop(void* grad, const void* act, std::int64_t n) {
  auto* g = static_cast<std::uint16_t*>(grad);
  const auto* a = static_cast<const std::uint16_t*>(act);
  GPUCLOUD_SIMD
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint16_t ai = a[i], gi = g[i];
    const bool positive = static_cast<std::uint16_t>(ai - 1u) < kInfBits;
    const bool nan = (gi & 0x7fffu) > kInfBits;
    g[i] = positive ? (nan ? std::uint16_t{0x7fff} : gi) : std::uint16_t{0};
  }
}

// Strips of columns that stay in L1 while the rows stream past.
template <class G, class O>
GPUCLOUD_ALWAYS_INLINE void bias_grad_loop(const void* grad, void* out, std::int64_t rows, std::int64_t cols) {
  constexpr std::int64_t kStrip = 512;
  const G* g = static_cast<const G*>(grad);
  O* o = static_cast<O*>(out);
  float acc[kStrip];
  for (std::int64_t jb = 0; jb < cols; jb += kStrip) {
    const std::int64_t w = cols - jb < kStrip ? cols - jb : kStrip;
    for (std::int64_t q = 0; q < w; ++q) acc[q] = 0.0f;
    for (std::int64_t i = 0; i < rows; ++i) {
      const G* row = g + i * cols + jb;
      if constexpr (std::is_same_v<G, Half>) {
        // fp16 rows widen in the CPU's conversion instructions first (F16C, AVX-512: the same
        // values as widen()); widen() in the loop is integer bit work, 5x the time of fp32 rows.
        float wide[kStrip];
        halves_to_floats(wide, reinterpret_cast<const std::uint16_t*>(row), static_cast<std::size_t>(w));
        GPUCLOUD_SIMD
        for (std::int64_t q = 0; q < w; ++q) acc[q] += wide[q];
      } else {
        GPUCLOUD_SIMD
        for (std::int64_t q = 0; q < w; ++q) acc[q] += widen(row[q]);
      }
    }
    for (std::int64_t q = 0; q < w; ++q) o[jb + q] = narrow<O>(acc[q]);
  }
}

template <class T>
GPUCLOUD_ALWAYS_INLINE bool scale_loop(void* data, std::int64_t n, float factor) {
  T* x = static_cast<T*>(data);
  unsigned bad = 0;
  _Pragma("omp simd reduction(|:bad)") for (std::int64_t i = 0; i < n; ++i) {
    const float v = widen(x[i]);
    std::uint32_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    bad |= (bits & 0x7f800000u) == 0x7f800000u ? 1u : 0u;  // inf or NaN (kernels::is_finite)
    x[i] = narrow<T>(v * factor);
  }
  return bad != 0;
}

// (grad or output type, input type) codes as one switch value.
constexpr int pair(std::uint8_t a, std::uint8_t b) { return a * 3 + b; }

}  // namespace

void cast_array(Half* dst, const float* src, std::size_t n) {
  floats_to_halves(reinterpret_cast<std::uint16_t*>(dst), src, n);
}
GPUCLOUD_HOST_CLONES void cast_array(BFloat16* dst, const float* src, std::size_t n) { cast_loop(dst, src, n); }
void cast_array(float* dst, const Half* src, std::size_t n) {
  halves_to_floats(dst, reinterpret_cast<const std::uint16_t*>(src), n);
}
GPUCLOUD_HOST_CLONES void cast_array(float* dst, const BFloat16* src, std::size_t n) { cast_loop(dst, src, n); }

GPUCLOUD_HOST_CLONES void relu_backward(void* grad, const void* act, std::uint8_t grad_t, std::uint8_t act_t,
                                        std::int64_t n) {
  switch (pair(grad_t, act_t)) {
    case pair(kF32, kF32):
      return relu_loop<float, float>(grad, act, n);
    case pair(kF32, kF16):
      return relu_loop<float, Half>(grad, act, n);
    case pair(kF32, kBF16):
      return relu_loop<float, BFloat16>(grad, act, n);
    case pair(kF16, kF32):
      return relu_loop<Half, float>(grad, act, n);
    case pair(kF16, kF16):
      return relu_bits_loop<0x7c00>(grad, act, n);
    case pair(kF16, kBF16):
      return relu_loop<Half, BFloat16>(grad, act, n);
    case pair(kBF16, kF32):
      return relu_loop<BFloat16, float>(grad, act, n);
    case pair(kBF16, kF16):
      return relu_loop<BFloat16, Half>(grad, act, n);
    default:
      return relu_bits_loop<0x7f80>(grad, act, n);
  }
}

GPUCLOUD_HOST_CLONES void bias_grad(const void* grad, void* out, std::uint8_t grad_t, std::uint8_t out_t,
                                    std::int64_t rows, std::int64_t cols) {
  switch (pair(grad_t, out_t)) {
    case pair(kF32, kF32):
      return bias_grad_loop<float, float>(grad, out, rows, cols);
    case pair(kF32, kF16):
      return bias_grad_loop<float, Half>(grad, out, rows, cols);
    case pair(kF32, kBF16):
      return bias_grad_loop<float, BFloat16>(grad, out, rows, cols);
    case pair(kF16, kF32):
      return bias_grad_loop<Half, float>(grad, out, rows, cols);
    case pair(kF16, kF16):
      return bias_grad_loop<Half, Half>(grad, out, rows, cols);
    case pair(kF16, kBF16):
      return bias_grad_loop<Half, BFloat16>(grad, out, rows, cols);
    case pair(kBF16, kF32):
      return bias_grad_loop<BFloat16, float>(grad, out, rows, cols);
    case pair(kBF16, kF16):
      return bias_grad_loop<BFloat16, Half>(grad, out, rows, cols);
    default:
      return bias_grad_loop<BFloat16, BFloat16>(grad, out, rows, cols);
  }
}

GPUCLOUD_HOST_CLONES bool scale_array(void* x, std::uint8_t type, std::int64_t n, float factor) {
  // 16-bit: in registers, in the CPU's conversion instructions (half_convert.cpp).
  if (type == kF16) return scale_halves(static_cast<std::uint16_t*>(x), static_cast<std::size_t>(n), factor);
  if (type == kBF16) return scale_bfloat16s(static_cast<std::uint16_t*>(x), static_cast<std::size_t>(n), factor);
  return scale_loop<float>(x, n, factor);
}

GPUCLOUD_HOST_CLONES void bias_relu_rows(float* c, std::int64_t ldc, std::int64_t rows, std::int64_t n,
                                         const float* bias, bool relu) {
  for (std::int64_t i = 0; i < rows; ++i) {
    float* v = c + i * ldc;
    if (bias != nullptr && relu) {
      GPUCLOUD_SIMD
      for (std::int64_t j = 0; j < n; ++j) {
        const float x = v[j] + bias[j];
        v[j] = x > 0.0f ? x : 0.0f;
      }
    } else if (bias != nullptr) {
      GPUCLOUD_SIMD
      for (std::int64_t j = 0; j < n; ++j) v[j] += bias[j];
    } else if (relu) {
      GPUCLOUD_SIMD
      for (std::int64_t j = 0; j < n; ++j) v[j] = v[j] > 0.0f ? v[j] : 0.0f;
    }
  }
}

}  // namespace gpucloud::kernels::host
