// The cleanup queue's worker: runs posted cleanups in order, off the threads that posted them.
#include "runtime/cleanup_queue.hpp"

#include <utility>

namespace gpucloud::detail {

CleanupQueue::CleanupQueue() : worker_([this] { run(); }) {}

CleanupQueue::~CleanupQueue() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  worker_.join();
}

CleanupQueue& CleanupQueue::shared() {
  static auto* q = new CleanupQueue();  // never destroyed, like the default resources
  return *q;
}

void CleanupQueue::post(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(std::move(fn));
  }
  wake_.notify_one();
}

void CleanupQueue::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    wake_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, and everything ran
    std::function<void()> fn = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    fn();
    fn = nullptr;  // whatever it captured is released here, off the lock
    lock.lock();
  }
}

}  // namespace gpucloud::detail
