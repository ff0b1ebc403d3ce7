#include "runtime/host/host_stream.hpp"

#include <gpucloud/runtime/error.hpp>

#include <utility>

namespace gpucloud::detail {

HostStream::HostStream() : StreamImpl(Device::host()), worker_([this] { run(); }) {}

HostStream::~HostStream() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  work_ready_.notify_one();
  worker_.join();  // the worker drains the queue before it exits
}

void HostStream::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    work_ready_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping and drained
    Task task = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    const bool skip = error_ && !task.always_run;
    if (skip) owed_.emplace(task.enqueuer, error_);  // dropped: its enqueuer must hear why
    lock.unlock();
    std::exception_ptr failure;
    if (!skip) {
      try {
        task.fn();
      } catch (...) {
        failure = std::current_exception();
      }
    }
    task.fn = nullptr;  // release captures outside the lock
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

void HostStream::launch_host_func(std::function<void()> fn, bool always_run) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(Task{std::move(fn), always_run, std::this_thread::get_id()});
    outstanding_.fetch_add(1, std::memory_order_relaxed);
  }
  work_ready_.notify_one();
}

void HostStream::synchronize() {
  GPUCLOUD_EXPECTS(std::this_thread::get_id() != worker_.get_id(), "Stream::synchronize",
                   "called from work running on the same stream, which would wait for itself");
  std::unique_lock<std::mutex> lock(mutex_);
  idle_.wait(lock, [this] { return queue_.empty() && !busy_; });
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
}

std::exception_ptr HostStream::take_error() noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  std::exception_ptr error = std::exchange(error_, nullptr);
  if (error) owed_.clear();  // taken over by the caller, which reports it (GradBucketer::wait)
  return error;
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
  auto record = std::make_shared<HostEventRecord>(static_cast<HostStream&>(stream).worker_id());
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
  GPUCLOUD_EXPECTS(record->done() || record->worker() != std::this_thread::get_id(), "Event::synchronize",
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
