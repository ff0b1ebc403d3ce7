// The watchdog behind run_with_deadline: a list of watched calls, one thread that sleeps until the
// earliest deadline. A call registers and deregisters under a mutex (no system call in the common
// case: the watchdog is only woken when a new deadline is earlier than the one it sleeps towards).
#include "runtime/host/deadline.hpp"

#include "runtime/host/host_stream.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <new>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

#include <pthread.h>

namespace gpucloud::detail {

namespace {

using Clock = std::chrono::steady_clock;

struct Watched {
  Clock::time_point deadline;
  std::atomic<int> state{0};  // kRunning, then kDone (by the caller) or kAbandoned (by the watchdog)
  HostStream* stream = nullptr;
  const void* worker = nullptr;
  const std::function<std::exception_ptr()>* on_timeout = nullptr;
};
constexpr int kRunning = 0, kDone = 1, kAbandoned = 2;

// Never destroyed: a stream worker may still call in while static objects are destroyed at exit,
// and the watchdog must keep watching until the process is gone (a hang at exit is still a hang).
// Its thread is started at the first watched call, and again in a fork() child, which has no
// threads but the one that forked: the calls it watched belong to the parent's threads.
class Watchdog {
 public:
  static Watchdog& instance() {
    static Watchdog* w = [] {
      auto* dog = new Watchdog();
      pthread_atfork(&Watchdog::before_fork, &Watchdog::after_fork_in_parent, &Watchdog::after_fork_in_child);
      return dog;
    }();
    return *w;
  }

  void add(Watched* w) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!running_) {
      std::thread([this] { run(); }).detach();
      running_ = true;
    }
    watched_.push_back(w);
    if (w->deadline < wake_at_) wake_.notify_one();
  }

  // Removes @p w unless the watchdog has abandoned it; true when it completed in time.
  bool finish(Watched* w) {
    int running = kRunning;
    if (w->state.compare_exchange_strong(running, kDone)) {
      std::lock_guard<std::mutex> lock(mutex_);
      watched_.erase(std::find(watched_.begin(), watched_.end(), w));
      return true;
    }
    // Abandoned: the watchdog holds its mutex until the stream has let this thread go.
    std::lock_guard<std::mutex> lock(mutex_);
    return false;
  }

 private:
  Watchdog() = default;

  static void before_fork() noexcept { instance().mutex_.lock(); }
  static void after_fork_in_parent() noexcept { instance().mutex_.unlock(); }
  // Fresh synchronisation objects (the parent's condition variable may count its thread as a
  // waiter, and the lock is held by before_fork), nothing watched, no thread yet.
  static void after_fork_in_child() noexcept {
    Watchdog& dog = instance();
    new (&dog.mutex_) std::mutex();
    new (&dog.wake_) std::condition_variable();
    dog.watched_.clear();
    dog.wake_at_ = Clock::time_point::max();
    dog.running_ = false;
  }

  void run() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      const auto now = Clock::now();
      auto next = now + std::chrono::seconds(1);  // idle: look again now and then
      for (std::size_t i = 0; i < watched_.size();) {
        Watched* w = watched_[i];
        int running = kRunning;
        if (w->deadline <= now && w->state.compare_exchange_strong(running, kAbandoned)) {
          watched_[i] = watched_.back();
          watched_.pop_back();
          std::exception_ptr error;
          try {
            error = (*w->on_timeout)();
          } catch (...) {
            error = std::current_exception();
          }
          w->stream->abandon_running_task(w->worker, std::move(error));  // no reference left here
          continue;
        }
        next = std::min(next, w->deadline);
        ++i;
      }
      wake_at_ = next;
      wake_.wait_until(lock, next);
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  Clock::time_point wake_at_ = Clock::time_point::max();
  std::vector<Watched*> watched_;
  bool running_ = false;  // its thread has started (in this process)
};

}  // namespace

void run_with_deadline(std::chrono::milliseconds timeout, const std::function<void()>& blocking,
                       const std::function<std::exception_ptr()>& on_timeout) {
  HostStream* stream = HostStream::current();
  if (stream == nullptr) {
    blocking();
    return;
  }
  Watched w;
  w.deadline = Clock::now() + timeout;
  w.stream = stream;
  w.worker = HostStream::current_worker();
  w.on_timeout = &on_timeout;
  Watchdog& dog = Watchdog::instance();
  dog.add(&w);
  try {
    blocking();
  } catch (...) {
    if (!dog.finish(&w)) throw std::runtime_error("abandoned after its deadline");
    throw;
  }
  if (!dog.finish(&w)) throw std::runtime_error("abandoned after its deadline");
}

}  // namespace gpucloud::detail
