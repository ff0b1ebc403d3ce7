// Collectives, nccl-tests style, each against the raw call it wraps, interleaved: for sizes from
// 8 B up, every iteration times gpucloud's all-reduce (flat or hierarchical), reduce-scatter,
// all-gather or broadcast (enqueued on a stream, then synchronized: what a caller waits for) and
// the raw blocking MPI call on the same buffers (MPI_Allreduce, MPI_Reduce_scatter_block,
// MPI_Allgather, MPI_Bcast; ncclAllReduce with --nccl), one after the other (which goes first
// alternates), each the slowest rank's time. Reported: gpucloud's time, algbw = bytes / time, busbw = algbw x 2(n-1)/n
// for all-reduce, x (n-1)/n for reduce-scatter and all-gather, x 1 for broadcast; ratio_vs_raw = the raw call's median
// / gpucloud's median (1.0 = as fast as the raw call) and overhead_us = the difference of the medians. Run under
// mpirun; rank 0 reports (and alone writes --benchmark_out). Iteration counts depend on the size only, so every rank
// runs the same collectives.
//
//   mpirun -np 4 bench_collectives [--benchmark_out=c.json --benchmark_out_format=json]
//   GPUCLOUD_LOCAL_SIZE=2 mpirun -np 4 bench_collectives     (2 simulated nodes: hierarchical)
//   mpirun -np 8 bench_collectives --nccl    (GPU buffers through the NCCL backend, one GPU per
//                                            rank; the raw baseline is ncclAllReduce)
//   ... bench_collectives --auto              (measure_cost_model() first, then also
//                                            all_reduce_auto, with the model's predictions)
//   ... bench_collectives --max-mib=256       (sizes up to 256 MiB instead of 16: 8 B x 8^k, then
//                                            the powers of two above 16 MiB)
//   ... bench_collectives --sizes=131072,1048576   (these sizes in bytes instead)
//   ... bench_collectives --loaded            (each benchmark again with one CPU-bound process per
//                                            core of every node beside the ranks, named .../loaded:
//                                            a training node's data loaders and framework threads)
// Every result also carries the spread of both sides (p25 and p75 of the per-call times) and the
// node's 1-minute load average when it ended.
#include <gpucloud/gpucloud.hpp>

#include "cuda_baselines.hpp"
#include "timing.hpp"

#include <benchmark/benchmark.h>
#include <mpi.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
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

enum Kind { kFlat = 0, kHierarchical = 1, kReduceScatter = 2, kAllGather = 3, kBroadcast = 4, kAuto = 5 };

bool with_auto = false;  // --auto: measure the cost model first and add all_reduce_auto (kind 5)
std::int64_t max_bytes = std::int64_t{64} << 20;  // --max-mib=N
std::vector<std::int64_t> only_sizes;             // --sizes=B,B,...: these sizes instead of the default ladder
std::optional<gc::AllReduceCostModel> model;      // measured on this job with --auto

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
double quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[static_cast<std::size_t>(q * static_cast<double>(v.size() - 1) + 0.5)];
}
using gpucloud::bench::load_average;

bool with_loaded = false;  // --loaded: every benchmark again beside CPU-bound processes

// One CPU-bound process per core of this node, started by the node's first rank on the first
// loaded benchmark and stopped at exit: each spins on its own, touching nothing of MPI's.
std::vector<pid_t> competitors;
void stop_competitors() {
  for (const pid_t p : competitors) kill(p, SIGKILL);
  for (const pid_t p : competitors) waitpid(p, nullptr, 0);
  competitors.clear();
}
void start_competitors() {
  static bool started = false;
  if (started) return;
  started = true;
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int local = 0;
  MPI_Comm_rank(node, &local);
  MPI_Comm_free(&node);
  const long cores = sysconf(_SC_NPROCESSORS_ONLN);
  for (long i = 0; local == 0 && i < cores; ++i) {
    const pid_t p = fork();
    if (p == 0) {
      volatile unsigned long spin = 0;
      for (;;) spin = spin + 1;
    }
    if (p > 0) competitors.push_back(p);
  }
  std::atexit(stop_competitors);
  MPI_Barrier(MPI_COMM_WORLD);
}

// The slowest rank's seconds for @p f (every rank calls it).
template <class F>
double timed(F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  MPI_Allreduce(MPI_IN_PLACE, &secs, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return secs;
}

// @p bytes of float32 (bytes / 4 elements, at least one per rank).
void BM_Collective(benchmark::State& state, Kind kind, std::int64_t size, bool loaded) {
  auto& c = comm();
  if (loaded) start_competitors();
  const auto bytes = static_cast<std::size_t>(size);
  const std::size_t n = std::max<std::size_t>(bytes / 4, static_cast<std::size_t>(c.size()));
  const std::size_t count = n / static_cast<std::size_t>(c.size()) * static_cast<std::size_t>(c.size());
  const std::size_t part_count = count / static_cast<std::size_t>(c.size());
  const bool has_raw = !use_nccl || ((kind <= kHierarchical || kind == kAuto) && raw() != nullptr);
  gc::Stream s(c.device());
  gc::Buffer buf(count, gc::DType::float32, c.device()), part(part_count, gc::DType::float32, c.device());
  gc::fill(buf, 1.0, s);
  gc::fill(part, 1.0, s);
  s.synchronize();
  const int icount = static_cast<int>(count), ipart = static_cast<int>(part_count);
  auto ours = [&] {
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
      case kBroadcast:
        c.broadcast(buf, 0, s);
        break;
      case kAuto:
        c.all_reduce_auto(buf, buf, gc::ReduceOp::sum, s);
        break;
    }
    s.synchronize();
  };
  auto raw_call = [&] {
    if (use_nccl) {
      gc::bench::raw_nccl_all_reduce(*raw(), buf.data(), count, s.native_handle());
      s.synchronize();
      return;
    }
    switch (kind) {
      case kFlat:
      case kHierarchical:
      case kAuto:
        MPI_Allreduce(MPI_IN_PLACE, buf.data(), icount, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        break;
      case kReduceScatter:
        MPI_Reduce_scatter_block(buf.data(), part.data(), ipart, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        break;
      case kAllGather:
        MPI_Allgather(part.data(), ipart, MPI_FLOAT, buf.data(), ipart, MPI_FLOAT, MPI_COMM_WORLD);
        break;
      case kBroadcast:
        MPI_Bcast(buf.data(), icount, MPI_FLOAT, 0, MPI_COMM_WORLD);
        break;
    }
  };
  // Warm-up, both, as nccl-tests' -w: first touches, and the route chooser's first timings of
  // each size class (src/comm/mpi/route_choice.hpp), which try both of its routes.
  for (int i = 0; i < 8; ++i) {
    ours();
    if (has_raw) raw_call();
  }
  // all_reduce_auto is timed beside both of its forms, interleaved (rows measured minutes apart
  // drift with the machine more than the forms differ): which form it took, and at what cost.
  auto form_call = [&](bool hierarchical) {
    return [&c, &buf, &s, hierarchical] {
      if (hierarchical) {
        c.hierarchical_all_reduce(buf, buf, gc::ReduceOp::sum, s);
      } else {
        c.all_reduce(buf, buf, gc::ReduceOp::sum, s);
      }
      s.synchronize();
    };
  };
  const auto flat_call = form_call(false), hier_call = form_call(true);
  for (int i = 0; kind == kAuto && i < 2; ++i) {
    flat_call();
    hier_call();
  }
  MPI_Barrier(MPI_COMM_WORLD);
  std::vector<double> mine, theirs, flat_times, hier_times;
  // The two alternate which goes first (ABBA), so neither always follows the other's last message.
  bool raw_first = false;
  for (auto _ : state) {
    if (has_raw && raw_first) theirs.push_back(timed(raw_call));
    if (kind == kAuto && raw_first) flat_times.push_back(timed(flat_call));
    const double t = timed(ours);
    state.SetIterationTime(t);
    mine.push_back(t);
    if (kind == kAuto) hier_times.push_back(timed(hier_call));
    if (kind == kAuto && !raw_first) flat_times.push_back(timed(flat_call));
    if (has_raw && !raw_first) theirs.push_back(timed(raw_call));
    raw_first = !raw_first;
  }
  const double total_bytes = static_cast<double>(count) * 4.0;
  const double nranks = c.size();
  const double factor = kind == kBroadcast                             ? 1.0
                        : kind == kReduceScatter || kind == kAllGather ? (nranks - 1) / nranks
                                                                       : 2 * (nranks - 1) / nranks;
  state.counters["algbw_GBs"] = benchmark::Counter(total_bytes / 1e9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["busbw_GBs"] =
      benchmark::Counter(total_bytes / 1e9 * factor, benchmark::Counter::kIsIterationInvariantRate);
  const double m = median(mine);
  state.counters["median_us"] = m * 1e6;
  const auto mean = [](const std::vector<double>& v) {
    double sum = 0;
    for (const double x : v) sum += x;
    return sum / static_cast<double>(v.size());
  };
  state.counters["mean_us"] = mean(mine) * 1e6;
  state.counters["calls"] = static_cast<double>(mine.size());  // with the means: runs pool (collectives_busy_node.py)
  state.counters["p25_us"] = quantile(mine, 0.25) * 1e6;
  state.counters["p75_us"] = quantile(mine, 0.75) * 1e6;
  if (has_raw) {
    const double r = median(theirs);
    state.counters["raw_us"] = r * 1e6;
    state.counters["raw_p25_us"] = quantile(theirs, 0.25) * 1e6;
    state.counters["raw_p75_us"] = quantile(theirs, 0.75) * 1e6;
    state.counters["ratio_vs_raw"] = r / m;
    // Beside busy cores the times are bimodal (a call meets a scheduler tick or not), and the
    // median flips between the modes: the means' ratio is what a job pays over many calls.
    state.counters["mean_ratio_vs_raw"] = mean(theirs) / mean(mine);
    state.counters["raw_mean_us"] = mean(theirs) * 1e6;
    state.counters["overhead_us"] = (m - r) * 1e6;
  }
  state.counters["loadavg"] = load_average();
  if (kind == kAuto && model) {  // what the model predicted and chose, beside what was measured
    state.counters["predicted_flat_us"] = model->flat_seconds(count * 4) * 1e6;
    state.counters["predicted_hier_us"] = model->hierarchical_seconds(count * 4) * 1e6;
    state.counters["model_picks_hier"] = model->prefer_hierarchical(count * 4) ? 1 : 0;
    state.counters["model_ties"] = model->ties(count * 4) ? 1 : 0;
    // What all_reduce_auto took after the timed calls (where the model ties, what it measured):
    // 0 flat, 1 hierarchical, 2 still measuring.
    state.counters["auto_form"] = static_cast<double>(c.all_reduce_auto_form(count * 4));
    state.counters["interleaved_flat_us"] = median(flat_times) * 1e6;
    state.counters["interleaved_hier_us"] = median(hier_times) * 1e6;
    state.counters["auto_vs_faster"] = m / std::min(median(flat_times), median(hier_times));
  }
  static const char* names[] = {"all_reduce flat", "all_reduce hierarchical", "reduce_scatter", "all_gather",
                                "broadcast",       "all_reduce auto"};
  static const char* raw_names[] = {"vs MPI_Allreduce", "vs MPI_Allreduce", "vs MPI_Reduce_scatter_block",
                                    "vs MPI_Allgather", "vs MPI_Bcast",     "vs MPI_Allreduce"};
  const char* raw_name = !has_raw ? "no raw baseline" : use_nccl ? "vs ncclAllReduce" : raw_names[kind];
  state.SetLabel(std::string(use_nccl ? "nccl " : "mpi ") + names[kind] + " (" + raw_name + "), " +
                 std::to_string(c.size()) + " ranks, " + std::to_string(c.nodes()) + " node(s)" +
                 (loaded ? ", a CPU-bound process per core" : ""));
}

// Every (kind, size) with an iteration count that depends on the size alone: Google Benchmark's
// own choice would differ between ranks, and the ranks would then run different collectives.
void register_all() {
  for (const bool loaded : {false, true}) {  // the loaded ones last: their competitors stay until exit
    if (loaded && !with_loaded) continue;
    for (int kind = 0; kind < (with_auto ? 6 : 5); ++kind) {
      std::vector<std::int64_t> sizes = only_sizes;
      for (std::int64_t bytes = 8;
           only_sizes.empty() && bytes <= std::min<std::int64_t>(max_bytes, std::int64_t{16} << 20); bytes *= 8)
        sizes.push_back(bytes);
      for (std::int64_t bytes = std::int64_t{32} << 20; only_sizes.empty() && bytes <= max_bytes; bytes *= 2)
        sizes.push_back(bytes);
      for (const std::int64_t bytes : sizes) {
        std::int64_t iterations = bytes <= (32 << 10)    ? 500
                                  : bytes <= (256 << 10) ? 200
                                  : bytes <= (2 << 20)   ? 50
                                  : bytes <= (16 << 20)  ? 20
                                                         : 5;
        // Beside busy cores a call meets the scheduler's 4 ms ticks or not (0.3 or 8 ms for a 4 MiB
        // broadcast), a quarter to half of them: with 60 calls the mean moved +-20 % from run to
        // run, with 400 it moves +-5 %.
        if (loaded) iterations = std::max<std::int64_t>(iterations, 400);
        const std::string name = "BM_Collective/kind:" + std::to_string(kind) + "/bytes:" + std::to_string(bytes) +
                                 (loaded ? "/loaded" : "");
        benchmark::RegisterBenchmark(
            name.c_str(),
            [kind, bytes, loaded](benchmark::State& st) { BM_Collective(st, static_cast<Kind>(kind), bytes, loaded); })
            ->UseManualTime()
            ->Iterations(iterations)
            ->Unit(benchmark::kMicrosecond);
      }
    }
  }
}

}  // namespace

// Reports nothing: the other ranks run the same benchmarks silently.
class Quiet : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>&) override {}
};

int main(int argc, char** argv) {
  for (int i = 1; i < argc;) {
    const bool nccl = std::strcmp(argv[i], "--nccl") == 0, automatic = std::strcmp(argv[i], "--auto") == 0;
    const bool loaded = std::strcmp(argv[i], "--loaded") == 0;
    const bool max = std::strncmp(argv[i], "--max-mib=", 10) == 0;
    if (max) {
      const long mib = std::strtol(argv[i] + 10, nullptr, 10);
      if (mib < 1 || mib > 4096) {
        std::fprintf(stderr, "bench_collectives: --max-mib: '%s' is not a size in [1, 4096] MiB\n", argv[i] + 10);
        return 2;
      }
      max_bytes = static_cast<std::int64_t>(mib) << 20;
    }
    const bool listed = std::strncmp(argv[i], "--sizes=", 8) == 0;
    for (const char* at = argv[i] + 8; listed && *at != '\0';) {
      char* end = nullptr;
      const long long bytes = std::strtoll(at, &end, 10);
      if (end == at || bytes < 1 || bytes > (std::int64_t{4} << 30) || (*end != ',' && *end != '\0')) {
        std::fprintf(stderr, "bench_collectives: --sizes: '%s' is not a list of byte counts in [1, 4 GiB]\n",
                     argv[i] + 8);
        return 2;
      }
      only_sizes.push_back(bytes);
      at = *end == ',' ? end + 1 : end;
    }
    if (!nccl && !automatic && !max && !listed && !loaded) {
      ++i;
      continue;
    }
    use_nccl |= nccl;
    with_auto |= automatic;
    with_loaded |= loaded;
    for (int j = i; j + 1 < argc; ++j) argv[j] = argv[j + 1];
    --argc;
  }
  (void)comm();  // MPI (and NCCL) up before the benchmarks
  if (with_auto) {
    gc::Stream s(comm().device());
    model = comm().measure_cost_model(s);  // what all_reduce_auto will use
  }
  if (comm().rank() != 0) {
    // Only rank 0 writes --benchmark_out: the others would truncate and interleave the same file.
    int kept = 1;
    for (int i = 1; i < argc; ++i) {
      if (std::strncmp(argv[i], "--benchmark_out", 15) != 0) argv[kept++] = argv[i];
    }
    argc = kept;
  }
  benchmark::Initialize(&argc, argv);
  register_all();
  if (comm().rank() == 0) {
    benchmark::RunSpecifiedBenchmarks();
  } else {
    Quiet quiet;
    benchmark::RunSpecifiedBenchmarks(&quiet);
  }
  benchmark::Shutdown();
  stop_competitors();
  return 0;
}
