#include <gpucloud/memory/resource_adaptors.hpp>
#include <gpucloud/runtime/error.hpp>

#include "memory/host_memory.hpp"

#include <algorithm>

namespace gpucloud {

StatisticsAdaptor::StatisticsAdaptor(MemoryResource& upstream) noexcept
    : MemoryResource(upstream.kind(), upstream.device()), upstream_(upstream) {}

MemoryStatistics StatisticsAdaptor::statistics() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void StatisticsAdaptor::reset_peak() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.peak_bytes = stats_.current_bytes;
}

void* StatisticsAdaptor::do_allocate(std::size_t bytes, std::optional<StreamView> stream) {
  void* p = upstream_.allocate(bytes, stream);
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.current_bytes += bytes;
  stats_.peak_bytes = std::max(stats_.peak_bytes, stats_.current_bytes);
  stats_.total_bytes += bytes;
  ++stats_.current_allocations;
  ++stats_.total_allocations;
  return p;
}

void StatisticsAdaptor::do_deallocate(void* p, std::size_t bytes, std::optional<StreamView> stream) noexcept {
  upstream_.deallocate(p, bytes, stream);
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.current_bytes -= bytes;
  --stats_.current_allocations;
}

LimitingAdaptor::LimitingAdaptor(MemoryResource& upstream, std::size_t limit_bytes) noexcept
    : MemoryResource(upstream.kind(), upstream.device()), upstream_(upstream), limit_(limit_bytes) {}

void* LimitingAdaptor::do_allocate(std::size_t bytes, std::optional<StreamView> stream) {
  std::size_t before = allocated_.load();
  do {
    if (bytes > limit_ - before) {
      throw OutOfMemory("allocate",
                        "cannot allocate " + detail::describe_bytes(bytes) + " of " + memory_kind_name(kind()) +
                            " memory on " + device().str() + ": limit " + detail::describe_bytes(limit_) + ", " +
                            detail::describe_bytes(before) + " in use",
                        bytes, __FILE__, __LINE__);
    }
  } while (!allocated_.compare_exchange_weak(before, before + bytes));
  try {
    return upstream_.allocate(bytes, stream);
  } catch (...) {
    allocated_ -= bytes;
    throw;
  }
}

void LimitingAdaptor::do_deallocate(void* p, std::size_t bytes, std::optional<StreamView> stream) noexcept {
  upstream_.deallocate(p, bytes, stream);
  allocated_ -= bytes;
}

}  // namespace gpucloud
