#pragma once
/// @file
/// @brief Device monitoring: utilisation, memory, temperature, power and clock of a device, read
/// once or sampled in the background over a run (nvidia-smi's figures; NVML on a GPU, /proc and
/// /sys on the host).

#include <gpucloud/export.hpp>
#include <gpucloud/runtime/device.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace gpucloud {

/// @brief One reading of a device's health and load. A figure the platform cannot report is empty.
struct DeviceMetrics {
  Device device = Device::host();            ///< the device read
  std::string source;                        ///< where the figures came from: "nvml", "cuda" or "procfs"
  std::optional<double> utilization;         ///< % of the last sample period the device was busy
  std::optional<double> memory_utilization;  ///< GPU: % of the last sample period memory was read or written
  std::uint64_t memory_used = 0;             ///< bytes in use on the device (host: total minus available)
  std::uint64_t memory_total = 0;            ///< bytes in all
  std::optional<double> temperature_c;       ///< degrees Celsius (host: the hottest thermal zone)
  std::optional<double> power_w;             ///< watts drawn (host: the CPU packages' RAPL counters)
  std::optional<double> power_limit_w;       ///< the enforced power limit, watts
  std::optional<double> clock_mhz;           ///< SM clock (host: mean CPU core clock), MHz
  std::optional<double> energy_j;            ///< GPU: joules used since the driver loaded (NVML's counter)
  /// @brief A GPU's health counters (NVML; empty where the GPU or platform does not report them,
  ///        and on the host): what precedes most GPU failures, exported under DCGM's names.
  struct Health {
    std::optional<double> xid;                          ///< the last XID error seen since monitoring began (0: none)
    std::optional<double> ecc_sbe_volatile;             ///< corrected (single-bit) ECC errors since the driver loaded
    std::optional<double> ecc_dbe_volatile;             ///< uncorrected (double-bit) ECC errors since the driver loaded
    std::optional<double> ecc_sbe_aggregate;            ///< corrected ECC errors over the GPU's life
    std::optional<double> ecc_dbe_aggregate;            ///< uncorrected ECC errors over the GPU's life
    std::optional<double> retired_pages_sbe;            ///< pages retired for corrected errors (pre-Ampere)
    std::optional<double> retired_pages_dbe;            ///< pages retired for uncorrected errors (pre-Ampere)
    std::optional<double> remapped_rows_correctable;    ///< rows remapped for corrected errors (Ampere+)
    std::optional<double> remapped_rows_uncorrectable;  ///< rows remapped for uncorrected errors (Ampere+)
    std::optional<double> row_remap_failure;            ///< 1 when a row remapping failed (the GPU needs service)
    std::optional<double> pcie_replay_counter;          ///< PCIe replays (link errors the bus retried)
    std::optional<double> throttle_reasons;             ///< NVML's clock throttle reason bits (0x8 HW slowdown, 0x20
                                             ///< SW thermal, 0x40 HW thermal, 0x80 HW power brake, 0x4 SW power cap)
  } health;                                    ///< the GPU's health counters
  std::chrono::steady_clock::time_point when;  ///< when the reading was taken
};

/// @brief Reads @p device now. Host utilisation and power are measured since the previous host
/// reading in this process (the first one waits 100 ms to have a period). Never fails for a missing
/// sensor; @throws InvalidArgument for a CUDA device that does not exist.
GPUCLOUD_API DeviceMetrics read_metrics(Device device);

/// @brief Why GPU readings lack NVML's figures (libnvidia-ml.so.1 not loadable, or its init
/// failed), or empty when NVML works. GPU memory then still comes from the CUDA runtime.
GPUCLOUD_API std::string nvml_unavailable_reason();

/// @brief Minimum, mean and maximum of one figure over a monitored run (count 0: never reported).
struct MetricStats {
  std::size_t count = 0;  ///< readings that reported the figure
  double min = 0;         ///< smallest reading
  double mean = 0;        ///< mean of the readings
  double max = 0;         ///< largest reading
};

/// @brief What a MetricsMonitor saw since it started (or since reset()).
struct MetricsSummary {
  Device device = Device::host();  ///< the device monitored
  std::size_t samples = 0;         ///< readings taken
  double seconds = 0;              ///< from the first reading to the last
  MetricStats utilization;         ///< % busy
  MetricStats memory_utilization;  ///< GPU memory traffic, %
  MetricStats memory_used;         ///< bytes
  MetricStats temperature_c;       ///< degrees Celsius
  MetricStats power_w;             ///< watts
  std::optional<double> energy_j;  ///< joules: the device's energy counter's increase, or power integrated
};

/// @brief Samples a device every interval on a background thread (nvidia-smi dmon, DCGM) and keeps
/// the latest reading and the run's statistics. Movable, not copyable; stops when destroyed.
class GPUCLOUD_API MetricsMonitor {
 public:
  /// Starts sampling @p device every @p interval (at least 10 ms), taking the first reading now.
  explicit MetricsMonitor(Device device, std::chrono::milliseconds interval = std::chrono::milliseconds(500));
  ~MetricsMonitor();
  MetricsMonitor(MetricsMonitor&&) noexcept;             ///< Moves ownership.
  MetricsMonitor& operator=(MetricsMonitor&&) noexcept;  ///< Moves ownership.
  MetricsMonitor(const MetricsMonitor&) = delete;
  MetricsMonitor& operator=(const MetricsMonitor&) = delete;

  /// The most recent reading.
  DeviceMetrics latest() const;
  /// The statistics since the start or the last reset(), including a reading taken now.
  MetricsSummary summary() const;
  /// Forgets the statistics (the latest reading stays) and starts a new period from now.
  void reset();
  /// Stops the background thread; the latest reading and the statistics stay readable.
  void stop();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace gpucloud
