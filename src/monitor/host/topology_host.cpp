#include "monitor/host/topology_host.hpp"

#include <gpucloud/runtime/error.hpp>

#if GPUCLOUD_WITH_HWLOC
#include <hwloc.h>
#endif
#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <utility>

namespace gpucloud::detail {
namespace {

std::string read_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

std::vector<int> affinity() {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof(mask), &mask) != 0) return cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &mask)) cpus.push_back(c);
  }
  return cpus;
}

#if GPUCLOUD_WITH_HWLOC
std::vector<int> cpus_of(hwloc_const_bitmap_t set) {
  std::vector<int> out;
  for (int c = hwloc_bitmap_first(set); c != -1; c = hwloc_bitmap_next(set, c)) out.push_back(c);
  return out;
}

void hwloc_topology(Topology& t) {
  hwloc_topology_t topo = nullptr;
  if (hwloc_topology_init(&topo) != 0)
    throw DeviceError("topology", "hwloc_topology_init failed", false, __FILE__, __LINE__);
  struct Destroy {
    hwloc_topology_t t;
    ~Destroy() { hwloc_topology_destroy(t); }
  } destroy{topo};
  // The whole machine, not just what this process may use (that is allowed_cpus).
  hwloc_topology_set_flags(topo, HWLOC_TOPOLOGY_FLAG_INCLUDE_DISALLOWED);
  if (hwloc_topology_load(topo) != 0)
    throw DeviceError("topology", "hwloc_topology_load failed", false, __FILE__, __LINE__);
  t.packages = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PACKAGE);
  t.cores = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE);
  t.hardware_threads = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PU);
  const int nodes = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE);
  for (int i = 0; i < nodes; ++i) {
    hwloc_obj_t node = hwloc_get_obj_by_type(topo, HWLOC_OBJ_NUMANODE, static_cast<unsigned>(i));
    NumaNode n;
    n.index = static_cast<int>(node->os_index);
    n.cpus = cpus_of(node->cpuset);
    n.memory_bytes = static_cast<std::size_t>(node->attr->numanode.local_memory);
    t.numa_nodes.push_back(std::move(n));
  }
  t.source = std::string("hwloc ") + HWLOC_VERSION;
}
#endif

}  // namespace

void sysfs_topology(Topology& t) {
  namespace fs = std::filesystem;
  std::set<std::pair<int, int>> cores;  // (package, core id)
  std::set<int> packages;
  const std::vector<int> online = parse_cpu_list(read_line("/sys/devices/system/cpu/online"));
  for (int c : online) {
    const std::string base = "/sys/devices/system/cpu/cpu" + std::to_string(c) + "/topology/";
    const int package = std::atoi(read_line(base + "physical_package_id").c_str());
    packages.insert(package);
    cores.emplace(package, std::atoi(read_line(base + "core_id").c_str()));
  }
  t.packages = static_cast<int>(packages.size());
  t.cores = static_cast<int>(cores.size());
  t.hardware_threads = static_cast<int>(online.size());
  for (int node : parse_cpu_list(read_line("/sys/devices/system/node/online"))) {
    const std::string base = "/sys/devices/system/node/node" + std::to_string(node) + "/";
    NumaNode n;
    n.index = node;
    n.cpus = parse_cpu_list(read_line(base + "cpulist"));
    std::ifstream meminfo(base + "meminfo");
    std::string word;
    while (meminfo >> word) {
      if (word == "MemTotal:") {
        std::size_t kib = 0;
        meminfo >> kib;
        n.memory_bytes = kib * 1024;
        break;
      }
    }
    t.numa_nodes.push_back(std::move(n));
  }
  if (t.numa_nodes.empty()) {  // a kernel without NUMA: one node of everything
    NumaNode n;
    n.cpus = online;
    t.numa_nodes.push_back(std::move(n));
  }
  t.source = "sysfs";
}

std::vector<int> parse_cpu_list(const std::string& text) {
  std::vector<int> out;
  std::stringstream in(text);
  std::string part;
  while (std::getline(in, part, ',')) {
    if (part.empty()) continue;
    const auto dash = part.find('-');
    try {
      const int first = std::stoi(part.substr(0, dash));
      const int last = dash == std::string::npos ? first : std::stoi(part.substr(dash + 1));
      for (int c = first; c <= last; ++c) out.push_back(c);
    } catch (...) {
      return {};
    }
  }
  return out;
}

void host_topology(Topology& t) {
#if GPUCLOUD_WITH_HWLOC
  hwloc_topology(t);
#else
  sysfs_topology(t);
#endif
  t.allowed_cpus = affinity();
}

void pci_locality(const std::string& bus_id, int& numa_node, std::vector<int>& cpus) {
  const std::string base = "/sys/bus/pci/devices/" + bus_id + "/";
  const std::string node = read_line(base + "numa_node");
  numa_node = node.empty() ? -1 : std::atoi(node.c_str());
  cpus = parse_cpu_list(read_line(base + "local_cpulist"));
}

}  // namespace gpucloud::detail
