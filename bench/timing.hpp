// Event timing shared by the benchmarks: what a stream took for a piece of enqueued work.
#pragma once

#include <gpucloud/event.hpp>
#include <gpucloud/stream.hpp>

#include <benchmark/benchmark.h>

namespace gpucloud::bench {

/// Milliseconds the stream spent on @p work (which enqueues on @p s), after one warm-up run.
template <class Work>
double time_ms(Stream& s, Work&& work) {
  Event a(s.device()), b(s.device());
  work();  // warm-up: first touch, pool growth, plan caches
  s.synchronize();
  a.record(s);
  work();
  b.record(s);
  b.synchronize();
  return elapsed_ms(a, b);
}

/// Google Benchmark manual time: every iteration event-timed on @p s.
template <class Work>
void run_timed(benchmark::State& state, Stream& s, Work&& work) {
  Event a(s.device()), b(s.device());
  work();
  s.synchronize();
  for (auto _ : state) {
    a.record(s);
    work();
    b.record(s);
    b.synchronize();
    state.SetIterationTime(static_cast<double>(elapsed_ms(a, b)) / 1e3);
  }
}

}  // namespace gpucloud::bench
