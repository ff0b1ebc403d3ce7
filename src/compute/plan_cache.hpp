// Internal: a thread-safe cache of library plans (descriptors, chosen algorithms) built once per
// key and kept for the process's life (not API).
#pragma once

#include <map>
#include <memory>
#include <mutex>

namespace gpucloud::detail {

template <class Key, class Plan>
class PlanCache {
 public:
  /// The plan for @p key, built by @p make() (returning std::unique_ptr<Plan>) the first time.
  template <class Make>
  Plan& get(const Key& key, Make&& make) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = plans_.find(key);
    if (it == plans_.end()) it = plans_.emplace(key, make()).first;
    return *it->second;
  }

 private:
  std::mutex mutex_;
  std::map<Key, std::unique_ptr<Plan>> plans_;
};

}  // namespace gpucloud::detail
