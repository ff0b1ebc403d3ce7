// Internal: the backend interface behind Stream and Event (not API).
#pragma once

#include <gpucloud/runtime/device.hpp>
#include <gpucloud/runtime/stream.hpp>

#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <tuple>
#include <utility>

namespace gpucloud::detail {

class EventImpl;

/// An error put on a stream from outside its work (a communicator's watchdog that aborted a
/// collective enqueued on it), raised by the stream's next synchronize(). Shared: whoever set it
/// may hold it after the stream is gone.
class StreamFailure {
 public:
  /// Makes @p error the stream's failure unless it already has one.
  void set(std::exception_ptr error) noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!error_) error_ = std::move(error);
  }
  /// Takes (and clears) the failure, if any.
  std::exception_ptr take() noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    return std::exchange(error_, nullptr);
  }
  /// True while a failure waits to be raised.
  bool pending() noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    return error_ != nullptr;
  }

 private:
  std::mutex mutex_;
  std::exception_ptr error_;
};

/// An in-order work queue on one device; implemented by the host and CUDA backends.
class StreamImpl {
 public:
  explicit StreamImpl(Device device) noexcept : device_(device) {}
  virtual ~StreamImpl() = default;
  StreamImpl(const StreamImpl&) = delete;
  StreamImpl& operator=(const StreamImpl&) = delete;

  Device device() const noexcept { return device_; }
  /// Blocks until the queue is empty, then rethrows (and clears) the first error of its work.
  virtual void synchronize() = 0;
  /// True when everything enqueued so far has finished.
  virtual bool query() = 0;
  /// Later work waits for the event's latest record.
  virtual void wait(EventImpl& event) = 0;
  /// Runs @p fn on the host after earlier work. @p always_run: also after a failure (cleanup).
  virtual void launch_host_func(std::function<void()> fn, bool always_run) = 0;
  /// Takes (and clears) the error raised by enqueued host work, if any, without waiting or
  /// calling CUDA: safe inside a host function of another stream.
  virtual std::exception_ptr take_error() noexcept = 0;
  /// cudaStream_t, or nullptr on the host.
  virtual void* native_handle() noexcept = 0;
  /// Where a failure from outside the stream's work goes (synchronize() raises it, after the
  /// stream's own error).
  const std::shared_ptr<StreamFailure>& failure() const noexcept { return failure_; }

 private:
  Device device_;
  std::shared_ptr<StreamFailure> failure_ = std::make_shared<StreamFailure>();
};

/// A marker recorded on a stream; implemented by the host and CUDA backends.
class EventImpl {
 public:
  EventImpl(Device device, bool timing) noexcept : device_(device), timing_(timing) {}
  virtual ~EventImpl() = default;
  EventImpl(const EventImpl&) = delete;
  EventImpl& operator=(const EventImpl&) = delete;

  Device device() const noexcept { return device_; }
  bool timing() const noexcept { return timing_; }
  bool recorded() const noexcept { return recorded_; }
  void record(StreamImpl& stream) {
    do_record(stream);
    recorded_ = true;
  }
  virtual bool query() = 0;
  virtual void synchronize() = 0;
  /// Milliseconds from @p start's latest record to this one's; both complete and recorded.
  virtual float elapsed_ms_since(EventImpl& start) = 0;

 protected:
  virtual void do_record(StreamImpl& stream) = 0;

 private:
  Device device_;
  bool timing_;
  bool recorded_ = false;
};

/// The library's lifetime rule (docs/architecture.md): work enqueued on a stream keeps alive what
/// it touches. Holds @p owners (shared_ptrs, null ones allowed) until @p stream has run the work
/// enqueued so far, also after a failure; they are released on the stream's worker (host) or the
/// cleanup thread (CUDA), never on CUDA's callback thread. A host stream that has already run
/// everything (its work ran in place) lets them go here instead: nothing is left to touch them.
template <class... Owners>
void hold_until_done(StreamView stream, Owners... owners) {
  if (!stream.device().is_cuda() && stream.impl()->query()) return;
  stream.impl()->launch_host_func([held = std::make_tuple(std::move(owners)...)] { (void)held; },
                                  /*always_run=*/true);
}

}  // namespace gpucloud::detail
