// Internal: the host thread budget (not API): the CPUs the process may use, and the count the
// library's pool and OpenBLAS get.
#pragma once

#include <gpucloud/runtime/threads.hpp>

namespace gpucloud::detail {

/// host_threads() without BLAS's figure: cpus, pool and the reason; blas is the count OpenBLAS is
/// to be given (0 when OPENBLAS_NUM_THREADS, GOTO_NUM_THREADS or OMP_NUM_THREADS is set).
const HostThreads& thread_budget() noexcept;

/// Library threads that keep a core busy (a Prefetcher's producer, counted from the Prefetcher's
/// construction to its stop()): OpenBLAS gets one thread fewer for each (at least one), so its
/// helpers, which spin between products, do not take turns with them on the same cores.
int busy_library_threads() noexcept;

/// Counts one busy library thread in busy_library_threads() for its lifetime. Counted in program
/// order (not by the busy thread itself, whose start and end move with the scheduler), so every
/// run of a program gives each product the same OpenBLAS thread count, and the same bits.
class BusyLibraryThread {
 public:
  BusyLibraryThread() noexcept;
  ~BusyLibraryThread();
  BusyLibraryThread(const BusyLibraryThread&) = delete;
  BusyLibraryThread& operator=(const BusyLibraryThread&) = delete;
};

}  // namespace gpucloud::detail
