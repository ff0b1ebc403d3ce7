// Internal: a thread that runs cleanups handed over by threads that must not run them (not API).
//
// A host function on a CUDA stream runs on CUDA's callback thread, which must not call CUDA
// (cudaFreeHost or cudaFree there synchronise the device, which waits for that very callback: a
// deadlock) nor wait for a lock that a thread blocked on the stream holds (Python's GIL). Cleanups
// (freeing staging buffers, releasing Python objects) do both, so the callback only posts them here.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace gpucloud::detail {

class CleanupQueue {
 public:
  /// Starts the worker thread.
  CleanupQueue();
  /// Runs what is queued, then stops the worker.
  ~CleanupQueue();
  CleanupQueue(const CleanupQueue&) = delete;
  CleanupQueue& operator=(const CleanupQueue&) = delete;

  /// The process's queue: created on first use, never destroyed (cleanups may arrive during exit).
  static CleanupQueue& shared();

  /// Runs @p fn on the worker thread after everything posted before it. @p fn must not throw.
  void post(std::function<void()> fn);

  /// True on the worker thread (a cleanup must not wait for cleanups queued behind it).
  bool on_worker() const noexcept { return std::this_thread::get_id() == worker_.get_id(); }

 private:
  void run();
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> queue_;
  bool stopping_ = false;
  std::thread worker_;
};

/// Counts an owner's cleanups in flight, so it can wait until they have all run.
class PendingCleanups {
 public:
  /// One more cleanup was handed over.
  void begin() {
    std::lock_guard<std::mutex> lock(mutex_);
    ++count_;
  }
  /// One cleanup finished.
  void end() {
    std::lock_guard<std::mutex> lock(mutex_);
    --count_;
    if (count_ == 0) drained_.notify_all();
  }
  /// True when no cleanup is in flight.
  bool idle() {
    std::lock_guard<std::mutex> lock(mutex_);
    return count_ == 0;
  }
  /// Waits until every cleanup handed over so far has run (at once on the queue's own worker,
  /// where waiting would wait for itself).
  void wait(const CleanupQueue& queue) {
    if (queue.on_worker()) return;
    std::unique_lock<std::mutex> lock(mutex_);
    drained_.wait(lock, [this] { return count_ == 0; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable drained_;
  std::size_t count_ = 0;
};

}  // namespace gpucloud::detail
