// The runtime's CUDA backend stand-in for builds without CUDA: no devices, and a clear error from
// every entry point (which the public layer never reaches, since no CUDA Device exists). Each
// capability's stand-ins are beside its own CUDA backend.
#include <gpucloud/runtime/error.hpp>

#include "runtime/cuda/runtime_backend.hpp"
#include "runtime/cuda/unavailable.hpp"

namespace gpucloud::detail::cuda {
[[noreturn]] void unavailable(const char* call) { GPUCLOUD_FAIL(Unsupported, call, kBuiltWithoutCuda); }

bool built() noexcept { return false; }
int runtime_version() noexcept { return 0; }
int device_count(std::string& reason) noexcept {
  reason = kBuiltWithoutCuda;
  return 0;
}
DeviceProperties properties(int) { unavailable("device_properties"); }
MemoryInfo memory_info(int) { unavailable("memory_info"); }
std::unique_ptr<StreamImpl> make_stream(int) { unavailable("Stream"); }
std::unique_ptr<StreamImpl> adopt_stream(int, void*) { unavailable("Stream::from_native"); }
std::unique_ptr<EventImpl> make_event(int, bool) { unavailable("Event"); }

}  // namespace gpucloud::detail::cuda
