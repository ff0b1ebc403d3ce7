// topology() and binding_advice(): the host's part (monitor/host/topology_host), the GPUs'
// placement (CUDA's PCI bus ids, sysfs locality) and NVML's link matrix (monitor/cuda).
#include <gpucloud/monitor/topology.hpp>
#include <gpucloud/runtime/error.hpp>

#include "monitor/cuda/monitor_backend.hpp"
#include "monitor/host/topology_host.hpp"

#include <algorithm>
#include <set>
#include <sstream>

namespace gpucloud {

Topology topology() {
  Topology t;
  detail::host_topology(t);
  std::vector<std::string> bus_ids;
  for (int i = 0; i < cuda_device_count(); ++i) {
    GpuPlacement g;
    g.index = i;
    g.pci_bus_id = detail::cuda::pci_bus_id(i);
    detail::pci_locality(g.pci_bus_id, g.numa_node, g.cpus);
    bus_ids.push_back(g.pci_bus_id);
    t.gpus.push_back(std::move(g));
  }
  if (!bus_ids.empty()) t.gpu_links = detail::cuda::gpu_links(bus_ids);
  return t;
}

std::vector<MigInstance> mig_instances() { return detail::cuda::mig_instances(); }

namespace {

std::string describe(const std::vector<int>& cpus) {  // "0-3,8"
  std::ostringstream out;
  for (std::size_t i = 0; i < cpus.size();) {
    std::size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (i > 0) out << ',';
    out << cpus[i];
    if (j > i) out << '-' << cpus[j];
    i = j + 1;
  }
  return out.str();
}

// Share @p index of @p shares of @p cpus: contiguous, as even as they divide; when there are more
// shares than CPUs, CPU index % size.
std::vector<int> share(const std::vector<int>& cpus, int index, int shares) {
  const auto n = static_cast<int>(cpus.size());
  if (shares > n) return {cpus[static_cast<std::size_t>(index % n)]};
  const int begin = index * n / shares, end = (index + 1) * n / shares;
  return std::vector<int>(cpus.begin() + begin, cpus.begin() + end);
}

std::vector<int> allowed_of(const Topology& t, const std::vector<int>& cpus) {
  std::vector<int> out;
  const std::set<int> allowed(t.allowed_cpus.begin(), t.allowed_cpus.end());
  for (int c : cpus) {
    if (allowed.count(c) != 0) out.push_back(c);
  }
  return out;
}

}  // namespace

BindingAdvice binding_advice(const Topology& t, int local_rank, int local_size, int gpu) {
  constexpr const char* call = "binding_advice";
  GPUCLOUD_EXPECTS(local_size >= 1, call, "local_size: " + std::to_string(local_size) + " is not positive");
  GPUCLOUD_EXPECTS(local_rank >= 0 && local_rank < local_size, call,
                   "local_rank: " + std::to_string(local_rank) + " is not in [0, " + std::to_string(local_size) + ")");
  GPUCLOUD_EXPECTS(!t.allowed_cpus.empty(), call, "topo: no allowed CPUs");
  BindingAdvice a;
  const auto gpus = static_cast<int>(t.gpus.size());
  GPUCLOUD_EXPECTS(gpu >= -1 && gpu < gpus, call,
                   "gpu: " + std::to_string(gpu) + " is not -1 (the host) or one of the " + std::to_string(gpus) +
                       " GPUs in the topology");
  if (gpu >= 0) {
    const GpuPlacement& g = t.gpus[static_cast<std::size_t>(gpu)];
    std::vector<int> near = allowed_of(t, g.cpus);
    if (g.numa_node >= 0 && !near.empty()) {
      // The local ranks whose GPU (local rank r serves GPU r % gpus) is on the same NUMA node.
      std::vector<int> sharing;
      for (int r = 0; r < local_size; ++r) {
        if (t.gpus[static_cast<std::size_t>(r % gpus)].numa_node == g.numa_node) sharing.push_back(r);
      }
      const int position = static_cast<int>(std::find(sharing.begin(), sharing.end(), local_rank) - sharing.begin());
      a.cpus = share(near, position < static_cast<int>(sharing.size()) ? position : 0,
                     std::max<int>(1, static_cast<int>(sharing.size())));
      a.numa_node = g.numa_node;
      a.reason = "cuda:" + std::to_string(gpu) + " is on NUMA node " + std::to_string(g.numa_node) + "; " +
                 std::to_string(sharing.size()) + " local rank(s) share its " + std::to_string(near.size()) +
                 " allowed CPUs (" + describe(near) + ")";
      return a;
    }
  }
  // The host (or a GPU whose locality the platform does not say): the ranks spread over the NUMA
  // nodes that have allowed CPUs, each node's allowed CPUs shared by the ranks on it.
  std::vector<std::pair<int, std::vector<int>>> nodes;
  for (const NumaNode& n : t.numa_nodes) {
    std::vector<int> cpus = allowed_of(t, n.cpus);
    if (!cpus.empty()) nodes.emplace_back(n.index, std::move(cpus));
  }
  if (nodes.empty()) nodes.emplace_back(-1, t.allowed_cpus);
  const auto count = static_cast<int>(nodes.size());
  if (local_size >= count) {
    const int node = local_rank * count / local_size;
    const int first = (node * local_size + count - 1) / count;  // the first rank on that node
    const int on_node = ((node + 1) * local_size + count - 1) / count - first;
    const auto& [index, cpus] = nodes[static_cast<std::size_t>(node)];
    a.cpus = share(cpus, local_rank - first, on_node);
    a.numa_node = index;
    a.reason = std::to_string(local_size) + " local rank(s) over " + std::to_string(count) +
               " NUMA node(s) with allowed CPUs; " + std::to_string(on_node) + " share node " + std::to_string(index) +
               "'s " + std::to_string(cpus.size()) + " (" + describe(cpus) + ")";
  } else {  // fewer ranks than nodes: a rank takes whole nodes
    for (int node = local_rank * count / local_size; node < (local_rank + 1) * count / local_size; ++node) {
      const auto& cpus = nodes[static_cast<std::size_t>(node)].second;
      a.cpus.insert(a.cpus.end(), cpus.begin(), cpus.end());
    }
    a.numa_node = -1;
    a.reason =
        std::to_string(local_size) + " local rank(s) over " + std::to_string(count) + " NUMA nodes: whole nodes each";
  }
  return a;
}

}  // namespace gpucloud
