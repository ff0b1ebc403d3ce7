// host_threads(): the budget (runtime/host/thread_budget) with OpenBLAS's count, which the
// compute layer owns.
#include <gpucloud/runtime/threads.hpp>

#include "compute/gemm/host/host_sgemm.hpp"
#include "runtime/host/thread_budget.hpp"

namespace gpucloud {

HostThreads host_threads() {
  HostThreads t = detail::thread_budget();
  t.blas = detail::host_blas_threads();
  return t;
}

}  // namespace gpucloud
