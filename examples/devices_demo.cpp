// Lists the devices gpucloud sees, then exercises streams, events and memory on each: a copy
// pipeline over two streams ordered by events, a pool that reuses blocks, and a dtype cast.
// This is the README's first command until the training example lands.
#include <gpucloud/gpucloud.hpp>

#include <cstdio>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

namespace gc = gpucloud;

namespace {

void exercise(gc::Device device) {
  const auto props = gc::device_properties(device);
  std::printf("\n== %s: %s\n", device.str().c_str(), props.name.c_str());
  std::printf("   memory %.1f GiB, %d %s, compute capability %d.%d, concurrent managed access %s\n",
              static_cast<double>(props.total_memory) / (1 << 30), props.multiprocessor_count,
              device.is_host() ? "hardware threads" : "SMs", props.compute_capability_major,
              props.compute_capability_minor, props.concurrent_managed_access ? "yes" : "no");
  // Its load and health now (NVML on a GPU, /proc on the host): what nvidia-smi would show.
  const gc::DeviceMetrics m = gc::read_metrics(device);
  auto figure = [](const std::optional<double>& v, const char* unit) {
    char text[32];
    std::snprintf(text, sizeof text, v ? "%.0f%s" : "-", v ? *v : 0.0, unit);
    return std::string(text);
  };
  std::printf("   now (%s): util %s, memory %.1f of %.1f GiB used, %s, %s, clock %s\n", m.source.c_str(),
              figure(m.utilization, "%").c_str(), static_cast<double>(m.memory_used) / (1 << 30),
              static_cast<double>(m.memory_total) / (1 << 30), figure(m.temperature_c, " C").c_str(),
              figure(m.power_w, " W").c_str(), figure(m.clock_mhz, " MHz").c_str());
  if (device.is_cuda() && !gc::nvml_unavailable_reason().empty()) {
    std::printf("   NVML: %s\n", gc::nvml_unavailable_reason().c_str());
  }

  // Upload on a copy stream, compute (a cast) on a compute stream once the upload's event fires.
  gc::Stream copy_stream(device), compute_stream(device);
  gc::Event uploaded(device);
  gc::TimedEvent start(device), done(device);
  constexpr std::size_t n = 1 << 22;
  gc::TypedBuffer<float> host_in(n, gc::Device::host(), gc::MemoryKind::pinned);
  std::iota(host_in.begin(), host_in.end(), 0.0f);

  gc::PlainResource plain(gc::MemoryKind::device, device);
  gc::StatisticsAdaptor stats(plain);
  gc::PoolResource pool(stats);
  gc::TypedBuffer<float> on_device(n, device, gc::MemoryKind::device, copy_stream, pool);
  gc::TypedBuffer<gc::Half> halves(n, device, gc::MemoryKind::device, compute_stream, pool);
  gc::TypedBuffer<gc::Half> host_out(n, gc::Device::host(), gc::MemoryKind::pinned);

  start.record(copy_stream);
  gc::copy(on_device, host_in, copy_stream);
  uploaded.record(copy_stream);
  compute_stream.wait(uploaded);
  gc::cast(halves, on_device, compute_stream);
  gc::copy(host_out, halves, compute_stream);
  done.record(compute_stream);
  done.synchronize();

  std::size_t wrong = 0;
  for (std::size_t i = 0; i < n; ++i) wrong += host_out[i].bits != gc::Half(host_in[i]).bits;
  const float ms = gc::elapsed_ms(start, done);
  std::printf("   upload %zu floats, cast to float16 on a second stream, download: %.2f ms, %zu wrong\n", n, ms, wrong);

  const auto s = stats.statistics();
  std::printf("   pool: %zu bytes held upstream in %zu allocations (peak %zu)\n", pool.pool_bytes(),
              s.total_allocations, s.peak_bytes);
  if (wrong != 0) throw gc::Error("devices_demo", "the round trip produced wrong values", __FILE__, __LINE__);
}

}  // namespace

int main() {
  const auto info = gc::build_info();
  std::printf("gpucloud %s, CUDA backend: %s", info.version.c_str(), info.cuda ? "built" : "not built");
  if (info.cuda)
    std::printf(" (runtime %d, architectures %s)", info.cuda_runtime_version, info.cuda_architectures.c_str());
  std::printf("\n");
  if (gc::cuda_device_count() == 0) std::printf("no CUDA device: %s\n", gc::cuda_unavailable_reason().c_str());
  try {
    for (gc::Device d : gc::available_devices()) exercise(d);
  } catch (const gc::Error& e) {
    std::fprintf(stderr, "devices_demo failed: %s\n", e.what());
    return 1;
  }
  std::printf("\nall devices ok\n");
  return 0;
}
