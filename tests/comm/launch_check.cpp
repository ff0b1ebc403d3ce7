// Launch detection under a real launcher (srun on Slurm nodes, mpirun on network-namespace
// nodes): what launch_info_from_environment() reads must agree with where the processes are,
// as host names say, and with the communicator's shared-memory split; and a communicator built
// on a sub-communicator must see the nodes its own ranks live on (a data-parallel group of a
// multi-node job: one rank per node; a node's group: one node).
//
//   launch_check LAUNCHER NODES     LAUNCHER as launch_info names it, NODES the job's node count
#include <gpucloud/comm/communicator.hpp>
#include <gpucloud/runtime/error.hpp>

#include <mpi.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

namespace gc = gpucloud;

namespace {

// The distinct host names of @p comm's ranks.
int distinct_hosts(MPI_Comm comm) {
  char name[256] = {};
  gethostname(name, sizeof name - 1);
  int size = 1;
  MPI_Comm_size(comm, &size);
  std::vector<char> all(static_cast<std::size_t>(size) * sizeof name);
  MPI_Allgather(name, sizeof name, MPI_CHAR, all.data(), sizeof name, MPI_CHAR, comm);
  std::set<std::string> hosts;
  for (int r = 0; r < size; ++r) hosts.insert(std::string(&all[static_cast<std::size_t>(r) * sizeof name]));
  return static_cast<int>(hosts.size());
}

bool expect(bool ok, int rank, const std::string& what) {
  if (!ok) std::printf("rank %d: %s\n", rank, what.c_str());
  return ok;
}

}  // namespace

int main(int argc, char** argv) try {
  if (argc != 3) {
    std::fprintf(stderr, "usage: launch_check LAUNCHER NODES\n");
    return 2;
  }
  const std::string launcher = argv[1];
  const int want_nodes = std::atoi(argv[2]);
  const gc::LaunchInfo l = gc::launch_info_from_environment();
  gc::Communicator c = gc::Communicator::mpi_world();
  const int r = c.rank();
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  std::printf("rank %d on %s: launcher %s, rank %d of %d, local %d of %d, node %d of %d; communicator: node %d of %d\n",
              r, host, l.launcher.c_str(), l.rank, l.size, l.local_rank, l.local_size, l.node, l.nodes, c.node(),
              c.nodes());
  std::fflush(stdout);
  bool ok = expect(l.launcher == launcher, r, "launcher " + l.launcher + ", expected " + launcher);
  ok &= expect(l.rank == c.rank() && l.size == c.size(), r, "rank/size differ from MPI's");
  ok &= expect(l.local_rank == c.local_rank() && l.local_size == c.local_size(), r,
               "local rank/size " + std::to_string(l.local_rank) + "/" + std::to_string(l.local_size) +
                   " differ from the shared-memory split's " + std::to_string(c.local_rank()) + "/" +
                   std::to_string(c.local_size()));
  ok &= expect(
      c.nodes() == want_nodes && distinct_hosts(MPI_COMM_WORLD) == want_nodes, r,
      "the communicator counts " + std::to_string(c.nodes()) + " node(s), expected " + std::to_string(want_nodes));
  if (l.nodes != 0)  // the launcher names the node (srun, torchrun): the same numbering as the communicator's
    ok &=
        expect(l.nodes == c.nodes() && l.node == c.node(), r,
               "launcher's node " + std::to_string(l.node) + " of " + std::to_string(l.nodes) +
                   " differs from the communicator's " + std::to_string(c.node()) + " of " + std::to_string(c.nodes()));
  else
    ok &= expect(l.launcher == "mpirun" && l.node == -1, r, "node unknown outside mpirun");

  // Data-parallel groups across nodes (same local rank on every node) and each node's group.
  for (const bool across : {true, false}) {
    MPI_Comm sub = MPI_COMM_NULL;
    MPI_Comm_split(MPI_COMM_WORLD, across ? l.local_rank : c.node(), r, &sub);
    gc::Communicator g = gc::Communicator::mpi(static_cast<std::int64_t>(MPI_Comm_c2f(sub)));
    const int hosts = distinct_hosts(sub);
    ok &= expect(g.nodes() == hosts, r,
                 std::string(across ? "data-parallel" : "node") + " group of " + std::to_string(g.size()) + " sees " +
                     std::to_string(g.nodes()) + " node(s), its ranks live on " + std::to_string(hosts));
    if (across && hosts == g.size()) ok &= expect(g.local_size() == 1, r, "one rank per node: local size 1");
    if (!across) ok &= expect(g.nodes() == 1 && g.local_size() == g.size(), r, "a node's group spans one node");
    MPI_Comm_free(&sub);
  }
  int all_ok = ok ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (r == 0)
    std::printf("%d ranks on %d nodes: %s\n", c.size(), c.nodes(),
                all_ok ? "LAUNCH CHECK PASSED" : "LAUNCH CHECK FAILED");
  return all_ok ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "launch_check: %s\nLAUNCH CHECK FAILED\n", e.what());
  return 1;
}
