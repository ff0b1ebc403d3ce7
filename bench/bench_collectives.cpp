// Collectives, nccl-tests style: for sizes from 8 B up, the all-reduce (flat and hierarchical),
// reduce-scatter and all-gather through gpucloud, and the raw MPI_Allreduce on the same buffers
// in the same run. algbw = bytes / time; busbw = algbw x 2(n-1)/n for all-reduce, x (n-1)/n for
// reduce-scatter and all-gather. Run under mpirun; rank 0 reports. Iteration counts are fixed so
// every rank runs the same number of collectives.
//
//   mpirun -np 4 bench_collectives [--benchmark_out=c.json --benchmark_out_format=json]
//   GPUCLOUD_LOCAL_SIZE=2 mpirun -np 4 bench_collectives     (2 simulated nodes: hierarchical)
#include <gpucloud/gpucloud.hpp>

#include <benchmark/benchmark.h>
#include <mpi.h>

#include <chrono>
#include <cstring>
#include <vector>

namespace gc = gpucloud;

namespace {

gc::Communicator& comm() {
  static gc::Communicator c = gc::Communicator::mpi_world();
  return c;
}

enum Kind { kFlat = 0, kHierarchical = 1, kRawMpi = 2, kReduceScatter = 3, kAllGather = 4 };

// args: kind, bytes (float32 elements = bytes / 4)
void BM_Collective(benchmark::State& state) {
  auto& c = comm();
  const auto kind = static_cast<Kind>(state.range(0));
  const auto bytes = static_cast<std::size_t>(state.range(1));
  const std::size_t n = std::max<std::size_t>(bytes / 4, static_cast<std::size_t>(c.size()));
  const std::size_t count = n / static_cast<std::size_t>(c.size()) * static_cast<std::size_t>(c.size());
  gc::Stream s;
  gc::Buffer buf(count, gc::DType::float32), part(count / static_cast<std::size_t>(c.size()), gc::DType::float32);
  std::memset(buf.data(), 0, buf.size_bytes());
  std::memset(part.data(), 0, part.size_bytes());
  auto once = [&] {
    switch (kind) {
      case kFlat:
        c.all_reduce(buf, buf, gc::ReduceOp::sum, s);
        break;
      case kHierarchical:
        c.hierarchical_all_reduce(buf, buf, gc::ReduceOp::sum, s);
        break;
      case kReduceScatter:
        c.reduce_scatter(buf, part, gc::ReduceOp::sum, s);
        break;
      case kAllGather:
        c.all_gather(part, buf, s);
        break;
      case kRawMpi:
        MPI_Allreduce(MPI_IN_PLACE, buf.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        return;
    }
    s.synchronize();
  };
  once();  // warm-up
  MPI_Barrier(MPI_COMM_WORLD);
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    once();
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    MPI_Allreduce(MPI_IN_PLACE, &secs, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);  // the slowest rank's time
    state.SetIterationTime(secs);
  }
  const double total_bytes = static_cast<double>(count) * 4.0;
  const double nranks = c.size();
  const double factor =
      kind == kReduceScatter || kind == kAllGather ? (nranks - 1) / nranks : 2 * (nranks - 1) / nranks;
  state.counters["algbw_GBs"] = benchmark::Counter(total_bytes / 1e9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["busbw_GBs"] =
      benchmark::Counter(total_bytes / 1e9 * factor, benchmark::Counter::kIsIterationInvariantRate);
  static const char* names[] = {"all_reduce flat", "all_reduce hierarchical", "MPI_Allreduce (raw)", "reduce_scatter",
                                "all_gather"};
  state.SetLabel(std::string(names[kind]) + ", " + std::to_string(c.size()) + " ranks, " + std::to_string(c.nodes()) +
                 " node(s)");
}

void args(benchmark::internal::Benchmark* b) {
  for (int kind = 0; kind < 5; ++kind) {
    for (std::int64_t bytes = 8; bytes <= (std::int64_t{64} << 20); bytes *= 8) b->Args({kind, bytes});
  }
  b->ArgNames({"kind", "bytes"})->UseManualTime()->Iterations(20)->Unit(benchmark::kMicrosecond);
}

}  // namespace

BENCHMARK(BM_Collective)->Apply(args);

// Reports nothing: the other ranks run the same benchmarks silently.
class Quiet : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>&) override {}
};

int main(int argc, char** argv) {
  (void)comm();  // MPI up before the benchmarks
  bool file_output = false;
  for (int i = 1; i < argc; ++i) file_output |= std::strncmp(argv[i], "--benchmark_out=", 16) == 0;
  benchmark::Initialize(&argc, argv);
  if (comm().rank() == 0) {
    benchmark::RunSpecifiedBenchmarks();
  } else {
    Quiet quiet, quiet_file;
    if (file_output) {
      benchmark::RunSpecifiedBenchmarks(&quiet, &quiet_file);
    } else {
      benchmark::RunSpecifiedBenchmarks(&quiet);
    }
  }
  benchmark::Shutdown();
  return 0;
}
