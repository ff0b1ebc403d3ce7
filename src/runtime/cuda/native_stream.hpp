// Internal: the cudaStream_t behind a stream (CUDA builds only; not API). The one place the
// library turns a stream into its native handle.
#pragma once

#include <gpucloud/runtime/stream.hpp>

#include "runtime/stream_impl.hpp"

#include <cuda_runtime_api.h>

namespace gpucloud::detail::cuda {

/// The cudaStream_t of a CUDA stream.
inline cudaStream_t native(StreamImpl& stream) noexcept { return static_cast<cudaStream_t>(stream.native_handle()); }
/// The cudaStream_t of a CUDA stream.
inline cudaStream_t native(StreamView stream) noexcept { return native(*stream.impl()); }

}  // namespace gpucloud::detail::cuda
