// The CUDA backend's stand-in for builds without CUDA: no devices, and a clear error from
// every entry point (which the public layer never reaches, since no CUDA Device exists).
#include <gpucloud/error.hpp>

#include "detail/cuda_backend.hpp"

namespace gpucloud::detail::cuda {
namespace {
[[noreturn]] void unavailable(const char* call) {
  GPUCLOUD_FAIL(Unsupported, call, "gpucloud was built without CUDA (GPUCLOUD_CUDA=OFF or no toolkit found)");
}
}  // namespace

bool built() noexcept { return false; }
int runtime_version() noexcept { return 0; }
int device_count(std::string& reason) noexcept {
  reason = "gpucloud was built without CUDA (GPUCLOUD_CUDA=OFF or no toolkit found)";
  return 0;
}
DeviceProperties properties(int) { unavailable("device_properties"); }
MemoryInfo memory_info(int) { unavailable("memory_info"); }
std::unique_ptr<StreamImpl> make_stream(int) { unavailable("Stream"); }
std::unique_ptr<EventImpl> make_event(int, bool) { unavailable("Event"); }
void* allocate(MemoryKind, std::size_t, int) { unavailable("allocate"); }
void deallocate(MemoryKind, void*, int) noexcept {}
void* allocate_async(std::size_t, int, StreamImpl*) { unavailable("allocate"); }
void deallocate_async(void*, int, StreamImpl*) noexcept {}
void memcpy_async(void*, const void*, std::size_t, StreamImpl&) { unavailable("copy"); }
void prefetch(const void*, std::size_t, Device, StreamImpl&) { unavailable("prefetch"); }
void advise(const void*, std::size_t, MemoryAdvice, Device) { unavailable("advise"); }
PointerInfo pointer_info(const void*) { return PointerInfo{}; }
void cast(BufferView, BufferView, StreamImpl&) { unavailable("cast"); }
void fill(BufferView, double, StreamImpl&) { unavailable("fill"); }

}  // namespace gpucloud::detail::cuda
