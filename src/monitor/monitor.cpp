// Device monitoring: one reading (NVML or /proc, by the device) and a background sampler that
// keeps a run's statistics, with energy integrated from the power readings.
#include <gpucloud/monitor/monitor.hpp>
#include <gpucloud/runtime/error.hpp>

#include "monitor/cuda/monitor_backend.hpp"
#include "monitor/host/host_metrics.hpp"
#include "monitor/metrics_summary.hpp"

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <thread>

namespace gpucloud {

DeviceMetrics read_metrics(Device device) {
  DeviceMetrics m;
  m.device = device;
  if (device.is_cuda()) {
    detail::cuda::read_metrics(device.index(), m);
    m.when = std::chrono::steady_clock::now();
  } else {
    detail::read_host_metrics(m);
  }
  return m;
}

std::string nvml_unavailable_reason() {
  if (cuda_device_count() == 0) return "no CUDA device: " + cuda_unavailable_reason();
  return detail::cuda::nvml_unavailable_reason();
}

struct MetricsMonitor::State {
  Device device = Device::host();
  std::chrono::milliseconds interval;
  mutable std::mutex mutex;
  std::condition_variable wake;
  bool stopping = false;
  std::thread thread;
  DeviceMetrics latest;
  MetricsSummary summary;
  std::chrono::steady_clock::time_point first;
  std::optional<DeviceMetrics> previous;  // for the energy's trapezoids

  // Folds @p m into the statistics (mutex held).
  void record(const DeviceMetrics& m) {
    if (summary.samples == 0) first = m.when;
    detail::accumulate(summary, previous, m, first);
    previous = m;
    latest = m;
  }

  void run() {
    std::unique_lock<std::mutex> lock(mutex);
    while (!stopping) {
      if (wake.wait_for(lock, interval, [this] { return stopping; })) break;
      lock.unlock();
      DeviceMetrics m;
      bool ok = true;
      try {
        m = read_metrics(device);
      } catch (...) {  // a reading that failed (a GPU that fell off the bus) is skipped, not fatal
        ok = false;
      }
      lock.lock();
      if (ok) record(m);
    }
  }
};

MetricsMonitor::MetricsMonitor(Device device, std::chrono::milliseconds interval) : state_(std::make_unique<State>()) {
  GPUCLOUD_EXPECTS(interval.count() >= 10, "MetricsMonitor",
                   "interval: " + std::to_string(interval.count()) + " ms is shorter than the 10 ms minimum");
  state_->device = device;
  state_->interval = interval;
  state_->summary.device = device;
  state_->record(read_metrics(device));  // the first reading, now: errors surface here
  State* s = state_.get();
  state_->thread = std::thread([s] { s->run(); });
}

MetricsMonitor::~MetricsMonitor() {
  if (state_) stop();
}

MetricsMonitor::MetricsMonitor(MetricsMonitor&&) noexcept = default;

MetricsMonitor& MetricsMonitor::operator=(MetricsMonitor&& other) noexcept {
  if (this != &other) {
    if (state_) stop();
    state_ = std::move(other.state_);
  }
  return *this;
}

DeviceMetrics MetricsMonitor::latest() const {
  GPUCLOUD_EXPECTS(state_ != nullptr, "MetricsMonitor::latest", "the monitor was moved from");
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->latest;
}

MetricsSummary MetricsMonitor::summary() const {
  GPUCLOUD_EXPECTS(state_ != nullptr, "MetricsMonitor::summary", "the monitor was moved from");
  const DeviceMetrics now = read_metrics(state_->device);
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->record(now);
  return state_->summary;
}

void MetricsMonitor::reset() {
  GPUCLOUD_EXPECTS(state_ != nullptr, "MetricsMonitor::reset", "the monitor was moved from");
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->summary = MetricsSummary{};
  state_->summary.device = state_->device;
  state_->previous.reset();
}

void MetricsMonitor::stop() {
  GPUCLOUD_EXPECTS(state_ != nullptr, "MetricsMonitor::stop", "the monitor was moved from");
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->stopping = true;
  }
  state_->wake.notify_all();
  if (state_->thread.joinable()) state_->thread.join();
}

}  // namespace gpucloud
