// Uses the library the way a downstream trainer would: a stream, buffers, a copy.
#include <gpucloud/gpucloud.hpp>

#include <cstdio>

int main() {
  gpucloud::Stream stream;
  gpucloud::TypedBuffer<float> a(1000, gpucloud::Device::host(), gpucloud::MemoryKind::pinned);
  gpucloud::TypedBuffer<float> b(1000);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i);
  gpucloud::copy(b, a, stream);
  stream.synchronize();
  for (std::size_t i = 0; i < b.size(); ++i) {
    if (b[i] != a[i]) {
      std::printf("consumer: mismatch at %zu\n", i);
      return 1;
    }
  }
  std::printf("consumer ok: gpucloud %s, %zu device(s)\n", gpucloud::build_info().version.c_str(),
              gpucloud::available_devices().size());
  return 0;
}
