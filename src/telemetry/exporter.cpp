// The Prometheus exporter: prometheus-cpp's registry and pull exposer, device metrics collected at
// scrape time under DCGM's names, training metrics, straggler detection (docs/telemetry.md).
#include <gpucloud/compute/cast.hpp>
#include <gpucloud/movement/copy.hpp>
#include <gpucloud/runtime/error.hpp>
#include <gpucloud/runtime/event.hpp>
#include <gpucloud/telemetry/telemetry.hpp>

#include <prometheus/check_names.h>
#include <prometheus/collectable.h>
#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <optional>

namespace gpucloud::telemetry {

namespace pm = prometheus;

namespace {

constexpr const char* kCall = "Exporter";

bool valid_utf8(const std::string& s) {
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const std::size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (std::size_t k = 1; k < n; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) >> 6) != 0x2) return false;
    }
    i += n;
  }
  return true;
}

void check_labels(const Labels& labels, const char* call) {
  for (const auto& [name, value] : labels) {
    GPUCLOUD_EXPECTS(pm::CheckLabelName(name) && name.compare(0, 2, "__") != 0, call,
                     "labels: '" + name + "' is not a Prometheus label name ([a-zA-Z_][a-zA-Z0-9_]*, no leading __)");
    GPUCLOUD_EXPECTS(valid_utf8(value), call, "labels['" + name + "']: the value is not valid UTF-8");
  }
}

void check_finite(double v, const char* what) {
  GPUCLOUD_EXPECTS(std::isfinite(v) && v >= 0, "StepMetrics::record",
                   std::string(what) + ": " + std::to_string(v) + " is not a finite non-negative number");
}

pm::ClientMetric gauge_metric(const Labels& labels, double value) {
  pm::ClientMetric m;
  for (const auto& [k, v] : labels) m.label.push_back({k, v});
  m.gauge.value = value;
  return m;
}

// Step times from 1 ms to about 1 minute.
pm::Histogram::BucketBoundaries step_buckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
}

// Device metrics at scrape time: each watched monitor's latest reading.
class DeviceCollectable : public pm::Collectable {
 public:
  explicit DeviceCollectable(Labels base) : base_(std::move(base)) {}
  void add(const MetricsMonitor* m) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (std::find(monitors_.begin(), monitors_.end(), m) == monitors_.end()) monitors_.push_back(m);
  }
  void remove(const MetricsMonitor* m) {
    std::lock_guard<std::mutex> lock(mutex_);
    monitors_.erase(std::remove(monitors_.begin(), monitors_.end(), m), monitors_.end());
  }
  std::vector<pm::MetricFamily> Collect() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    std::map<std::string, pm::MetricFamily> families;
    auto put = [&](const std::string& name, const char* help, const Labels& labels, std::optional<double> v) {
      if (!v) return;
      auto& f = families[name];
      f.name = name;
      f.help = help;
      f.type = pm::MetricType::Gauge;
      f.metric.push_back(gauge_metric(labels, *v));
    };
    for (const MetricsMonitor* monitor : monitors_) {
      const DeviceMetrics d = monitor->latest();
      Labels labels = base_;
      const double mib = 1024.0 * 1024.0;
      const std::optional<double> used = static_cast<double>(d.memory_used);
      const std::optional<double> free =
          static_cast<double>(d.memory_total > d.memory_used ? d.memory_total - d.memory_used : 0);
      if (d.device.is_cuda()) {
        // The DCGM exporter's names, units and labels, so its dashboards and alerts apply as they are.
        const DeviceProperties p = device_properties(d.device);
        labels["gpu"] = std::to_string(d.device.index());
        labels["device"] = "nvidia" + std::to_string(d.device.index());
        labels["modelName"] = p.name;
        if (!p.uuid.empty()) labels["UUID"] = p.uuid;
        put("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", labels, d.utilization);
        put("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).", labels, d.memory_utilization);
        put("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", labels, d.temperature_c);
        put("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", labels, *used / mib);
        put("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", labels, *free / mib);
        put("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", labels, d.power_w);
        put("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", labels, d.clock_mhz);
      } else {
        labels["device"] = "host";
        put("gpucloud_host_utilization_percent", "CPU utilization of the host (in %).", labels, d.utilization);
        put("gpucloud_host_temperature_celsius", "Hottest thermal zone of the host (in C).", labels, d.temperature_c);
        put("gpucloud_host_memory_used_bytes", "Host memory in use (total minus available).", labels, used);
        put("gpucloud_host_memory_free_bytes", "Host memory available.", labels, free);
        put("gpucloud_host_power_watts", "CPU package power (RAPL).", labels, d.power_w);
        put("gpucloud_host_clock_mhz", "Mean CPU core clock.", labels, d.clock_mhz);
      }
    }
    std::vector<pm::MetricFamily> out;
    for (auto& [name, f] : families) out.push_back(std::move(f));
    return out;
  }

 private:
  Labels base_;
  mutable std::mutex mutex_;
  std::vector<const MetricsMonitor*> monitors_;
};

pm::Labels to_pm(const Labels& l) { return pm::Labels(l.begin(), l.end()); }

}  // namespace

// ---- StepMetrics ------------------------------------------------------------------------------

struct Straggler {
  Straggler(Communicator& c, StreamView s, StragglerOptions o) : comm(&c), stream(s), options(o) {}
  Communicator* comm;
  StreamView stream;
  StragglerOptions options;
  double sum = 0;
  int count = 0;
  Buffer send, recv, host_send, host_recv;
  std::optional<Event> done;
  StragglerReport report;
};

struct StepMetrics::Impl {
  std::shared_ptr<pm::Registry> registry;
  pm::Histogram* step_seconds = nullptr;
  pm::Counter *steps = nullptr, *samples = nullptr, *skipped = nullptr, *data_wait = nullptr, *comm = nullptr;
  pm::Gauge *samples_per_second = nullptr, *loss_scale = nullptr;
  pm::Gauge *memory_in_use = nullptr, *memory_peak = nullptr, *memory_allocations = nullptr;
  pm::Histogram* checkpoint_seconds = nullptr;
  pm::Family<pm::Gauge>* rank_step = nullptr;
  pm::Gauge *straggler = nullptr, *straggler_rank = nullptr;
  std::mutex mutex;  // the straggler state (records themselves are lock-free or prometheus-cpp's)
  std::optional<Straggler> stragglers;

  // An exchange still queued on the stream reads and writes the straggler buffers: it finishes
  // before they are freed.
  ~Impl() {
    if (stragglers && stragglers->done) {
      try {
        stragglers->done->synchronize();
      } catch (...) {  // the stream's error belongs to its owner
      }
    }
  }

  void finish_exchange(Straggler& s) {
    s.done->synchronize();
    const auto* all = s.host_recv.data_as<double>();
    StragglerReport r;
    r.step_seconds.assign(all, all + s.comm->size());
    std::vector<double> sorted = r.step_seconds;
    std::sort(sorted.begin(), sorted.end());
    const std::size_t n = sorted.size();
    r.median = n % 2 == 1 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
    r.slowest =
        static_cast<int>(std::max_element(r.step_seconds.begin(), r.step_seconds.end()) - r.step_seconds.begin());
    r.straggler =
        r.median > 0 && r.step_seconds[static_cast<std::size_t>(r.slowest)] > r.median * (1 + s.options.threshold);
    for (std::size_t i = 0; i < n; ++i) rank_step->Add({{"rank", std::to_string(i)}}).Set(r.step_seconds[i]);
    straggler->Set(r.straggler ? 1 : 0);
    straggler_rank->Set(r.straggler ? r.slowest : -1);
    s.report = std::move(r);
    s.done.reset();
  }

  // Enqueues the all-gather of this rank's mean step time over the period just ended.
  void start_exchange(Straggler& s) {
    *s.host_send.data_as<double>() = s.sum / s.count;
    s.sum = 0;
    s.count = 0;
    copy(s.send, s.host_send, s.stream);
    s.comm->all_gather(s.send, s.recv, s.stream);
    copy(s.host_recv, s.recv, s.stream);
    s.done.emplace(s.stream.device(), false);
    s.done->record(s.stream);
  }
};

void StepMetrics::record(const StepRecord& r) {
  check_finite(r.seconds, "step.seconds");
  check_finite(r.data_wait_seconds, "step.data_wait_seconds");
  check_finite(r.comm_seconds, "step.comm_seconds");
  check_finite(r.loss_scale, "step.loss_scale");
  GPUCLOUD_EXPECTS(r.samples >= 0, "StepMetrics::record", "step.samples: negative");
  GPUCLOUD_EXPECTS(r.skipped >= 0, "StepMetrics::record", "step.skipped: negative");
  Impl& m = *impl_;
  m.step_seconds->Observe(r.seconds);
  m.steps->Increment();
  m.samples->Increment(static_cast<double>(r.samples));
  if (r.seconds > 0) m.samples_per_second->Set(static_cast<double>(r.samples) / r.seconds);
  if (r.data_wait_seconds > 0) m.data_wait->Increment(r.data_wait_seconds);
  if (r.comm_seconds > 0) m.comm->Increment(r.comm_seconds);
  if (r.loss_scale > 0) m.loss_scale->Set(r.loss_scale);
  if (r.skipped > 0) m.skipped->Increment(static_cast<double>(r.skipped));
  if (m.stragglers) {
    std::lock_guard<std::mutex> lock(m.mutex);
    Straggler& s = *m.stragglers;
    s.sum += r.seconds;
    if (++s.count == s.options.every) {
      if (s.done) m.finish_exchange(s);  // the previous period's, long done by now
      m.start_exchange(s);
    } else if (s.done && s.done->query()) {
      m.finish_exchange(s);
    }
  }
}

void StepMetrics::record_checkpoint(double seconds) {
  GPUCLOUD_EXPECTS(std::isfinite(seconds) && seconds >= 0, "StepMetrics::record_checkpoint",
                   "seconds: " + std::to_string(seconds) + " is not a finite non-negative number");
  impl_->checkpoint_seconds->Observe(seconds);
}

void StepMetrics::record_memory(const MemoryStatistics& s) {
  impl_->memory_in_use->Set(static_cast<double>(s.current_bytes));
  impl_->memory_peak->Set(static_cast<double>(s.peak_bytes));
  impl_->memory_allocations->Set(static_cast<double>(s.total_allocations));
}

std::int64_t StepMetrics::steps() const { return static_cast<std::int64_t>(impl_->steps->Value()); }

// ---- Exporter ---------------------------------------------------------------------------------

struct Exporter::Impl {
  ExporterOptions options;
  std::shared_ptr<pm::Registry> registry = std::make_shared<pm::Registry>();
  std::shared_ptr<DeviceCollectable> devices;
  std::unique_ptr<pm::Exposer> exposer;
  std::unique_ptr<StepMetrics> steps;
  std::shared_ptr<StepMetrics::Impl> step_impl;
  int port = -1;

  std::vector<pm::MetricFamily> collect() const {
    std::vector<pm::MetricFamily> all = registry->Collect();
    for (auto& f : devices->Collect()) all.push_back(std::move(f));
    return all;
  }
};

Exporter::Exporter(ExporterOptions options) {
  check_labels(options.labels, kCall);
  GPUCLOUD_EXPECTS(options.port >= -1 && options.port <= 65535, kCall,
                   "options.port: " + std::to_string(options.port) + " is not a port (0 picks one, -1 serves none)");
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->devices = std::make_shared<DeviceCollectable>(options.labels);
  const pm::Labels constant = to_pm(options.labels);
  auto& r = *impl->registry;
  auto m = std::make_shared<StepMetrics::Impl>();
  m->registry = impl->registry;
  m->step_seconds = &pm::BuildHistogram()
                         .Name("gpucloud_step_seconds")
                         .Help("Wall time of a training step.")
                         .Labels(constant)
                         .Register(r)
                         .Add({}, step_buckets());
  auto counter = [&](const char* name, const char* help) {
    return &pm::BuildCounter().Name(name).Help(help).Labels(constant).Register(r).Add({});
  };
  auto gauge = [&](const char* name, const char* help) {
    return &pm::BuildGauge().Name(name).Help(help).Labels(constant).Register(r).Add({});
  };
  m->steps = counter("gpucloud_steps_total", "Training steps recorded.");
  m->samples = counter("gpucloud_samples_total", "Samples processed by this rank.");
  m->skipped = counter("gpucloud_skipped_steps_total", "Steps the optimizer skipped (an inf/NaN gradient).");
  m->data_wait = counter("gpucloud_data_wait_seconds_total", "Time spent waiting for input batches.");
  m->comm = counter("gpucloud_comm_seconds_total", "Time the collectives took (the communicator's own events).");
  m->samples_per_second = gauge("gpucloud_samples_per_second", "Samples per second of the last step (this rank).");
  m->loss_scale = gauge("gpucloud_loss_scale", "The dynamic loss scale.");
  m->memory_in_use = gauge("gpucloud_memory_pool_bytes_in_use", "Bytes allocated from the memory pool.");
  m->memory_peak = gauge("gpucloud_memory_pool_peak_bytes", "Peak bytes allocated from the memory pool.");
  m->memory_allocations = gauge("gpucloud_memory_pool_allocations_total", "Allocations from the memory pool.");
  m->checkpoint_seconds = &pm::BuildHistogram()
                               .Name("gpucloud_checkpoint_save_seconds")
                               .Help("Time a checkpoint save took.")
                               .Labels(constant)
                               .Register(r)
                               .Add({}, pm::Histogram::BucketBoundaries{0.01, 0.1, 0.5, 1, 5, 10, 30, 60, 300});
  pm::Labels without_rank = constant;
  without_rank.erase("rank");
  m->rank_step = &pm::BuildGauge()
                      .Name("gpucloud_rank_step_seconds")
                      .Help("Every rank's mean step time over the last straggler period, by rank.")
                      .Labels(without_rank)
                      .Register(r);
  m->straggler = gauge("gpucloud_straggler", "1 while the slowest rank is beyond the straggler threshold.");
  m->straggler_rank = gauge("gpucloud_straggler_rank", "The straggling rank, or -1.");
  m->straggler_rank->Set(-1);
  impl->step_impl = m;
  impl->steps = std::make_unique<StepMetrics>(m);
  if (options.port >= 0) {
    const std::string address = options.address + ":" + std::to_string(options.port);
    try {
      impl->exposer = std::make_unique<pm::Exposer>(address, 2);
    } catch (const std::exception& e) {
      GPUCLOUD_FAIL(InvalidArgument, kCall,
                    "options.port: cannot serve on " + address + " (" + e.what() + "; in use, or not allowed)");
    }
    impl->exposer->RegisterCollectable(impl->registry);
    impl->exposer->RegisterCollectable(impl->devices);
    const auto ports = impl->exposer->GetListeningPorts();
    impl->port = ports.empty() ? options.port : ports.front();
  }
  impl_ = std::move(impl);
}

Exporter::~Exporter() = default;
Exporter::Exporter(Exporter&&) noexcept = default;
Exporter& Exporter::operator=(Exporter&&) noexcept = default;

int Exporter::port() const { return impl_->port; }
void Exporter::watch(const MetricsMonitor& monitor) { impl_->devices->add(&monitor); }
void Exporter::unwatch(const MetricsMonitor& monitor) { impl_->devices->remove(&monitor); }
StepMetrics& Exporter::steps() { return *impl_->steps; }

void Exporter::detect_stragglers(Communicator& comm, StreamView stream, StragglerOptions options) {
  constexpr const char* call = "Exporter::detect_stragglers";
  GPUCLOUD_EXPECTS(options.every >= 1, call, "options.every: must be at least 1");
  GPUCLOUD_EXPECTS(std::isfinite(options.threshold) && options.threshold >= 0, call,
                   "options.threshold: must be a finite fraction >= 0");
  GPUCLOUD_EXPECTS(stream.device() == comm.device(), call,
                   "stream: on " + stream.device().str() + ", the communicator's buffers on " + comm.device().str());
  auto& m = *impl_->step_impl;
  std::lock_guard<std::mutex> lock(m.mutex);
  if (m.stragglers && m.stragglers->done) m.stragglers->done->synchronize();
  Straggler s(comm, stream, options);
  const auto n = static_cast<std::size_t>(comm.size());
  s.send = Buffer(1, DType::float64, comm.device(), MemoryKind::device);
  s.recv = Buffer(n, DType::float64, comm.device(), MemoryKind::device);
  s.host_send = Buffer(1, DType::float64, Device::host(), MemoryKind::pinned);
  s.host_recv = Buffer(n, DType::float64, Device::host(), MemoryKind::pinned);
  m.stragglers.emplace(std::move(s));
}

StragglerReport Exporter::straggler_report() const {
  auto& m = *impl_->step_impl;
  std::lock_guard<std::mutex> lock(m.mutex);
  return m.stragglers ? m.stragglers->report : StragglerReport{};
}

std::string Exporter::exposition() const { return pm::TextSerializer().Serialize(impl_->collect()); }

void Exporter::write_textfile() const {
  const std::string& path = impl_->options.textfile;
  GPUCLOUD_EXPECTS(!path.empty(), "Exporter::write_textfile", "options.textfile: not set");
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f << exposition();
    f.flush();
    if (!f) {
      const int err = errno;
      std::remove(tmp.c_str());
      throw Error("Exporter::write_textfile", tmp + ": " + std::strerror(err), __FILE__, __LINE__);
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    throw Error("Exporter::write_textfile", path + ": " + std::strerror(err), __FILE__, __LINE__);
  }
}

}  // namespace gpucloud::telemetry
