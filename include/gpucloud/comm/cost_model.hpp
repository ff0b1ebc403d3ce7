/// @file cost_model.hpp
/// @brief The alpha-beta cost model that chooses between flat and hierarchical all-reduce.
#pragma once

#include <gpucloud/export.hpp>

#include <cstddef>
#include <string>

namespace gpucloud {

/// @brief One kind of link: time = alpha + bytes * beta per message step.
struct LinkCost {
  double alpha = 0.0;  ///< latency per step, seconds
  double beta = 0.0;   ///< seconds per byte (1 / bandwidth)
};

/// @brief Ring all-reduce times over a job of nodes x local_size ranks (Hockney's model).
///
/// Flat ring over n ranks: 2(n-1) alpha + 2(n-1)/n S beta, on the slowest link the ring crosses
/// (inter-node as soon as there are two nodes). Flat halving and doubling (flat_halving, on more
/// than one node): 2 [log2(L) alpha_i + (L-1)/L S beta_i] + 2 [log2(N) alpha_e + (N-1)/N S/L beta_e].
/// Hierarchical: reduce-scatter inside the node
/// ((L-1)(alpha_i + S/L beta_i)), all-reduce of an S/L shard across N nodes
/// (2(N-1) alpha_e + 2(N-1)/N S/L beta_e), all-gather inside the node (as the reduce-scatter).
/// "Node" is the hierarchy's group (Communicator::hierarchy()): a node, or a node's NVLink island,
/// NUMA node or block of ranks where GPUCLOUD_HIERARCHY splits the nodes.
struct GPUCLOUD_API AllReduceCostModel {
  LinkCost intra;      ///< inside a group (shared memory, NVLink)
  LinkCost inter;      ///< between groups (network; PCIe or the socket link between a node's groups)
  int local_size = 1;  ///< ranks per group (a node by default)
  int nodes = 1;       ///< groups (nodes by default)
  /// The flat all-reduce halves and doubles, low rank bits first, instead of running a ring (the MPI
  /// backend on 4, 8 or 16 ranks over more than one node): only S/L crosses the network.
  bool flat_halving = false;

  /// @brief Predicted seconds of a flat all-reduce of @p bytes.
  double flat_seconds(std::size_t bytes) const noexcept;
  /// @brief Predicted seconds of a hierarchical all-reduce of @p bytes.
  double hierarchical_seconds(std::size_t bytes) const noexcept;
  /// @brief True when the hierarchical all-reduce is predicted to be faster.
  bool prefer_hierarchical(std::size_t bytes) const noexcept {
    return hierarchical_seconds(bytes) < flat_seconds(bytes);
  }
  /// @brief True when the two predictions for @p bytes are within kTie of each other: too close to
  ///        choose by, so all_reduce_auto() times both forms instead.
  bool ties(std::size_t bytes) const noexcept;
  /// @brief The relative difference of the predictions below which they tie (10 %).
  static constexpr double kTie = 0.10;

  /// @brief A one-line JSON object, to save a measurement and load it later.
  std::string to_json() const;
  /// @brief Parses to_json()'s output. @throws InvalidArgument for anything else.
  static AllReduceCostModel from_json(const std::string& json);
};

}  // namespace gpucloud
