// The host backend's fp32 matrix product: OpenBLAS's cblas_sgemm (multithreaded), or, in builds
// without a BLAS (GPUCLOUD_BLAS=OFF, or none found), a loop nest whose inner loops run over
// contiguous rows so the compiler vectorises them.
#include "compute/gemm/host/host_sgemm.hpp"

#include "runtime/host/thread_budget.hpp"

#if GPUCLOUD_WITH_BLAS
#include <cblas.h>
#endif

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

namespace gpucloud::detail {

#if GPUCLOUD_WITH_BLAS

namespace {
// OpenBLAS starts a thread per online core, blind to the cgroup's CPU quota: it gets the budget,
// once, before the library's first product.
struct BlasThreads {
  int budget = 0;           // what it was given (0: its own variables decide, never changed)
  bool adjustable = false;  // a count may change between products (below)
  std::mutex mutex;
  std::atomic<int> applied{0};
};

BlasThreads& blas_threads() noexcept {
  static BlasThreads t;
  return t;
}

void apply_blas_budget() noexcept {
  static std::once_flag once;
  std::call_once(once, [] {
    BlasThreads& t = blas_threads();
    const int n = thread_budget().blas;
    if (n > 0) openblas_set_num_threads(n);
    t.budget = n;
    t.applied.store(n, std::memory_order_relaxed);
    // Lowering the count and raising it back to the budget is one store in OpenBLAS's pthreads
    // server built without CPU affinity (Debian's, conda-forge's, the wheels'): its threads exist
    // and a product in flight keeps the count it started with. Other builds (OpenMP, affinity)
    // re-pin or re-allocate per thread: left alone.
    const char* config = openblas_get_config();
    t.adjustable =
        n > 1 && openblas_get_parallel() == 1 && config != nullptr && std::strstr(config, "NO_AFFINITY") != nullptr;
    bool avx2 = false, avx512 = false;
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
#endif
    const std::string advice =
        blas_core_advice(openblas_get_corename(), avx2, avx512, std::getenv("OPENBLAS_CORETYPE") != nullptr);
    if (!advice.empty()) std::fprintf(stderr, "gpucloud: warning: %s\n", advice.c_str());
  });
  // One thread fewer for each busy library thread (a Prefetcher's producer): on a machine with
  // few cores OpenBLAS's helpers, spinning between products, otherwise take turns with the data
  // loader (train_mlp on 2 cores: 1.3-2.7 s for 3000 fp32 steps with 2 threads, 1.3-1.6 with 1).
  BlasThreads& t = blas_threads();
  if (!t.adjustable) return;
  const auto wanted = [&t] { return std::max(1, t.budget - busy_library_threads()); };
  if (t.applied.load(std::memory_order_relaxed) == wanted()) return;
  std::lock_guard<std::mutex> lock(t.mutex);  // one setter at a time; read again under it
  const int want = wanted();
  if (t.applied.load(std::memory_order_relaxed) != want) {
    openblas_set_num_threads(want);
    t.applied.store(want, std::memory_order_relaxed);
  }
}
}  // namespace

int host_blas_threads() noexcept {
  apply_blas_budget();
  return openblas_get_num_threads();
}

void host_sgemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda, const float* b,
                int ldb, float beta, float* c, int ldc) {
  apply_blas_budget();
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha,
              a, lda, b, ldb, beta, c, ldc);
}

const char* host_sgemm_implementation() noexcept { return "OpenBLAS"; }

#else

int host_blas_threads() noexcept { return 0; }

void host_sgemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda, const float* b,
                int ldb, float beta, float* c, int ldc) {
  // op(B) as k contiguous rows of n: B itself, or B transposed once (O(nk), against O(mnk)).
  std::vector<float> packed;
  const float* rows = b;
  std::size_t row_stride = static_cast<std::size_t>(ldb);
  if (trans_b && m > 0) {
    packed.resize(static_cast<std::size_t>(k) * static_cast<std::size_t>(n));
    for (int j = 0; j < n; ++j) {
      for (int l = 0; l < k; ++l) {
        packed[static_cast<std::size_t>(l) * n + j] = b[static_cast<std::size_t>(j) * ldb + l];
      }
    }
    rows = packed.data();
    row_stride = static_cast<std::size_t>(n);
  }
  for (int i = 0; i < m; ++i) {
    float* row = c + static_cast<std::size_t>(i) * ldc;
    if (beta == 0.0f) {  // C is not read: whatever it held (NaN) is gone
      for (int j = 0; j < n; ++j) row[j] = 0.0f;
    } else if (beta != 1.0f) {
      for (int j = 0; j < n; ++j) row[j] *= beta;
    }
    if (alpha == 0.0f) continue;
    // Row i of C += alpha op(A)(i, l) * row l of op(B): contiguous, vectorised without reassociation.
    for (int l = 0; l < k; ++l) {
      const float ail = trans_a ? a[static_cast<std::size_t>(l) * lda + i] : a[static_cast<std::size_t>(i) * lda + l];
      const float s = alpha * ail;
      const float* brow = rows + static_cast<std::size_t>(l) * row_stride;
      for (int j = 0; j < n; ++j) row[j] += s * brow[j];
    }
  }
}

const char* host_sgemm_implementation() noexcept { return "built-in"; }

#endif

}  // namespace gpucloud::detail
