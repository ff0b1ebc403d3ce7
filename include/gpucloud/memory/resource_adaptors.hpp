/// @file resource_adaptors.hpp
/// @brief Adaptors that wrap an upstream resource: statistics and a hard limit.
#pragma once

#include <gpucloud/memory/memory_resource.hpp>

#include <atomic>
#include <cstddef>
#include <mutex>

namespace gpucloud {

/// @brief Counters kept by StatisticsAdaptor.
struct MemoryStatistics {
  std::size_t current_bytes = 0;        ///< bytes allocated and not yet freed
  std::size_t peak_bytes = 0;           ///< highest current_bytes seen
  std::size_t total_bytes = 0;          ///< bytes allocated over the lifetime
  std::size_t current_allocations = 0;  ///< live allocations
  std::size_t total_allocations = 0;    ///< allocations over the lifetime
};

/// @brief Counts bytes and allocations passing through to an upstream resource (thread-safe).
class GPUCLOUD_API StatisticsAdaptor final : public MemoryResource {
 public:
  /// @brief Wraps @p upstream, which must outlive the adaptor.
  explicit StatisticsAdaptor(MemoryResource& upstream) noexcept;
  /// @brief A consistent snapshot of the counters.
  MemoryStatistics statistics() const;
  /// @brief Sets peak_bytes back to current_bytes.
  void reset_peak();

 private:
  void* do_allocate(std::size_t bytes, std::optional<StreamView> stream) override;
  void do_deallocate(void* p, std::size_t bytes, std::optional<StreamView> stream) noexcept override;
  MemoryResource& upstream_;
  mutable std::mutex mutex_;
  MemoryStatistics stats_;
};

/// @brief Fails allocations that would take the bytes in use above a fixed limit.
class GPUCLOUD_API LimitingAdaptor final : public MemoryResource {
 public:
  /// @brief Wraps @p upstream (which must outlive the adaptor) with a cap of @p limit_bytes.
  LimitingAdaptor(MemoryResource& upstream, std::size_t limit_bytes) noexcept;
  /// @brief Bytes currently allocated through the adaptor.
  std::size_t allocated_bytes() const noexcept { return allocated_.load(); }
  /// @brief The cap.
  std::size_t limit_bytes() const noexcept { return limit_; }

 private:
  void* do_allocate(std::size_t bytes, std::optional<StreamView> stream) override;
  void do_deallocate(void* p, std::size_t bytes, std::optional<StreamView> stream) noexcept override;
  MemoryResource& upstream_;
  std::size_t limit_;
  std::atomic<std::size_t> allocated_{0};
};

}  // namespace gpucloud
