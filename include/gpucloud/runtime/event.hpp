/// @file event.hpp
/// @brief Events: markers recorded on a stream to order and time work across streams.
#pragma once

#include <gpucloud/export.hpp>
#include <gpucloud/runtime/device.hpp>
#include <gpucloud/runtime/stream.hpp>

#include <cstddef>
#include <memory>

namespace gpucloud {

namespace detail {
class EventImpl;
}

/// @brief An owned, move-only event on one device (CUDA semantics on both backends).
///
/// record() captures the work enqueued on a stream so far; query(), synchronize() and Stream::wait()
/// refer to the latest record. An event never recorded counts as complete. A plain Event orders
/// work and keeps no timestamp (cudaEventDisableTiming, the cheaper kind, as CCCL's cuda::event);
/// a TimedEvent also keeps one, for elapsed_ms().
class GPUCLOUD_API Event {
 public:
  /// @brief Creates an untimed event on @p device.
  explicit Event(Device device = Device::host());
  ~Event();                            ///< Releases the event; never throws.
  Event(Event&&) noexcept;             ///< Moves ownership.
  Event& operator=(Event&&) noexcept;  ///< Moves ownership.
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  /// @brief Device of the event.
  Device device() const;
  /// @brief True for a TimedEvent (one that keeps timestamps for elapsed_ms()).
  bool timed() const;
  /// @brief Records the work enqueued on @p stream so far.
  /// @throws InvalidArgument if the stream is on another device.
  void record(StreamView stream);
  /// @brief True when the latest record's work has finished (or it was never recorded).
  bool query() const;
  /// @brief Blocks the calling thread until the latest record's work has finished.
  void synchronize() const;
  /// @brief Internal implementation (not API).
  detail::EventImpl* impl() const noexcept { return impl_.get(); }

 protected:
  /// @brief Creates an event on @p device that keeps timestamps when @p timing (TimedEvent's).
  Event(Device device, bool timing, std::nullptr_t internal);

 private:
  std::unique_ptr<detail::EventImpl> impl_;
};

/// @brief An event that also keeps the time of its latest completed record (cudaEventDefault):
///        the kind elapsed_ms() measures between.
class GPUCLOUD_API TimedEvent : public Event {
 public:
  /// @brief Creates a timed event on @p device.
  explicit TimedEvent(Device device = Device::host());
};

/// @brief Milliseconds between two completed records of timed events on one device.
/// @throws InvalidArgument if either was never recorded or is on another device;
///         Error if either has not completed yet.
GPUCLOUD_API float elapsed_ms(const TimedEvent& start, const TimedEvent& end);

}  // namespace gpucloud
