// Internal: the host thread budget (not API): the CPUs the process may use, and the count the
// library's pool and OpenBLAS get.
#pragma once

#include <gpucloud/runtime/threads.hpp>

namespace gpucloud::detail {

/// host_threads() without BLAS's figure: cpus, pool and the reason; blas is the count OpenBLAS is
/// to be given (0 when OPENBLAS_NUM_THREADS, GOTO_NUM_THREADS or OMP_NUM_THREADS is set).
const HostThreads& thread_budget() noexcept;

}  // namespace gpucloud::detail
