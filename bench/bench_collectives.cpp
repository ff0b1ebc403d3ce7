// Collectives, nccl-tests style: for sizes from 8 B up, the all-reduce (flat and hierarchical),
// reduce-scatter and all-gather through gpucloud, and the raw MPI_Allreduce on the same buffers
// in the same run. algbw = bytes / time; busbw = algbw x 2(n-1)/n for all-reduce, x (n-1)/n for
// reduce-scatter and all-gather. Run under mpirun; rank 0 reports. Iteration counts are fixed so
// every rank runs the same number of collectives.
//
//   mpirun -np 4 bench_collectives [--benchmark_out=c.json --benchmark_out_format=json]
//   GPUCLOUD_LOCAL_SIZE=2 mpirun -np 4 bench_collectives     (2 simulated nodes: hierarchical)
//   mpirun -np 8 bench_collectives --nccl    (GPU buffers through the NCCL backend, one GPU per
//                                            rank; the baseline is a raw ncclAllReduce)
#include <gpucloud/gpucloud.hpp>

#include "cuda_baselines.hpp"

#include <benchmark/benchmark.h>
#include <mpi.h>

#include <chrono>
#include <cstring>
#include <vector>

namespace gc = gpucloud;

namespace {

bool use_nccl = false;  // --nccl

gc::Communicator& comm() {
  static gc::Communicator c = use_nccl ? gc::Communicator::nccl_from_mpi() : gc::Communicator::mpi_world();
  return c;
}

// The raw ncclAllReduce baseline: its own NCCL communicator, the id broadcast through MPI.
gc::bench::RawNccl* raw() {
  static std::shared_ptr<gc::bench::RawNccl> r = [] {
    gc::NcclUniqueId id;
    if (comm().rank() == 0) id = gc::Communicator::nccl_unique_id();
    MPI_Bcast(id.bytes.data(), static_cast<int>(id.bytes.size()), MPI_BYTE, 0, MPI_COMM_WORLD);
    return gc::bench::raw_nccl(id, comm().rank(), comm().size(), comm().device().index());
  }();
  return r.get();
}

enum Kind { kFlat = 0, kHierarchical = 1, kRaw = 2, kReduceScatter = 3, kAllGather = 4 };

// args: kind, bytes (float32 elements = bytes / 4)
void BM_Collective(benchmark::State& state) {
  auto& c = comm();
  const auto kind = static_cast<Kind>(state.range(0));
  const auto bytes = static_cast<std::size_t>(state.range(1));
  const std::size_t n = std::max<std::size_t>(bytes / 4, static_cast<std::size_t>(c.size()));
  const std::size_t count = n / static_cast<std::size_t>(c.size()) * static_cast<std::size_t>(c.size());
  if (kind == kRaw && use_nccl && raw() == nullptr) {
    state.SkipWithError("the raw NCCL baseline needs a CUDA build with cuDNN and NCCL (bench/cuda_baselines.cpp)");
    return;
  }
  gc::Stream s(c.device());
  gc::Buffer buf(count, gc::DType::float32, c.device()),
      part(count / static_cast<std::size_t>(c.size()), gc::DType::float32, c.device());
  gc::fill(buf, 0.0, s);
  gc::fill(part, 0.0, s);
  s.synchronize();
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
      case kRaw:
        if (use_nccl) {
          gc::bench::raw_nccl_all_reduce(*raw(), buf.data(), count, s.native_handle());
        } else {
          MPI_Allreduce(MPI_IN_PLACE, buf.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        }
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
  const std::string name = kind == kRaw && use_nccl ? "ncclAllReduce (raw)" : names[kind];
  state.SetLabel(std::string(use_nccl ? "nccl " : "mpi ") + name + ", " + std::to_string(c.size()) + " ranks, " +
                 std::to_string(c.nodes()) + " node(s)");
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
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--nccl") == 0) {
      use_nccl = true;
      for (int j = i; j + 1 < argc; ++j) argv[j] = argv[j + 1];
      --argc;
      break;
    }
  }
  (void)comm();  // MPI (and NCCL) up before the benchmarks
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
