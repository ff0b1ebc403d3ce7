// The MPI backend of Communicator: how a communicator is made (over MPI's world or a caller's
// communicator; the nodes found by a shared-memory split or GPUCLOUD_LOCAL_SIZE), NCCL ids handed
// out through MPI, the job's end after a timeout, and the cost model's timings. The collectives
// are in mpi_collectives.cpp.
#include "comm/mpi/mpi_communicator.hpp"

#include <gpucloud/comm/communicator.hpp>
#include <gpucloud/runtime/error.hpp>

#include "comm/hierarchy.hpp"
#include "comm/mpi/mpi_types.hpp"
#include "comm/nccl/nccl_communicator.hpp"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

namespace gpucloud {

void detail::abort_job(int code) noexcept {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

Communicator Communicator::mpi_world() {
  constexpr const char* call = "Communicator::mpi_world";
  detail::ensure_mpi();
  int world = 1;
  GPUCLOUD_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world));
  return Communicator(detail::MpiCommunicator::build(MPI_COMM_WORLD, call, [&] {
    // A process the launcher counts in a larger job, alone in MPI's world (torchrun starts
    // processes without MPI: each would be "rank 0 of 1" and train on its own).
    const LaunchInfo launch = launch_info_from_environment();
    // Slurm's batch script in an allocation of several tasks: the ranks are what srun starts.
    const char* tasks = std::getenv("SLURM_NTASKS");
    GPUCLOUD_EXPECTS(launch.launcher != "slurm-batch" || world > 1 || tasks == nullptr || std::atoi(tasks) <= 1, call,
                     std::string("this process is Slurm's batch script, not one of the allocation's ") + tasks +
                         " tasks (SLURM_NTASKS): start the ranks with srun (srun --mpi=pmix ./trainer) or mpirun");
    GPUCLOUD_EXPECTS(launch.size == world, call,
                     "the launcher (" + launch.launcher + ") started " + std::to_string(launch.size) +
                         " processes but MPI's world has " + std::to_string(world) +
                         (launch.launcher == "torchrun" ? " (WORLD_SIZE without mpirun)" : "") +
                         ": start the job with mpirun or srun, or use NCCL ids through the launcher's store "
                         "(gpucloud.distributed)");
  }));
}

Communicator Communicator::nccl_from_mpi(Device device) {
  constexpr const char* call = "Communicator::nccl_from_mpi";
  Communicator world = mpi_world();
  const auto& mpi = static_cast<const detail::MpiCommunicator&>(*world.impl_);
  if (device.is_host()) {
    const int gpus = cuda_device_count();
    GPUCLOUD_EXPECTS(gpus > 0, call, "device: no GPU is visible (" + cuda_unavailable_reason() + ")");
    device = Device::cuda(mpi.local_rank % gpus);
  }
  // Rank 0 makes the id, MPI hands it to everyone (a failure on rank 0 is everyone's).
  NcclUniqueId id;
  int ok = 1;
  std::string why;
  if (mpi.rank == 0) {
    try {
      id = nccl_unique_id();
    } catch (const Error& e) {
      ok = 0;
      why = e.what();
    }
  }
  GPUCLOUD_MPI_CHECK(MPI_Bcast(&ok, 1, MPI_INT, 0, mpi.world));
  if (!ok)
    GPUCLOUD_FAIL(CommunicationError, call,
                  "rank 0 could not make a NCCL unique id: " + (why.empty() ? std::string("see rank 0") : why));
  GPUCLOUD_MPI_CHECK(MPI_Bcast(id.bytes.data(), static_cast<int>(id.bytes.size()), MPI_BYTE, 0, mpi.world));
  return Communicator(detail::make_nccl_communicator(id, mpi.rank, mpi.size, device));
}

Communicator Communicator::mpi(std::int64_t fortran_handle) {
  int initialized = 0, finalized = 0;
  GPUCLOUD_MPI_CHECK(MPI_Initialized(&initialized));
  GPUCLOUD_MPI_CHECK(MPI_Finalized(&finalized));
  GPUCLOUD_EXPECTS(initialized && !finalized, "Communicator::mpi",
                   "fortran_handle: MPI is not initialised (or already finalised), so no MPI communicator exists");
  const MPI_Comm parent = MPI_Comm_f2c(static_cast<MPI_Fint>(fortran_handle));
  GPUCLOUD_EXPECTS(parent != MPI_COMM_NULL && static_cast<std::int64_t>(MPI_Comm_c2f(parent)) == fortran_handle,
                   "Communicator::mpi",
                   "fortran_handle: " + std::to_string(fortran_handle) + " is not a live MPI communicator");
  int inter = 0;
  GPUCLOUD_MPI_CHECK(MPI_Comm_test_inter(parent, &inter));
  GPUCLOUD_EXPECTS(!inter, "Communicator::mpi", "fortran_handle: an inter-communicator; pass an intra-communicator");
  detail::ensure_mpi();
  return Communicator(detail::MpiCommunicator::build(parent, "Communicator::mpi"));
}

std::shared_ptr<detail::MpiCommunicator> detail::MpiCommunicator::build(MPI_Comm parent, const char* call,
                                                                        const std::function<void()>& checks) {
  auto c = std::make_shared<MpiCommunicator>();
  // The environment first, before any MPI call that waits for the other ranks: a bad value
  // changes nothing. Every rank then hears whether any rank's was bad (one small all-reduce on
  // @p parent), and all refuse the communicator: a bad value on some ranks only would otherwise
  // leave the others waiting in MPI_Comm_dup for good.
  std::exception_ptr bad;
  bool doubling = false;  // GPUCLOUD_AGREEMENT
  HierarchyRequest hierarchy;
  int local_size = 0;  // GPUCLOUD_LOCAL_SIZE: simulated nodes of this many world ranks
  int world_rank = 0, world_size = 1;
  GPUCLOUD_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank));  // (local calls)
  GPUCLOUD_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world_size));
  try {
    if (checks) checks();
    c->timeout = detail::timeout_from_environment();            // GPUCLOUD_COMM_TIMEOUT
    c->route_policy = detail::route_policy_from_environment();  // GPUCLOUD_COLLECTIVE_ROUTE
    if (const char* form = std::getenv("GPUCLOUD_AGREEMENT"); form != nullptr && *form != '\0') {
      GPUCLOUD_EXPECTS(std::string(form) == "auto" || std::string(form) == "doubling", call,
                       std::string("GPUCLOUD_AGREEMENT: '") + form + "' is not auto or doubling");
      doubling = std::string(form) == "doubling";
    }
    hierarchy = detail::hierarchy_from_environment(call);
    if (const char* m = std::getenv("GPUCLOUD_MPI_MAX_COUNT"); m != nullptr && *m != '\0') {
      char* end = nullptr;
      const long long v = std::strtoll(m, &end, 10);
      GPUCLOUD_EXPECTS(end != m && *end == '\0' && v >= 1 && v <= c->max_count, call,
                       std::string("GPUCLOUD_MPI_MAX_COUNT: '") + m + "' is not a count in [1, 2147483647]");
      c->max_count = v;
    }
    if (const char* forced = std::getenv("GPUCLOUD_LOCAL_SIZE"); forced != nullptr && *forced != '\0')
      local_size = detail::local_size_from_environment(forced, world_size, call);
  } catch (...) {
    bad = std::current_exception();
  }
  int parent_rank = 0, parent_size = 1;
  GPUCLOUD_MPI_CHECK(MPI_Comm_rank(parent, &parent_rank));
  GPUCLOUD_MPI_CHECK(MPI_Comm_size(parent, &parent_size));
  int first_bad = bad ? parent_rank : parent_size;
  GPUCLOUD_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &first_bad, 1, MPI_INT, MPI_MIN, parent));
  if (first_bad < parent_size) {  // its reason to every rank, then each raises
    char reason[512] = {};
    if (parent_rank == first_bad) {
      try {
        std::rethrow_exception(bad);
      } catch (const std::exception& e) {
        std::strncpy(reason, e.what(), sizeof reason - 1);
      } catch (...) {
        std::strncpy(reason, "an unknown exception", sizeof reason - 1);
      }
    }
    GPUCLOUD_MPI_CHECK(MPI_Bcast(reason, sizeof reason, MPI_CHAR, first_bad, parent));
    if (bad) std::rethrow_exception(bad);
    GPUCLOUD_FAIL(InvalidArgument, call,
                  "the environment of rank " + std::to_string(first_bad) +
                      " is invalid, so every rank refuses the communicator: " + reason);
  }
  GPUCLOUD_MPI_CHECK(MPI_Comm_dup(parent, &c->world));
  GPUCLOUD_MPI_CHECK(MPI_Comm_dup(c->world, &c->agreement));
  GPUCLOUD_MPI_CHECK(MPI_Comm_rank(c->world, &c->rank));
  GPUCLOUD_MPI_CHECK(MPI_Comm_size(c->world, &c->size));
  c->where = detail::where(c->rank);
  if (local_size != 0) {
    // Simulated nodes are blocks of the job's world ranks, whatever communicator this is: a
    // sub-communicator's ranks keep the nodes their processes are on.
    GPUCLOUD_MPI_CHECK(MPI_Comm_split(c->world, world_rank / local_size, c->rank, &c->local));
  } else {
    GPUCLOUD_MPI_CHECK(MPI_Comm_split_type(c->world, MPI_COMM_TYPE_SHARED, c->rank, MPI_INFO_NULL, &c->local));
  }
  GPUCLOUD_MPI_CHECK(MPI_Comm_rank(c->local, &c->local_rank));
  GPUCLOUD_MPI_CHECK(MPI_Comm_size(c->local, &c->local_size));
  GPUCLOUD_MPI_CHECK(MPI_Comm_split(c->world, c->local_rank, c->rank, &c->cross));
  int sizes[2] = {c->local_size, -c->local_size};
  GPUCLOUD_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, sizes, 2, MPI_INT, MPI_MAX, c->world));
  c->uniform_nodes = sizes[0] == -sizes[1];
  // The nodes of the job and this rank's node, the same on every rank also when nodes differ in
  // size (where a cross-node communicator does not span every node): node k is the k-th distinct
  // node leader (a node's lowest rank) in rank order.
  int leader = c->rank;
  GPUCLOUD_MPI_CHECK(MPI_Allreduce(&c->rank, &leader, 1, MPI_INT, MPI_MIN, c->local));
  std::vector<int> leaders(static_cast<std::size_t>(c->size));
  GPUCLOUD_MPI_CHECK(MPI_Allgather(&leader, 1, MPI_INT, leaders.data(), 1, MPI_INT, c->world));
  std::sort(leaders.begin(), leaders.end());
  leaders.erase(std::unique(leaders.begin(), leaders.end()), leaders.end());
  c->nodes = static_cast<int>(leaders.size());
  c->node = static_cast<int>(std::lower_bound(leaders.begin(), leaders.end(), leader) - leaders.begin());
  // The agreement's form: every rank must take the same one, or each would wait for messages the
  // others never send.
  c->all_to_all = !doubling && detail::all_to_all_agreement(c->size, c->nodes);
  int forms[2] = {c->all_to_all ? 1 : 0, c->all_to_all ? -1 : 0};
  GPUCLOUD_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, forms, 2, MPI_INT, MPI_MAX, c->world));
  GPUCLOUD_EXPECTS(forms[0] == -forms[1], call,
                   "GPUCLOUD_AGREEMENT: set to doubling on some ranks and not on others (it must be the same on "
                   "every rank: mpirun -x GPUCLOUD_AGREEMENT)");
  c->split_groups(hierarchy, call);
  return c;
}

void detail::MpiCommunicator::split_groups(const HierarchyRequest& request, const char* call) {
  use_nodes_as_groups();
  group = local;
  group_cross = cross;
  check_blocks(request, local_size, uniform_nodes, call);
  // Host memory is shared by the whole node: it stays the group unless NUMA nodes or blocks are asked for.
  if (request.kind != HierarchyRequest::Kind::numa && request.kind != HierarchyRequest::Kind::blocks) return;
  const std::int64_t mine[2] = {node, local_subgroup_key(request, -1, local_rank)};
  std::vector<std::int64_t> all(2 * static_cast<std::size_t>(size));
  GPUCLOUD_MPI_CHECK(MPI_Allgather(mine, 2, MPI_INT64_T, all.data(), 2, MPI_INT64_T, world));
  const std::optional<NodeLayout> layout = group_layout_of_pairs(all, rank);
  if (!layout) return;
  GPUCLOUD_MPI_CHECK(MPI_Comm_split(world, layout->node, rank, &group));
  GPUCLOUD_MPI_CHECK(MPI_Comm_split(world, layout->local_rank, rank, &group_cross));
  grouping =
      Hierarchy{hierarchy_level(request, true), layout->node, layout->nodes, layout->local_rank, layout->local_size};
  uniform_groups = true;
}

double detail::MpiCommunicator::time_all_reduce(bool intra, std::size_t bytes, int repeats) {
  const MPI_Comm comm = intra ? group : group_cross;
  std::vector<float> buf(std::max<std::size_t>(bytes / 4, 1));
  GPUCLOUD_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, buf.data(), static_cast<int>(buf.size()), MPI_FLOAT, MPI_SUM, comm));
  GPUCLOUD_MPI_CHECK(MPI_Barrier(world));
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < repeats; ++i) {
    GPUCLOUD_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, buf.data(), static_cast<int>(buf.size()), MPI_FLOAT, MPI_SUM, comm));
  }
  double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / repeats;
  GPUCLOUD_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, world));
  return t;
}

}  // namespace gpucloud
