#include <gpucloud/comm/communicator.hpp>
#include <gpucloud/runtime/error.hpp>

#include <cstdlib>
#include <string>

namespace gpucloud {

namespace {
bool read_int(const char* name, int& out) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return false;
  try {
    std::size_t used = 0;
    out = std::stoi(v, &used);
    if (used != std::string(v).size()) throw std::invalid_argument(v);
  } catch (const std::exception&) {
    GPUCLOUD_FAIL(InvalidArgument, "launch_info_from_environment",
                  std::string(name) + ": '" + v + "' is not an integer");
  }
  return true;
}
}  // namespace

LaunchInfo launch_info_from_environment() {
  LaunchInfo info;
  info.launcher = "none";
  int rank = 0, size = 1, local_rank = 0, local_size = 0;
  if (read_int("OMPI_COMM_WORLD_RANK", rank)) {
    info.launcher = "mpirun";
    read_int("OMPI_COMM_WORLD_SIZE", size);
    read_int("OMPI_COMM_WORLD_LOCAL_RANK", local_rank);
    read_int("OMPI_COMM_WORLD_LOCAL_SIZE", local_size);
  } else if (read_int("SLURM_PROCID", rank)) {
    info.launcher = "srun";
    read_int("SLURM_NTASKS", size);
    read_int("SLURM_LOCALID", local_rank);
    // SLURM_NTASKS_PER_NODE may read "4(x2)": the leading number is the tasks per node.
    if (const char* per_node = std::getenv("SLURM_NTASKS_PER_NODE")) local_size = std::atoi(per_node);
  } else if (read_int("PMI_RANK", rank)) {
    info.launcher = "mpirun";
    read_int("PMI_SIZE", size);
  } else if (read_int("RANK", rank)) {
    info.launcher = "torchrun";
    read_int("WORLD_SIZE", size);
    read_int("LOCAL_RANK", local_rank);
    read_int("LOCAL_WORLD_SIZE", local_size);
  }
  GPUCLOUD_EXPECTS(size >= 1 && rank >= 0 && rank < size, "launch_info_from_environment",
                   "rank " + std::to_string(rank) + " is outside a job of " + std::to_string(size));
  int forced = 0;
  if (read_int("GPUCLOUD_LOCAL_SIZE", forced)) {
    GPUCLOUD_EXPECTS(forced >= 1 && size % forced == 0, "launch_info_from_environment",
                     "GPUCLOUD_LOCAL_SIZE: " + std::to_string(forced) + " does not divide the " + std::to_string(size) +
                         " processes into equal nodes");
    local_size = forced;
    local_rank = rank % forced;
  }
  if (local_size <= 0) {
    local_size = size;  // no node information: one node
    local_rank = rank;
  }
  info.rank = rank;
  info.size = size;
  info.local_rank = local_rank;
  info.local_size = local_size;
  return info;
}

}  // namespace gpucloud
