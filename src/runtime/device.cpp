#include <gpucloud/runtime/device.hpp>
#include <gpucloud/runtime/error.hpp>

#include "runtime/cuda/runtime_backend.hpp"
#include "runtime/host/cgroup.hpp"

#include <sys/sysinfo.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <thread>

namespace gpucloud {

namespace {

struct CudaDiscovery {
  int count = 0;
  std::string reason;
};

// Discovered once: the driver's answer does not change within a process.
const CudaDiscovery& discovery() noexcept {
  static const CudaDiscovery d = [] {
    CudaDiscovery out;
    out.count = detail::cuda::device_count(out.reason);
    return out;
  }();
  return d;
}

std::string host_cpu_name() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos && colon + 2 <= line.size()) return line.substr(colon + 2);
    }
  }
  return "host CPU";
}

}  // namespace

Device Device::cuda(int index) {
  if (!detail::cuda::built()) {
    GPUCLOUD_FAIL(Unsupported, "Device::cuda",
                  "gpucloud was built without CUDA (GPUCLOUD_CUDA=OFF or no toolkit found)");
  }
  const auto& d = discovery();
  if (d.count == 0) {
    throw DeviceError("Device::cuda",
                      "cuda:" + std::to_string(index) + " requested but no CUDA device is usable: " + d.reason, false,
                      __FILE__, __LINE__);
  }
  GPUCLOUD_EXPECTS(index >= 0 && index < d.count, "Device::cuda",
                   "index: cuda:" + std::to_string(index) + " is out of range, " + std::to_string(d.count) +
                       " CUDA device(s) visible");
  return Device(DeviceKind::cuda, index);
}

Device Device::parse(const std::string& text) {
  if (text == "host" || text == "cpu") return host();
  if (text == "cuda") return cuda(0);
  if (text.rfind("cuda:", 0) == 0 && text.size() > 5) {
    std::size_t used = 0;
    int index = -1;
    try {
      index = std::stoi(text.substr(5), &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == text.size() - 5) return cuda(index);
  }
  // A GPU's or MIG instance's UUID, as nvidia-smi -L and CUDA_VISIBLE_DEVICES write them: the visible
  // device whose UUID it is (CUDA reports a MIG instance's own UUID for the instance).
  if ((text.rfind("GPU-", 0) == 0 || text.rfind("MIG-", 0) == 0) && text.size() > 4) {
    for (int i = 0; i < cuda_device_count(); ++i) {
      const std::string uuid = detail::cuda::properties(i).uuid;  // "GPU-<hex>"
      if (uuid.size() > 4 && uuid.compare(4, std::string::npos, text, 4, std::string::npos) == 0) return cuda(i);
    }
    GPUCLOUD_FAIL(InvalidArgument, "Device::parse",
                  "text: '" + text + "' is not the UUID of any of the " + std::to_string(cuda_device_count()) +
                      " visible CUDA device(s)" +
                      (cuda_device_count() == 0 ? " (" + cuda_unavailable_reason() + ")" : "") +
                      "; nvidia-smi -L lists them, CUDA_VISIBLE_DEVICES selects them");
  }
  GPUCLOUD_FAIL(InvalidArgument, "Device::parse",
                "text: '" + text + "' is not 'host', 'cpu', 'cuda', 'cuda:N' or a GPU-/MIG- UUID");
}

std::string Device::str() const { return is_host() ? "host" : "cuda:" + std::to_string(index_); }

int cuda_device_count() noexcept { return discovery().count; }

std::string cuda_unavailable_reason() { return discovery().count > 0 ? std::string() : discovery().reason; }

std::vector<Device> available_devices() {
  std::vector<Device> out{Device::host()};
  for (int i = 0; i < cuda_device_count(); ++i) out.push_back(Device::cuda(i));
  return out;
}

DeviceProperties device_properties(Device device) {
  if (device.is_cuda()) return detail::cuda::properties(device.index());
  DeviceProperties p;
  p.name = host_cpu_name();
  p.total_memory = memory_info(device).total;
  p.multiprocessor_count = static_cast<int>(std::thread::hardware_concurrency());
  p.concurrent_managed_access = true;  // host "managed" memory is ordinary host memory
  p.backend = "host";
  return p;
}

MemoryInfo memory_info(Device device) {
  if (device.is_cuda()) return detail::cuda::memory_info(device.index());
  MemoryInfo info;
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long available = sysconf(_SC_AVPHYS_PAGES);
  const long page = sysconf(_SC_PAGESIZE);
  info.total = static_cast<std::size_t>(pages) * static_cast<std::size_t>(page);
  info.free = static_cast<std::size_t>(available) * static_cast<std::size_t>(page);
  // MemAvailable counts reclaimable cache too, which is what an allocation can really get.
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  std::size_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit) {
    if (key == "MemAvailable:") {
      info.free = kib * 1024;
      break;
    }
  }
  // A cgroup's memory limit is the process's memory: a container's, a Slurm job's, a quota's.
  const detail::CgroupMemory cgroup = detail::cgroup_memory();
  if (cgroup.limit && *cgroup.limit < info.total) {
    info.total = *cgroup.limit;
    const std::size_t used = cgroup.usage.value_or(0);
    info.free = std::min(info.free, info.total > used ? info.total - used : 0);
  }
  return info;
}

}  // namespace gpucloud
