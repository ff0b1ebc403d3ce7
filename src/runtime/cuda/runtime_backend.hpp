// Internal: the runtime's CUDA backend, devices, streams and events (src/runtime/cuda/runtime_backend.cpp),
// or its stand-in when the library is built without CUDA (runtime_disabled.cpp). Each capability
// above declares its own CUDA backend in its own cuda/ folder. Not API.
#pragma once

#include <gpucloud/runtime/device.hpp>

#include "runtime/stream_impl.hpp"

#include <memory>
#include <string>

namespace gpucloud::detail::cuda {

/// True when the library was built with the CUDA backend.
bool built() noexcept;
/// CUDART_VERSION the library was built against, or 0.
int runtime_version() noexcept;
/// Visible devices; on failure 0 and the reason in @p reason. Never throws.
int device_count(std::string& reason) noexcept;
/// cudaGetDeviceProperties of @p device, in the library's terms.
DeviceProperties properties(int device);
/// cudaMemGetInfo of @p device.
MemoryInfo memory_info(int device);

/// A new non-blocking stream on @p device.
std::unique_ptr<StreamImpl> make_stream(int device);
/// A stream over the caller's cudaStream_t @p native of @p device, which it does not destroy.
std::unique_ptr<StreamImpl> adopt_stream(int device, void* native);
/// A new event on @p device (@p timing: it can time).
std::unique_ptr<EventImpl> make_event(int device, bool timing);

}  // namespace gpucloud::detail::cuda
