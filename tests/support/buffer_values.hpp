// Test support: values into a buffer on any device and back, as their bytes (upload, download)
// or as floats rounded to and widened from any float dtype (make, write, read).
#pragma once

#include <gpucloud/compute/cast.hpp>
#include <gpucloud/memory/buffer.hpp>
#include <gpucloud/movement/copy.hpp>
#include <gpucloud/runtime/stream.hpp>

#include <cstring>
#include <vector>

namespace gpucloud::testing {

/// @p v's bytes as @p dtype (by default T's) in a new device buffer of @p d; synchronises @p s.
template <class T>
Buffer upload(const std::vector<T>& v, Device d, StreamView s, DType dtype = dtype_of<T>()) {
  Buffer staging(v.size(), dtype, Device::host(), MemoryKind::pinned);
  if (!v.empty()) std::memcpy(staging.data(), v.data(), v.size() * sizeof(T));
  Buffer out(v.size(), dtype, d, MemoryKind::device);
  copy(out, staging, s);
  s.synchronize();
  return out;
}

/// The elements of @p v (any device) as T, bytes unconverted; synchronises @p s.
template <class T>
std::vector<T> download(BufferView v, StreamView s) {
  Buffer staging(v.size(), v.dtype(), Device::host(), MemoryKind::pinned);
  copy(staging, v, s);
  s.synchronize();
  std::vector<T> out(v.size());
  if (!out.empty()) std::memcpy(out.data(), staging.data(), out.size() * sizeof(T));
  return out;
}

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

/// @p values rounded into @p dst's float dtype (any device); synchronises @p s.
inline void write(BufferView dst, const std::vector<float>& values, StreamView s) {
  Buffer f = upload(values, dst.device(), s);
  cast(dst, f, s);
  s.synchronize();
}

}  // namespace gpucloud::testing
