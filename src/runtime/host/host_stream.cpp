#include "runtime/host/host_stream.hpp"

#include <gpucloud/runtime/error.hpp>

#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <new>
#include <string>
#include <utility>
#include <vector>

namespace gpucloud::detail {

namespace {
thread_local HostStream* current_stream = nullptr;  // the stream whose worker this thread is
thread_local const void* current_worker_id = nullptr;
thread_local std::shared_ptr<std::atomic<int>> current_waiters;  // of current_stream, kept by its worker

// How long a worker out of work, or a thread in synchronize(), spins before it sleeps: a hand-off
// within that time costs no futex wake-up (40-150 µs on this project's virtual machine). 200 µs:
// with 50, work of 50-200 µs (a 128^3 GEMM) ended just after its waiter had gone to sleep and
// took twice as long to reach it (128^3 fp32 GEMM + synchronize 111 -> 47 µs, the product itself
// 44). GPUCLOUD_HOST_SPIN_US (0 to 10000) overrides the default.
std::chrono::microseconds spin_budget() {
  static const std::chrono::microseconds budget = [] {
    const char* text = std::getenv("GPUCLOUD_HOST_SPIN_US");
    if (text == nullptr || *text == '\0') return std::chrono::microseconds(200);
    char* end = nullptr;
    const long v = std::strtol(text, &end, 10);
    GPUCLOUD_EXPECTS(
        end != text && *end == '\0' && v >= 0 && v <= 10000, "Stream",
        std::string("GPUCLOUD_HOST_SPIN_US: '") + text + "' is not a number of microseconds in [0, 10000]");
    return std::chrono::microseconds(v);
  }();
  return budget;
}

// Spins until @p ready() (true) or the budget is spent (false), yielding the core on every
// turn: with more busy threads than cores (two MPI ranks, each with a caller waiting and a worker
// in MPI, on two cores) a spinner that keeps its core delays the very thread it waits for. With
// a free core sched_yield returns at once, and a hand-off still costs well under a microsecond.
template <class Ready>
bool spin_until(Ready ready, std::chrono::microseconds budget) {
  if (budget.count() == 0) return ready();
  const auto end = std::chrono::steady_clock::now() + budget;
  for (;;) {
    if (ready()) return true;
    if (std::chrono::steady_clock::now() >= end) return false;
    std::this_thread::yield();
  }
}

// A thread's scheduling policy, or -1 (`tid` 0: the calling thread).
int policy_of(pid_t tid) noexcept { return sched_getscheduler(tid); }
// Sets @p tid's policy to @p policy (SCHED_OTHER or SCHED_BATCH, priority 0, the nice value kept).
// Best effort: where it is refused (a seccomp filter) the worker only keeps its policy
// (HostStream::push).
void set_policy(pid_t tid, int policy) noexcept {
  const sched_param param{};
  (void)sched_setscheduler(tid, policy, &param);
}

// Every live host stream, for the fork handlers. Never destroyed (a stream may outlive statics).
struct StreamRegistry {
  std::mutex mutex;
  std::vector<HostStream*> streams;
};
StreamRegistry& stream_registry() {
  static auto* r = new StreamRegistry();
  return *r;
}
std::atomic<std::uint64_t> fork_generation_{0};

}  // namespace

std::uint64_t HostStream::fork_generation() noexcept { return fork_generation_.load(std::memory_order_acquire); }

void HostStream::register_fork_handlers() {
  static const bool registered = [] {
    pthread_atfork(&HostStream::before_fork, &HostStream::after_fork_in_parent, &HostStream::after_fork_in_child);
    return true;
  }();
  (void)registered;
}

// Registry first, then each stream's lock: nothing else takes them in the other order (a stream's
// lock is never held while the registry is taken).
void HostStream::before_fork() noexcept {
  stream_registry().mutex.lock();
  for (HostStream* s : stream_registry().streams) s->mutex_.lock();
}

void HostStream::after_fork_in_parent() noexcept {
  for (HostStream* s : stream_registry().streams) s->mutex_.unlock();
  stream_registry().mutex.unlock();
}

void HostStream::after_fork_in_child() noexcept {
  fork_generation_.fetch_add(1, std::memory_order_acq_rel);
  for (HostStream* s : stream_registry().streams) s->reset_in_child();
  stream_registry().mutex.unlock();
}

void HostStream::reset_in_child() noexcept {
  // Fresh synchronisation objects: the parent's condition variables may count waiters (its
  // worker) that do not exist here, and the lock is held by before_fork.
  new (&mutex_) std::mutex();
  new (&work_ready_) std::condition_variable();
  new (&idle_) std::condition_variable();
  new (&exited_) std::condition_variable();
  wake_.reopen_in_child();  // the parent's descriptors would wake the parent's worker
  const bool unfinished = busy_ || inline_running_ || !queue_.empty();
  // The parent's worker (no thread here), its queued work and the errors it owed are left alone,
  // never destroyed: their captures may hold objects (Python's among them) that must not be
  // released inside fork().
  new std::shared_ptr<Worker>(std::move(worker_));
  (new std::deque<Task>())->swap(queue_);
  (new std::unordered_map<std::thread::id, std::exception_ptr>())->swap(owed_);
  if (unfinished) {
    error_ = std::make_exception_ptr(
        Error("Stream",
              "work enqueued before fork() had not finished there: it runs in the parent process only, not in this "
              "child (synchronize streams before forking); the stream runs new work",
              __FILE__, __LINE__));
  }
  busy_ = false;
  inline_running_ = false;
  stopping_ = false;
  running_enqueuer_ = std::thread::id();
  outstanding_.store(0, std::memory_order_relaxed);
  queued_.store(0, std::memory_order_relaxed);
  waiters_->store(0, std::memory_order_relaxed);  // the parent's waiting threads are not here
}

HostStream::HostStream() : StreamImpl(Device::host()) {
  (void)spin_budget();  // a bad GPUCLOUD_HOST_SPIN_US is an error here, not in the worker
  register_fork_handlers();
  {
    std::lock_guard<std::mutex> lock(stream_registry().mutex);
    stream_registry().streams.push_back(this);
  }
  std::lock_guard<std::mutex> lock(mutex_);
  start_worker();
}

void HostStream::start_worker() {
  worker_ = std::make_shared<Worker>();
  worker_->thread = std::thread([this, self = worker_] { run(self); });
}

HostStream::~HostStream() {
  {
    std::lock_guard<std::mutex> lock(stream_registry().mutex);
    auto& all = stream_registry().streams;
    all.erase(std::find(all.begin(), all.end(), this));
  }
  std::unique_lock<std::mutex> lock(mutex_);
  if (!worker_) return;  // a fork() child's copy that never ran work: no thread to stop
  stopping_ = true;
  wake_worker();
  // The worker drains the queue before it exits; a worker abandoned meanwhile is replaced, and
  // the replacement drains and exits.
  exited_.wait(lock, [this] { return worker_->exited; });
  std::thread last = std::move(worker_->thread);
  lock.unlock();
  last.join();
}

HostStream* HostStream::current() noexcept { return current_stream; }

const void* HostStream::current_worker() noexcept { return current_worker_id; }

bool HostStream::waited_for() noexcept {
  return current_waiters && current_waiters->load(std::memory_order_relaxed) != 0;
}

void HostStream::run(std::shared_ptr<Worker> self) {
  current_stream = this;
  current_worker_id = self.get();
  current_waiters = waiters_;  // set before any worker starts, never reassigned
  const pid_t tid = gettid();
  const bool ordinary = policy_of(0) == SCHED_OTHER;  // (inherited from the thread that made the stream)
  std::unique_lock<std::mutex> lock(mutex_);
  self->tid = ordinary ? tid : 0;
  for (;;) {
    if (queue_.empty() && !stopping_) {  // out of work: look for more a while before sleeping
      lock.unlock();
      spin_until([this] { return queued_.load(std::memory_order_acquire) != 0; }, spin_budget());
      lock.lock();
    }
    // Nothing runs while a caller runs work in place (run_now_if_idle): in order, one at a time.
    self->asleep = true;
    while (!((stopping_ || !queue_.empty()) && !inline_running_)) {
      if (!wake_.usable()) {
        work_ready_.wait(lock);
        continue;
      }
      lock.unlock();
      wake_.sleep();  // a waker writes after it changed what the condition reads: never missed
      lock.lock();
      wake_.woke();  // awake now: a delayed wake-up would only come late
    }
    self->asleep = false;
    if (queue_.empty()) {  // stopping and drained
      self->exited = true;
      exited_.notify_all();
      return;
    }
    Task task = std::move(queue_.front());
    queue_.pop_front();
    queued_.fetch_sub(1, std::memory_order_relaxed);
    busy_ = true;
    running_enqueuer_ = task.enqueuer;
    if (task.on_caller) {  // (the caller was not there to take it)
      callers_help_ = false;
      helped_at_once_ = 0;
    }
    const bool was_batch = std::exchange(self->batch, false);
    const bool skip = error_ && !task.always_run;
    if (skip) owed_.emplace(task.enqueuer, error_);  // dropped: its enqueuer must hear why
    lock.unlock();
    if (was_batch) set_policy(tid, SCHED_OTHER);  // work runs as an ordinary thread
    std::exception_ptr failure;
    if (!skip) {
      try {
        task.fn();
      } catch (...) {
        failure = std::current_exception();
      }
    }
    task.fn = nullptr;  // release captures outside the lock
    if (self->abandoned.load(std::memory_order_acquire)) {
      // The stream went on without this thread (its task was declared failed) and may be gone.
      current_stream = nullptr;
      current_worker_id = nullptr;
      lock.release();  // unlocked: forget the mutex without touching it
      return;
    }
    lock.lock();
    if (failure) {
      if (!error_) error_ = failure;
      owed_.emplace(task.enqueuer, failure);
    }
    busy_ = false;
    outstanding_.fetch_sub(1, std::memory_order_release);  // its effects are visible to query()
    if (queue_.empty()) idle_.notify_all();
  }
}

bool HostStream::abandon_running_task(const void* worker, std::exception_ptr error) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (worker_.get() != worker || !busy_) return false;
  worker_->abandoned.store(true, std::memory_order_release);
  worker_->thread.detach();
  // Every reference the caller handed over is taken here, under the lock: the error's last
  // release then happens on a thread that took the lock after this one (ThreadSanitizer cannot
  // see libstdc++'s reference count, and reported the watchdog's release racing the reader's what()).
  if (!error_) error_ = error;
  owed_.emplace(running_enqueuer_, std::move(error));
  busy_ = false;
  outstanding_.fetch_sub(1, std::memory_order_release);
  start_worker();  // it waits for mutex_, then runs what is queued
  if (queue_.empty()) idle_.notify_all();
  return true;
}

void HostStream::launch_host_func(std::function<void()> fn, bool always_run) {
  push(Task{std::move(fn), always_run, std::this_thread::get_id()});
}

void HostStream::push(Task task) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!worker_) start_worker();  // a fork() child's first work
    // The worker sleeps as it runs, but is woken as a batch thread for work a waiting caller has
    // been taking (on_caller, the last such task helped): Linux lets no waking batch thread
    // preempt a running one, so the worker takes a free core at once, and on a busy node leaves
    // the core to the caller, which is about to run the work itself. 2 ranks, each core shared with
    // a CPU-bound process, a 4 MiB broadcast and synchronize(): the worker took 10-20 % of them,
    // each twice as likely to meet a scheduler tick as those the caller ran (docs/collectives.md).
    // Any other work wakes it as an ordinary thread, and it runs all work as one.
    if (worker_->asleep && worker_->tid != 0) {
      const bool batch = task.on_caller && callers_help_;
      if (batch != worker_->batch) {
        set_policy(worker_->tid, batch ? SCHED_BATCH : SCHED_OTHER);
        worker_->batch = batch;
      }
    }
    const bool caller_will_help = task.on_caller && helped_at_once_ >= 2;
    if (task.on_caller) task.pushed = std::chrono::steady_clock::now();
    queue_.push_back(std::move(task));
    outstanding_.fetch_add(1, std::memory_order_relaxed);
    queued_.fetch_add(1, std::memory_order_release);
    // Work of the kind that waiting callers took at once the last two times: the worker is woken
    // only if no caller took it within kHelpWindow. Its wake-up alone, on a busy node, cost what
    // the caller saved (2 ranks, each core shared with a CPU-bound process, 8 MiB broadcast +
    // synchronize(): the woken worker took the caller's core in 1 of 5 calls, and stayed in the
    // run queue into the next call; 0.90 of the raw call with the wake-up, 1.02 without).
    if (caller_will_help && wake_.usable() && worker_->asleep && !wake_.pending()) {
      wake_.arm(kHelpWindow);
      return;
    }
    wake_worker();
  }
}

void HostStream::wake_worker() noexcept {
  if (!worker_ || !worker_->asleep) return;  // running, or spinning for queued_: it finds the work
  if (!wake_.usable()) {
    work_ready_.notify_one();
    return;
  }
  wake_.now();
}

void HostStream::after_enqueued_work(std::function<void()> fn) noexcept {
  auto remaining = std::make_shared<std::atomic<std::size_t>>(1);  // 1: this call's own share
  auto shared = std::make_shared<std::function<void()>>(std::move(fn));
  auto arrive = [remaining, shared] {
    if (remaining->fetch_sub(1, std::memory_order_acq_rel) == 1) (*shared)();
  };
  {
    // Under the registry's lock no stream finishes destruction: a marker enqueued here is run by
    // its worker, which drains its queue before it exits.
    std::lock_guard<std::mutex> lock(stream_registry().mutex);
    for (HostStream* s : stream_registry().streams) {
      if (s->outstanding_.load(std::memory_order_acquire) == 0) continue;  // idle: nothing to wait for
      remaining->fetch_add(1, std::memory_order_relaxed);
      try {
        s->launch_host_func(arrive, /*always_run=*/true);
      } catch (...) {  // out of memory for the marker: do not wait for this stream
        remaining->fetch_sub(1, std::memory_order_relaxed);
      }
    }
  }
  arrive();
}

bool HostStream::begin_inline() {
  if (current_stream == this) return false;  // the worker itself: its own work comes first
  std::lock_guard<std::mutex> lock(mutex_);
  if (!queue_.empty() || busy_ || inline_running_ || error_ || stopping_) return false;
  inline_running_ = true;
  outstanding_.fetch_add(1, std::memory_order_relaxed);  // query() from other threads sees it
  return true;
}

void HostStream::end_inline(std::exception_ptr failure, std::thread::id owner) noexcept {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (failure) {
      if (!error_) error_ = failure;
      owed_.emplace(owner, failure);
    }
    inline_running_ = false;
    outstanding_.fetch_sub(1, std::memory_order_release);
    if (queue_.empty()) {
      idle_.notify_all();
      return;
    }
    wake_worker();  // work enqueued meanwhile by other threads waited for this
  }
}

void HostStream::launch_host_func_or_help(std::function<void()> fn, std::function<bool()> on_caller) {
  push(Task{std::move(fn), false, std::this_thread::get_id(), std::move(on_caller)});
}

// The next task, taken from the worker that has not started it, when it has an on_caller form and
// nothing runs before it: run here as in-place work (the worker waits meanwhile). On a busy node
// the worker's wake-up waits for a core (a 2 MiB all-reduce of 2 ranks, each core shared with a
// CPU-bound process: 3.4-20 ms on the worker, 0.26-0.30 ms here, as the raw MPI call).
bool HostStream::help_once() {
  Task task;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (queue_.empty() || busy_ || inline_running_ || error_ || stopping_ || !queue_.front().on_caller) return false;
    task = std::move(queue_.front());
    queue_.pop_front();
    queued_.fetch_sub(1, std::memory_order_relaxed);
    inline_running_ = true;  // outstanding_ counts it since its launch
    callers_help_ = true;
    helped_at_once_ = std::chrono::steady_clock::now() - task.pushed <= kHelpWindow ? helped_at_once_ + 1 : 0;
    if (queue_.empty()) wake_.disarm();  // taken: no delayed wake-up is owed (push)
  }
  std::exception_ptr failure;
  bool ran = true;
  try {
    ran = task.on_caller();
  } catch (...) {
    failure = std::current_exception();
  }
  if (!ran) {  // the worker's, after all: back at the front, untouched
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_front(std::move(task));
      queued_.fetch_add(1, std::memory_order_release);
      inline_running_ = false;
      wake_worker();
    }
    return false;
  }
  task.fn = nullptr;  // captures released outside the lock
  task.on_caller = nullptr;
  end_inline(failure, task.enqueuer);
  return true;
}

void HostStream::synchronize() {
  GPUCLOUD_EXPECTS(current_stream != this, "Stream::synchronize",
                   "called from work running on the same stream, which would wait for itself");
  while (help_once()) {
  }
  struct Waiting {
    std::atomic<int>& n;
    explicit Waiting(std::atomic<int>& count) : n(count) { n.fetch_add(1, std::memory_order_relaxed); }
    ~Waiting() { n.fetch_sub(1, std::memory_order_relaxed); }
  } waiting(*waiters_);
  spin_until([this] { return outstanding_.load(std::memory_order_acquire) == 0; }, spin_budget());
  std::unique_lock<std::mutex> lock(mutex_);
  idle_.wait(lock, [this] { return queue_.empty() && !busy_ && !inline_running_; });
  // This thread's own failed or dropped work first; else the stream's error, whoever enqueued it.
  // Either way the stream runs work again afterwards; other threads are still owed theirs.
  std::exception_ptr error;
  if (auto mine = owed_.find(std::this_thread::get_id()); mine != owed_.end()) {
    error = mine->second;
    owed_.erase(mine);
  } else if (error_) {
    error = error_;
  }
  if (error) {
    error_ = nullptr;
    std::rethrow_exception(error);
  }
  lock.unlock();
  if (auto outside = failure()->take()) std::rethrow_exception(outside);
}

std::exception_ptr HostStream::take_error() noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  std::exception_ptr error = std::exchange(error_, nullptr);
  if (error) owed_.clear();  // taken over by the caller, which reports it (GradBucketer::wait)
  return error ? error : failure()->take();
}

bool HostStream::query() { return outstanding_.load(std::memory_order_acquire) == 0; }

void HostStream::wait(EventImpl& event) {
  auto record = static_cast<HostEvent&>(event).latest();
  if (!record) return;  // never recorded: nothing to wait for (CUDA semantics)
  launch_host_func([record] { record->wait(); }, /*always_run=*/true);
}

void HostEventRecord::complete() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    time_ = std::chrono::steady_clock::now();
    done_ = true;
  }
  done_cv_.notify_all();
}

void HostEventRecord::wait() {
  if (generation_ != HostStream::fork_generation()) {  // recorded in the parent: nobody here completes it
    if (done_) return;  // only this process's threads touch it now, and none of them writes it
    GPUCLOUD_FAIL(Error, "Event::synchronize",
                  "the event was recorded before fork() and had not completed: it completes in the parent process "
                  "only");
  }
  std::unique_lock<std::mutex> lock(mutex_);
  done_cv_.wait(lock, [this] { return done_; });
}

bool HostEventRecord::done() {
  std::lock_guard<std::mutex> lock(mutex_);
  return done_;
}

std::chrono::steady_clock::time_point HostEventRecord::time() {
  std::lock_guard<std::mutex> lock(mutex_);
  return time_;
}

void HostEvent::do_record(StreamImpl& stream) {
  auto record = std::make_shared<HostEventRecord>(&static_cast<HostStream&>(stream));
  stream.launch_host_func([record] { record->complete(); }, /*always_run=*/true);
  std::lock_guard<std::mutex> lock(mutex_);
  latest_ = std::move(record);
}

std::shared_ptr<HostEventRecord> HostEvent::latest() {
  std::lock_guard<std::mutex> lock(mutex_);
  return latest_;
}

bool HostEvent::query() {
  auto record = latest();
  return !record || record->done();
}

void HostEvent::synchronize() {
  auto record = latest();
  if (!record) return;
  GPUCLOUD_EXPECTS(record->done() || record->stream() != HostStream::current(), "Event::synchronize",
                   "called from work running on the stream the event was recorded on, which would wait for itself");
  record->wait();
}

float HostEvent::elapsed_ms_since(EventImpl& start) {
  auto from = static_cast<HostEvent&>(start).latest();
  auto to = latest();
  if (!from->done() || !to->done()) {
    GPUCLOUD_FAIL(Error, "elapsed_ms", "an event has not completed yet (synchronize it first)");
  }
  return std::chrono::duration<float, std::milli>(to->time() - from->time()).count();
}

}  // namespace gpucloud::detail
