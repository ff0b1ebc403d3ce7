// Test support: float values into a buffer of any float dtype on any device, and back.
#pragma once

#include <gpucloud/compute/cast.hpp>
#include <gpucloud/memory/buffer.hpp>
#include <gpucloud/movement/copy.hpp>
#include <gpucloud/runtime/stream.hpp>

#include <cstring>
#include <vector>

namespace gpucloud::testing {

/// @p v rounded to @p t in a new device buffer of @p d, through a float32 staging buffer.
inline Buffer make(const std::vector<float>& v, DType t, Device d, StreamView s) {
  Buffer staging(v.size(), DType::float32, Device::host(), MemoryKind::pinned);
  if (!v.empty()) std::memcpy(staging.data(), v.data(), v.size() * 4);
  Buffer f(v.size(), DType::float32, d, MemoryKind::device);
  copy(f, staging, s);
  Buffer out(v.size(), t, d, MemoryKind::device);
  cast(out, f, s);
  s.synchronize();
  return out;
}

/// The values of @p v (any float dtype, any device) as floats; synchronises @p s.
inline std::vector<float> read(BufferView v, StreamView s) {
  Buffer f(v.size(), DType::float32, v.device(), MemoryKind::device);
  cast(f, v, s);
  Buffer staging(v.size(), DType::float32, Device::host(), MemoryKind::pinned);
  copy(staging, f, s);
  s.synchronize();
  const float* p = staging.data_as<float>();
  return std::vector<float>(p, p + v.size());
}

}  // namespace gpucloud::testing
