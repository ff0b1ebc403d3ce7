// Event timing shared by the benchmarks: what a stream took for a piece of enqueued work.
#pragma once

#include <gpucloud/monitor/monitor.hpp>
#include <gpucloud/runtime/device.hpp>
#include <gpucloud/runtime/event.hpp>
#include <gpucloud/runtime/gpu_specs.hpp>
#include <gpucloud/runtime/stream.hpp>

#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <optional>

namespace gpucloud::bench {

/// Milliseconds the stream spent on @p work (which enqueues on @p s), after one warm-up run.
template <class Work>
double time_ms(Stream& s, Work&& work) {
  TimedEvent a(s.device()), b(s.device());
  work();  // warm-up: first touch, pool growth, plan caches
  s.synchronize();
  a.record(s);
  work();
  b.record(s);
  b.synchronize();
  return elapsed_ms(a, b);
}

/// The machine's one-minute load average (/proc/loadavg; 0 where there is none): recorded beside
/// every figure as the counter "loadavg", so a result from a busy machine says so.
inline double load_average() {
  double one = 0;
  if (std::FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &one) != 1) one = 0;
    std::fclose(f);
  }
  return one;
}

/// Seconds in all of ours() and of theirs(), run alternately in every iteration (ours first),
/// each by the caller's wall clock; ours' time is the iteration's manual time. A host-side peer
/// (memcpy, a direct BLAS call) against gpucloud's call + synchronize, under the same load.
struct Alternated {
  double ours = 0, theirs = 0;
};
template <class Ours, class Theirs>
Alternated alternate_timed(benchmark::State& state, Ours&& ours, Theirs&& theirs) {
  Alternated t;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    ours();
    const auto t1 = std::chrono::steady_clock::now();
    theirs();
    benchmark::ClobberMemory();
    const auto t2 = std::chrono::steady_clock::now();
    const double mine = std::chrono::duration<double>(t1 - t0).count();
    t.ours += mine;
    t.theirs += std::chrono::duration<double>(t2 - t1).count();
    state.SetIterationTime(mine);
  }
  state.counters["loadavg"] = load_average();
  return t;
}

/// Google Benchmark manual time: one warm-up, then every iteration event-timed on @p s.
/// Returns the mean milliseconds per iteration. On a GPU, also the board's mean power and
/// utilisation while the iterations ran (NVML, sampled every 50 ms; NVML averages power over up to
/// a second, so short cases read approximately) as the counters "watts" and "util_pct".
template <class Work>
double run_timed(benchmark::State& state, Stream& s, Work&& work) {
  TimedEvent a(s.device()), b(s.device());
  work();
  s.synchronize();
  std::optional<MetricsMonitor> monitor;
  if (s.device().is_cuda()) monitor.emplace(s.device(), std::chrono::milliseconds(50));
  double total = 0;
  std::int64_t n = 0;
  for (auto _ : state) {
    a.record(s);
    work();
    b.record(s);
    b.synchronize();
    const double ms = static_cast<double>(elapsed_ms(a, b));
    state.SetIterationTime(ms / 1e3);
    total += ms;
    ++n;
  }
  state.counters["loadavg"] = load_average();
  if (monitor) {
    const MetricsSummary m = monitor->summary();
    if (m.power_w.count > 0) state.counters["watts"] = m.power_w.mean;
    if (m.utilization.count > 0) state.counters["util_pct"] = m.utilization.mean;
  }
  return n > 0 ? total / static_cast<double>(n) : 0.0;
}

/// Sets the "TFLOPs" counter; with a "watts" counter, "GFLOPs_per_J" (energy efficiency); and on a
/// GPU of the spec table "pct_of_peak": the rate as a percentage of the spec sheet's dense peak in
/// @p precision (GPU_SPECS.md).
inline void report_tflops(benchmark::State& state, Device device, Precision precision, double flops, double ms) {
  const double tflops = flops / (ms * 1e-3) / 1e12;
  state.counters["TFLOPs"] = tflops;
  if (const auto w = state.counters.find("watts"); w != state.counters.end() && w->second.value > 0) {
    state.counters["GFLOPs_per_J"] = tflops * 1e3 / w->second.value;
  }
  if (!device.is_cuda()) return;
  if (auto spec = find_gpu_spec(device_properties(device).name)) {
    const double peak = peak_tflops(*spec, precision);
    if (peak > 0) state.counters["pct_of_peak"] = 100.0 * tflops / peak;
  }
}

}  // namespace gpucloud::bench
