// Runtime dtype -> compile-time element type dispatch, shared by host and CUDA launchers.
#pragma once

#include <gpucloud/runtime/dtype.hpp>

#include <cstdint>

namespace gpucloud::kernels {

/// A value that carries an element type.
template <class T>
struct TypeTag {
  using type = T;
};

/// Calls @p f(TypeTag<T>{}) with T the element type of @p t.
template <class F>
decltype(auto) dispatch_dtype(DType t, F&& f) {
  switch (t) {
    case DType::float32:
      return f(TypeTag<float>{});
    case DType::float64:
      return f(TypeTag<double>{});
    case DType::float16:
      return f(TypeTag<Half>{});
    case DType::bfloat16:
      return f(TypeTag<BFloat16>{});
    case DType::int32:
      return f(TypeTag<std::int32_t>{});
    case DType::int64:
      return f(TypeTag<std::int64_t>{});
    case DType::uint8:
      return f(TypeTag<std::uint8_t>{});
    case DType::float8_e4m3:
      return f(TypeTag<Float8E4M3>{});
    case DType::float8_e5m2:
      return f(TypeTag<Float8E5M2>{});
  }
  return f(TypeTag<std::uint8_t>{});  // unreachable for valid dtypes
}

}  // namespace gpucloud::kernels
