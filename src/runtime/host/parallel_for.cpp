#include "runtime/host/parallel_for.hpp"

#include "runtime/host/thread_budget.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include <pthread.h>

namespace gpucloud::detail {

namespace {

// GPUCLOUD_HOST_THREADS, else the CPUs the process may use (affinity, cgroup CPU quota).
int configured_threads() noexcept { return thread_budget().pool; }

thread_local bool inside_job = false;

// Workers sleep on a condition variable between jobs; a job is a range split into chunks that
// every participant takes from one atomic counter, so an uneven split never waits on a slow one.
class Pool {
 public:
  explicit Pool(int threads) {
    for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { work(); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& t : workers_) t.join();
  }
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;

  int threads() const noexcept { return static_cast<int>(workers_.size()) + 1; }

  // False when another caller holds the pool: the caller then runs the range itself.
  bool run(std::int64_t n, std::int64_t chunk, const std::function<void(std::int64_t, std::int64_t)>& fn) {
    std::unique_lock<std::mutex> job_lock(job_mutex_, std::try_to_lock);
    if (!job_lock.owns_lock()) return false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stop_) return false;
      fn_ = &fn;
      n_ = n;
      chunk_ = chunk;
      next_.store(0, std::memory_order_relaxed);
      error_ = nullptr;
      busy_ = static_cast<int>(workers_.size());
      ++generation_;
    }
    wake_.notify_all();
    take_chunks();
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [this] { return busy_ == 0; });
    fn_ = nullptr;
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
    return true;
  }

 private:
  void take_chunks() {
    inside_job = true;
    for (;;) {
      const std::int64_t begin = next_.fetch_add(chunk_, std::memory_order_relaxed);
      if (begin >= n_) break;
      try {
        (*fn_)(begin, std::min(n_, begin + chunk_));
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex_);
        if (!error_) error_ = std::current_exception();
        next_.store(n_, std::memory_order_relaxed);  // the others stop taking chunks
      }
    }
    inside_job = false;
  }

  void work() {
    std::uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
      }
      take_chunks();
      std::lock_guard<std::mutex> lock(mutex_);
      if (--busy_ == 0) done_.notify_one();
    }
  }

  std::vector<std::thread> workers_;
  std::mutex job_mutex_;  // one job at a time
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  bool stop_ = false;
  std::uint64_t generation_ = 0;
  int busy_ = 0;
  const std::function<void(std::int64_t, std::int64_t)>* fn_ = nullptr;
  std::int64_t n_ = 0, chunk_ = 1;
  std::atomic<std::int64_t> next_{0};
  std::exception_ptr error_;
};

// The pool is never destroyed (as the default resources): a stream's worker may still run a
// copy while statics are torn down, and its idle threads, asleep on a condition variable, do not
// keep the process from exiting. A forked child has none of the parent's threads: it forgets the
// parent's pool (never touched again) and makes its own.
std::mutex& pool_mutex() {
  static auto* m = new std::mutex();
  return *m;
}
Pool* pool_ptr = nullptr;

Pool* pool() {
  static const bool registered = [] {
    // Held across fork(), so the child's copy of the lock is free and no pool is half-made.
    pthread_atfork([] { pool_mutex().lock(); }, [] { pool_mutex().unlock(); },
                   [] {
                     pool_ptr = nullptr;
                     pool_mutex().unlock();
                   });
    return true;
  }();
  (void)registered;
  std::lock_guard<std::mutex> lock(pool_mutex());
  if (pool_ptr == nullptr) pool_ptr = new Pool(configured_threads());
  return pool_ptr;
}

}  // namespace

int parallel_for_threads() noexcept {
  static const int threads = configured_threads();
  return threads;
}

void parallel_for(std::int64_t n, std::int64_t grain, const std::function<void(std::int64_t, std::int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<std::int64_t>(grain, 1);
  const int threads = parallel_for_threads();
  if (threads == 1 || n < 2 * grain || inside_job) {
    fn(0, n);
    return;
  }
  // About four chunks per thread, none under the grain: balance without many hand-offs.
  const std::int64_t chunk = std::max(grain, (n + 4 * threads - 1) / (4 * threads));
  if (!pool()->run(n, chunk, fn)) fn(0, n);
}

}  // namespace gpucloud::detail
