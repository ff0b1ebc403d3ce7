// Internal: the monitor's CUDA backend, NVML loaded at run time (src/monitor/cuda/nvml_metrics.cpp),
// or its stand-in without CUDA (monitor_disabled.cpp). Not API.
#pragma once

#include <gpucloud/monitor/monitor.hpp>

#include <string>

namespace gpucloud::detail::cuda {

/// NVML's figures for CUDA device @p device, or the runtime's memory figures alone when NVML is
/// unavailable.
void read_metrics(int device, DeviceMetrics& m);
/// Why NVML is unusable, or empty.
std::string nvml_unavailable_reason();

}  // namespace gpucloud::detail::cuda
