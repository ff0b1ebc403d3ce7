/// @file event.hpp
/// @brief Events: markers recorded on a stream to order and time work across streams.
#pragma once

#include <gpucloud/export.hpp>
#include <gpucloud/runtime/device.hpp>
#include <gpucloud/runtime/stream.hpp>

#include <memory>

namespace gpucloud {

namespace detail {
class EventImpl;
}

/// @brief An owned, move-only event on one device (CUDA semantics on both backends).
///
/// record() captures the work enqueued on a stream so far; query(), synchronize() and Stream::wait()
/// refer to the latest record. An event never recorded counts as complete.
class GPUCLOUD_API Event {
 public:
  /// @brief Creates an event on @p device; @p timing enables elapsed_ms().
  explicit Event(Device device = Device::host(), bool timing = true);
  ~Event();                            ///< Releases the event; never throws.
  Event(Event&&) noexcept;             ///< Moves ownership.
  Event& operator=(Event&&) noexcept;  ///< Moves ownership.
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  /// @brief Device of the event.
  Device device() const;
  /// @brief Records the work enqueued on @p stream so far.
  /// @throws InvalidArgument if the stream is on another device.
  void record(StreamView stream);
  /// @brief True when the latest record's work has finished (or it was never recorded).
  bool query() const;
  /// @brief Blocks the calling thread until the latest record's work has finished.
  void synchronize() const;
  /// @brief Internal implementation (not API).
  detail::EventImpl* impl() const noexcept { return impl_.get(); }

 private:
  std::unique_ptr<detail::EventImpl> impl_;
};

/// @brief Milliseconds between two completed records of timing events on one device.
/// @throws InvalidArgument if either was never recorded, lacks timing, or is on another device;
///         Error if either has not completed yet.
GPUCLOUD_API float elapsed_ms(const Event& start, const Event& end);

}  // namespace gpucloud
