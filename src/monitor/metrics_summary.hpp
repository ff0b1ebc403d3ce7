// Internal: how a MetricsMonitor folds one reading into its statistics (not API).
#pragma once

#include <gpucloud/monitor/monitor.hpp>

#include <chrono>
#include <optional>

namespace gpucloud::detail {

/// Adds @p m to @p s: each reported figure's min/mean/max, and the energy: the increase of the
/// device's energy counter since @p previous where it has one, else the trapezoid from @p previous's
/// power to @p m's; @p first is the period's first reading's time.
void accumulate(MetricsSummary& s, const std::optional<DeviceMetrics>& previous, const DeviceMetrics& m,
                std::chrono::steady_clock::time_point first);

}  // namespace gpucloud::detail
