// Internal: what the host backend's oneDNN paths (the bf16 GEMM, the convolutions) share: the one
// CPU engine, and oneDNN's errors as gpucloud's typed ones. Include only where
// GPUCLOUD_WITH_ONEDNN (not API).
#pragma once

#include <gpucloud/runtime/error.hpp>

#include <oneapi/dnnl/dnnl.hpp>

namespace gpucloud::detail {

/// The process's oneDNN CPU engine.
inline const dnnl::engine& onednn_engine() {
  static const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

/// @p e from oneDNN's @p call as OutOfMemory (allocation failed) or DeviceError, raised at file:line.
[[noreturn]] inline void throw_onednn_error(const char* call, const dnnl::error& e, const char* file, int line) {
  if (e.status == dnnl_out_of_memory) throw OutOfMemory(call, e.what(), 0, file, line);
  throw DeviceError(call, e.what(), /*sticky=*/false, file, line);
}

}  // namespace gpucloud::detail
