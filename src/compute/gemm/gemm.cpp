#include <gpucloud/compute/gemm.hpp>
#include <gpucloud/runtime/error.hpp>

#include "compute/gemm/cuda/gemm_backend.hpp"
#include "compute/gemm/gemm_plan.hpp"
#include "compute/gemm/host/host_bf16_gemm.hpp"
#include "compute/gemm/host/host_sgemm.hpp"
#include "compute/host_values.hpp"
#include "kernels/compute/host_convert.hpp"
#include "kernels/compute/host_nn_ops.hpp"
#include "memory/access.hpp"
#include "runtime/host/host_stream.hpp"
#include "runtime/stream_impl.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

namespace gpucloud {

Precision gemm_precision(DType a, bool tf32) {
  switch (a) {
    case DType::float32:
      return tf32 ? Precision::tf32 : Precision::fp32;
    case DType::float16:
      return Precision::fp16;
    case DType::bfloat16:
      return Precision::bf16;
    case DType::float8_e4m3:
    case DType::float8_e5m2:
      return Precision::fp8;
    default:
      break;
  }
  GPUCLOUD_FAIL(InvalidArgument, "gemm", std::string("a: dtype ") + dtype_name(a) + " is not a GEMM input type");
}

bool supports(Device device, Precision precision) {
  if (device.is_host()) return true;
  const auto p = device_properties(device);
  const int sm = p.compute_capability_major * 10 + p.compute_capability_minor;
  switch (precision) {
    case Precision::fp32:
      return true;
    case Precision::fp16:
      return sm >= 70;
    case Precision::tf32:
    case Precision::bf16:
      return sm >= 80;
    case Precision::fp8:
      return sm >= 89;
  }
  return false;
}

namespace {

constexpr const char* kCall = "gemm";

// Host products up to this many multiply-adds (128^3: tens of µs) run in place on an idle stream.
constexpr std::int64_t kInPlaceMultiplyAdds = std::int64_t{1} << 21;

bool is_fp8(DType t) { return t == DType::float8_e4m3 || t == DType::float8_e5m2; }

bool has_bias(Epilogue e) { return e == Epilogue::bias || e == Epilogue::bias_relu || e == Epilogue::bias_gelu; }

// a * b + c in int64, or an InvalidArgument naming @p what when it overflows.
std::int64_t checked_madd(std::int64_t a, std::int64_t b, std::int64_t c, const std::string& what) {
  std::int64_t product = 0, sum = 0;
  GPUCLOUD_EXPECTS(!__builtin_mul_overflow(a, b, &product) && !__builtin_add_overflow(product, c, &sum), kCall,
                   what + ": the element count overflows int64 (" + std::to_string(a) + " x " + std::to_string(b) +
                       " + " + std::to_string(c) + ")");
  return sum;
}

std::int64_t extent(std::int64_t rows, std::int64_t cols, std::int64_t ld) {
  return rows == 0 || cols == 0 ? 0 : checked_madd(rows - 1, ld, cols, "ld");
}

void check_operand(const char* name, BufferView v, std::int64_t rows, std::int64_t cols, std::int64_t& ld,
                   std::int64_t& stride, std::int64_t batch) {
  const std::string arg(name);
  if (ld == 0) ld = std::max<std::int64_t>(cols, 1);
  GPUCLOUD_EXPECTS(ld >= std::max<std::int64_t>(cols, 1), kCall,
                   "ld" + arg + ": " + std::to_string(ld) + " is shorter than a row of " + arg + " (" +
                       std::to_string(cols) + " elements)");
  if (stride < 0) stride = checked_madd(rows, ld, 0, "stride_" + arg);
  const std::int64_t one = extent(rows, cols, ld);
  const std::int64_t needed = one == 0 ? 0 : checked_madd(batch - 1, stride, one, "batch x stride_" + arg);
  GPUCLOUD_EXPECTS(static_cast<std::int64_t>(v.size()) >= needed, kCall,
                   arg + ": " + std::to_string(v.size()) + " elements, the shape needs " + std::to_string(needed));
}

detail::GemmPlan validate(BufferView c, BufferView a, BufferView b, const GemmArgs& in, StreamView s) {
  detail::GemmPlan plan;
  plan.args = in;
  GemmArgs& g = plan.args;
  GPUCLOUD_EXPECTS(g.m >= 0 && g.n >= 0 && g.k >= 0, kCall,
                   "m/n/k: negative dimension (" + std::to_string(g.m) + ", " + std::to_string(g.n) + ", " +
                       std::to_string(g.k) + ")");
  GPUCLOUD_EXPECTS(g.batch >= 1, kCall, "batch: " + std::to_string(g.batch) + " must be at least 1");
  // The libraries count in int: OpenBLAS's cblas_sgemm for every dimension and leading dimension,
  // cuBLASLt for the batch (its layouts take 64-bit rows, columns and strides).
  constexpr std::int64_t kIntMax = std::numeric_limits<int>::max();
  GPUCLOUD_EXPECTS(g.batch <= kIntMax, kCall, "batch: " + std::to_string(g.batch) + " exceeds 2^31-1");
  if (s.device().is_host()) {
    for (auto [value, name] : {std::pair{g.m, "m"}, std::pair{g.n, "n"}, std::pair{g.k, "k"}, std::pair{g.lda, "lda"},
                               std::pair{g.ldb, "ldb"}, std::pair{g.ldc, "ldc"}}) {
      GPUCLOUD_EXPECTS(value <= kIntMax, kCall,
                       std::string(name) + ": " + std::to_string(value) +
                           " exceeds the host BLAS's int (2^31-1); split the product");
    }
  }
  // dtypes
  const bool float_pair = a.dtype() == b.dtype() &&
                          (a.dtype() == DType::float32 || a.dtype() == DType::float16 || a.dtype() == DType::bfloat16);
  GPUCLOUD_EXPECTS(float_pair || (is_fp8(a.dtype()) && is_fp8(b.dtype())), kCall,
                   std::string("b: dtype ") + dtype_name(b.dtype()) + " does not pair with a's " +
                       dtype_name(a.dtype()) + " (both float32, both float16, both bfloat16, or fp8)");
  GPUCLOUD_EXPECTS(c.dtype() == DType::float32 || c.dtype() == DType::float16 || c.dtype() == DType::bfloat16, kCall,
                   std::string("c: dtype ") + dtype_name(c.dtype()) + " is not float32, float16 or bfloat16");
  GPUCLOUD_EXPECTS(a.dtype() != DType::float32 || c.dtype() == DType::float32, kCall,
                   std::string("c: float32 inputs need a float32 output, not ") + dtype_name(c.dtype()));
  GPUCLOUD_EXPECTS(!g.tf32 || a.dtype() == DType::float32, kCall, "tf32: only for float32 inputs");
  GPUCLOUD_EXPECTS(is_fp8(a.dtype()) || (g.scale_a == 1.0f && g.scale_b == 1.0f), kCall,
                   "scale_a/scale_b: per-tensor scales are for fp8 inputs");
  // shapes
  const bool ta = g.trans_a == Transpose::transpose, tb = g.trans_b == Transpose::transpose;
  plan.rows_a = ta ? g.k : g.m;
  plan.cols_a = ta ? g.m : g.k;
  plan.rows_b = tb ? g.n : g.k;
  plan.cols_b = tb ? g.k : g.n;
  check_operand("a", a, plan.rows_a, plan.cols_a, g.lda, g.stride_a, g.batch);
  check_operand("b", b, plan.rows_b, plan.cols_b, g.ldb, g.stride_b, g.batch);
  check_operand("c", c, g.m, g.n, g.ldc, g.stride_c, g.batch);
  GPUCLOUD_EXPECTS(g.batch == 1 || g.stride_c >= extent(g.m, g.n, g.ldc), kCall,
                   "stride_c: " + std::to_string(g.stride_c) + " makes batches of C overlap (one matrix spans " +
                       std::to_string(extent(g.m, g.n, g.ldc)) + " elements)");
  GPUCLOUD_EXPECTS(!detail::overlaps(c, a), kCall, "c: aliases a");
  GPUCLOUD_EXPECTS(!detail::overlaps(c, b), kCall, "c: aliases b");
  // epilogue
  plan.has_bias = has_bias(g.epilogue);
  if (plan.has_bias) {
    GPUCLOUD_EXPECTS(static_cast<std::int64_t>(g.bias.size()) == g.n, kCall,
                     "bias: " + std::to_string(g.bias.size()) + " elements, C has " + std::to_string(g.n) + " columns");
    GPUCLOUD_EXPECTS(g.bias.dtype() == DType::float32 || g.bias.dtype() == c.dtype(), kCall,
                     std::string("bias: dtype ") + dtype_name(g.bias.dtype()) + " is neither float32 nor c's dtype");
    detail::check_access(g.bias, s, detail::Access::kernel, kCall, "bias");
  } else {
    GPUCLOUD_EXPECTS(g.bias.empty(), kCall, "bias: given, but the epilogue adds none");
  }
  // devices
  detail::check_access(c, s, detail::Access::kernel, kCall, "c");
  detail::check_access(a, s, detail::Access::kernel, kCall, "a");
  detail::check_access(b, s, detail::Access::kernel, kCall, "b");
  plan.precision = gemm_precision(a.dtype(), g.tf32);
  if (!supports(s.device(), plan.precision)) {
    GPUCLOUD_FAIL(Unsupported, kCall,
                  std::string(precision_name(plan.precision)) + " GEMMs need a newer GPU than " +
                      device_properties(s.device()).name);
  }
  return plan;
}

// ---- the host model -------------------------------------------------------------------------

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

// One operand of one batch as fp32 (the storage layout kept), rounded as the tensor cores see it.
const float* as_fp32(const void* base, DType t, std::int64_t offset, std::int64_t count, bool tf32, float scale,
                     std::vector<float>& scratch) {
  if (t == DType::float32 && !tf32) return static_cast<const float*>(base) + offset;
  scratch.resize(static_cast<std::size_t>(count));
  if ((t == DType::float16 || t == DType::bfloat16) && scale == 1.0f) {  // exact: no tf32 rounding applies
    // The vectorised widening of the host casts (the same bits as load_as_float).
    if (t == DType::float16) {
      kernels::host::cast_array(scratch.data(), static_cast<const Half*>(base) + offset,
                                static_cast<std::size_t>(count));
    } else {
      kernels::host::cast_array(scratch.data(), static_cast<const BFloat16*>(base) + offset,
                                static_cast<std::size_t>(count));
    }
    return scratch.data();
  }
  for (std::int64_t i = 0; i < count; ++i) {
    float v = load_as_float(base, offset + i, t);
    if (tf32) v = tf32_round(v);
    scratch[static_cast<std::size_t>(i)] = v * scale;
  }
  return scratch.data();
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

// One product's C from alpha op(A) op(B) in fp32 (`ab`, m x n, dense): add beta C, the epilogue,
// and store into C's dtype, rounding once (the vectorised narrowing of the host casts for 16-bit C).
void finish_rows(BufferView c, std::int64_t c_offset, const GemmArgs& g, float* ab, const Epiloguer& epilogue) {
  for (std::int64_t i = 0; i < g.m; ++i) {
    float* row = ab + i * g.n;
    const std::int64_t c0 = c_offset + i * g.ldc;
    if (g.beta != 0.0f) {
      for (std::int64_t j = 0; j < g.n; ++j) row[j] += g.beta * load_as_float(c.data(), c0 + j, c.dtype());
    }
    epilogue.row(row, g.n);
    const auto cols = static_cast<std::size_t>(g.n);
    if (c.dtype() == DType::float32) {
      std::memcpy(static_cast<float*>(c.data()) + c0, row, cols * sizeof(float));
    } else if (c.dtype() == DType::float16) {
      kernels::host::cast_array(static_cast<Half*>(c.data()) + c0, row, cols);
    } else if (c.dtype() == DType::bfloat16) {
      kernels::host::cast_array(static_cast<BFloat16*>(c.data()) + c0, row, cols);
    } else {
      for (std::int64_t j = 0; j < g.n; ++j) store_from_float(c.data(), c0 + j, c.dtype(), row[j]);
    }
  }
}

void host_gemm(BufferView c, BufferView a, BufferView b, const detail::GemmPlan& plan) {
  const GemmArgs& g = plan.args;
  const bool fp32_out = c.dtype() == DType::float32;
  std::vector<float> a32, b32;
  std::unique_ptr<float[]> out;  // not value-initialised: every element is written before it is read
  const std::int64_t ext_a = extent(plan.rows_a, plan.cols_a, g.lda);
  const std::int64_t ext_b = extent(plan.rows_b, plan.cols_b, g.ldb);
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
    out.reset(new float[static_cast<std::size_t>(g.m * g.n)]);
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
      float* pc = direct ? c.data_as<float>() + p * g.stride_c : out.get();
      detail::host_bf16_gemm(ta, tb, g.m, g.n, g.k, g.alpha, pa, g.lda, pb, g.ldb, pc, direct ? g.ldc : g.n,
                             /*c_bf16=*/false);
      if (direct) {
        if (g.epilogue != Epilogue::none) epilogue.rows(pc, g.ldc, g.m, g.n);
        continue;
      }
      finish_rows(c, p * g.stride_c, g, out.get(), epilogue);
      continue;
    }
    const float* pa = as_fp32(a.data(), a.dtype(), p * g.stride_a, ext_a, g.tf32, fp8 ? g.scale_a : 1.0f, a32);
    const float* pb = as_fp32(b.data(), b.dtype(), p * g.stride_b, ext_b, g.tf32, fp8 ? g.scale_b : 1.0f, b32);
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
                       static_cast<int>(g.lda), pb, static_cast<int>(g.ldb), 0.0f, out.get(), static_cast<int>(g.n));
    finish_rows(c, p * g.stride_c, g, out.get(), epilogue);
  }
}

}  // namespace

void gemm(BufferView c, BufferView a, BufferView b, const GemmArgs& args, StreamView stream) {
  const detail::GemmPlan plan = validate(c, a, b, args, stream);
  if (plan.args.m == 0 || plan.args.n == 0) return;
  if (stream.device().is_cuda()) {
    detail::cuda::gemm(c, a, b, plan, *stream.impl());
    return;
  }
  // Small products (up to 128^3 multiply-adds, tens of µs) run in place on an idle stream, as
  // NumPy's and torch's CPU matmul run on the caller: no hand-off to the worker.
  const auto& g = plan.args;
  const bool small = g.m * g.n * std::max<std::int64_t>(g.k, 1) * g.batch <= kInPlaceMultiplyAdds;
  detail::run_or_enqueue(*stream.impl(), small, [c, a, b, plan] { host_gemm(c, a, b, plan); });
}

}  // namespace gpucloud
