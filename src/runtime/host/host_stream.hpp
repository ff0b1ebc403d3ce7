// Internal: the host backend's streams and events (not API).
#pragma once

#include "runtime/stream_impl.hpp"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

namespace gpucloud::detail {

/// A stream run by its own worker thread, strictly in order.
class HostStream final : public StreamImpl {
 public:
  HostStream();
  ~HostStream() override;

  void synchronize() override;
  bool query() override;
  void wait(EventImpl& event) override;
  void launch_host_func(std::function<void()> fn, bool always_run) override;
  std::exception_ptr take_error() noexcept override;
  void* native_handle() noexcept override { return nullptr; }

 private:
  struct Task {
    std::function<void()> fn;
    bool always_run;
  };
  void run();

  std::mutex mutex_;
  std::condition_variable work_ready_;
  std::condition_variable idle_;
  std::deque<Task> queue_;
  bool busy_ = false;
  bool stopping_ = false;
  std::atomic<std::size_t> outstanding_{0};  // enqueued and not yet finished: query() reads it without the lock
  std::exception_ptr error_;
  std::thread worker_;
};

/// One record of a host event: completes when the stream's worker reaches it.
class HostEventRecord {
 public:
  void complete();
  void wait();
  bool done();
  std::chrono::steady_clock::time_point time();

 private:
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
