// The runtime's CUDA backend: devices, streams and events through the CUDA runtime.
#include "runtime/cuda/runtime_backend.hpp"

#include <gpucloud/runtime/error.hpp>

#include "runtime/cleanup_queue.hpp"
#include "runtime/cuda/cuda_check.hpp"
#include "runtime/cuda/native_stream.hpp"

#include <cuda_runtime_api.h>

#include <cstdio>
#include <exception>
#include <map>
#include <mutex>
#include <utility>

namespace gpucloud::detail::cuda {

bool built() noexcept { return true; }
int runtime_version() noexcept { return CUDART_VERSION; }

int device_count(std::string& reason) noexcept {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    reason = std::string("cudaGetDeviceCount: ") + cudaGetErrorName(status) + ": " + cudaGetErrorString(status);
    return 0;
  }
  if (count == 0) reason = "cudaGetDeviceCount: no CUDA device is visible";
  return count;
}

namespace {
DeviceProperties query_properties(int device) {
  cudaDeviceProp prop{};
  GPUCLOUD_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  DeviceProperties out;
  out.name = prop.name;
  out.compute_capability_major = prop.major;
  out.compute_capability_minor = prop.minor;
  out.total_memory = prop.totalGlobalMem;
  out.multiprocessor_count = prop.multiProcessorCount;
  out.concurrent_managed_access = prop.concurrentManagedAccess != 0;
  out.backend = "cuda";
  // nvidia-smi's form: GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx
  char uuid[64];
  const auto* b = reinterpret_cast<const unsigned char*>(prop.uuid.bytes);
  std::snprintf(uuid, sizeof uuid, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
                b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
  out.uuid = uuid;
  return out;
}
}  // namespace

// Queried once per device (cudaGetDeviceProperties costs tens of µs and is asked on every GEMM and
// convolution); a device's properties do not change while the process runs.
DeviceProperties properties(int device) {
  static std::mutex mutex;
  static std::map<int, DeviceProperties> known;
  std::lock_guard<std::mutex> lock(mutex);
  const auto it = known.find(device);
  if (it != known.end()) return it->second;
  DeviceProperties p = query_properties(device);  // throws for a device that does not exist: not cached
  known.emplace(device, p);
  return p;
}

MemoryInfo memory_info(int device) {
  DeviceGuard guard(device);
  MemoryInfo info;
  GPUCLOUD_CUDA_CHECK(cudaMemGetInfo(&info.free, &info.total));
  return info;
}

namespace {

class CudaStream final : public StreamImpl {
 public:
  explicit CudaStream(int device) : StreamImpl(Device::cuda(device)) {
    DeviceGuard guard(device);
    GPUCLOUD_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  // Adopts @p native (a framework's stream): used, never destroyed. Null (or cudaStreamLegacy) is
  // the legacy default stream of whichever device is current, so every call below sets the device.
  CudaStream(int device, cudaStream_t native) : StreamImpl(Device::cuda(device)), stream_(native), owned_(false) {}
  ~CudaStream() override {
    try {
      DeviceGuard guard(device().index());
      GPUCLOUD_CUDA_CHECK_NOTHROW(cudaStreamSynchronize(stream_));
    } catch (const std::exception&) {  // cudaSetDevice failed: the runtime is going away
    }
    cleanups_->wait(detail::CleanupQueue::shared());  // they refer to this stream
    if (owned_) GPUCLOUD_CUDA_CHECK_NOTHROW(cudaStreamDestroy(stream_));
  }
  void synchronize() override {
    {
      DeviceGuard guard(device().index());
      GPUCLOUD_CUDA_CHECK(cudaStreamSynchronize(stream_));
    }
    cleanups_->wait(detail::CleanupQueue::shared());  // done means released too, as on the host
    std::exception_ptr error;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      error = std::exchange(host_error_, nullptr);
    }
    if (!error) error = failure()->take();
    if (error) std::rethrow_exception(error);
  }
  bool query() override {
    DeviceGuard guard(device().index());
    const cudaError_t status = cudaStreamQuery(stream_);
    if (status == cudaErrorNotReady) {
      (void)cudaGetLastError();
      return false;
    }
    GPUCLOUD_CUDA_CHECK(status);
    return cleanups_->idle();
  }
  void wait(EventImpl& event) override;
  void launch_host_func(std::function<void()> fn, bool always_run) override {
    DeviceGuard guard(device().index());
    auto* payload = new Payload{std::move(fn), this, always_run};
    const cudaError_t status = cudaLaunchHostFunc(stream_, &CudaStream::trampoline, payload);
    if (status != cudaSuccess) delete payload;
    GPUCLOUD_CUDA_CHECK(status);
  }
  std::exception_ptr take_error() noexcept override {
    std::exception_ptr error;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      error = std::exchange(host_error_, nullptr);
    }
    return error ? error : failure()->take();
  }
  void* native_handle() noexcept override { return stream_; }
  cudaStream_t stream() const noexcept { return stream_; }

 private:
  struct Payload {
    std::function<void()> fn;
    CudaStream* owner;
    bool always_run;
  };
  // Runs on CUDA's callback thread, which must not call CUDA nor wait for the GIL. A cleanup
  // (always_run: it frees buffers, releases Python objects) may do both, so it is handed to the
  // cleanup thread (runtime/cleanup_queue.hpp); synchronize() and query() wait for it to finish.
  static void CUDART_CB trampoline(void* data) {
    std::unique_ptr<Payload> payload(static_cast<Payload*>(data));
    CudaStream& s = *payload->owner;
    if (payload->always_run) {
      s.cleanups_->begin();
      try {
        // The count outlives the stream: releasing what the cleanup captured may destroy the stream.
        detail::CleanupQueue::shared().post([p = payload.get(), pending = s.cleanups_] {
          {
            const std::unique_ptr<Payload> own(p);  // what the cleanup captured goes with it
            own->owner->run(*own);
          }
          pending->end();
        });
        (void)payload.release();
      } catch (...) {  // could not queue it (out of memory): run it here rather than never
        s.run(*payload);
        payload.reset();
        s.cleanups_->end();
      }
      return;
    }
    bool skip = false;
    {
      std::lock_guard<std::mutex> lock(s.mutex_);
      skip = s.host_error_ != nullptr;  // same contract as the host backend
    }
    skip = skip || s.failure()->pending();
    if (!skip) s.run(*payload);
    s.release_elsewhere(std::move(payload));
  }
  // What a function captured is released on the cleanup thread, never on CUDA's callback thread:
  // the last reference to a stream (its destructor synchronises it) or to a Python object (its
  // release takes the GIL) must not be dropped there. synchronize() and query() wait for it.
  void release_elsewhere(std::unique_ptr<Payload> payload) noexcept {
    cleanups_->begin();
    try {
      detail::CleanupQueue::shared().post([p = payload.get(), pending = cleanups_] {
        delete p;  // may destroy this stream: the count is held apart
        pending->end();
      });
      (void)payload.release();
    } catch (...) {  // could not queue it (out of memory): release it here rather than leak it
      payload.reset();
      cleanups_->end();
    }
  }
  // Runs @p p's function; an exception becomes the stream's error, raised at synchronize().
  void run(Payload& p) noexcept {
    try {
      p.fn();
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!host_error_) host_error_ = std::current_exception();
    }
  }
  cudaStream_t stream_ = nullptr;
  bool owned_ = true;  // false: a caller's stream (from_native), never destroyed here
  std::mutex mutex_;
  std::exception_ptr host_error_;
  std::shared_ptr<detail::PendingCleanups> cleanups_ = std::make_shared<detail::PendingCleanups>();
};

class CudaEvent final : public EventImpl {
 public:
  CudaEvent(int device, bool timing) : EventImpl(Device::cuda(device), timing) {
    DeviceGuard guard(device);
    GPUCLOUD_CUDA_CHECK(cudaEventCreateWithFlags(&event_, timing ? cudaEventDefault : cudaEventDisableTiming));
  }
  ~CudaEvent() override { GPUCLOUD_CUDA_CHECK_NOTHROW(cudaEventDestroy(event_)); }
  bool query() override {
    const cudaError_t status = cudaEventQuery(event_);
    if (status == cudaErrorNotReady) {
      (void)cudaGetLastError();
      return false;
    }
    GPUCLOUD_CUDA_CHECK(status);
    return true;
  }
  void synchronize() override { GPUCLOUD_CUDA_CHECK(cudaEventSynchronize(event_)); }
  float elapsed_ms_since(EventImpl& start) override {
    float ms = 0.0f;
    GPUCLOUD_CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<CudaEvent&>(start).event_, event_));
    return ms;
  }
  cudaEvent_t event() const noexcept { return event_; }

 protected:
  void do_record(StreamImpl& stream) override {
    DeviceGuard guard(device().index());
    GPUCLOUD_CUDA_CHECK(cudaEventRecord(event_, static_cast<CudaStream&>(stream).stream()));
  }

 private:
  cudaEvent_t event_ = nullptr;
};

void CudaStream::wait(EventImpl& event) {
  DeviceGuard guard(device().index());
  GPUCLOUD_CUDA_CHECK(cudaStreamWaitEvent(stream_, static_cast<CudaEvent&>(event).event(), 0));
}

}  // namespace

std::unique_ptr<StreamImpl> make_stream(int device) { return std::make_unique<CudaStream>(device); }
std::unique_ptr<StreamImpl> adopt_stream(int device, void* native) {
  int count = 0;
  GPUCLOUD_CUDA_CHECK(cudaGetDeviceCount(&count));
  GPUCLOUD_EXPECTS(
      device >= 0 && device < count, "Stream::from_native",
      "device: cuda:" + std::to_string(device) + " is not one of the " + std::to_string(count) + " visible GPUs");
  return std::make_unique<CudaStream>(device, static_cast<cudaStream_t>(native));
}
std::unique_ptr<EventImpl> make_event(int device, bool timing) { return std::make_unique<CudaEvent>(device, timing); }

}  // namespace gpucloud::detail::cuda
