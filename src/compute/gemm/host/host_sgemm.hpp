// Internal: the host backend's fp32 matrix product, row-major (cblas_sgemm's contract): OpenBLAS
// where the build found it, else a built-in loop nest, so the host library builds anywhere (the
// GPU check machine has no OpenBLAS) (not API).
#pragma once

namespace gpucloud::detail {

/// C = alpha op(A) op(B) + beta C, row-major, m x n x k; C is not read when beta is 0.
void host_sgemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda, const float* b,
                int ldb, float beta, float* c, int ldc);

/// "OpenBLAS" or "built-in": which implementation host_sgemm runs.
const char* host_sgemm_implementation() noexcept;

/// OpenBLAS's thread count, set once to the host thread budget (thread_budget().blas) unless its
/// own variables are set; 0 without OpenBLAS.
int host_blas_threads() noexcept;

}  // namespace gpucloud::detail
