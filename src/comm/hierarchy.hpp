// Internal: the inner groups of the hierarchical all-reduce (not API). By default a group is a
// node; GPUCLOUD_HIERARCHY asks for the ranks joined by the fastest link inside a node instead:
// the GPUs of one NVLink island, the ranks of one NUMA node, or blocks of K local ranks.
#pragma once

#include "comm/node_layout.hpp"

#include <gpucloud/monitor/topology.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace gpucloud::detail {

/// What GPUCLOUD_HIERARCHY asks for.
struct HierarchyRequest {
  enum class Kind { automatic, node, numa, nvlink, blocks };
  Kind kind = Kind::automatic;  ///< automatic: NVLink islands on NCCL, nodes elsewhere
  int block = 0;                ///< ranks per group for Kind::blocks
};

/// Reads GPUCLOUD_HIERARCHY: auto (or unset), node, numa, nvlink, or a positive number of local
/// ranks per group. @throws InvalidArgument naming the variable for anything else.
HierarchyRequest hierarchy_from_environment(const char* call);

/// The NVLink island of GPU @p gpu in an `nvidia-smi topo -m` matrix (Topology::gpu_links): the
/// GPUs reachable from it over NVLink ("NV<n>"), as the lowest index among them; -1 when it has
/// no NVLink peer or the matrix does not cover it.
int nvlink_island(const std::vector<std::vector<std::string>>& links, int gpu);

/// The NUMA node that holds every CPU of @p cpus, or -1 when they span several (or none is known).
int numa_node_of(const Topology& topo, const std::vector<int>& cpus);

/// This rank's group key within its node for @p request: an NVLink island (@p gpu: the CUDA device,
/// -1 for a host communicator) named by its lowest GPU's PCI address, the NUMA node of the process's
/// allowed CPUs (or of the GPU), or local_rank / K; -1 when the node is the group (node, automatic
/// without NVLink islands, or nothing known).
long long subgroup_key(const HierarchyRequest& request, int gpu, int local_rank, const Topology& topo);

/// subgroup_key() for this process: the machine's topology read only where @p request needs it,
/// -1 (the node is the group) when it cannot be read.
long long local_subgroup_key(const HierarchyRequest& request, int gpu, int local_rank);

/// The inner groups when rank r sits on node node_of[r] with subgroup key keys[r]: the layout of
/// @p rank's group (local_rank = rank in its group, local_size = group size, node = group,
/// nodes = groups), or nullopt when the nodes themselves are the groups — some key is -1, groups
/// of different sizes, groups of one rank, or no node split into more than one group.
std::optional<NodeLayout> group_layout(const std::vector<int>& node_of, const std::vector<long long>& keys, int rank);
/// group_layout() from every rank's (node, key) pair, all-gathered in rank order.
std::optional<NodeLayout> group_layout_of_pairs(const std::vector<std::int64_t>& pairs, int rank);

/// @throws InvalidArgument naming GPUCLOUD_HIERARCHY when @p request asks for blocks of K ranks
/// and K does not divide the ranks of every node (nodes of @p local_size each, when @p uniform).
void check_blocks(const HierarchyRequest& request, int local_size, bool uniform, const char* call);

/// How the level reads in Communicator::hierarchy(): "node", "numa", "nvlink" or "blocks of K".
std::string hierarchy_level(const HierarchyRequest& request, bool grouped);

}  // namespace gpucloud::detail
