#include <gpucloud/compute/cast.hpp>
#include <gpucloud/runtime/error.hpp>

#include "compute/cuda/cast_backend.hpp"
#include "kernels/compute/cast_body.hpp"
#include "kernels/launch/dispatch.hpp"
#include "memory/access.hpp"
#include "runtime/host/host_stream.hpp"
#include "runtime/stream_impl.hpp"

namespace gpucloud {

void cast(BufferView dst, BufferView src, StreamView stream) {
  GPUCLOUD_EXPECTS(dst.size() == src.size(), "cast",
                   "src: " + std::to_string(src.size()) + " elements, dst holds " + std::to_string(dst.size()));
  detail::check_access(dst, stream, detail::Access::kernel, "cast", "dst");
  detail::check_access(src, stream, detail::Access::kernel, "cast", "src");
  detail::check_no_overlap(dst, src, "cast", "src");
  if (dst.empty()) return;
  if (stream.device().is_cuda()) {
    detail::cuda::cast(dst, src, *stream.impl());
    return;
  }
  kernels::dispatch_dtype(dst.dtype(), [&](auto dst_tag) {
    using Dst = typename decltype(dst_tag)::type;
    kernels::dispatch_dtype(src.dtype(), [&](auto src_tag) {
      using Src = typename decltype(src_tag)::type;
      const kernels::CastBody<Dst, Src> body{dst.data_as<Dst>(), src.data_as<Src>(), dst.size()};
      const kernels::Grid grid = kernels::host_range_grid(kernels::elementwise_grid(dst.size()));
      detail::run_or_enqueue(*stream.impl(), dst.size_bytes() + src.size_bytes() <= detail::kInPlaceBytes,
                             [body, grid] { kernels::host_launch(grid, body); });
    });
  });
}

namespace {
// @p value (double or int64) converted once to dst's dtype, then written by the shared body.
template <class Value>
void fill_with(BufferView dst, Value value, StreamView stream, const char* call) {
  detail::check_access(dst, stream, detail::Access::kernel, call, "dst");
  if (dst.empty()) return;
  if (stream.device().is_cuda()) {
    detail::cuda::fill(dst, value, *stream.impl());
    return;
  }
  kernels::dispatch_dtype(dst.dtype(), [&](auto tag) {
    using Dst = typename decltype(tag)::type;
    const kernels::FillBody<Dst> body{dst.data_as<Dst>(), kernels::convert<Dst>(value), dst.size()};
    const kernels::Grid grid = kernels::host_range_grid(kernels::elementwise_grid(dst.size()));
    detail::run_or_enqueue(*stream.impl(), dst.size_bytes() <= detail::kInPlaceBytes,
                           [body, grid] { kernels::host_launch(grid, body); });
  });
}
}  // namespace

void fill(BufferView dst, double value, StreamView stream) { fill_with(dst, value, stream, "fill"); }

void fill_integer(BufferView dst, std::int64_t value, StreamView stream) {
  fill_with(dst, value, stream, "fill_integer");
}

}  // namespace gpucloud
