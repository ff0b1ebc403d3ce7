// The GEMM's host backend: alpha op(A) op(B) + beta C in fp32 (inputs widened, and rounded as
// the tensor cores see them: tf32, fp8 scales), the epilogue, one rounding into C's dtype. The
// products themselves run on OpenBLAS's sgemm and oneDNN's bf16 GEMM where they are built in
// (host_sgemm.hpp, host_bf16_gemm.hpp).
#include "compute/gemm/host/gemm_host.hpp"

#include "compute/gemm/host/host_bf16_gemm.hpp"
#include "compute/gemm/host/host_sgemm.hpp"
#include "compute/host_values.hpp"
#include "kernels/compute/host_convert.hpp"
#include "kernels/compute/host_nn_ops.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

namespace gpucloud::detail {

namespace {

float tf32_round(float x) {  // cvt.rna.tf32.f32: 10 mantissa bits, ties away from zero
  std::uint32_t u = detail::float_as_bits(x);
  if ((u & 0x7f800000u) == 0x7f800000u) return x;
  u = (u + 0x1000u) & 0xffffe000u;
  return detail::bits_as_float(u);
}

using detail::load_as_float;
using detail::store_from_float;

float gelu_tanh(float x) {
  const float c = 0.7978845608028654f;  // sqrt(2 / pi)
  return 0.5f * x * (1.0f + std::tanh(c * (x + 0.044715f * x * x * x)));
}

// fp32 scratch kept by each thread between GEMMs (up to kKeepBytes), uninitialised: a 16-bit
// GEMM's widened operands and product neither zero-fill nor page-fault fresh memory every call
// (a vector per call did both: in train_mlp's fp16 run, a memset and page faults each GEMM).
class Scratch {
 public:
  float* get(std::size_t n) {
    if (n > capacity_) {
      data_.reset();  // the old block goes first: never both held at once
      data_.reset(new float[n]);
      capacity_ = n;
    }
    return data_.get();
  }
  void trim() noexcept {
    if (capacity_ * sizeof(float) > kKeepBytes) {
      data_.reset();
      capacity_ = 0;
    }
  }

 private:
  static constexpr std::size_t kKeepBytes = std::size_t{32} << 20;
  std::unique_ptr<float[]> data_;
  std::size_t capacity_ = 0;
};

// This thread's scratch for A, B and a narrow C's fp32 product; trimmed when the GEMM ends.
struct ThreadScratch {
  Scratch a, b, out;
};
ThreadScratch& thread_scratch() {
  thread_local ThreadScratch scratch;
  return scratch;
}

// One operand of one batch as fp32 (the storage layout kept), rounded as the tensor cores see it.
const float* as_fp32(const void* base, DType t, std::int64_t offset, std::int64_t count, bool tf32, float scale,
                     Scratch& scratch) {
  if (t == DType::float32 && !tf32) return static_cast<const float*>(base) + offset;
  float* out = scratch.get(static_cast<std::size_t>(count));
  if ((t == DType::float16 || t == DType::bfloat16) && scale == 1.0f) {  // exact: no tf32 rounding applies
    // The vectorised widening of the host casts (the same bits as load_as_float).
    if (t == DType::float16) {
      kernels::host::cast_array(out, static_cast<const Half*>(base) + offset, static_cast<std::size_t>(count));
    } else {
      kernels::host::cast_array(out, static_cast<const BFloat16*>(base) + offset, static_cast<std::size_t>(count));
    }
    return out;
  }
  for (std::int64_t i = 0; i < count; ++i) {
    float v = load_as_float(base, offset + i, t);
    if (tf32) v = tf32_round(v);
    out[static_cast<std::size_t>(i)] = v * scale;
  }
  return out;
}

// The epilogue on one stored value of C (v already holds alpha AB + beta C).
// The epilogue on one row of C in fp32 (v already holds alpha AB + beta C): bias (widened to fp32
// once per call), then ReLU or GELU, as tight loops the compiler vectorises.
struct Epiloguer {
  std::vector<float> bias;  // empty: no bias
  bool relu = false, gelu = false;

  explicit Epiloguer(const detail::GemmPlan& plan) {
    const GemmArgs& g = plan.args;
    if (plan.has_bias) {
      bias.resize(static_cast<std::size_t>(g.n));
      for (std::int64_t j = 0; j < g.n; ++j)
        bias[static_cast<std::size_t>(j)] = load_as_float(g.bias.data(), j, g.bias.dtype());
    }
    relu = g.epilogue == Epilogue::relu || g.epilogue == Epilogue::bias_relu;
    gelu = g.epilogue == Epilogue::gelu || g.epilogue == Epilogue::bias_gelu;
  }
  // Rows of C (row stride ldc) in one pass each (it is memory-bound when C is large): bias, then
  // the activation, in that order (the same values as separate passes). Bias and ReLU run the
  // vectorised host loop.
  void rows(float* c, std::int64_t ldc, std::int64_t m, std::int64_t n) const {
    const float* b = bias.empty() ? nullptr : bias.data();
    if (!gelu) {
      if (b != nullptr || relu) kernels::host::bias_relu_rows(c, ldc, m, n, b, relu);
      return;
    }
    for (std::int64_t i = 0; i < m; ++i) {
      float* v = c + i * ldc;
      for (std::int64_t j = 0; j < n; ++j) v[j] = gelu_tanh(b != nullptr ? v[j] + b[j] : v[j]);
    }
  }
  void row(float* v, std::int64_t n) const { rows(v, n, 1, n); }
};

// Rows of C per product when an epilogue follows a shallow product (k <= kShallowK): each panel
// of C (about 256 KiB) gets its epilogue while still in cache instead of a second pass over all
// of C from memory; B (k x n) is small, so packing it again per panel costs little.
constexpr std::int64_t kShallowK = 128;
std::int64_t epilogue_panel_rows(const GemmArgs& g) {
  if (g.epilogue == Epilogue::none || g.k > kShallowK) return g.m;
  return std::clamp<std::int64_t>((std::int64_t{64} << 10) / std::max<std::int64_t>(g.n, 1), 16, g.m);
}

// @p n fp32 values into C's dtype from element @p c0 on (16-bit: the vectorised host casts).
void store_row(BufferView c, std::int64_t c0, const float* row, std::size_t n) {
  if (c.dtype() == DType::float32) {
    std::memcpy(static_cast<float*>(c.data()) + c0, row, n * sizeof(float));
  } else if (c.dtype() == DType::float16) {
    kernels::host::cast_array(static_cast<Half*>(c.data()) + c0, row, n);
  } else if (c.dtype() == DType::bfloat16) {
    kernels::host::cast_array(static_cast<BFloat16*>(c.data()) + c0, row, n);
  } else {
    for (std::size_t j = 0; j < n; ++j)
      store_from_float(c.data(), c0 + static_cast<std::int64_t>(j), c.dtype(), row[j]);
  }
}

// One product's C from alpha op(A) op(B) in fp32 (`ab`, m x n, dense): add beta C, the epilogue,
// and store into C's dtype, rounding once (the vectorised narrowing of the host casts for 16-bit C).
void finish_rows(BufferView c, std::int64_t c_offset, const GemmArgs& g, float* ab, const Epiloguer& epilogue) {
  // 16-bit C without gaps between rows (ldc == n) is narrowed in one call after the epilogue: a
  // row at a time would leave a scalar tail per row (n = 1: every element).
  const bool narrow_whole = g.ldc == g.n && (c.dtype() == DType::float16 || c.dtype() == DType::bfloat16);
  for (std::int64_t i = 0; i < g.m; ++i) {
    float* row = ab + i * g.n;
    const std::int64_t c0 = c_offset + i * g.ldc;
    if (g.beta != 0.0f) {
      for (std::int64_t j = 0; j < g.n; ++j) row[j] += g.beta * load_as_float(c.data(), c0 + j, c.dtype());
    }
    epilogue.row(row, g.n);
    if (narrow_whole) continue;
    store_row(c, c0, row, static_cast<std::size_t>(g.n));
  }
  if (narrow_whole) store_row(c, c_offset, ab, static_cast<std::size_t>(g.m * g.n));
}

}  // namespace

void host_gemm(BufferView c, BufferView a, BufferView b, const GemmPlan& plan) {
  const GemmArgs& g = plan.args;
  const bool fp32_out = c.dtype() == DType::float32;
  ThreadScratch& scratch = thread_scratch();
  struct Trim {  // a large GEMM's scratch is not kept, also when it throws
    ThreadScratch& s;
    ~Trim() {
      s.a.trim();
      s.b.trim();
      s.out.trim();
    }
  } trim{scratch};
  float* out = nullptr;  // not initialised: every element is written before it is read
  const std::int64_t ext_a = stored_extent(plan.rows_a, plan.cols_a, g.lda);
  const std::int64_t ext_b = stored_extent(plan.rows_b, plan.cols_b, g.ldb);
  const bool fp8 = is_fp8(a.dtype());
  const bool ta = g.trans_a == Transpose::transpose;
  const bool tb = g.trans_b == Transpose::transpose;
  const Epiloguer epilogue(plan);
  // bf16 x bf16 through oneDNN's native product where there is one: alpha op(A) op(B) in fp32,
  // straight into an fp32 C when beta is 0 (a bf16 C without epilogue too, rounded once by oneDNN),
  // else into `out`, then the same beta/epilogue/rounding
  // as the widened path below (fp32 accumulation, one rounding into C).
  const bool native_bf16 =
      a.dtype() == DType::bfloat16 && b.dtype() == DType::bfloat16 && detail::host_bf16_gemm_available();
  // oneDNN writes C itself (bf16 or fp32), the bias and ReLU fused as its bias and post-op, when
  // nothing else is needed: beta 0, and alpha 1 with a bias (oneDNN scales before adding it, as we
  // do only with alpha 1). GELU, beta and fp16 C take the finishing passes below.
  const bool relu_epilogue = g.epilogue == Epilogue::relu || g.epilogue == Epilogue::bias_relu;
  const bool fusable =
      g.epilogue == Epilogue::none || (g.alpha == 1.0f && g.k > 0 && (plan.has_bias || relu_epilogue) &&
                                       g.epilogue != Epilogue::gelu && g.epilogue != Epilogue::bias_gelu);
  const bool direct_bf16 = native_bf16 && (c.dtype() == DType::bfloat16 || fp32_out) && g.beta == 0.0f && fusable;
  // alpha AB in fp32 for C's finishing pass: a narrow C not written by oneDNN, or an fp32 C read
  // for beta on the native path (the widened path's sgemm applies beta itself).
  if ((!fp32_out && !direct_bf16) || (native_bf16 && fp32_out && g.beta != 0.0f)) {
    out = scratch.out.get(static_cast<std::size_t>(g.m * g.n));
  }
  for (std::int64_t p = 0; p < g.batch; ++p) {
    if (native_bf16) {
      const auto* pa = static_cast<const std::uint16_t*>(a.data()) + p * g.stride_a;
      const auto* pb = static_cast<const std::uint16_t*>(b.data()) + p * g.stride_b;
      if (direct_bf16) {  // oneDNN rounds relu(alpha AB + bias) into C once, as finish_rows would
        void* pc = static_cast<char*>(c.data()) + p * g.stride_c * static_cast<std::int64_t>(dtype_size(c.dtype()));
        detail::host_bf16_gemm(ta, tb, g.m, g.n, g.k, g.alpha, pa, g.lda, pb, g.ldb, pc, g.ldc,
                               /*c_bf16=*/!fp32_out, plan.has_bias ? g.bias.data() : nullptr,
                               plan.has_bias && g.bias.dtype() == DType::bfloat16, relu_epilogue);
        continue;
      }
      const bool direct = fp32_out && g.beta == 0.0f;
      float* pc = direct ? c.data_as<float>() + p * g.stride_c : out;
      detail::host_bf16_gemm(ta, tb, g.m, g.n, g.k, g.alpha, pa, g.lda, pb, g.ldb, pc, direct ? g.ldc : g.n,
                             /*c_bf16=*/false);
      if (direct) {
        if (g.epilogue != Epilogue::none) epilogue.rows(pc, g.ldc, g.m, g.n);
        continue;
      }
      finish_rows(c, p * g.stride_c, g, out, epilogue);
      continue;
    }
    const float* pa = as_fp32(a.data(), a.dtype(), p * g.stride_a, ext_a, g.tf32, fp8 ? g.scale_a : 1.0f, scratch.a);
    const float* pb = as_fp32(b.data(), b.dtype(), p * g.stride_b, ext_b, g.tf32, fp8 ? g.scale_b : 1.0f, scratch.b);
    if (fp32_out) {
      // Straight into C: host_sgemm applies alpha and beta (and reads no C when beta is 0), in
      // panels of rows when an epilogue follows a shallow product.
      float* pc = c.data_as<float>() + p * g.stride_c;
      const std::int64_t panel = epilogue_panel_rows(g);
      for (std::int64_t r0 = 0; r0 < g.m; r0 += panel) {
        const std::int64_t rows = std::min(panel, g.m - r0);
        const float* pa_rows = pa + (ta ? r0 : r0 * g.lda);  // row r0 of op(A)
        float* pc_rows = pc + r0 * g.ldc;
        detail::host_sgemm(ta, tb, static_cast<int>(rows), static_cast<int>(g.n), static_cast<int>(g.k), g.alpha,
                           pa_rows, static_cast<int>(g.lda), pb, static_cast<int>(g.ldb), g.beta, pc_rows,
                           static_cast<int>(g.ldc));
        if (g.epilogue != Epilogue::none) epilogue.rows(pc_rows, g.ldc, rows, g.n);
      }
      continue;
    }
    // Narrow output: accumulate in fp32, add beta C and the epilogue, round once.
    detail::host_sgemm(ta, tb, static_cast<int>(g.m), static_cast<int>(g.n), static_cast<int>(g.k), g.alpha, pa,
                       static_cast<int>(g.lda), pb, static_cast<int>(g.ldb), 0.0f, out, static_cast<int>(g.n));
    finish_rows(c, p * g.stride_c, g, out, epilogue);
  }
}

}  // namespace gpucloud::detail
