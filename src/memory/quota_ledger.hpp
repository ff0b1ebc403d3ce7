// Internal: the ledger behind memory quotas; the resources that take memory from a device call it.
#pragma once

#include <gpucloud/memory/memory_resource.hpp>

#include <cstddef>

namespace gpucloud::detail {

/// Counts @p bytes of @p kind memory as held from @p device.
/// @throws OutOfMemory naming the quota, the request and what is held when they exceed the quota;
///         nothing is counted then.
void quota_take(Device device, MemoryKind kind, std::size_t bytes);

/// Returns @p bytes taken from @p device. Never throws.
void quota_give(Device device, std::size_t bytes) noexcept;

/// Bytes held under @p device's quota for the hold's life (memory taken outside a resource).
class QuotaHold {
 public:
  QuotaHold(Device device, MemoryKind kind, std::size_t bytes) : device_(device), bytes_(bytes) {
    quota_take(device, kind, bytes);
  }
  ~QuotaHold() { quota_give(device_, bytes_); }
  QuotaHold(const QuotaHold&) = delete;
  QuotaHold& operator=(const QuotaHold&) = delete;

 private:
  Device device_;
  std::size_t bytes_;
};

}  // namespace gpucloud::detail
