// Internal: which node each rank of a communicator is on, from keys every rank contributed (not
// API). The NCCL backend all-gathers host keys at setup; the MPI backend splits by shared memory
// and numbers nodes the same way (by first rank, in rank order).
#pragma once

#include <cstdint>
#include <vector>

namespace gpucloud::detail {

/// Where one rank sits among the nodes of its communicator.
struct NodeLayout {
  int local_rank = 0;   ///< rank among the ranks of its node, in rank order
  int local_size = 1;   ///< ranks on its node
  int node = 0;         ///< its node: nodes are numbered by their first rank, in rank order
  int nodes = 1;        ///< nodes of the communicator
  bool uniform = true;  ///< every node has local_size ranks
};

/// The layout of @p rank when rank r is on the node whose key is keys[r] (equal keys: one node),
/// whatever order the ranks are in (blocks, round-robin, uneven nodes).
NodeLayout node_layout(const std::vector<std::uint64_t>& keys, int rank);

/// Simulated nodes (GPUCLOUD_LOCAL_SIZE): blocks of @p local_size consecutive ranks.
NodeLayout block_layout(int rank, int size, int local_size);

/// This process's host key: a 64-bit FNV-1a hash of its host name (as NCCL keys hosts).
std::uint64_t host_key();

}  // namespace gpucloud::detail
