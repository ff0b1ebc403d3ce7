// Internal: the host backend's fp32 matrix product, row-major (cblas_sgemm's contract): OpenBLAS
// where the build found it, else a built-in loop nest, so the host library builds anywhere (the
// GPU check machine has no OpenBLAS) (not API).
#pragma once

#include <strings.h>

#include <string>

namespace gpucloud::detail {

/// What to tell the user when OpenBLAS @p corename (openblas_get_corename()) is one of its
/// pre-AVX kernel sets on a CPU with AVX2 (@p avx2) or AVX-512 (@p avx512): the CPU's model is one
/// it does not know (common on cloud VMs, whose CPU model is masked) and it fell back; an empty
/// string when nothing is wrong, or when OPENBLAS_CORETYPE is set (@p coretype_set: the user chose).
inline std::string blas_core_advice(const char* corename, bool avx2, bool avx512, bool coretype_set) {
  if (coretype_set || corename == nullptr || !(avx2 || avx512)) return {};
  static const char* const kPreAvx[] = {"Prescott", "Core2",     "Penryn", "Dunnington", "Nehalem", "Atom",
                                        "Katmai",   "Northwood", "Banias", "Athlon",     "Opteron", "Unknown"};
  bool pre_avx = false;
  for (const char* name : kPreAvx) pre_avx = pre_avx || strcasecmp(corename, name) == 0;
  if (!pre_avx) return {};
  const char* want = avx512 ? "SkylakeX" : "Haswell";
  return std::string("OpenBLAS runs its ") + corename + " kernels on this " + (avx512 ? "AVX-512" : "AVX2") +
         " CPU (a CPU model it does not know, as cloud VMs often report): set OPENBLAS_CORETYPE=" + want +
         " before the process starts for several times the fp32 GEMM rate (docs/tuning.md)";
}

/// C = alpha op(A) op(B) + beta C, row-major, m x n x k; C is not read when beta is 0.
void host_sgemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda, const float* b,
                int ldb, float beta, float* c, int ldc);

/// "OpenBLAS" or "built-in": which implementation host_sgemm runs.
const char* host_sgemm_implementation() noexcept;

/// OpenBLAS's thread count, set once to the host thread budget (thread_budget().blas) unless its
/// own variables are set; 0 without OpenBLAS.
int host_blas_threads() noexcept;

}  // namespace gpucloud::detail
