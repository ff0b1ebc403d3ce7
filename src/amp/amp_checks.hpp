// Internal: argument checks shared by the loss scaler and the optimizers (not API).
#pragma once

#include <gpucloud/memory/buffer.hpp>
#include <gpucloud/runtime/error.hpp>
#include <gpucloud/runtime/stream.hpp>

#include "memory/access.hpp"

#include <string>

namespace gpucloud::detail {

/// fp32, fp16 or bf16, memory the stream's kernels can reach. @throws InvalidArgument naming @p what.
inline void check_float_tensor(BufferView v, StreamView s, const char* call, const std::string& what) {
  GPUCLOUD_EXPECTS(v.dtype() == DType::float32 || v.dtype() == DType::float16 || v.dtype() == DType::bfloat16, call,
                   what + ": dtype " + dtype_name(v.dtype()) + " is not float32, float16 or bfloat16");
  check_access(v, s, Access::kernel, call, what.c_str());
}

/// A finite number in [lo, hi] (or (lo, hi] when @p open_low). @throws InvalidArgument.
inline void check_range(double x, double lo, double hi, bool open_low, const char* call, const char* name) {
  const bool ok = x == x && (open_low ? x > lo : x >= lo) && x <= hi;
  GPUCLOUD_EXPECTS(ok, call,
                   std::string(name) + ": " + std::to_string(x) + " is not in " + (open_low ? "(" : "[") +
                       std::to_string(lo) + ", " + std::to_string(hi) + "]");
}

}  // namespace gpucloud::detail
