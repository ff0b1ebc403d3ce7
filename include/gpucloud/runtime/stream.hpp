/// @file stream.hpp
/// @brief Streams: in-order asynchronous work queues on a device.
///
/// On a CUDA device a Stream owns a non-blocking cudaStream_t (or adopts a caller's:
/// Stream::from_native). On the host it owns a worker
/// thread that runs enqueued work in order, so stream-ordered code behaves the same on both.
/// An exception thrown by enqueued work is kept; work enqueued after it on the same stream is
/// discarded (event records and waits still complete), and the exception is rethrown, with its
/// message, by the next synchronize() of that stream, which clears it.
#pragma once

#include <gpucloud/export.hpp>
#include <gpucloud/runtime/device.hpp>

#include <exception>
#include <functional>
#include <memory>

namespace gpucloud {

class Event;
class Stream;
namespace detail {
class StreamImpl;
}

/// @brief Non-owning, copyable reference to a Stream; what asynchronous APIs take.
class GPUCLOUD_API StreamView {
 public:
  /// @brief Views @p stream; the stream must outlive the view.
  StreamView(const Stream& stream) noexcept;  // NOLINT(google-explicit-constructor): a view
  /// @brief Device the stream runs on.
  Device device() const noexcept;
  /// @brief Blocks until all work enqueued so far finished; rethrows enqueued work's error.
  void synchronize() const;
  /// @brief True when all work enqueued so far has finished.
  bool query() const;
  /// @brief Makes later work on this stream wait for @p event's last record.
  void wait(const Event& event) const;
  /// @brief The native handle (a cudaStream_t on CUDA, null for the legacy default stream; null
  ///        on the host).
  void* native_handle() const noexcept;
  /// @brief Internal implementation (not API).
  detail::StreamImpl* impl() const noexcept { return impl_; }
  /// @brief Internal: a view of an implementation (not API).
  static StreamView from_impl(detail::StreamImpl& impl) noexcept { return StreamView(&impl); }
  /// @brief Identity comparison.
  friend bool operator==(StreamView a, StreamView b) noexcept { return a.impl_ == b.impl_; }
  /// @brief Identity comparison.
  friend bool operator!=(StreamView a, StreamView b) noexcept { return a.impl_ != b.impl_; }

 private:
  explicit StreamView(detail::StreamImpl* impl) noexcept : impl_(impl) {}
  detail::StreamImpl* impl_;
};

/// @brief An owned, move-only stream on one device.
class GPUCLOUD_API Stream {
 public:
  /// @brief Creates a stream on @p device (host: a worker thread; CUDA: a non-blocking stream).
  explicit Stream(Device device = Device::host());
  /// @brief Adopts a caller's stream (a framework's: PyTorch's current stream, CuPy's) without
  ///        owning it: gpucloud work is enqueued on @p native (a cudaStream_t of @p device),
  ///        ordered with the framework's own work. The caller keeps @p native alive while the
  ///        returned Stream is used; destroying the Stream drains gpucloud's work and leaves
  ///        @p native alone.
  ///        A null handle (or cudaStreamLegacy) is the device's legacy default stream, what
  ///        PyTorch's current stream is outside `torch.cuda.stream(...)`.
  /// @throws InvalidArgument for the host device (a host stream has no native handle) or
  ///         cudaStreamPerThread (a different stream on every host thread, while gpucloud
  ///         orders frees and cleanups from its own threads).
  static Stream from_native(void* native, Device device);
  /// @brief Waits for the stream's work to finish, then releases it; never throws.
  ~Stream();
  Stream(Stream&&) noexcept;             ///< Moves ownership.
  Stream& operator=(Stream&&) noexcept;  ///< Moves ownership; the old stream is drained first.
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  /// @brief Device the stream runs on.
  Device device() const;
  /// @brief Blocks until all work enqueued so far finished; rethrows enqueued work's error.
  void synchronize() const { view().synchronize(); }
  /// @brief True when all work enqueued so far has finished.
  bool query() const { return view().query(); }
  /// @brief Makes later work on this stream wait for @p event's last record.
  void wait(const Event& event) const { view().wait(event); }
  /// @brief The native handle (a cudaStream_t on CUDA, nullptr on the host).
  void* native_handle() const noexcept;
  /// @brief A non-owning view.
  StreamView view() const noexcept { return StreamView(*this); }
  /// @brief Internal implementation (not API).
  detail::StreamImpl* impl() const noexcept { return impl_.get(); }

 private:
  explicit Stream(std::unique_ptr<detail::StreamImpl> impl) noexcept;
  std::unique_ptr<detail::StreamImpl> impl_;
};

/// @brief Enqueues @p fn on @p stream; it runs on the host once earlier work finished.
///
/// On CUDA this is cudaLaunchHostFunc: @p fn must not call CUDA. An exception from @p fn is
/// reported by the stream's next synchronize().
GPUCLOUD_API void launch_host_func(StreamView stream, std::function<void()> fn);

/// @brief Enqueues a cleanup @p fn that runs once earlier work finished, even if it failed.
///
/// For releasing what in-flight work uses (a borrowed array, a staging buffer): unlike
/// launch_host_func it is not discarded after an error. @p fn must not throw.
GPUCLOUD_API void launch_cleanup(StreamView stream, std::function<void()> fn);

/// @brief Enqueues @p fn(error) that runs once earlier work finished, also after a failure, as
///        cudaStreamAddCallback hands its callback a status.
///
/// @p error is the first exception earlier work raised since the stream was last synchronised
/// (taken over by @p fn: synchronize() will not raise it again), or null. For completing futures
/// and promises from a stream. An exception from @p fn is reported by the next synchronize().
GPUCLOUD_API void add_callback(StreamView stream, std::function<void(std::exception_ptr)> fn);

}  // namespace gpucloud
