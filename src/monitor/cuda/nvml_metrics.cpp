// A GPU's metrics through NVML, loaded at run time (dlopen "libnvidia-ml.so.1", as PyTorch and
// pynvml do): NVML belongs to the driver, so linking it would stop the library from loading on
// machines without one. The toolkit here ships no nvml.h; the few entry points used are declared
// below from NVML's stable C ABI. Devices are matched by PCI bus id, so CUDA_VISIBLE_DEVICES
// reordering cannot mix them up. Without NVML, memory still comes from the CUDA runtime.
#include <gpucloud/runtime/error.hpp>

#include "monitor/cuda/monitor_backend.hpp"
#include "runtime/cuda/cuda_check.hpp"
#include "runtime/cuda/runtime_backend.hpp"

#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <mutex>
#include <string>

namespace gpucloud::detail::cuda {

namespace {

// NVML's ABI (nvml.h): return codes are an int enum, devices an opaque pointer.
using nvmlReturn = int;
using nvmlDevice = struct nvmlDevice_st*;
struct nvmlUtilization {
  unsigned int gpu;     // % of the sample period a kernel ran
  unsigned int memory;  // % of the sample period device memory was read or written
};
struct nvmlMemory {
  unsigned long long total, free, used;  // NOLINT(google-runtime-int): NVML's types
};
constexpr nvmlReturn kSuccess = 0;
constexpr int kTemperatureGpu = 0;  // NVML_TEMPERATURE_GPU
constexpr int kClockSm = 1;         // NVML_CLOCK_SM

struct Nvml {
  void* library = nullptr;
  std::string unavailable;  // empty: loaded and initialised
  nvmlReturn (*init)() = nullptr;
  const char* (*error_string)(nvmlReturn) = nullptr;
  nvmlReturn (*by_pci_bus_id)(const char*, nvmlDevice*) = nullptr;
  nvmlReturn (*utilization)(nvmlDevice, nvmlUtilization*) = nullptr;
  nvmlReturn (*memory)(nvmlDevice, nvmlMemory*) = nullptr;
  nvmlReturn (*temperature)(nvmlDevice, int, unsigned int*) = nullptr;
  nvmlReturn (*power)(nvmlDevice, unsigned int*) = nullptr;
  nvmlReturn (*power_limit)(nvmlDevice, unsigned int*) = nullptr;
  nvmlReturn (*clock)(nvmlDevice, int, unsigned int*) = nullptr;

  template <class F>
  bool resolve(F& f, const char* name) {
    f = reinterpret_cast<F>(dlsym(library, name));
    if (f == nullptr) unavailable = std::string("libnvidia-ml.so.1 lacks ") + name;
    return f != nullptr;
  }

  // Loaded once, never unloaded (other threads may still be reading).
  Nvml() {
    library = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (library == nullptr) {
      const char* why = dlerror();
      unavailable = std::string("cannot load libnvidia-ml.so.1 (it comes with the NVIDIA driver): ") +
                    (why != nullptr ? why : "unknown reason");
      return;
    }
    if (!(resolve(init, "nvmlInit_v2") && resolve(error_string, "nvmlErrorString") &&
          resolve(by_pci_bus_id, "nvmlDeviceGetHandleByPciBusId_v2") &&
          resolve(utilization, "nvmlDeviceGetUtilizationRates") && resolve(memory, "nvmlDeviceGetMemoryInfo") &&
          resolve(temperature, "nvmlDeviceGetTemperature") && resolve(power, "nvmlDeviceGetPowerUsage") &&
          resolve(power_limit, "nvmlDeviceGetEnforcedPowerLimit") && resolve(clock, "nvmlDeviceGetClockInfo"))) {
      return;
    }
    if (const nvmlReturn r = init(); r != kSuccess) {
      unavailable = std::string("nvmlInit failed: ") + error_string(r);
    }
  }
};

Nvml& nvml() {
  static Nvml n;
  return n;
}

}  // namespace

std::string nvml_unavailable_reason() { return nvml().unavailable; }

void read_metrics(int device, DeviceMetrics& m) {
  Nvml& n = nvml();
  if (!n.unavailable.empty()) {  // the runtime's memory figures only
    const MemoryInfo mem = memory_info(device);
    m.source = "cuda";
    m.memory_total = mem.total;
    m.memory_used = mem.total - mem.free;
    return;
  }
  char bus_id[32] = {};
  GPUCLOUD_CUDA_CHECK(cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, device));
  nvmlDevice handle = nullptr;
  if (const nvmlReturn r = n.by_pci_bus_id(bus_id, &handle); r != kSuccess) {
    throw DeviceError("read_metrics",
                      std::string("NVML does not know the GPU at PCI bus id ") + bus_id + ": " + n.error_string(r),
                      false, __FILE__, __LINE__);
  }
  m.source = "nvml";
  // A figure the GPU does not report (NVML_ERROR_NOT_SUPPORTED, common on virtual GPUs) stays empty.
  if (nvmlUtilization u{}; n.utilization(handle, &u) == kSuccess) {
    m.utilization = u.gpu;
    m.memory_utilization = u.memory;
  }
  if (nvmlMemory mem{}; n.memory(handle, &mem) == kSuccess) {
    m.memory_total = mem.total;
    m.memory_used = mem.used;
  } else {
    const MemoryInfo runtime = memory_info(device);
    m.memory_total = runtime.total;
    m.memory_used = runtime.total - runtime.free;
  }
  unsigned int v = 0;
  if (n.temperature(handle, kTemperatureGpu, &v) == kSuccess) m.temperature_c = v;
  if (n.power(handle, &v) == kSuccess) m.power_w = v / 1000.0;  // milliwatts
  if (n.power_limit(handle, &v) == kSuccess) m.power_limit_w = v / 1000.0;
  if (n.clock(handle, kClockSm, &v) == kSuccess) m.clock_mhz = v;
}

}  // namespace gpucloud::detail::cuda
