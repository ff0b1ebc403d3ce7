// Internal: what every CUDA backend stand-in raises in a build without CUDA (defined in
// runtime_disabled.cpp; not API).
#pragma once

namespace gpucloud::detail::cuda {

/// Why no CUDA device can be used in this build.
inline constexpr const char* kBuiltWithoutCuda =
    "gpucloud was built without CUDA (GPUCLOUD_CUDA=OFF or no toolkit found)";

/// @throws Unsupported naming @p call: the library was built without CUDA.
[[noreturn]] void unavailable(const char* call);

}  // namespace gpucloud::detail::cuda
