// How a MetricsMonitor folds a reading into its statistics: running min/mean/max per figure, and
// the energy: the device's own energy counter's increase where it has one (NVML's), else power
// integrated by trapezoids.
#include "monitor/metrics_summary.hpp"

#include <algorithm>

namespace gpucloud {

namespace {

void add(MetricStats& s, double v) {
  s.min = s.count == 0 ? v : std::min(s.min, v);
  s.max = s.count == 0 ? v : std::max(s.max, v);
  s.mean += (v - s.mean) / static_cast<double>(s.count + 1);
  ++s.count;
}

void add(MetricStats& s, const std::optional<double>& v) {
  if (v) add(s, *v);
}

}  // namespace

namespace detail {

void accumulate(MetricsSummary& s, const std::optional<DeviceMetrics>& previous, const DeviceMetrics& m,
                std::chrono::steady_clock::time_point first) {
  ++s.samples;
  s.seconds = std::chrono::duration<double>(m.when - first).count();
  add(s.utilization, m.utilization);
  add(s.memory_utilization, m.memory_utilization);
  add(s.memory_used, static_cast<double>(m.memory_used));
  add(s.temperature_c, m.temperature_c);
  add(s.power_w, m.power_w);
  if (m.energy_j) {  // the counter's increase since the previous reading
    if (!s.energy_j) s.energy_j = 0.0;
    if (previous && previous->energy_j && *m.energy_j >= *previous->energy_j) {
      *s.energy_j += *m.energy_j - *previous->energy_j;
    }
  } else if (m.power_w) {
    if (!s.energy_j) s.energy_j = 0.0;
    if (previous && previous->power_w) {
      const double dt = std::chrono::duration<double>(m.when - previous->when).count();
      *s.energy_j += 0.5 * (*previous->power_w + *m.power_w) * dt;
    }
  }
}

}  // namespace detail

}  // namespace gpucloud
