#include <gpucloud/runtime/error.hpp>
#include <gpucloud/runtime/event.hpp>
#include <gpucloud/runtime/stream.hpp>

#include "runtime/cuda/runtime_backend.hpp"
#include "runtime/host/host_stream.hpp"
#include "runtime/stream_impl.hpp"

#include <cstdint>
#include <utility>

namespace gpucloud {

namespace {
void check_same_device(Device stream_device, Device event_device, const char* call) {
  GPUCLOUD_EXPECTS(stream_device == event_device, call,
                   "event: the event is on " + event_device.str() + " but the stream is on " + stream_device.str());
}
}  // namespace

// ---- Stream ---------------------------------------------------------------------------------

Stream::Stream(Device device)
    : impl_(device.is_host() ? std::unique_ptr<detail::StreamImpl>(std::make_unique<detail::HostStream>())
                             : detail::cuda::make_stream(device.index())) {}

Stream Stream::from_native(void* native, Device device) {
  GPUCLOUD_EXPECTS(device.is_cuda(), "Stream::from_native",
                   "device: " + device.str() + " has no native streams; adopt a CUDA stream of a GPU");
  // cudaStreamPerThread (CUDA's driver_types.h; no CUDA types in this file). The legacy default
  // stream (null, or cudaStreamLegacy) is one stream per device, whichever thread uses it.
  constexpr std::uintptr_t kPerThreadDefaultStream = 0x2;
  GPUCLOUD_EXPECTS(reinterpret_cast<std::uintptr_t>(native) != kPerThreadDefaultStream, "Stream::from_native",
                   "native: cudaStreamPerThread is a different stream on every host thread, and gpucloud orders "
                   "frees and cleanups from its own threads; pass the legacy default stream (null) or a created "
                   "stream");
  return Stream(detail::cuda::adopt_stream(device.index(), native));
}

Stream::Stream(std::unique_ptr<detail::StreamImpl> impl) noexcept : impl_(std::move(impl)) {}

Stream::~Stream() = default;  // the implementation drains its work before it goes
Stream::Stream(Stream&&) noexcept = default;
Stream& Stream::operator=(Stream&&) noexcept = default;

Device Stream::device() const {
  GPUCLOUD_EXPECTS(impl_ != nullptr, "Stream::device", "this stream was moved from");
  return impl_->device();
}

void* Stream::native_handle() const noexcept { return impl_ ? impl_->native_handle() : nullptr; }

StreamView::StreamView(const Stream& stream) noexcept : impl_(stream.impl()) {}

Device StreamView::device() const noexcept { return impl_->device(); }

void StreamView::synchronize() const { impl_->synchronize(); }

bool StreamView::query() const { return impl_->query(); }

void StreamView::wait(const Event& event) const {
  check_same_device(impl_->device(), event.device(), "Stream::wait");
  impl_->wait(*event.impl());
}

void* StreamView::native_handle() const noexcept { return impl_->native_handle(); }

void launch_host_func(StreamView stream, std::function<void()> fn) {
  GPUCLOUD_EXPECTS(static_cast<bool>(fn), "launch_host_func", "fn: empty function");
  stream.impl()->launch_host_func(std::move(fn), /*always_run=*/false);
}

void launch_cleanup(StreamView stream, std::function<void()> fn) {
  GPUCLOUD_EXPECTS(static_cast<bool>(fn), "launch_cleanup", "fn: empty function");
  stream.impl()->launch_host_func(std::move(fn), /*always_run=*/true);
}

void add_callback(StreamView stream, std::function<void(std::exception_ptr)> fn) {
  GPUCLOUD_EXPECTS(static_cast<bool>(fn), "add_callback", "fn: empty function");
  detail::StreamImpl* impl = stream.impl();  // outlives its queued work (its destructor drains it)
  impl->launch_host_func([impl, fn = std::move(fn)] { fn(impl->take_error()); }, /*always_run=*/true);
}

// ---- Event ----------------------------------------------------------------------------------

Event::Event(Device device, bool timing, std::nullptr_t)
    : impl_(device.is_host() ? std::unique_ptr<detail::EventImpl>(std::make_unique<detail::HostEvent>(timing))
                             : detail::cuda::make_event(device.index(), timing)) {}

Event::Event(Device device) : Event(device, false, nullptr) {}

TimedEvent::TimedEvent(Device device) : Event(device, true, nullptr) {}

Event::~Event() = default;
Event::Event(Event&&) noexcept = default;
Event& Event::operator=(Event&&) noexcept = default;

Device Event::device() const {
  GPUCLOUD_EXPECTS(impl_ != nullptr, "Event::device", "this event was moved from");
  return impl_->device();
}

void Event::record(StreamView stream) {
  check_same_device(stream.device(), device(), "Event::record");
  impl_->record(*stream.impl());
}

bool Event::query() const { return impl_->query(); }

void Event::synchronize() const { impl_->synchronize(); }

bool Event::timed() const {
  GPUCLOUD_EXPECTS(impl_ != nullptr, "Event::timed", "this event was moved from");
  return impl_->timing();
}

float elapsed_ms(const TimedEvent& start, const TimedEvent& end) {
  GPUCLOUD_EXPECTS(start.impl() != nullptr, "elapsed_ms", "start: this event was moved from");
  GPUCLOUD_EXPECTS(end.impl() != nullptr, "elapsed_ms", "end: this event was moved from");
  GPUCLOUD_EXPECTS(start.device() == end.device(), "elapsed_ms",
                   "end: events are on different devices (" + start.device().str() + ", " + end.device().str() + ")");
  GPUCLOUD_EXPECTS(start.timed(), "elapsed_ms", "start: an untimed event (create a TimedEvent to measure time)");
  GPUCLOUD_EXPECTS(end.timed(), "elapsed_ms", "end: an untimed event (create a TimedEvent to measure time)");
  GPUCLOUD_EXPECTS(start.impl()->recorded(), "elapsed_ms", "start: never recorded");
  GPUCLOUD_EXPECTS(end.impl()->recorded(), "elapsed_ms", "end: never recorded");
  return end.impl()->elapsed_ms_since(*start.impl());
}

}  // namespace gpucloud
