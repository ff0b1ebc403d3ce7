// Internal: the limits the process's control groups (v1 or v2) set on its memory and CPU time.
#pragma once

#include <cstddef>
#include <optional>
#include <string>

namespace gpucloud::detail {

/// The tightest memory limit on the process's cgroup and its ancestors, and that cgroup's usage.
struct CgroupMemory {
  std::optional<std::size_t> limit;  ///< bytes; none when no cgroup limits memory
  std::optional<std::size_t> usage;  ///< bytes in use in the limiting cgroup
  std::string path;                  ///< the limiting cgroup's directory
};

/// Read from /proc/self/cgroup and /proc/self/mountinfo at each call (a job may be moved).
CgroupMemory cgroup_memory();

/// The CPUs the process's cgroups grant (CFS quota / period, the tightest up the tree): 1.5 for
/// "150000 100000"; none without a quota.
std::optional<double> cgroup_cpu_limit();

}  // namespace gpucloud::detail
