// CUDA launchers for cast and fill: the same bodies the host backend runs (src/compute/cast.cpp).
#include "kernels/compute/cast_body.hpp"
#include "kernels/launch/dispatch.hpp"
#include "runtime/cuda/launch.cuh"

#include "compute/cuda/cast_backend.hpp"
#include "runtime/cuda/cuda_check.hpp"

#include <cuda_runtime_api.h>

namespace gpucloud::detail::cuda {

namespace {
template <class Body>
void launch(const Body& body, std::size_t n, StreamImpl& stream) {
  launch_body(body, kernels::elementwise_grid(n), stream);
}

// @p value (double or int64) converted once to dst's dtype on the host, written by the body.
template <class Value>
void fill_with(BufferView dst, Value value, StreamImpl& stream) {
  kernels::dispatch_dtype(dst.dtype(), [&](auto tag) {
    using Dst = typename decltype(tag)::type;
    launch(kernels::FillBody<Dst>{static_cast<Dst*>(dst.data()), kernels::convert<Dst>(value), dst.size()}, dst.size(),
           stream);
  });
}
}  // namespace

void cast(BufferView dst, BufferView src, StreamImpl& stream) {
  kernels::dispatch_dtype(dst.dtype(), [&](auto dst_tag) {
    using Dst = typename decltype(dst_tag)::type;
    kernels::dispatch_dtype(src.dtype(), [&](auto src_tag) {
      using Src = typename decltype(src_tag)::type;
      launch(
          kernels::CastBody<Dst, Src>{static_cast<Dst*>(dst.data()), static_cast<const Src*>(src.data()), dst.size()},
          dst.size(), stream);
    });
  });
}

void fill(BufferView dst, double value, StreamImpl& stream) { fill_with(dst, value, stream); }
void fill(BufferView dst, std::int64_t value, StreamImpl& stream) { fill_with(dst, value, stream); }

}  // namespace gpucloud::detail::cuda
