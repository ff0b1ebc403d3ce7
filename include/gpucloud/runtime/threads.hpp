/// @file threads.hpp
/// @brief The host threads the library uses: the CPUs the process may run on (its affinity and
///        its cgroup's CPU quota), its own pool, and what it gives OpenBLAS.
#pragma once

#include <gpucloud/export.hpp>

#include <string>

namespace gpucloud {

/// @brief The one knob: host threads for the library's pool and OpenBLAS (1 to 1024); by default
///        the CPUs the process may use. Python's gpucloud.torch caps torch's intra-op threads at it.
inline constexpr const char* kHostThreadsEnv = "GPUCLOUD_HOST_THREADS";

/// @brief How many host threads the library runs and why.
struct HostThreads {
  int cpus = 1;        ///< CPUs the process may use: its affinity mask, capped by its cgroup CPU quota
  int pool = 1;        ///< the library's compute pool, the calling thread included
  int blas = 0;        ///< OpenBLAS's threads now: the pool's count (one fewer per Prefetcher, from its
                       ///< construction to its stop()) unless OPENBLAS_NUM_THREADS, GOTO_NUM_THREADS or
                       ///< OMP_NUM_THREADS is set (then its own); 0 when built without OpenBLAS
  std::string reason;  ///< where the figures come from, e.g. "affinity 8 of 64 cores, cgroup quota 4.0 CPUs"
};

/// @brief The process's host thread budget (read once: a job's affinity and quota are fixed at its start).
GPUCLOUD_API HostThreads host_threads();

}  // namespace gpucloud
