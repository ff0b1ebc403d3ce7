// Internal: the host device's metrics from /proc and /sys, and the parsers behind them (tested
// on fixed text) (not API).
#pragma once

#include <gpucloud/monitor/monitor.hpp>

#include <cstdint>
#include <optional>
#include <string>

namespace gpucloud::detail {

/// Jiffies the CPUs spent busy and in all, from the aggregate "cpu" line of /proc/stat.
struct CpuTimes {
  std::uint64_t busy = 0;   ///< user + nice + system + irq + softirq + steal
  std::uint64_t total = 0;  ///< busy + idle + iowait
};

/// The aggregate "cpu" line of /proc/stat's @p text; empty when it is missing or malformed.
std::optional<CpuTimes> parse_proc_stat(const std::string& text);

/// The mean "cpu MHz" of /proc/cpuinfo's @p text; empty when no core reports one.
std::optional<double> parse_cpuinfo_mhz(const std::string& text);

/// Percent busy between two readings; empty when no time passed.
std::optional<double> busy_percent(const CpuTimes& before, const CpuTimes& after);

/// Fills the host's figures into @p m: utilisation and RAPL power since the previous call (the
/// first call measures over 100 ms), memory from memory_info, thermal zones, core clocks.
void read_host_metrics(DeviceMetrics& m);

}  // namespace gpucloud::detail
