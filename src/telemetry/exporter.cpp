// The Prometheus exporter: prometheus-cpp's registry and pull exposer, device metrics collected at
// scrape time under DCGM's names, training metrics, straggler detection (docs/telemetry.md).
#include <gpucloud/compute/cast.hpp>
#include <gpucloud/memory/quota.hpp>
#include <gpucloud/movement/copy.hpp>
#include <gpucloud/runtime/error.hpp>
#include <gpucloud/runtime/event.hpp>
#include <gpucloud/telemetry/telemetry.hpp>

#include "telemetry/straggler_channel.hpp"
#include "telemetry/tls_front.hpp"

#include <prometheus/check_names.h>
#include <prometheus/collectable.h>
#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <arpa/inet.h>
#include <crypt.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <utility>

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

// Label names the exporter puts on series itself (histogram buckets, summaries, device metrics):
// a user label of the same name would make a series carry it twice, which Prometheus rejects
// along with the whole scrape.
constexpr const char* kReservedLabels[] = {"le", "quantile", "gpu", "device", "modelName", "UUID"};

void check_labels(const Labels& labels, const char* call) {
  for (const auto& [name, value] : labels) {
    GPUCLOUD_EXPECTS(pm::CheckLabelName(name) && name.compare(0, 2, "__") != 0, call,
                     "labels: '" + name + "' is not a Prometheus label name ([a-zA-Z_][a-zA-Z0-9_]*, no leading __)");
    for (const char* reserved : kReservedLabels) {
      GPUCLOUD_EXPECTS(name != reserved, call,
                       "labels: '" + name +
                           "' is reserved (the exporter sets it on its own series: le, quantile, "
                           "gpu, device, modelName, UUID)");
    }
    GPUCLOUD_EXPECTS(valid_utf8(value), call, "labels['" + name + "']: the value is not valid UTF-8");
  }
}

// An IPv4 or IPv6 address, as inet_pton reads it; the form civetweb's listening_ports takes.
std::string listening_address(const std::string& address) {
  unsigned char buf[sizeof(in6_addr)];
  if (::inet_pton(AF_INET, address.c_str(), buf) == 1) return address;
  if (::inet_pton(AF_INET6, address.c_str(), buf) == 1) return "[" + address + "]";
  GPUCLOUD_FAIL(InvalidArgument, kCall,
                "options.address: '" + address +
                    "' is not an IPv4 or IPv6 address (\"0.0.0.0\": every interface, \"127.0.0.1\": this machine)");
}

// civetweb's access_control_list for @p allow: deny all, then allow each block.
std::string access_control_list(const std::vector<std::string>& allow) {
  std::string acl = "-0.0.0.0/0";
  for (const auto& entry : allow) {
    const auto slash = entry.find('/');
    const std::string ip = entry.substr(0, slash);
    in_addr a{};
    bool ok = ::inet_pton(AF_INET, ip.c_str(), &a) == 1;
    if (ok && slash != std::string::npos) {
      const std::string bits = entry.substr(slash + 1);
      ok = !bits.empty() && bits.size() <= 2 && std::all_of(bits.begin(), bits.end(), ::isdigit) &&
           std::stoi(bits) <= 32;
    }
    GPUCLOUD_EXPECTS(ok, kCall, "options.allow: '" + entry + "' is not an IPv4 address or CIDR block (\"10.0.0.0/8\")");
    acl += ",+" + entry;
  }
  return acl;
}

bool is_bcrypt(const std::string& hash) {
  return hash.size() == 60 && hash[0] == '$' && hash[1] == '2' &&
         (hash[2] == 'a' || hash[2] == 'b' || hash[2] == 'y') && hash[3] == '$';
}

// libcrypt's crypt_r, looked up in libcrypt itself rather than called by name: a sanitizer
// runtime preloaded into a program that loads libcrypt only later (Python loading the extension)
// intercepts crypt_r with no real function behind it, and the call jumped to address 0.
using CryptR = char* (*)(const char*, const char*, crypt_data*);
CryptR real_crypt_r() {
  static const CryptR fn = [] {
    void* lib = ::dlopen("libcrypt.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (lib == nullptr) lib = ::dlopen("libcrypt.so.1", RTLD_NOW);
    return lib == nullptr ? nullptr : reinterpret_cast<CryptR>(::dlsym(lib, "crypt_r"));
  }();
  return fn;
}

// The password @p password of @p user against its bcrypt hash (crypt_r: libxcrypt's bcrypt).
bool password_matches(const std::map<std::string, std::string>& users, const std::string& user,
                      const std::string& password) {
  const auto it = users.find(user);
  // An unknown user is checked against a fixed hash too: the answer takes as long either way.
  static const std::string kDummy = "$2y$10$abcdefghijklmnopqrstuu5Mb8ZQwZrtvYQFvbdmK1cR3iHbE/7Xm";
  const std::string& hash = it != users.end() ? it->second : kDummy;
  const CryptR crypt = real_crypt_r();
  if (crypt == nullptr) return false;
  auto data = std::make_unique<crypt_data>();
  const char* out = crypt(password.c_str(), hash.c_str(), data.get());
  if (out == nullptr || out[0] == '*') return false;
  const std::string computed(out);
  if (computed.size() != hash.size()) return false;
  unsigned char diff = 0;
  for (std::size_t i = 0; i < hash.size(); ++i) diff |= static_cast<unsigned char>(computed[i] ^ hash[i]);
  return diff == 0 && it != users.end();
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
        put("DCGM_FI_DEV_POWER_MGMT_LIMIT", "Power management limit (in W).", labels, d.power_limit_w);
        std::optional<double> millijoules;
        if (d.energy_j) millijoules = *d.energy_j * 1000.0;
        put("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "Total energy consumption since boot (in mJ).", labels,
            millijoules);
        const DeviceMetrics::Health& h = d.health;
        const std::pair<const char*, const char*> names[] = {
            {"DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered."},
            {"DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "Total number of single-bit volatile ECC errors."},
            {"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "Total number of double-bit volatile ECC errors."},
            {"DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "Total number of single-bit persistent ECC errors."},
            {"DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "Total number of double-bit persistent ECC errors."},
            {"DCGM_FI_DEV_RETIRED_SBE", "Total number of retired pages due to single-bit errors."},
            {"DCGM_FI_DEV_RETIRED_DBE", "Total number of retired pages due to double-bit errors."},
            {"DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "Number of remapped rows for correctable errors."},
            {"DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "Number of remapped rows for uncorrectable errors."},
            {"DCGM_FI_DEV_ROW_REMAP_FAILURE", "Whether remapping of rows has failed."},
            {"DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "Total number of PCIe retries."},
            {"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "Current clock throttle reasons (NVML's bit mask)."}};
        const std::optional<double> values[] = {h.xid,
                                                h.ecc_sbe_volatile,
                                                h.ecc_dbe_volatile,
                                                h.ecc_sbe_aggregate,
                                                h.ecc_dbe_aggregate,
                                                h.retired_pages_sbe,
                                                h.retired_pages_dbe,
                                                h.remapped_rows_correctable,
                                                h.remapped_rows_uncorrectable,
                                                h.row_remap_failure,
                                                h.pcie_replay_counter,
                                                h.throttle_reasons};
        for (std::size_t i = 0; i < std::size(names); ++i) put(names[i].first, names[i].second, labels, values[i]);
      } else {
        labels["device"] = "host";
        // Base units, as Prometheus' naming guide asks of a project's own metrics: a ratio, hertz.
        std::optional<double> ratio, hertz;
        if (d.utilization) ratio = *d.utilization / 100.0;
        if (d.clock_mhz) hertz = *d.clock_mhz * 1e6;
        put("gpucloud_host_utilization_ratio", "CPU utilization of the host (0 to 1).", labels, ratio);
        put("gpucloud_host_temperature_celsius", "Hottest thermal zone of the host (in C).", labels, d.temperature_c);
        put("gpucloud_host_memory_used_bytes", "Host memory in use (total minus available).", labels, used);
        put("gpucloud_host_memory_free_bytes", "Host memory available.", labels, free);
        put("gpucloud_host_power_watts", "CPU package power (RAPL).", labels, d.power_w);
        put("gpucloud_host_clock_hertz", "Mean CPU core clock.", labels, hertz);
      }
    }
    // The process's memory quotas (set_memory_quota, GPUCLOUD_MEMORY_QUOTA) and what it holds.
    for (const MemoryQuota& q : memory_quotas()) {
      Labels labels = base_;
      labels["device"] = q.device.str();
      if (q.limit_bytes) {
        put("gpucloud_memory_quota_bytes", "The process's memory quota on the device.", labels,
            static_cast<double>(*q.limit_bytes));
      }
      put("gpucloud_memory_held_bytes", "Bytes the library's resources hold from the device (pool caches included).",
          labels, static_cast<double>(q.held_bytes));
      put("gpucloud_memory_held_peak_bytes", "Highest gpucloud_memory_held_bytes seen.", labels,
          static_cast<double>(q.peak_bytes));
      auto& refusals = families["gpucloud_memory_quota_refusals_total"];
      refusals.name = "gpucloud_memory_quota_refusals_total";
      refusals.help = "Allocations the memory quota refused.";
      refusals.type = pm::MetricType::Counter;
      pm::ClientMetric counted;
      for (const auto& [k, v] : labels) counted.label.push_back({k, v});
      counted.counter.value = static_cast<double>(q.refused);
      refusals.metric.push_back(std::move(counted));
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

// A series added to its family at its first use: a metric never recorded is absent from the
// exposition instead of a 0 that reads as a measurement. Family::Add is idempotent and
// thread-safe; the pointer is cached for the hot path.
template <class T>
class Lazy {
 public:
  Lazy() = default;
  explicit Lazy(pm::Family<T>& family) : family_(&family) {}
  T& get() {
    T* m = metric_.load(std::memory_order_acquire);
    if (m == nullptr) {
      m = &family_->Add({});
      metric_.store(m, std::memory_order_release);
    }
    return *m;
  }
  void operator=(pm::Family<T>& family) { family_ = &family; }

 private:
  pm::Family<T>* family_ = nullptr;
  std::atomic<T*> metric_{nullptr};
};

}  // namespace

// ---- StepMetrics ------------------------------------------------------------------------------

struct Straggler {
  Straggler(StragglerOptions o, detail::StragglerChannel c) : options(o), channel(std::move(c)) {}
  StragglerOptions options;
  double step_sum = 0, compute_sum = 0;  // over the period so far
  int count = 0;
  std::int64_t steps = 0;  // recorded since detection started
  detail::StragglerChannel channel;
  StragglerReport report;
};

struct StepMetrics::Impl {
  std::shared_ptr<pm::Registry> registry;
  pm::Histogram* step_seconds = nullptr;
  pm::Counter *steps = nullptr, *samples = nullptr, *skipped = nullptr, *data_wait = nullptr, *comm = nullptr,
              *compute = nullptr;
  Lazy<pm::Gauge> samples_per_second, loss_scale, memory_in_use, memory_peak;
  Lazy<pm::Counter> memory_allocations;
  pm::Histogram* checkpoint_seconds = nullptr;
  Lazy<pm::Gauge> checkpoint_pending, checkpoint_committed_step, checkpoint_commit_time;
  Lazy<pm::Counter> checkpoint_waited, checkpoint_failures;
  pm::Family<pm::Gauge>*rank_step = nullptr, *rank_compute = nullptr;
  Lazy<pm::Gauge> straggler, straggler_rank, ranks_lost;
  std::mutex mutex;  // the straggler state (records themselves are lock-free or prometheus-cpp's)
  std::optional<Straggler> stragglers;
  std::mutex totals_mutex;  // the last totals the counters were advanced to
  double allocations_seen = 0, checkpoint_waited_seen = 0, checkpoint_failures_seen = 0;

  // Advances @p counter to @p total (a running total kept elsewhere); a total below the last one
  // (another source, or its reset) counts from 0 again.
  void advance(Lazy<pm::Counter>& counter, double& seen, double total) {
    std::lock_guard<std::mutex> lock(totals_mutex);
    const double delta = total >= seen ? total - seen : total;
    counter.get().Increment(delta);
    seen = total;
  }

  // Exports what rank 0's latest table says: every rank's means, the slowest rank's own work
  // against the median. A rank whose channel closed (it ended, or died) keeps its last period: at
  // the end of a job the ranks end in any order, and what they measured still stands.
  void apply(Straggler& s, const detail::SummaryTable& t) {
    StragglerReport r;
    std::vector<double> compared;
    for (std::size_t i = 0; i < t.ranks.size(); ++i) {
      r.step_seconds.push_back(t.ranks[i].step_seconds);
      r.compute_seconds.push_back(t.ranks[i].compute_seconds);
      r.steps.push_back(t.ranks[i].steps);
      if (t.lost[i]) r.lost.push_back(static_cast<int>(i));
      if (t.ranks[i].steps == 0) continue;  // lost before its first period: nothing to compare
      compared.push_back(t.ranks[i].compute_seconds);
      // The ranks' own work, not their wall steps: in a synchronous loop the collectives make every
      // rank's step as long as the slowest's, and only the waiting moves.
      if (r.slowest < 0 || t.ranks[i].compute_seconds > r.compute_seconds[static_cast<std::size_t>(r.slowest)]) {
        r.slowest = static_cast<int>(i);
      }
    }
    if (!compared.empty()) {
      std::sort(compared.begin(), compared.end());
      const std::size_t n = compared.size();
      r.median = n % 2 == 1 ? compared[n / 2] : 0.5 * (compared[n / 2 - 1] + compared[n / 2]);
      const double slowest = r.compute_seconds[static_cast<std::size_t>(r.slowest)];
      r.straggler = n > 1 && r.median > 0 && slowest > r.median * (1 + s.options.threshold) &&
                    slowest - r.median >= s.options.min_excess_seconds;
    }
    for (std::size_t i = 0; i < t.ranks.size(); ++i) {
      rank_step->Add({{"rank", std::to_string(i)}}).Set(r.step_seconds[i]);
      rank_compute->Add({{"rank", std::to_string(i)}}).Set(r.compute_seconds[i]);
    }
    straggler.get().Set(r.straggler ? 1 : 0);
    straggler_rank.get().Set(r.straggler ? r.slowest : -1);
    ranks_lost.get().Set(static_cast<double>(r.lost.size()));
    s.report = std::move(r);
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
  if (r.seconds > 0) m.samples_per_second.get().Set(static_cast<double>(r.samples) / r.seconds);
  if (r.data_wait_seconds > 0) m.data_wait->Increment(r.data_wait_seconds);
  if (r.comm_seconds > 0) m.comm->Increment(r.comm_seconds);
  const double compute = std::max(0.0, r.seconds - r.data_wait_seconds - r.comm_seconds);
  if (compute > 0) m.compute->Increment(compute);
  if (r.loss_scale > 0) m.loss_scale.get().Set(r.loss_scale);
  if (r.skipped > 0) m.skipped->Increment(static_cast<double>(r.skipped));
  if (m.stragglers) {
    std::lock_guard<std::mutex> lock(m.mutex);
    Straggler& s = *m.stragglers;
    s.step_sum += r.seconds;
    s.compute_sum += compute;
    ++s.steps;
    if (++s.count == s.options.every) {
      s.channel.publish({s.step_sum / s.count, s.compute_sum / s.count, s.steps});
      s.step_sum = s.compute_sum = 0;
      s.count = 0;
    }
    if (auto table = s.channel.poll()) m.apply(s, *table);  // never blocks
  }
}

void StepMetrics::record_checkpoint(double seconds) {
  GPUCLOUD_EXPECTS(std::isfinite(seconds) && seconds >= 0, "StepMetrics::record_checkpoint",
                   "seconds: " + std::to_string(seconds) + " is not a finite non-negative number");
  impl_->checkpoint_seconds->Observe(seconds);
}

void StepMetrics::record_memory(const MemoryStatistics& s) {
  impl_->memory_in_use.get().Set(static_cast<double>(s.current_bytes));
  impl_->memory_peak.get().Set(static_cast<double>(s.peak_bytes));
  impl_->advance(impl_->memory_allocations, impl_->allocations_seen, static_cast<double>(s.total_allocations));
}

void StepMetrics::record_checkpoint_progress(const checkpoint::Progress& p) {
  constexpr const char* call = "StepMetrics::record_checkpoint_progress";
  GPUCLOUD_EXPECTS(std::isfinite(p.waited_seconds) && p.waited_seconds >= 0, call,
                   "progress.waited_seconds: " + std::to_string(p.waited_seconds) + " is not finite and >= 0");
  GPUCLOUD_EXPECTS(std::isfinite(p.committed_unix_time) && p.committed_unix_time >= 0, call,
                   "progress.committed_unix_time: not finite and >= 0");
  Impl& m = *impl_;
  m.checkpoint_pending.get().Set(p.writing_step ? 1 : 0);
  if (p.committed_step) {
    m.checkpoint_committed_step.get().Set(static_cast<double>(*p.committed_step));
    m.checkpoint_commit_time.get().Set(p.committed_unix_time);
  }
  m.advance(m.checkpoint_waited, m.checkpoint_waited_seen, p.waited_seconds);
  m.advance(m.checkpoint_failures, m.checkpoint_failures_seen, static_cast<double>(p.saves_failed));
}

std::int64_t StepMetrics::steps() const { return static_cast<std::int64_t>(impl_->steps->Value()); }

// ---- Exporter ---------------------------------------------------------------------------------

struct Exporter::Impl {
  ExporterOptions options;
  std::shared_ptr<pm::Registry> registry = std::make_shared<pm::Registry>();
  std::shared_ptr<DeviceCollectable> devices;
  std::unique_ptr<pm::Exposer> exposer;
  std::unique_ptr<detail::TlsFront> tls;  // destroyed before the exposer it forwards to
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
  const std::string bind = listening_address(options.address);
  GPUCLOUD_EXPECTS(options.threads >= 1 && options.threads <= 1024, kCall,
                   "options.threads: " + std::to_string(options.threads) + " is not in [1, 1024]");
  GPUCLOUD_EXPECTS(options.request_timeout.count() > 0, kCall, "options.request_timeout: must be positive");
  GPUCLOUD_EXPECTS(options.tls_cert_file.empty() == options.tls_key_file.empty(), kCall,
                   "options.tls_cert_file and options.tls_key_file: set both (HTTPS) or neither (HTTP)");
  for (const auto& [user, hash] : options.basic_auth_users) {
    GPUCLOUD_EXPECTS(!user.empty() && user.find(':') == std::string::npos && valid_utf8(user), kCall,
                     "options.basic_auth_users: '" + user + "' is not a user name (non-empty, no ':')");
    GPUCLOUD_EXPECTS(is_bcrypt(hash), kCall,
                     "options.basic_auth_users['" + user +
                         "']: not a bcrypt hash ($2y$, $2b$ or $2a$, 60 characters; htpasswd -nbB makes one)");
  }
  const std::string acl = options.allow.empty() ? std::string() : access_control_list(options.allow);
  if (!options.basic_auth_users.empty() && real_crypt_r() == nullptr) {
    GPUCLOUD_FAIL(Unsupported, kCall, "options.basic_auth_users: libcrypt.so.1 (crypt_r, for bcrypt) cannot be loaded");
  }
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
  auto gauge = [&](const char* name, const char* help) -> pm::Family<pm::Gauge>& {
    return pm::BuildGauge().Name(name).Help(help).Labels(constant).Register(r);
  };
  auto lazy_counter = [&](const char* name, const char* help) -> pm::Family<pm::Counter>& {
    return pm::BuildCounter().Name(name).Help(help).Labels(constant).Register(r);
  };
  m->steps = counter("gpucloud_steps_total", "Training steps recorded.");
  m->samples = counter("gpucloud_samples_total", "Samples processed by this rank.");
  m->skipped = counter("gpucloud_skipped_steps_total", "Steps the optimizer skipped (an inf/NaN gradient).");
  m->data_wait = counter("gpucloud_data_wait_seconds_total", "Time spent waiting for input batches.");
  m->comm = counter("gpucloud_comm_seconds_total", "Time the collectives took (the communicator's own events).");
  m->compute = counter("gpucloud_compute_seconds_total",
                       "Time of the steps not spent waiting for input or in collectives: this rank's own work.");
  m->samples_per_second = gauge("gpucloud_samples_per_second", "Samples per second of the last step (this rank).");
  m->loss_scale = gauge("gpucloud_loss_scale", "The dynamic loss scale.");
  m->memory_in_use = gauge("gpucloud_memory_pool_bytes_in_use", "Bytes allocated from the memory pool.");
  m->memory_peak = gauge("gpucloud_memory_pool_peak_bytes", "Peak bytes allocated from the memory pool.");
  m->memory_allocations = lazy_counter("gpucloud_memory_pool_allocations_total", "Allocations from the memory pool.");
  m->checkpoint_pending =
      gauge("gpucloud_checkpoint_pending_saves", "Checkpoint saves being written in the background (0 or 1).");
  m->checkpoint_committed_step = gauge("gpucloud_checkpoint_committed_step", "The newest committed checkpoint's step.");
  m->checkpoint_commit_time =
      gauge("gpucloud_checkpoint_last_commit_timestamp_seconds", "When the newest checkpoint committed (Unix time).");
  m->checkpoint_waited = lazy_counter("gpucloud_checkpoint_wait_seconds_total",
                                      "Time save_async blocked for the previous save (the writer lagging).");
  m->checkpoint_failures = lazy_counter("gpucloud_checkpoint_failures_total", "Checkpoint saves that failed.");
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
  m->rank_compute = &pm::BuildGauge()
                         .Name("gpucloud_rank_compute_seconds")
                         .Help(
                             "Every rank's mean own work per step (not waiting for input or in collectives) over "
                             "the last straggler period, by rank.")
                         .Labels(without_rank)
                         .Register(r);
  m->straggler = gauge("gpucloud_straggler", "1 while the slowest rank's own work is beyond the straggler threshold.");
  m->straggler_rank = gauge("gpucloud_straggler_rank", "The straggling rank, or -1.");
  m->ranks_lost =
      gauge("gpucloud_straggler_ranks_lost",
            "Ranks whose straggler channel closed (they ended or died); their last period is still compared.");
  impl->step_impl = m;
  impl->steps = std::make_unique<StepMetrics>(m);
  if (options.port >= 0) {
    // With TLS the HTTP server listens on loopback only, behind a TLS front that enforces the
    // allow list (detail::TlsFront: civetweb's own TLS does not work with OpenSSL 3 as Debian
    // builds it); without, it serves the address itself.
    const bool tls = !options.tls_cert_file.empty();
    const std::string address = tls ? "127.0.0.1:0" : bind + ":" + std::to_string(options.port);
    std::vector<std::string> civet = {"listening_ports",    address,
                                      "num_threads",        std::to_string(options.threads),
                                      "request_timeout_ms", std::to_string(options.request_timeout.count())};
    if (tls) {
      civet.insert(civet.end(), {"access_control_list", "-0.0.0.0/0,+127.0.0.1"});
    } else if (!acl.empty()) {
      civet.insert(civet.end(), {"access_control_list", acl});
    }
    try {
      impl->exposer = std::make_unique<pm::Exposer>(civet);
    } catch (const std::exception& e) {
      GPUCLOUD_FAIL(InvalidArgument, kCall,
                    "options.port: cannot serve on " + address + " (" + e.what() + "; in use, or not allowed)");
    }
    if (!options.basic_auth_users.empty()) {
      impl->exposer->RegisterAuth(
          [users = options.basic_auth_users](const std::string& user, const std::string& password) {
            return password_matches(users, user, password);
          },
          "gpucloud");
    }
    impl->exposer->RegisterCollectable(impl->registry);
    impl->exposer->RegisterCollectable(impl->devices);
    const auto ports = impl->exposer->GetListeningPorts();
    impl->port = ports.empty() ? options.port : ports.front();
    if (tls) {
      detail::TlsFrontOptions t;
      t.address = options.address;
      t.port = options.port;
      t.cert_file = options.tls_cert_file;
      t.key_file = options.tls_key_file;
      t.allow = options.allow;
      t.threads = options.threads;
      t.idle_timeout = options.request_timeout;
      t.backend_port = impl->port;
      impl->tls = detail::TlsFront::start(t);
      impl->port = impl->tls->port();
    }
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
  GPUCLOUD_EXPECTS(std::isfinite(options.min_excess_seconds) && options.min_excess_seconds >= 0, call,
                   "options.min_excess_seconds: must be a finite number of seconds >= 0");
  GPUCLOUD_EXPECTS(stream.device() == comm.device(), call,
                   "stream: on " + stream.device().str() + ", the communicator's buffers on " + comm.device().str());
  const int rank = comm.rank(), size = comm.size();
  // Setup, the only use of the communicator: rank 0's address reaches the others in a broadcast,
  // they connect, and an all-reduce makes every rank agree that all did (or raise together).
  detail::Rendezvous where;
  std::optional<detail::StragglerChannel> channel;
  std::string failure;
  if (rank == 0) {
    try {
      channel.emplace(detail::StragglerChannel::host(size, where));
    } catch (const Error& e) {  // the others still take part in the broadcast: port 0 says why
      failure = e.reason();
      where.words.fill(0);
    }
  }
  const double wait = std::min(60.0, std::chrono::duration<double>(comm.timeout()).count());
  if (size > 1) {
    Buffer host(detail::Rendezvous::kWords, DType::int64, Device::host(), MemoryKind::pinned);
    Buffer shared(detail::Rendezvous::kWords, DType::int64, comm.device(), MemoryKind::device);
    std::copy(where.words.begin(), where.words.end(), host.data_as<std::int64_t>());
    copy(shared, host, stream);
    comm.broadcast(shared, 0, stream);
    copy(host, shared, stream);
    stream.synchronize();
    std::copy(host.data_as<std::int64_t>(), host.data_as<std::int64_t>() + where.words.size(), where.words.begin());
    if (rank > 0) {
      if (where.words[1] == 0) {
        failure = "rank 0 could not listen for the other ranks";
      } else {
        channel.emplace(detail::StragglerChannel::join(rank, size, where, wait));
      }
    } else if (channel) {
      channel->accept_peers(wait);
    }
    if (channel && !channel->joined()) failure = channel->error();
    // Every rank's verdict: the lowest failing rank, or size when none failed.
    host.data_as<std::int64_t>()[0] = failure.empty() ? size : rank;
    copy(shared, host, stream);
    comm.all_reduce(shared.view().slice(0, 1), shared.view().slice(0, 1), ReduceOp::min, stream);
    copy(host, shared, stream);
    stream.synchronize();
    const std::int64_t first_failed = host.data_as<std::int64_t>()[0];
    if (first_failed != size) {
      throw CommunicationError(
          call,
          "the straggler channel could not be set up: " +
              (failure.empty() ? "rank " + std::to_string(first_failed) + " failed (its error says why)" : failure),
          __FILE__, __LINE__);
    }
  } else if (!failure.empty()) {
    throw CommunicationError(call, failure, __FILE__, __LINE__);
  }
  auto& m = *impl_->step_impl;
  std::lock_guard<std::mutex> lock(m.mutex);
  if (!m.stragglers) {  // exported from now on: none yet
    m.straggler.get().Set(0);
    m.straggler_rank.get().Set(-1);
    m.ranks_lost.get().Set(0);
  }
  m.stragglers.reset();  // an earlier channel closes
  m.stragglers.emplace(options, std::move(*channel));
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
