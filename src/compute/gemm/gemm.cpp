#include <gpucloud/compute/gemm.hpp>
#include <gpucloud/runtime/error.hpp>

#include "compute/gemm/cuda/gemm_backend.hpp"
#include "compute/gemm/gemm_plan.hpp"
#include "compute/gemm/host/gemm_host.hpp"
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
  GPUCLOUD_EXPECTS(float_pair || (detail::is_fp8(a.dtype()) && detail::is_fp8(b.dtype())), kCall,
                   std::string("b: dtype ") + dtype_name(b.dtype()) + " does not pair with a's " +
                       dtype_name(a.dtype()) + " (both float32, both float16, both bfloat16, or fp8)");
  GPUCLOUD_EXPECTS(c.dtype() == DType::float32 || c.dtype() == DType::float16 || c.dtype() == DType::bfloat16, kCall,
                   std::string("c: dtype ") + dtype_name(c.dtype()) + " is not float32, float16 or bfloat16");
  GPUCLOUD_EXPECTS(a.dtype() != DType::float32 || c.dtype() == DType::float32, kCall,
                   std::string("c: float32 inputs need a float32 output, not ") + dtype_name(c.dtype()));
  GPUCLOUD_EXPECTS(!g.tf32 || a.dtype() == DType::float32, kCall, "tf32: only for float32 inputs");
  GPUCLOUD_EXPECTS(detail::is_fp8(a.dtype()) || (g.scale_a == 1.0f && g.scale_b == 1.0f), kCall,
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
  // What cuBLASLt's fp8 table has (cublasLtMatmul: E4M3 x E4M3, E4M3 x E5M2, E5M2 x E4M3, in its
  // TN layout); the host model computes every pairing and layout.
  if (s.device().is_cuda() && detail::is_fp8(a.dtype())) {
    if (a.dtype() == DType::float8_e5m2 && b.dtype() == DType::float8_e5m2) {
      GPUCLOUD_FAIL(Unsupported, kCall,
                    "b: cuBLASLt has no e5m2 x e5m2 product; make one operand e4m3 (e5m2 is for gradients)");
    }
    if (g.trans_a != Transpose::none || g.trans_b != Transpose::transpose) {
      GPUCLOUD_FAIL(Unsupported, kCall,
                    "trans_b: fp8 on cuBLASLt needs C = A * B^T (trans_a none, trans_b transpose), its TN layout");
    }
  }
  return plan;
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
  detail::run_or_enqueue(*stream.impl(), small, [c, a, b, plan] { detail::host_gemm(c, a, b, plan); });
}

}  // namespace gpucloud
