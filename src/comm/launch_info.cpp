#include "comm/communicator_impl.hpp"

#include <gpucloud/comm/communicator.hpp>
#include <gpucloud/runtime/error.hpp>

#include <algorithm>
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <vector>

namespace gpucloud {

namespace {
constexpr const char* kCall = "launch_info_from_environment";

const char* get(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : nullptr;
}

int parse_int(const char* name, const char* v) {
  try {
    std::size_t used = 0;
    const int out = std::stoi(v, &used);
    if (used != std::string(v).size()) throw std::invalid_argument(v);
    return out;
  } catch (const std::exception&) {
    GPUCLOUD_FAIL(InvalidArgument, kCall, std::string(name) + ": '" + v + "' is not an integer");
  }
}

bool read_int(const char* name, int& out) {
  const char* v = get(name);
  if (v == nullptr) return false;
  out = parse_int(name, v);
  return true;
}

// The first of @p names that is set, or nullptr (so the step's variable wins over the job's).
const char* first_set(std::initializer_list<const char*> names, const char*& which) {
  for (const char* n : names)
    if (const char* v = get(n)) {
      which = n;
      return v;
    }
  return nullptr;
}

}  // namespace

std::vector<int> detail::parse_slurm_tasks_per_node(const std::string& text, const char* name) {
  // Slurm's compressed list: "4(x2)" is 4,4; "3,1"; "2(x3),1" is 2,2,2,1.
  const auto bad = [&](const std::string& why) {
    GPUCLOUD_FAIL(InvalidArgument, kCall, std::string(name) + ": '" + text + "' " + why);
  };
  std::vector<int> counts;
  std::size_t at = 0;
  while (at <= text.size()) {
    const std::size_t comma = std::min(text.find(',', at), text.size());
    const std::string item = text.substr(at, comma - at);
    std::size_t used = 0;
    long count = 0, repeat = 1;
    try {
      count = std::stol(item, &used);
      if (used < item.size()) {
        if (item.compare(used, 2, "(x") != 0 || item.back() != ')') throw std::invalid_argument(item);
        std::size_t r_used = 0;
        const std::string r = item.substr(used + 2, item.size() - used - 3);
        repeat = std::stol(r, &r_used);
        if (r_used != r.size()) throw std::invalid_argument(item);
      }
    } catch (const std::exception&) {
      bad("is not a list of task counts such as 4(x2) or 3,1 (at '" + item + "')");
    }
    if (count < 1 || repeat < 1 || repeat > 1'000'000 || count > 1'000'000)
      bad("has a count out of range ('" + item + "')");
    counts.insert(counts.end(), static_cast<std::size_t>(repeat), static_cast<int>(count));
    at = comma + 1;
  }
  return counts;
}

LaunchInfo launch_info_from_environment() {
  LaunchInfo info;
  info.launcher = "none";
  int rank = 0, size = 1, local_rank = 0, local_size = 0, node = -1, nodes = 0;
  if (read_int("OMPI_COMM_WORLD_RANK", rank)) {
    // mpirun (also inside a Slurm allocation, whose batch variables it inherits). OpenMPI
    // does not say which node, only how many ranks share this one.
    info.launcher = "mpirun";
    read_int("OMPI_COMM_WORLD_SIZE", size);
    read_int("OMPI_COMM_WORLD_LOCAL_RANK", local_rank);
    read_int("OMPI_COMM_WORLD_LOCAL_SIZE", local_size);
  } else if (get("SLURM_PROCID") != nullptr && get("SLURM_STEP_ID") == nullptr && get("SLURM_STEPID") == nullptr) {
    // Slurm's batch script (or an salloc shell): one process, not a task of a step. Its
    // SLURM_PROCID/SLURM_NTASKS describe the allocation; the tasks are what srun starts.
    info.launcher = "slurm-batch";
  } else if (read_int("SLURM_PROCID", rank)) {
    info.launcher = "srun";
    if (!read_int("SLURM_STEP_NUM_TASKS", size)) read_int("SLURM_NTASKS", size);
    read_int("SLURM_LOCALID", local_rank);
    read_int("SLURM_NODEID", node);  // the node's index within the step
    const char* name = nullptr;
    if (const char* per_node = first_set({"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"}, name)) {
      const std::vector<int> counts = detail::parse_slurm_tasks_per_node(per_node, name);
      long total = 0;
      for (int c : counts) total += c;
      nodes = static_cast<int>(counts.size());
      GPUCLOUD_EXPECTS(total == size, kCall,
                       std::string(name) + ": '" + per_node + "' counts " + std::to_string(total) +
                           " tasks but the step has " + std::to_string(size));
      GPUCLOUD_EXPECTS(node >= 0 && node < nodes, kCall,
                       "SLURM_NODEID: " + std::to_string(node) + " is not one of the step's " + std::to_string(nodes) +
                           " nodes (" + name + "='" + per_node + "')");
      local_size = counts[static_cast<std::size_t>(node)];
    } else {
      node = -1;  // an srun that did not say how tasks are spread: one node is assumed below
    }
  } else if (read_int("PMI_RANK", rank)) {
    // MPICH's Hydra (and Intel MPI): mpiexec.
    info.launcher = "mpirun";
    read_int("PMI_SIZE", size);
    read_int("MPI_LOCALRANKID", local_rank);
    read_int("MPI_LOCALNRANKS", local_size);
  } else if (read_int("RANK", rank)) {
    info.launcher = "torchrun";
    read_int("WORLD_SIZE", size);
    read_int("LOCAL_RANK", local_rank);
    read_int("LOCAL_WORLD_SIZE", local_size);
    if (read_int("GROUP_RANK", node) && !read_int("GROUP_WORLD_SIZE", nodes)) node = -1;
  }
  GPUCLOUD_EXPECTS(size >= 1 && rank >= 0 && rank < size, kCall,
                   "rank " + std::to_string(rank) + " is outside a job of " + std::to_string(size));
  if (const char* forced = get("GPUCLOUD_LOCAL_SIZE")) {
    local_size = detail::local_size_from_environment(forced, size, kCall);
    local_rank = rank % local_size;
    node = rank / local_size;
    nodes = size / local_size;
  }
  if (local_size <= 0 || local_size == size) {
    local_size = size;  // no node information, or all on one: one node
    local_rank = rank;
    node = 0;
    nodes = 1;
  }
  GPUCLOUD_EXPECTS(local_rank >= 0 && local_rank < local_size, kCall,
                   "local rank " + std::to_string(local_rank) + " is outside a node of " + std::to_string(local_size) +
                       " processes");
  if (node < 0 || nodes <= 0 || node >= nodes) {
    node = -1;  // the launcher did not say (mpirun): the communicator's node() knows
    nodes = 0;
  }
  info.rank = rank;
  info.size = size;
  info.local_rank = local_rank;
  info.local_size = local_size;
  info.node = node;
  info.nodes = nodes;
  return info;
}

}  // namespace gpucloud
