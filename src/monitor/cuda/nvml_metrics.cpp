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

#include <cctype>
#include <map>
#include <mutex>
#include <string>
#include <utility>

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
// nvmlMemory_v2_t: "used" excludes the memory the driver reserves (what nvidia-smi shows); v1
// counts it as used.
struct nvmlMemoryV2 {
  unsigned int version;
  unsigned long long total, reserved, free, used;  // NOLINT(google-runtime-int): NVML's types
};
constexpr unsigned int kMemoryV2Version = static_cast<unsigned int>(sizeof(nvmlMemoryV2)) | (2u << 24);
using nvmlEventSet = struct nvmlEventSet_st*;
// nvmlDeviceAttributes_t: a MIG instance's share of its GPU.
struct nvmlDeviceAttributes {
  unsigned int multiprocessors, copy_engines, decoders, encoders, jpegs, ofas, gpu_slices, compute_slices;
  unsigned long long memory_mib;  // NOLINT(google-runtime-int): NVML's type
};
// nvmlEventData_t: the device, the event type and its data (an XID's number).
struct nvmlEventData {
  nvmlDevice device;
  unsigned long long type, data;  // NOLINT(google-runtime-int): NVML's types
  unsigned int gpu_instance, compute_instance;
};
constexpr unsigned long long kEventXid = 0x8;  // nvmlEventTypeXidCriticalError  NOLINT(google-runtime-int)
// nvmlPciInfo_t (v3): the bus id string first, then numbers this code does not read.
struct nvmlPciInfo {
  char bus_id_legacy[16];
  unsigned int domain, bus, device, pci_device_id, pci_subsystem_id;
  char bus_id[32];
};
constexpr nvmlReturn kSuccess = 0;
constexpr nvmlReturn kInsufficientSize = 7;  // NVML_ERROR_INSUFFICIENT_SIZE
constexpr unsigned int kMaxNvLinks = 18;     // NVML_NVLINK_MAX_LINKS
constexpr int kTemperatureGpu = 0;           // NVML_TEMPERATURE_GPU
constexpr int kClockSm = 1;                  // NVML_CLOCK_SM

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
  // Optional (older drivers lack them): found or null.
  nvmlReturn (*memory_v2)(nvmlDevice, nvmlMemoryV2*) = nullptr;
  nvmlReturn (*energy)(nvmlDevice, unsigned long long*) = nullptr;  // NOLINT(google-runtime-int): mJ
  nvmlReturn (*mig_mode)(nvmlDevice, unsigned int*, unsigned int*) = nullptr;
  nvmlReturn (*by_uuid)(const char*, nvmlDevice*) = nullptr;
  // Health (optional each).
  nvmlReturn (*ecc_total)(nvmlDevice, int, int, unsigned long long*) = nullptr;  // NOLINT(google-runtime-int)
  nvmlReturn (*retired_pages)(nvmlDevice, int, unsigned int*, unsigned long long*) = nullptr;  // NOLINT
  nvmlReturn (*remapped_rows)(nvmlDevice, unsigned int*, unsigned int*, unsigned int*, unsigned int*) = nullptr;
  nvmlReturn (*pcie_replay)(nvmlDevice, unsigned int*) = nullptr;
  nvmlReturn (*throttle)(nvmlDevice, unsigned long long*) = nullptr;  // NOLINT(google-runtime-int)
  nvmlReturn (*event_set_create)(nvmlEventSet*) = nullptr;
  nvmlReturn (*register_events)(nvmlDevice, unsigned long long, nvmlEventSet) = nullptr;  // NOLINT
  nvmlReturn (*event_wait)(nvmlEventSet, nvmlEventData*, unsigned int) = nullptr;
  std::mutex xid_mutex;
  std::map<std::string, std::pair<nvmlEventSet, double>> xid;  // by bus id: its event set, the last XID
  // MIG (optional each).
  nvmlReturn (*count)(unsigned int*) = nullptr;
  nvmlReturn (*by_index)(unsigned int, nvmlDevice*) = nullptr;
  nvmlReturn (*uuid)(nvmlDevice, char*, unsigned int) = nullptr;
  nvmlReturn (*max_mig)(nvmlDevice, unsigned int*) = nullptr;
  nvmlReturn (*mig_by_index)(nvmlDevice, unsigned int, nvmlDevice*) = nullptr;
  nvmlReturn (*gpu_instance_id)(nvmlDevice, unsigned int*) = nullptr;
  nvmlReturn (*compute_instance_id)(nvmlDevice, unsigned int*) = nullptr;
  nvmlReturn (*attributes)(nvmlDevice, nvmlDeviceAttributes*) = nullptr;
  nvmlReturn (*common_ancestor)(nvmlDevice, nvmlDevice, int*) = nullptr;  // nvmlGpuTopologyLevel_t
  nvmlReturn (*nvlink_state)(nvmlDevice, unsigned int, int*) = nullptr;   // nvmlEnableState_t
  nvmlReturn (*nvlink_remote_pci)(nvmlDevice, unsigned int, nvmlPciInfo*) = nullptr;

  template <class F>
  bool resolve(F& f, const char* name) {
    f = reinterpret_cast<F>(dlsym(library, name));
    if (f == nullptr) unavailable = std::string("libnvidia-ml.so.1 lacks ") + name;
    return f != nullptr;
  }

  // An entry point older drivers may lack: found or left null.
  template <class F>
  void optional(F& f, const char* name) {
    f = reinterpret_cast<F>(dlsym(library, name));
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
    optional(memory_v2, "nvmlDeviceGetMemoryInfo_v2");
    optional(energy, "nvmlDeviceGetTotalEnergyConsumption");
    optional(mig_mode, "nvmlDeviceGetMigMode");
    optional(by_uuid, "nvmlDeviceGetHandleByUUID");
    optional(common_ancestor, "nvmlDeviceGetTopologyCommonAncestor");
    optional(ecc_total, "nvmlDeviceGetTotalEccErrors");
    optional(retired_pages, "nvmlDeviceGetRetiredPages");
    optional(remapped_rows, "nvmlDeviceGetRemappedRows");
    optional(pcie_replay, "nvmlDeviceGetPcieReplayCounter");
    optional(throttle, "nvmlDeviceGetCurrentClocksThrottleReasons");
    optional(event_set_create, "nvmlEventSetCreate");
    optional(register_events, "nvmlDeviceRegisterEvents");
    optional(event_wait, "nvmlEventSetWait_v2");
    optional(count, "nvmlDeviceGetCount_v2");
    optional(by_index, "nvmlDeviceGetHandleByIndex_v2");
    optional(uuid, "nvmlDeviceGetUUID");
    optional(max_mig, "nvmlDeviceGetMaxMigDeviceCount");
    optional(mig_by_index, "nvmlDeviceGetMigDeviceHandleByIndex");
    optional(gpu_instance_id, "nvmlDeviceGetGpuInstanceId");
    optional(compute_instance_id, "nvmlDeviceGetComputeInstanceId");
    optional(attributes, "nvmlDeviceGetAttributes_v2");
    optional(nvlink_state, "nvmlDeviceGetNvLinkState");
    optional(nvlink_remote_pci, "nvmlDeviceGetNvLinkRemotePciInfo_v2");
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

std::vector<MigInstance> mig_instances() {
  Nvml& n = nvml();
  std::vector<MigInstance> out;
  if (!n.unavailable.empty() || n.count == nullptr || n.by_index == nullptr || n.uuid == nullptr ||
      n.mig_mode == nullptr || n.max_mig == nullptr || n.mig_by_index == nullptr) {
    return out;
  }
  unsigned int gpus = 0;
  if (n.count(&gpus) != kSuccess) return out;
  auto uuid_of = [&](nvmlDevice d) {
    char text[96] = {};
    return n.uuid(d, text, sizeof text) == kSuccess ? std::string(text) : std::string();
  };
  for (unsigned int g = 0; g < gpus; ++g) {
    nvmlDevice gpu = nullptr;
    unsigned int current = 0, pending = 0, slots = 0;
    if (n.by_index(g, &gpu) != kSuccess || n.mig_mode(gpu, &current, &pending) != kSuccess || current != 1) continue;
    if (n.max_mig(gpu, &slots) != kSuccess) continue;
    for (unsigned int i = 0; i < slots; ++i) {
      nvmlDevice mig = nullptr;
      if (n.mig_by_index(gpu, i, &mig) != kSuccess) continue;  // an empty slot
      MigInstance m;
      m.gpu = static_cast<int>(g);
      m.gpu_uuid = uuid_of(gpu);
      m.uuid = uuid_of(mig);
      unsigned int id = 0;
      if (n.gpu_instance_id != nullptr && n.gpu_instance_id(mig, &id) == kSuccess)
        m.gpu_instance_id = static_cast<int>(id);
      if (n.compute_instance_id != nullptr && n.compute_instance_id(mig, &id) == kSuccess) {
        m.compute_instance_id = static_cast<int>(id);
      }
      nvmlDeviceAttributes a{};
      if (n.attributes != nullptr && n.attributes(mig, &a) == kSuccess) {
        m.multiprocessors = static_cast<int>(a.multiprocessors);
        m.memory_bytes = static_cast<std::size_t>(a.memory_mib) << 20;
      }
      out.push_back(std::move(m));
    }
  }
  return out;
}

namespace {
std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}
}  // namespace

std::string pci_bus_id(int device) {
  char id[32] = {};
  GPUCLOUD_CUDA_CHECK(cudaDeviceGetPCIBusId(id, sizeof id, device));
  return lower(id);
}

std::vector<std::vector<std::string>> gpu_links(const std::vector<std::string>& bus_ids) {
  Nvml& n = nvml();
  if (!n.unavailable.empty() || n.common_ancestor == nullptr) return {};
  std::vector<nvmlDevice> handles(bus_ids.size());
  for (std::size_t i = 0; i < bus_ids.size(); ++i) {
    if (n.by_pci_bus_id(bus_ids[i].c_str(), &handles[i]) != kSuccess) return {};
  }
  // NVLinks between each pair: a link of i whose remote end is j's PCI address.
  auto same_bus = [](const std::string& a, const std::string& b) {  // "00000000:17:00.0" vs "0000:17:00.0"
    auto tail = [](std::string s) { return lower(s.size() > 12 ? s.substr(s.size() - 12) : s); };
    return tail(a) == tail(b);
  };
  std::vector<std::vector<std::string>> out(bus_ids.size(), std::vector<std::string>(bus_ids.size()));
  for (std::size_t i = 0; i < bus_ids.size(); ++i) {
    std::vector<int> links(bus_ids.size(), 0);
    for (unsigned int l = 0; n.nvlink_state != nullptr && n.nvlink_remote_pci != nullptr && l < kMaxNvLinks; ++l) {
      int active = 0;
      nvmlPciInfo remote{};
      if (n.nvlink_state(handles[i], l, &active) != kSuccess || active == 0) continue;
      if (n.nvlink_remote_pci(handles[i], l, &remote) != kSuccess) continue;
      for (std::size_t j = 0; j < bus_ids.size(); ++j) {
        if (j != i && same_bus(remote.bus_id, bus_ids[j])) ++links[j];
      }
    }
    for (std::size_t j = 0; j < bus_ids.size(); ++j) {
      if (i == j) {
        out[i][j] = "X";
      } else if (links[j] > 0) {
        out[i][j] = "NV" + std::to_string(links[j]);
      } else {
        int level = 0;  // NVML_TOPOLOGY_INTERNAL 0, SINGLE 10, MULTIPLE 20, HOSTBRIDGE 30, NODE 40, SYSTEM 50
        const bool known = n.common_ancestor(handles[i], handles[j], &level) == kSuccess;
        out[i][j] = !known        ? "?"
                    : level <= 10 ? "PIX"
                    : level <= 20 ? "PXB"
                    : level <= 30 ? "PHB"
                    : level <= 40 ? "NODE"
                                  : "SYS";
      }
    }
  }
  return out;
}

namespace {

// The health counters DCGM watches; each one the GPU does not report stays empty.
void read_health(Nvml& n, nvmlDevice handle, const std::string& bus_id, DeviceMetrics::Health& h) {
  unsigned long long count = 0;  // NOLINT(google-runtime-int): NVML's type
  if (n.ecc_total != nullptr) {  // error type 0 corrected / 1 uncorrected; counter 0 volatile / 1 aggregate
    if (n.ecc_total(handle, 0, 0, &count) == kSuccess) h.ecc_sbe_volatile = static_cast<double>(count);
    if (n.ecc_total(handle, 1, 0, &count) == kSuccess) h.ecc_dbe_volatile = static_cast<double>(count);
    if (n.ecc_total(handle, 0, 1, &count) == kSuccess) h.ecc_sbe_aggregate = static_cast<double>(count);
    if (n.ecc_total(handle, 1, 1, &count) == kSuccess) h.ecc_dbe_aggregate = static_cast<double>(count);
  }
  if (n.retired_pages != nullptr) {  // cause 0: multiple single-bit errors, 1: a double-bit error
    for (int cause = 0; cause < 2; ++cause) {
      unsigned int pages = 0;
      const nvmlReturn r = n.retired_pages(handle, cause, &pages, nullptr);
      if (r == kSuccess || r == kInsufficientSize) (cause == 0 ? h.retired_pages_sbe : h.retired_pages_dbe) = pages;
    }
  }
  unsigned int corrected = 0, uncorrected = 0, pending = 0, failed = 0;
  if (n.remapped_rows != nullptr && n.remapped_rows(handle, &corrected, &uncorrected, &pending, &failed) == kSuccess) {
    h.remapped_rows_correctable = corrected;
    h.remapped_rows_uncorrectable = uncorrected;
    h.row_remap_failure = failed;
  }
  unsigned int replays = 0;
  if (n.pcie_replay != nullptr && n.pcie_replay(handle, &replays) == kSuccess) h.pcie_replay_counter = replays;
  unsigned long long reasons = 0;  // NOLINT(google-runtime-int): NVML's type
  if (n.throttle != nullptr && n.throttle(handle, &reasons) == kSuccess)
    h.throttle_reasons = static_cast<double>(reasons);
  // XIDs arrive as events: a set per GPU, registered at its first reading and drained (never
  // waiting) at each one after; the last XID seen stays (DCGM's XID_ERRORS is the last one too).
  if (n.event_set_create == nullptr || n.register_events == nullptr || n.event_wait == nullptr) return;
  std::lock_guard<std::mutex> lock(n.xid_mutex);
  auto it = n.xid.find(bus_id);
  if (it == n.xid.end()) {
    nvmlEventSet set = nullptr;
    if (n.event_set_create(&set) != kSuccess) return;
    if (n.register_events(handle, kEventXid, set) != kSuccess) return;  // not supported (a vGPU): empty
    it = n.xid.emplace(bus_id, std::make_pair(set, 0.0)).first;
  }
  nvmlEventData event{};
  while (n.event_wait(it->second.first, &event, 0) == kSuccess) {
    if (event.type == kEventXid) it->second.second = static_cast<double>(event.data);
  }
  h.xid = it->second.second;
}

}  // namespace

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
  // On a MIG instance CUDA's device is the instance and NVML's handle by bus id its parent GPU: the
  // memory figures come from the instance's own handle (its UUID, "MIG-" and CUDA's uuid), and
  // utilisation, which NVML does not report per instance, is left out. Temperature, power and
  // clock stay the parent GPU's (the instance has none of its own).
  nvmlDevice memory_handle = handle;
  bool mig = false;
  unsigned int current = 0, pending = 0;
  if (n.mig_mode != nullptr && n.mig_mode(handle, &current, &pending) == kSuccess && current == 1) {
    mig = true;
    const std::string uuid = "MIG-" + properties(device).uuid.substr(4);  // "GPU-..." as CUDA names it
    nvmlDevice instance = nullptr;
    if (n.by_uuid != nullptr && n.by_uuid(uuid.c_str(), &instance) == kSuccess) memory_handle = instance;
    m.source = "nvml (MIG instance)";
  }
  // A figure the GPU does not report (NVML_ERROR_NOT_SUPPORTED, common on virtual GPUs) stays empty.
  if (nvmlUtilization u{}; !mig && n.utilization(handle, &u) == kSuccess) {
    m.utilization = u.gpu;
    m.memory_utilization = u.memory;
  }
  nvmlMemoryV2 v2{};
  v2.version = kMemoryV2Version;
  nvmlMemory v1{};
  if (n.memory_v2 != nullptr && n.memory_v2(memory_handle, &v2) == kSuccess) {
    m.memory_total = v2.total;
    m.memory_used = v2.used;
  } else if (n.memory(memory_handle, &v1) == kSuccess) {
    m.memory_total = v1.total;
    m.memory_used = v1.used;
  } else {
    const MemoryInfo runtime = memory_info(device);
    m.memory_total = runtime.total;
    m.memory_used = runtime.total - runtime.free;
  }
  unsigned long long millijoules = 0;  // NOLINT(google-runtime-int): NVML's type
  if (n.energy != nullptr && n.energy(handle, &millijoules) == kSuccess)
    m.energy_j = static_cast<double>(millijoules) / 1000.0;
  unsigned int v = 0;
  if (n.temperature(handle, kTemperatureGpu, &v) == kSuccess) m.temperature_c = v;
  if (n.power(handle, &v) == kSuccess) m.power_w = v / 1000.0;  // milliwatts
  if (n.power_limit(handle, &v) == kSuccess) m.power_limit_w = v / 1000.0;
  if (n.clock(handle, kClockSm, &v) == kSuccess) m.clock_mhz = v;
  read_health(n, handle, bus_id, m.health);
}

}  // namespace gpucloud::detail::cuda
