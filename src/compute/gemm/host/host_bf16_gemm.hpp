// Internal: the host backend's bf16 matrix product with fp32 accumulation, through oneDNN's matmul
// (the library PyTorch's CPU bf16 matmul runs) where the build found oneDNN and the CPU has native
// bf16 dot products (AVX512_BF16/AMX); elsewhere the caller widens to fp32 and runs host_sgemm
// (not API).
#pragma once

#include <cstdint>

namespace gpucloud::detail {

/// True when host_bf16_gemm runs natively here (oneDNN built in and a CPU with bf16 dot products).
bool host_bf16_gemm_available() noexcept;

/// C = relu?(alpha op(A) op(B) + bias), row-major, A and B bf16 bits, C fp32 or (c_bf16) bf16
/// rounded once from the fp32 value (RNE), not read; fp32 accumulation. @p bias (n values, fp32 or,
/// with @p bias_bf16, bf16; may be null) is added to the fp32 sum after alpha, so pass alpha 1 with
/// a bias. False (nothing written) when not available.
bool host_bf16_gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                    const std::uint16_t* a, std::int64_t lda, const std::uint16_t* b, std::int64_t ldb, void* c,
                    std::int64_t ldc, bool c_bf16, const void* bias = nullptr, bool bias_bf16 = false,
                    bool relu = false);

/// "oneDNN" or "widened to fp32": what a host GEMM with bf16 operands runs.
const char* host_bf16_gemm_implementation() noexcept;

}  // namespace gpucloud::detail
