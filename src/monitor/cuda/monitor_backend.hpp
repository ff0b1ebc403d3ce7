// Internal: the monitor's CUDA backend, NVML loaded at run time (src/monitor/cuda/nvml_metrics.cpp),
// or its stand-in without CUDA (monitor_disabled.cpp). Not API.
#pragma once

#include <gpucloud/monitor/monitor.hpp>
#include <gpucloud/monitor/topology.hpp>

#include <string>
#include <vector>

namespace gpucloud::detail::cuda {

/// NVML's figures for CUDA device @p device, or the runtime's memory figures alone when NVML is
/// unavailable.
void read_metrics(int device, DeviceMetrics& m);
/// Why NVML is unusable, or empty.
std::string nvml_unavailable_reason();

/// Every MIG instance on the machine's GPUs (NVML), empty without NVML.
std::vector<MigInstance> mig_instances();

/// CUDA device @p device's PCI bus id ("0000:17:00.0", lower case as sysfs names it).
std::string pci_bus_id(int device);

/// The `nvidia-smi topo -m` matrix of the devices @p bus_ids (NVML: NVLinks, else the PCIe path's
/// common ancestor); empty without NVML.
std::vector<std::vector<std::string>> gpu_links(const std::vector<std::string>& bus_ids);

}  // namespace gpucloud::detail::cuda
