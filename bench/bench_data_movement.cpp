// Data movement: copy bandwidth (pageable vs pinned, per direction) and the copy pipeline's
// overlap efficiency against the serial copy-then-compute baseline, on every available device.
//
// Definitions (ARCHITECTURE.md): GB/s per direction = bytes / time; overlap efficiency =
// (copy time + compute time) / pipelined time: 1 means no overlap, the number of stages (2 for
// upload + compute) means perfect overlap. Times are event-timed on the stream.
#include <gpucloud/gpucloud.hpp>

#include <benchmark/benchmark.h>

#include "timing.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

namespace gc = gpucloud;

namespace {

gc::Device device_of(int index) { return index == 0 ? gc::Device::host() : gc::Device::cuda(0); }

// args: device (0 host, 1 cuda:0), bytes, pinned (0/1), direction (0 h2d, 1 d2h)
void BM_Copy(benchmark::State& state) {
  const gc::Device device = device_of(static_cast<int>(state.range(0)));
  const auto bytes = static_cast<std::size_t>(state.range(1));
  const auto kind = state.range(2) ? gc::MemoryKind::pinned : gc::MemoryKind::host;
  const bool h2d = state.range(3) == 0;
  gc::Stream s(device);
  gc::Buffer host(bytes, gc::DType::uint8, gc::Device::host(), kind);
  gc::Buffer dev(bytes, gc::DType::uint8, device);
  // Both sides written before timing: a never-written source reads the kernel's shared zero page
  // and reports more than memory can deliver.
  std::memset(host.data(), 1, bytes);
  gc::fill_integer(dev, 2, s);
  s.synchronize();
  if (device.is_host()) {
    // The peer on the host is memcpy of the same bytes between the same buffers, run alternately
    // with gpucloud's copy in every iteration; both timed by the caller's wall clock around the
    // call and its completion (gpucloud's includes the hand-off to the stream's worker).
    void* dst = h2d ? dev.data() : host.data();
    const void* src = h2d ? host.data() : dev.data();
    gc::copy(h2d ? dev.view() : host.view(), h2d ? host.view() : dev.view(), s);  // warm-up
    s.synchronize();
    const gc::bench::Alternated t = gc::bench::alternate_timed(
        state,
        [&] {
          gc::copy(h2d ? dev.view() : host.view(), h2d ? host.view() : dev.view(), s);
          s.synchronize();
        },
        [&] { std::memcpy(dst, src, bytes); });
    const double ours = t.ours, theirs = t.theirs;
    state.counters["memcpy_GBps"] = static_cast<double>(bytes) * static_cast<double>(state.iterations()) / theirs / 1e9;
    state.counters["ratio_vs_memcpy"] = theirs / ours;
  } else {
    gc::bench::run_timed(state, s, [&] { h2d ? gc::copy(dev, host, s) : gc::copy(host, dev, s); });
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(bytes));
  state.SetLabel(device.str() + (kind == gc::MemoryKind::pinned ? " pinned " : " pageable ") + (h2d ? "H2D" : "D2H"));
}

// The "compute" of a chunk: a real kernel (fp32 -> fp16 cast) on each chunk, on its stream.
void compute_chunk(const gc::Chunk& c, gc::BufferView scratch) {
  gc::cast(scratch.slice(c.offset, c.data.size()), c.data, c.stream);
}

// args: device, bytes. The same 16 chunks four ways, each event-timed on one caller stream:
// copy only and compute only (one stream), serial (copy, compute, copy, compute... on one stream:
// the copy-then-compute baseline) and pipelined (depth 3).
void BM_PipelineOverlap(benchmark::State& state) {
  const gc::Device device = device_of(static_cast<int>(state.range(0)));
  const auto bytes = static_cast<std::size_t>(state.range(1));
  const std::size_t n = bytes / sizeof(float);
  const std::size_t chunk_bytes = std::max<std::size_t>(bytes / 16, 1 << 16);
  gc::Stream s(device);
  gc::TypedBuffer<float> host(n, gc::Device::host(), gc::MemoryKind::pinned);
  std::memset(host.data(), 0, bytes);
  gc::TypedBuffer<float> dev(n, device);
  gc::TypedBuffer<gc::Half> scratch(n, device);
  gc::CopyPipeline serial(device, {chunk_bytes, 1}), piped(device, {chunk_bytes, 3});
  auto step = [&](const gc::Chunk& c) { compute_chunk(c, scratch); };
  auto time_of = [&](auto&& work) { return gc::bench::time_ms(s, work); };
  const std::size_t chunk = chunk_bytes / sizeof(float);
  double copy_ms = 0, compute_ms = 0, serial_ms = 0, piped_ms = 0;
  for (auto _ : state) {
    copy_ms = time_of([&] { serial.upload(dev, host, s); });
    compute_ms = time_of([&] {
      for (std::size_t i = 0; i * chunk < n; ++i) {
        const std::size_t len = std::min(chunk, n - i * chunk);
        compute_chunk(gc::Chunk{i, i * chunk, gc::BufferView(dev).slice(i * chunk, len), s}, scratch);
      }
    });
    serial_ms = time_of([&] { serial.upload(dev, host, s, step); });
    piped_ms = time_of([&] { piped.upload(dev, host, s, step); });
    state.SetIterationTime(piped_ms / 1e3);
  }
  state.counters["copy_ms"] = copy_ms;
  state.counters["compute_ms"] = compute_ms;
  state.counters["serial_ms"] = serial_ms;
  state.counters["pipelined_ms"] = piped_ms;
  state.counters["overlap_efficiency"] = (copy_ms + compute_ms) / piped_ms;
  state.counters["speedup_vs_serial"] = serial_ms / piped_ms;
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(bytes));
  state.SetLabel(device.str() + " depth 3, 16 chunks");
}

void copy_args(benchmark::internal::Benchmark* b) {
  const int devices = gc::cuda_device_count() > 0 ? 2 : 1;
  const std::int64_t max_bytes = gc::cuda_device_count() > 0 ? (std::int64_t{1} << 30) : (std::int64_t{256} << 20);
  for (int d = 0; d < devices; ++d) {
    for (std::int64_t bytes = 1 << 20; bytes <= max_bytes; bytes *= 4) {
      for (int pinned : {0, 1}) {
        for (int dir : {0, 1}) b->Args({d, bytes, pinned, dir});
      }
    }
  }
  b->ArgNames({"device", "bytes", "pinned", "d2h"})->UseManualTime()->Unit(benchmark::kMillisecond);
}

void overlap_args(benchmark::internal::Benchmark* b) {
  const int devices = gc::cuda_device_count() > 0 ? 2 : 1;
  for (int d = 0; d < devices; ++d) {
    for (std::int64_t bytes : {std::int64_t{1} << 20, std::int64_t{64} << 20, std::int64_t{256} << 20})
      b->Args({d, bytes});
  }
  b->ArgNames({"device", "bytes"})->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(3);
}

}  // namespace

BENCHMARK(BM_Copy)->Apply(copy_args);
BENCHMARK(BM_PipelineOverlap)->Apply(overlap_args);
BENCHMARK_MAIN();
