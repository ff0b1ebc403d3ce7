// The monitor's CUDA backend stand-in for builds without CUDA: a clear error from every entry point
// (which the public layer never reaches, since no CUDA Device exists).
#include "monitor/cuda/monitor_backend.hpp"
#include "runtime/cuda/unavailable.hpp"

namespace gpucloud::detail::cuda {
void read_metrics(int, DeviceMetrics&) { unavailable("read_metrics"); }
std::string nvml_unavailable_reason() { return kBuiltWithoutCuda; }
std::string pci_bus_id(int) { unavailable("pci_bus_id"); }
std::vector<MigInstance> mig_instances() { return {}; }
std::vector<std::vector<std::string>> gpu_links(const std::vector<std::string>&) { return {}; }

}  // namespace gpucloud::detail::cuda
