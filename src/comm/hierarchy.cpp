#include "comm/hierarchy.hpp"

#include <gpucloud/runtime/error.hpp>

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace gpucloud::detail {

HierarchyRequest hierarchy_from_environment(const char* call) {
  HierarchyRequest r;
  const char* text = std::getenv("GPUCLOUD_HIERARCHY");
  if (text == nullptr || *text == '\0' || std::strcmp(text, "auto") == 0) return r;
  if (std::strcmp(text, "node") == 0) {
    r.kind = HierarchyRequest::Kind::node;
  } else if (std::strcmp(text, "numa") == 0) {
    r.kind = HierarchyRequest::Kind::numa;
  } else if (std::strcmp(text, "nvlink") == 0) {
    r.kind = HierarchyRequest::Kind::nvlink;
  } else {
    char* end = nullptr;
    const long v = std::strtol(text, &end, 10);
    GPUCLOUD_EXPECTS(end != text && *end == '\0' && v >= 1 && v <= 1 << 20, call,
                     std::string("GPUCLOUD_HIERARCHY: '") + text +
                         "' is not auto, node, numa, nvlink or a positive number of ranks per group");
    r.kind = HierarchyRequest::Kind::blocks;
    r.block = static_cast<int>(v);
  }
  return r;
}

int nvlink_island(const std::vector<std::vector<std::string>>& links, int gpu) {
  const auto n = static_cast<int>(links.size());
  if (gpu < 0 || gpu >= n) return -1;
  auto joined = [&](int a, int b) {
    const auto& row = links[static_cast<std::size_t>(a)];
    return b < static_cast<int>(row.size()) && row[static_cast<std::size_t>(b)].rfind("NV", 0) == 0;
  };
  std::vector<bool> seen(static_cast<std::size_t>(n), false);
  std::vector<int> todo{gpu};
  seen[static_cast<std::size_t>(gpu)] = true;
  int lowest = gpu, members = 0;
  while (!todo.empty()) {
    const int a = todo.back();
    todo.pop_back();
    ++members;
    lowest = std::min(lowest, a);
    for (int b = 0; b < n; ++b) {
      if (!seen[static_cast<std::size_t>(b)] && b != a && (joined(a, b) || joined(b, a))) {
        seen[static_cast<std::size_t>(b)] = true;
        todo.push_back(b);
      }
    }
  }
  return members > 1 ? lowest : -1;
}

int numa_node_of(const Topology& topo, const std::vector<int>& cpus) {
  if (cpus.empty()) return -1;
  for (const NumaNode& node : topo.numa_nodes) {
    const bool holds = std::all_of(cpus.begin(), cpus.end(), [&](int cpu) {
      return std::find(node.cpus.begin(), node.cpus.end(), cpu) != node.cpus.end();
    });
    if (holds) return node.index;
  }
  return -1;
}

namespace {
long long text_key(const std::string& text) {  // FNV-1a, kept positive
  std::uint64_t h = 14695981039346656037ull;
  for (const char c : text) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return static_cast<long long>(h >> 2);
}
}  // namespace

long long subgroup_key(const HierarchyRequest& request, int gpu, int local_rank, const Topology& topo) {
  using Kind = HierarchyRequest::Kind;
  const bool has_gpu = gpu >= 0 && gpu < static_cast<int>(topo.gpus.size());
  switch (request.kind) {
    case Kind::node:
      return -1;
    case Kind::blocks:
      return local_rank / request.block;
    case Kind::numa: {
      if (has_gpu && topo.gpus[static_cast<std::size_t>(gpu)].numa_node >= 0) {
        return topo.gpus[static_cast<std::size_t>(gpu)].numa_node;
      }
      return numa_node_of(topo, topo.allowed_cpus);
    }
    case Kind::automatic:
    case Kind::nvlink: {
      if (!has_gpu) return -1;
      const int island = nvlink_island(topo.gpu_links, gpu);
      // Named by a PCI address, which every process sees alike (device indices depend on
      // CUDA_VISIBLE_DEVICES).
      return island < 0 ? -1 : text_key(topo.gpus[static_cast<std::size_t>(island)].pci_bus_id);
    }
  }
  return -1;
}

long long local_subgroup_key(const HierarchyRequest& request, int gpu, int local_rank) {
  using Kind = HierarchyRequest::Kind;
  if (request.kind == Kind::node) return -1;
  try {
    return subgroup_key(request, gpu, local_rank, request.kind == Kind::blocks ? Topology{} : topology());
  } catch (const Error&) {  // the OS's or NVML's description unreadable: the node is the group
    return -1;
  }
}

std::optional<NodeLayout> group_layout_of_pairs(const std::vector<std::int64_t>& pairs, int rank) {
  std::vector<int> node_of;
  std::vector<long long> keys;
  for (std::size_t r = 0; r + 1 < pairs.size(); r += 2) {
    node_of.push_back(static_cast<int>(pairs[r]));
    keys.push_back(pairs[r + 1]);
  }
  return group_layout(node_of, keys, rank);
}

std::optional<NodeLayout> group_layout(const std::vector<int>& node_of, const std::vector<long long>& keys, int rank) {
  if (keys.empty() || std::any_of(keys.begin(), keys.end(), [](long long k) { return k < 0; })) return std::nullopt;
  std::vector<std::uint64_t> combined(keys.size());
  for (std::size_t r = 0; r < keys.size(); ++r) {
    // node and key together: the same island key on two nodes is two groups
    combined[r] = (static_cast<std::uint64_t>(keys[r]) * 1099511628211ull) ^
                  (static_cast<std::uint64_t>(node_of[r]) * 0x9e3779b97f4a7c15ull);
  }
  const NodeLayout groups = node_layout(combined, rank);
  int nodes = 0;
  for (const int n : node_of) nodes = std::max(nodes, n + 1);
  if (!groups.uniform || groups.local_size < 2 || groups.nodes <= nodes) return std::nullopt;
  return groups;
}

void check_blocks(const HierarchyRequest& request, int local_size, bool uniform, const char* call) {
  if (request.kind != HierarchyRequest::Kind::blocks || !uniform) return;
  GPUCLOUD_EXPECTS(local_size % request.block == 0, call,
                   "GPUCLOUD_HIERARCHY: groups of " + std::to_string(request.block) + " ranks do not divide the " +
                       std::to_string(local_size) + " ranks of each node");
}

std::string hierarchy_level(const HierarchyRequest& request, bool grouped) {
  using Kind = HierarchyRequest::Kind;
  if (!grouped) return "node";
  switch (request.kind) {
    case Kind::numa:
      return "numa";
    case Kind::blocks:
      return "blocks of " + std::to_string(request.block);
    default:
      return "nvlink";
  }
}

}  // namespace gpucloud::detail
