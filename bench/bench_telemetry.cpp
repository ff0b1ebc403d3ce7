// The cost of recording a step (target: under 1 us) against the same updates made directly on
// prometheus-cpp's metrics (the peer: what a trainer would write by hand), in one process.
//
//   bench_telemetry [--benchmark_filter=...]
//   mpirun -np 2 bench_telemetry   # also a record with straggler detection on, on rank 0
#include <gpucloud/gpucloud.hpp>

#include <benchmark/benchmark.h>
#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

namespace tel = gpucloud::telemetry;

static void record(benchmark::State& state) {
  tel::ExporterOptions o;
  o.port = -1;
  o.labels = {{"job", "bench"}, {"rank", "0"}};
  tel::Exporter exporter(o);
  tel::StepMetrics& steps = exporter.steps();
  tel::StepRecord r{0.012, 256, 0.001, 0.002, 65536, 0};
  for (auto _ : state) {
    steps.record(r);
    benchmark::ClobberMemory();
  }
  state.counters["ns_per_record"] = benchmark::Counter(static_cast<double>(state.iterations()),
                                                       benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(record)->Name("gpucloud_StepMetrics_record");

// The same seven updates on prometheus-cpp directly: histogram, four counters, two gauges.
static void prometheus_direct(benchmark::State& state) {
  prometheus::Registry registry;
  const prometheus::Labels labels{{"job", "bench"}, {"rank", "0"}};
  auto& hist = prometheus::BuildHistogram().Name("h").Labels(labels).Register(registry).Add(
      {}, prometheus::Histogram::BucketBoundaries{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5,
                                                  10, 30, 60});
  auto counter = [&](const char* n) -> prometheus::Counter& {
    return prometheus::BuildCounter().Name(n).Labels(labels).Register(registry).Add({});
  };
  auto gauge = [&](const char* n) -> prometheus::Gauge& {
    return prometheus::BuildGauge().Name(n).Labels(labels).Register(registry).Add({});
  };
  auto &steps = counter("s"), &samples = counter("n"), &wait = counter("w"), &comm = counter("c");
  auto &rate = gauge("r"), &scale = gauge("l");
  for (auto _ : state) {
    hist.Observe(0.012);
    steps.Increment();
    samples.Increment(256);
    rate.Set(256 / 0.012);
    wait.Increment(0.001);
    comm.Increment(0.002);
    scale.Set(65536);
    benchmark::ClobberMemory();
  }
  state.counters["ns_per_record"] = benchmark::Counter(static_cast<double>(state.iterations()),
                                                       benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(prometheus_direct)->Name("prometheus_cpp_direct_same_updates");

// Under mpirun: the same record with straggler detection on (every 50 steps, as the examples), so
// every record also reads the channel (on rank 0: one poll(2) over every other rank's socket).
// The other ranks record a step every millisecond meanwhile and stop at a barrier rank 0 joins last.
static int run_detecting() {
  gpucloud::Communicator comm = gpucloud::Communicator::mpi_world();
  gpucloud::Stream stream(gpucloud::Device::host());
  tel::ExporterOptions o;
  o.port = -1;
  tel::Exporter exporter(o);
  exporter.detect_stragglers(comm, stream, {50, 0.2});
  tel::StepMetrics& steps = exporter.steps();
  const tel::StepRecord r{0.012, 256, 0.001, 0.002, 65536, 0};
  if (comm.rank() == 0) {
    benchmark::RegisterBenchmark(("gpucloud_StepMetrics_record_detecting_np" + std::to_string(comm.size())).c_str(),
                                 [&](benchmark::State& state) {
                                   for (auto _ : state) {
                                     steps.record(r);
                                     benchmark::ClobberMemory();
                                   }
                                   state.counters["ns_per_record"] =
                                       benchmark::Counter(static_cast<double>(state.iterations()),
                                                          benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
                                 });
    benchmark::RunSpecifiedBenchmarks();
    comm.barrier(stream);
    stream.synchronize();
  } else {
    comm.barrier(stream);
    gpucloud::Event done(gpucloud::Device::host());
    done.record(stream);
    while (!done.query()) {
      steps.record(r);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  return 0;
}

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  const char* ranks = std::getenv("OMPI_COMM_WORLD_SIZE");
  if (ranks != nullptr && std::atoi(ranks) > 1) return run_detecting();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
