// The MPI backend's reduction (and an average's division), one typed loop per dtype and op, vectorised (`omp simd`,
// built with -fopenmp-simd like the other host array loops) and compiled for AVX-512, AVX2 and the baseline
// (GPUCLOUD_HOST_CLONES). Written out rather than left to the compiler: GCC's -O2 cost model does
// not vectorise a plain loop that needs a remainder, so it would reduce one element at a time.
#include "comm/host_reduce.hpp"

#include "kernels/compute/host_convert.hpp"

#include "runtime/host/target_clones.hpp"

#include <cstring>
#include <type_traits>

namespace gpucloud::detail {

namespace {

// T is the element type as stored; arithmetic in T, or in fp32 for Half and BFloat16. Loads and
// stores through memcpy: a segment of a user's buffer need not be aligned to T.
template <class T, class Op>
GPUCLOUD_ALWAYS_INLINE void reduce_loop(const unsigned char* partial, const unsigned char* mine, unsigned char* out,
                                        std::int64_t n, Op op) {
  constexpr std::int64_t size = sizeof(T);
  _Pragma("omp simd") for (std::int64_t i = 0; i < n; ++i) {
    T a, b;
    std::memcpy(&a, partial + i * size, sizeof(T));
    std::memcpy(&b, mine + i * size, sizeof(T));
    T r;
    if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
      r = kernels::host::narrow<T>(op(kernels::host::widen(a), kernels::host::widen(b)));
    } else {
      r = op(a, b);
    }
    std::memcpy(out + i * size, &r, sizeof(T));
  }
}

template <class Op>
GPUCLOUD_ALWAYS_INLINE void reduce_typed(const unsigned char* partial, const unsigned char* mine, unsigned char* out,
                                         std::int64_t n, DType t, Op op) {
  switch (t) {
    case DType::float32:
      return reduce_loop<float>(partial, mine, out, n, op);
    case DType::float64:
      return reduce_loop<double>(partial, mine, out, n, op);
    case DType::int32:
      return reduce_loop<std::int32_t>(partial, mine, out, n, op);
    case DType::int64:
      return reduce_loop<std::int64_t>(partial, mine, out, n, op);
    case DType::float16:
      return reduce_loop<Half>(partial, mine, out, n, op);
    case DType::bfloat16:
      return reduce_loop<BFloat16>(partial, mine, out, n, op);
    default:
      return;
  }
}

template <class T>
GPUCLOUD_ALWAYS_INLINE void divide_loop(unsigned char* data, std::int64_t n, double inv) {
  constexpr std::int64_t size = sizeof(T);
  _Pragma("omp simd") for (std::int64_t i = 0; i < n; ++i) {
    T v;
    std::memcpy(&v, data + i * size, sizeof(T));
    if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
      v = kernels::host::narrow<T>(static_cast<float>(kernels::host::widen(v) * inv));
    } else {
      v = static_cast<T>(v * inv);
    }
    std::memcpy(data + i * size, &v, sizeof(T));
  }
}

}  // namespace

GPUCLOUD_HOST_CLONES void divide_elements(unsigned char* data, std::int64_t n, DType t, int size) {
  const double inv = 1.0 / size;
  switch (t) {
    case DType::float32:
      return divide_loop<float>(data, n, inv);
    case DType::float64:
      return divide_loop<double>(data, n, inv);
    case DType::float16:
      return divide_loop<Half>(data, n, inv);
    case DType::bfloat16:
      return divide_loop<BFloat16>(data, n, inv);
    default:
      return;
  }
}

GPUCLOUD_HOST_CLONES void reduce_elements(const unsigned char* partial, const unsigned char* mine, unsigned char* out,
                                          std::int64_t n, DType t, ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::average:
      return reduce_typed(partial, mine, out, n, t, [](auto x, auto y) {
        using T = decltype(x);
        if constexpr (std::is_integral_v<T>) {  // wraps, as MPI_SUM does (signed overflow is undefined)
          using U = std::make_unsigned_t<T>;
          return static_cast<T>(static_cast<U>(x) + static_cast<U>(y));
        } else {
          return x + y;
        }
      });
    case ReduceOp::max:
      return reduce_typed(partial, mine, out, n, t, [](auto x, auto y) { return x > y ? x : y; });
    case ReduceOp::min:
      return reduce_typed(partial, mine, out, n, t, [](auto x, auto y) { return x < y ? x : y; });
  }
}

}  // namespace gpucloud::detail
