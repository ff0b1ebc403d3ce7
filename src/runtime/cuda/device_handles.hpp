// Internal: one library handle per device (cuBLASLt, cuDNN), created lazily on first use with
// that device current, destroyed at exit with a no-throw check (not API). Each entry carries a
// mutex for libraries whose handle holds per-call state (cudnnSetStream + the call).
#pragma once

#include "runtime/cuda/cuda_check.hpp"

#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <mutex>

namespace gpucloud::detail::cuda {

template <class Handle>
class PerDeviceHandles {
 public:
  struct Entry {
    Handle handle{};
    std::mutex mutex;  ///< for callers that bind per-call state to the handle
  };
  /// @p create makes a handle (throwing a typed error), @p destroy releases one and says whether
  /// it succeeded; @p name is for the message when it did not.
  PerDeviceHandles(std::function<void(Handle*)> create, std::function<bool(Handle)> destroy, const char* name)
      : create_(std::move(create)), destroy_(std::move(destroy)), name_(name) {}
  ~PerDeviceHandles() {
    for (auto& [device, entry] : entries_) {
      (void)device;
      if (entry && !destroy_(entry->handle)) std::fprintf(stderr, "gpucloud: destroying a %s handle failed\n", name_);
    }
  }
  PerDeviceHandles(const PerDeviceHandles&) = delete;
  PerDeviceHandles& operator=(const PerDeviceHandles&) = delete;

  /// The handle of @p device, made on first use.
  Entry& get(int device) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto& slot = entries_[device];
    if (!slot) {
      DeviceGuard guard(device);
      auto entry = std::make_unique<Entry>();
      create_(&entry->handle);
      slot = std::move(entry);
    }
    return *slot;
  }

 private:
  std::function<void(Handle*)> create_;
  std::function<bool(Handle)> destroy_;
  const char* name_;
  std::mutex mutex_;
  std::map<int, std::unique_ptr<Entry>> entries_;
};

}  // namespace gpucloud::detail::cuda
