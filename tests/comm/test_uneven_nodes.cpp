// Nodes of different sizes (run as 3 ranks on one network-namespace node and 1 on another, or any
// uneven split): the hierarchical all-reduce refuses with an InvalidArgument naming the reason
// before anything is enqueued, and all_reduce_auto (with a cost model measured on this job) and
// the flat all-reduce give the exact sums on every rank. Never a wrong sum.
#include <gpucloud/comm/communicator.hpp>
#include <gpucloud/compute/cast.hpp>
#include <gpucloud/memory/buffer.hpp>
#include <gpucloud/runtime/error.hpp>
#include <gpucloud/runtime/stream.hpp>

#include <mpi.h>

#include <cstdio>
#include <string>

namespace gc = gpucloud;

int main() {
  gc::Communicator c = gc::Communicator::mpi_world();
  gc::Stream s;
  bool ok = c.nodes() == 2;
  if (!ok) std::printf("rank %d: %d node(s), expected 2\n", c.rank(), c.nodes());
  const std::size_t n = 1000;
  gc::Buffer x(n, gc::DType::int64), y(n, gc::DType::int64);
  gc::fill_integer(x, c.rank() + 1, s);
  gc::fill_integer(y, c.rank() + 1, s);
  try {
    c.hierarchical_all_reduce(x, x, gc::ReduceOp::sum, s);
    ok = false;
    std::printf("rank %d: hierarchical_all_reduce accepted uneven nodes\n", c.rank());
  } catch (const gc::InvalidArgument& e) {
    ok = ok && std::string(e.what()).find("different numbers of processes") != std::string::npos;
  }
  c.measure_cost_model(s);
  c.all_reduce_auto(x, x, gc::ReduceOp::sum, s);
  c.all_reduce(y, y, gc::ReduceOp::sum, s);
  s.synchronize();
  const std::int64_t want = static_cast<std::int64_t>(c.size()) * (c.size() + 1) / 2;
  for (std::size_t i = 0; i < n; ++i) {
    ok = ok && x.data_as<std::int64_t>()[i] == want && y.data_as<std::int64_t>()[i] == want;
  }
  int all_ok = ok ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (c.rank() == 0) {
    std::printf("%d ranks on %d nodes of local sizes up to %d: %s\n", c.size(), c.nodes(), c.local_size(),
                all_ok ? "UNEVEN NODES TEST PASSED" : "UNEVEN NODES TEST FAILED");
  }
  return all_ok ? 0 : 1;
}
