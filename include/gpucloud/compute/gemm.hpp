/// @file gemm.hpp
/// @brief Mixed-precision GEMM: row-major C = alpha * op(A) * op(B) + beta * C, strided batches,
///        fused bias and ReLU/GELU epilogues; cuBLASLt on a GPU, an exact host model elsewhere.
#pragma once

#include <gpucloud/export.hpp>
#include <gpucloud/memory/buffer.hpp>
#include <gpucloud/runtime/device.hpp>
#include <gpucloud/runtime/gpu_specs.hpp>
#include <gpucloud/runtime/stream.hpp>

#include <cstdint>

namespace gpucloud {

/// @brief op(X): X as stored, or its transpose.
enum class Transpose : std::uint8_t { none, transpose };

/// @brief What happens to alpha * op(A) op(B) + beta * C before it is stored.
enum class Epilogue : std::uint8_t {
  none,       ///< nothing
  bias,       ///< + bias (one value per column of C)
  relu,       ///< max(x, 0)
  bias_relu,  ///< max(x + bias, 0)
  gelu,       ///< GELU, tanh approximation (cuBLASLt's)
  bias_gelu,  ///< GELU(x + bias)
};

/// @brief The shape and options of a GEMM. Row-major: element (i, j) of a matrix X with leading
///        dimension ldx is X[i * ldx + j].
struct GemmArgs {
  std::int64_t m = 0;                   ///< rows of op(A) and C
  std::int64_t n = 0;                   ///< columns of op(B) and C
  std::int64_t k = 0;                   ///< columns of op(A), rows of op(B); 0 gives C = beta * C (+ epilogue)
  Transpose trans_a = Transpose::none;  ///< op for A (A is m x k as stored, or k x m when transposed)
  Transpose trans_b = Transpose::none;  ///< op for B (B is k x n as stored, or n x k when transposed)
  std::int64_t lda = 0;                 ///< leading dimension of A (0: its row length)
  std::int64_t ldb = 0;                 ///< leading dimension of B (0: its row length)
  std::int64_t ldc = 0;                 ///< leading dimension of C (0: n)
  std::int64_t batch = 1;               ///< number of products
  std::int64_t stride_a = -1;           ///< elements between batches of A (-1: packed; 0: one A for all)
  std::int64_t stride_b = -1;           ///< elements between batches of B (-1: packed; 0: one B for all)
  std::int64_t stride_c = -1;           ///< elements between batches of C (-1: packed; batches must not overlap)
  float alpha = 1.0f;                   ///< scales the product
  float beta = 0.0f;                    ///< scales C's previous value (C is not read when 0)
  Epilogue epilogue = Epilogue::none;   ///< fused epilogue
  BufferView bias;                      ///< n values, float32 or C's dtype, for the bias epilogues
  bool tf32 = false;                    ///< float32 inputs computed as TF32 on tensor cores
  float scale_a = 1.0f;                 ///< fp8 A is dequantised as A * scale_a
  float scale_b = 1.0f;                 ///< fp8 B is dequantised as B * scale_b
};

/// @brief C = epilogue(alpha * op(A) op(B) + beta * C [+ bias]) in the order of @p stream, batched.
///
/// Inputs: A and B both float32 (fp32 or, with tf32, TF32 math), both float16, both bfloat16, or
/// fp8 (e4m3/e5m2, either mix). Accumulation is fp32. C is float32, float16 or bfloat16 (float32
/// for float32 inputs). On a GPU: cuBLASLt, its plan chosen once per shape and cached. On the
/// host: the inputs (already rounded to their dtype; TF32 inputs rounded to 10 mantissa bits) are
/// multiplied in fp32 by OpenBLAS, the epilogue applied, the output rounded to C's dtype.
/// @throws InvalidArgument naming the argument (inner dimensions, leading dimensions shorter than a
///         row, buffers too small, batches of C that overlap, C aliasing A or B, buffers on other
///         devices, unsupported dtypes), Unsupported for a precision the GPU lacks; all before any work.
GPUCLOUD_API void gemm(BufferView c, BufferView a, BufferView b, const GemmArgs& args, StreamView stream);

/// @brief The precision a GEMM on these dtypes runs in (for the spec table and the support query).
GPUCLOUD_API Precision gemm_precision(DType a, bool tf32);

/// @brief Whether @p device runs @p precision: the host models all of them; a GPU needs tensor
///        cores for fp16 (sm_70+), bf16 and tf32 (sm_80+), fp8 (sm_89+).
GPUCLOUD_API bool supports(Device device, Precision precision);

}  // namespace gpucloud
