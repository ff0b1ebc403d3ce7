// Internal: the host backend's streams and events (not API).
#pragma once

#include "runtime/host/worker_wake.hpp"
#include "runtime/stream_impl.hpp"

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>

namespace gpucloud::detail {

/// A stream run by its own worker thread, strictly in order.
class HostStream final : public StreamImpl {
 public:
  HostStream();
  ~HostStream() override;

  /// The host stream whose worker is the calling thread (work running on it), or nullptr.
  static HostStream* current() noexcept;
  /// Identifies the calling thread's worker while it runs a task (for abandon_running_task).
  static const void* current_worker() noexcept;
  /// From another thread, for a task blocked for good (a collective whose peers never came): that
  /// task fails with @p error, the stream goes on with a new worker thread, and the old thread is
  /// left in its call, detached; should the call return, the thread leaves without touching the
  /// stream. No-op (false) unless @p worker is still this stream's worker.
  bool abandon_running_task(const void* worker, std::exception_ptr error);

  void synchronize() override;
  /// Whether a thread waits in synchronize() for the stream whose worker is the calling thread
  /// (work polling there need not yield the core to it); false off a worker. Safe on a worker the
  /// stream abandoned, which may outlive it.
  static bool waited_for() noexcept;
  bool query() override;
  /// How many times this process is a fork() child of a process that had host streams (events
  /// recorded in an earlier generation complete in the parent only).
  static std::uint64_t fork_generation() noexcept;
  void wait(EventImpl& event) override;
  void launch_host_func(std::function<void()> fn, bool always_run) override;
  /// Runs @p fn once every host stream has finished the work enqueued on it before this call
  /// (what cudaFree waits for on a GPU), without blocking the caller: at once when every stream
  /// is idle, else on the worker of the last of those streams to get there. Never throws.
  static void after_enqueued_work(std::function<void()> fn) noexcept;
  /// Runs @p fn on the calling thread before returning, when the stream is idle (nothing queued
  /// or running, no error pending, a thread other than its worker): work that costs less than the
  /// hand-off to the worker, as CUDA runs a host-to-host cudaMemcpyAsync synchronously. Returns
  /// false, without running fn, when the stream is busy: enqueue it instead. A throw from fn is
  /// the stream's error, as from the worker.
  template <class Fn>
  bool run_now_if_idle(Fn&& fn) {
    if (!begin_inline()) return false;
    std::exception_ptr failure;
    try {
      fn();
    } catch (...) {
      failure = std::current_exception();
    }
    end_inline(failure, std::this_thread::get_id());
    return true;
  }
  /// Enqueues @p fn as launch_host_func does; but a thread that waits in synchronize() while
  /// the worker has not started it calls @p on_caller instead (work that polls and is safe on any
  /// thread: a collective), sparing the hand-off to a worker that sleeps or waits for a busy core.
  /// @p on_caller returns false, having done nothing, when it cannot run now: the worker runs fn.
  /// Once a waiting thread took the last such work, the next wakes a sleeping worker as a batch
  /// thread, which preempts no running thread; once waiting threads took the last two within
  /// kHelpWindow of their enqueue, only if no thread took it within kHelpWindow (push).
  void launch_host_func_or_help(std::function<void()> fn, std::function<bool()> on_caller);
  std::exception_ptr take_error() noexcept override;
  void* native_handle() noexcept override { return nullptr; }

 private:
  struct Task {
    std::function<void()> fn;
    bool always_run;
    std::thread::id enqueuer;                        // who is owed the error if this task fails or is skipped
    std::function<bool()> on_caller{};               // what a waiting thread may run instead (launch_host_func_or_help)
    std::chrono::steady_clock::time_point pushed{};  // when an on_caller task was enqueued
  };
  struct Worker {
    std::thread thread;
    std::atomic<bool> abandoned{false};  // set (under mutex_) when the stream went on without it
    bool exited = false;                 // guarded by mutex_
    pid_t tid = 0;        // its thread, once started, when it may be woken as a batch thread (push); guarded by mutex_
    bool asleep = false;  // waiting for work; guarded by mutex_
    bool batch = false;   // its policy is SCHED_BATCH (set by push while it sleeps); guarded by mutex_
  };
  void start_worker();          // with mutex_ held, or in the constructor
  void push(Task task);         // enqueues behind earlier work and wakes the worker (or arms its wake-up)
  void wake_worker() noexcept;  // wakes a sleeping worker now; mutex_ held
  bool begin_inline();          // claims an idle stream for the calling thread (run_now_if_idle)
  void end_inline(std::exception_ptr failure, std::thread::id owner) noexcept;
  bool help_once();  // synchronize(): runs the queue's next task on this thread when it may (on_caller)
  void run(std::shared_ptr<Worker> self);
  // fork(): every stream's lock is held across it; in the child, whose copy has no worker thread,
  // each stream starts afresh (a worker on its next launch) and work that had not finished in the
  // parent is dropped and reported at the next synchronize().
  static void register_fork_handlers();
  static void before_fork() noexcept;
  static void after_fork_in_parent() noexcept;
  static void after_fork_in_child() noexcept;
  void reset_in_child() noexcept;

  std::mutex mutex_;
  std::condition_variable work_ready_;  // the worker's sleep where wake_ is not usable
  WorkerWake wake_;                     // the worker's sleep otherwise; guarded by mutex_ but sleep()
  std::condition_variable idle_;
  std::condition_variable exited_;
  std::deque<Task> queue_;
  bool busy_ = false;
  bool inline_running_ = false;  // a caller runs work in place (run_now_if_idle): the worker waits
  bool stopping_ = false;
  bool callers_help_ = false;  // the last on_caller task was run by a waiting caller, not the worker (push)
  int helped_at_once_ = 0;     // on_caller tasks in a row a waiting caller took within kHelpWindow (push)
  std::atomic<std::size_t> outstanding_{0};  // enqueued and not yet finished: query() reads it without the lock
  std::atomic<std::size_t> queued_{0};       // in queue_: what an idle worker spins for (not in-place work)
  // Threads in synchronize(); shared with the workers, which read it after an abandonment too.
  std::shared_ptr<std::atomic<int>> waiters_ = std::make_shared<std::atomic<int>>(0);
  std::exception_ptr error_;  // set by a failure: later work is skipped until a synchronize() raises it
  // Threads whose enqueued work failed or was skipped, and the error each is owed: every one of
  // them gets it at its next synchronize(), so no thread's work is dropped behind a success.
  std::unordered_map<std::thread::id, std::exception_ptr> owed_;
  std::thread::id running_enqueuer_;  // of the task now running
  std::shared_ptr<Worker> worker_;    // the current worker (abandoned ones are detached)
};

/// How long work that waiting callers have been taking at once waits for one before a sleeping
/// worker is woken for it (HostStream::launch_host_func_or_help). Such a caller reaches
/// synchronize() within microseconds; a wrong guess delays the work by at most this. A timer due
/// before the next scheduler tick (4 ms here) reprograms the clock when armed and disarmed: in a
/// loop 1.5 µs each at 1 ms, 5-6 µs at 50 µs, 0.4 µs from 4 ms on this project's virtual machine,
/// and with a 1 ms window a quiet 2-rank 4 MiB all-gather lost 7 %.
inline constexpr std::chrono::microseconds kHelpWindow{4000};
/// Work of about this much memory traffic (tens of µs) runs in place on an idle host stream
/// (run_or_enqueue): less than a hand-off to the worker costs when it has gone to sleep
/// (40-150 µs on this project's virtual machine), and the caller's cache already holds the data.
inline constexpr std::size_t kInPlaceBytes = std::size_t{1} << 20;

/// Runs @p fn, work for the host stream @p stream: on the calling thread before returning when
/// @p small and the stream is idle (HostStream::run_now_if_idle), else enqueued behind earlier
/// work (skipped after an error unless @p always_run, as any enqueued work).
template <class Fn>
void run_or_enqueue(StreamImpl& stream, bool small, Fn fn, bool always_run = false) {
  auto& host = static_cast<HostStream&>(stream);
  if (small && host.run_now_if_idle(fn)) return;
  host.launch_host_func(std::move(fn), always_run);
}

/// One record of a host event: completes when the stream's worker reaches it.
class HostEventRecord {
 public:
  explicit HostEventRecord(const HostStream* stream) noexcept
      : stream_(stream), generation_(HostStream::fork_generation()) {}
  /// The stream the record is on: a wait from its work would wait for itself.
  const HostStream* stream() const noexcept { return stream_; }
  void complete();
  void wait();
  bool done();
  std::chrono::steady_clock::time_point time();

 private:
  const HostStream* const stream_;
  const std::uint64_t generation_;  // recorded before a fork(): completes in the parent only
  std::mutex mutex_;
  std::condition_variable done_cv_;
  bool done_ = false;
  std::chrono::steady_clock::time_point time_{};
};

class HostEvent final : public EventImpl {
 public:
  explicit HostEvent(bool timing) noexcept : EventImpl(Device::host(), timing) {}
  bool query() override;
  void synchronize() override;
  float elapsed_ms_since(EventImpl& start) override;
  /// The latest record, or nullptr if never recorded.
  std::shared_ptr<HostEventRecord> latest();

 protected:
  void do_record(StreamImpl& stream) override;

 private:
  std::mutex mutex_;
  std::shared_ptr<HostEventRecord> latest_;
};

}  // namespace gpucloud::detail
