/// @file quota.hpp
/// @brief A per-process quota on the memory the library holds from each device: torch's
///        set_per_process_memory_fraction and RMM's limiting adaptor, for every resource at once.
#pragma once

#include <gpucloud/export.hpp>
#include <gpucloud/runtime/device.hpp>

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

namespace gpucloud {

/// @brief Environment variable read at a device's first allocation: a quota per device, e.g.
///        "8GiB", "0.5" or "50%" (of the device's memory; the host's is its cgroup limit when one is
///        set), or "host=2GiB,cuda=0.9,cuda:1=10GiB" (cuda: every GPU, cuda:N: one; N wins).
inline constexpr const char* kMemoryQuotaEnv = "GPUCLOUD_MEMORY_QUOTA";

/// @brief The quota of one device and what the process holds under it.
struct MemoryQuota {
  Device device = Device::host();          ///< the device
  std::optional<std::size_t> limit_bytes;  ///< the quota; none when unset
  std::string source;                      ///< where the limit came from ("" without one)
  std::size_t held_bytes = 0;              ///< bytes the library's resources hold from the device now
  std::size_t peak_bytes = 0;              ///< highest held_bytes seen
  std::size_t refused = 0;                 ///< allocations the quota refused (an OutOfMemory each)
};

/// @brief Caps what the library's resources hold from @p device at @p bytes (pools' caches
///        included); an allocation beyond it is an OutOfMemory naming the quota, the request and
///        what is held. A cap below what is held refuses new allocations until enough is freed.
/// @throws InvalidArgument for an index beyond the devices the quota tracks (64 GPUs).
GPUCLOUD_API void set_memory_quota(Device device, std::size_t bytes);

/// @brief The quota as a share of @p device's memory (memory_info().total; the host's is capped by
///        the process's cgroup memory limit), as torch.cuda.set_per_process_memory_fraction.
/// @throws InvalidArgument unless 0 < @p fraction <= 1.
GPUCLOUD_API void set_memory_fraction(Device device, double fraction);

/// @brief Removes @p device's quota (GPUCLOUD_MEMORY_QUOTA's included).
GPUCLOUD_API void clear_memory_quota(Device device);

/// @brief @p device's quota and what is held under it.
/// @throws InvalidArgument for a malformed GPUCLOUD_MEMORY_QUOTA, naming the entry.
GPUCLOUD_API MemoryQuota memory_quota(Device device);

/// @brief Every device the process has allocated on or set a quota for, host first.
GPUCLOUD_API std::vector<MemoryQuota> memory_quotas();

/// @brief The byte count of a size such as "512MiB", "2GB", "4G" or "1048576" (K/M/G/T and
///        KiB/MiB/GiB/TiB are powers of 1024, KB/MB/GB/TB of 1000).
/// @throws InvalidArgument naming @p what for anything else, or a size beyond 2^63.
GPUCLOUD_API std::size_t parse_bytes(const std::string& text, const std::string& what);

}  // namespace gpucloud
