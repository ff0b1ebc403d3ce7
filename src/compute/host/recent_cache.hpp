// Internal: a small cache of host library objects (oneDNN primitives) kept most recently used
// first and bounded in entries, for one thread (make it thread_local; not API).
#pragma once

#include <cstddef>
#include <iterator>
#include <list>
#include <utility>

namespace gpucloud::detail {

template <class Key, class Value, std::size_t Capacity>
class RecentCache {
 public:
  /// The value cached for @p key, now the most recent; nullptr when there is none.
  Value* find(const Key& key) {
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (it->first == key) {
        entries_.splice(entries_.begin(), entries_, it);
        return &entries_.front().second;
      }
    }
    return nullptr;
  }

  /// Caches @p value for @p key (not cached yet) as the most recent, dropping the least recent beyond Capacity.
  Value& insert(const Key& key, Value value) {
    entries_.emplace_front(key, std::move(value));
    if (entries_.size() > Capacity) entries_.pop_back();
    return entries_.front().second;
  }

 private:
  std::list<std::pair<Key, Value>> entries_;
};

}  // namespace gpucloud::detail
