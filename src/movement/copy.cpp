#include <gpucloud/memory/managed_memory.hpp>
#include <gpucloud/movement/copy.hpp>
#include <gpucloud/runtime/error.hpp>

#include "memory/access.hpp"
#include "memory/cuda/memory_backend.hpp"
#include "movement/cuda/movement_backend.hpp"
#include "runtime/host/host_stream.hpp"
#include "runtime/host/parallel_for.hpp"
#include "runtime/host/streaming_copy.hpp"
#include "runtime/stream_impl.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace gpucloud {

void copy(BufferView dst, BufferView src, StreamView stream) {
  GPUCLOUD_EXPECTS(
      dst.dtype() == src.dtype(), "copy",
      std::string("src: dtype ") + dtype_name(src.dtype()) + " differs from dst's " + dtype_name(dst.dtype()));
  GPUCLOUD_EXPECTS(dst.size() == src.size(), "copy",
                   "src: " + std::to_string(src.size()) + " elements, dst holds " + std::to_string(dst.size()));
  detail::check_access(dst, stream, detail::Access::copy, "copy", "dst");
  detail::check_access(src, stream, detail::Access::copy, "copy", "src");
  detail::check_no_overlap(dst, src, "copy", "src");
  if (dst.empty()) return;
  if (stream.device().is_cuda()) {
    detail::cuda::memcpy_async(dst.data(), src.data(), dst.size_bytes(), *stream.impl());
    return;
  }
  auto* d = static_cast<char*>(dst.data());
  const auto* s = static_cast<const char*>(src.data());
  const std::size_t n = dst.size_bytes();
  // Up to a few MiB on an idle stream the copy runs on the calling thread, as CUDA runs a
  // host-to-host cudaMemcpyAsync: the hand-off to the worker, and another core pulling what the
  // caller's cache holds, cost more than the copy (4 MiB: ~100 µs here, ~200 µs split over cores).
  constexpr std::size_t kInPlaceMax = std::size_t{4} << 20;
  auto& host = static_cast<detail::HostStream&>(*stream.impl());
  if (n <= kInPlaceMax && host.run_now_if_idle([&] { std::memcpy(d, s, n); })) return;
  auto run = [d, s, n] {
    // Large copies split across the cores in 1 MiB pieces (one core rarely saturates memory),
    // written around the caches (what glibc's memcpy does alone only from ~100 MiB here).
    constexpr std::int64_t kPiece = std::int64_t{1} << 20;
    const auto pieces = static_cast<std::int64_t>((n + kPiece - 1) / kPiece);
    detail::parallel_for(pieces, 2, [&](std::int64_t p0, std::int64_t p1) {
      const auto begin = static_cast<std::size_t>(p0 * kPiece);
      const std::size_t end = std::min(n, static_cast<std::size_t>(p1 * kPiece));
      detail::streaming_copy(d + begin, s + begin, end - begin);
    });
  };
  host.launch_host_func(std::move(run), /*always_run=*/false);
}

namespace {
void check_managed(BufferView view, const char* call) {
  GPUCLOUD_EXPECTS(view.kind() == MemoryKind::managed, call,
                   std::string("view: ") + memory_kind_name(view.kind()) + " memory is not managed memory");
}
}  // namespace

void prefetch(BufferView view, Device target, StreamView stream) {
  check_managed(view, "prefetch");
  detail::check_access(view, stream, detail::Access::copy, "prefetch", "view");
  GPUCLOUD_EXPECTS(target.is_host() || target == view.device(), "prefetch",
                   "target: managed memory of " + view.device().str() + " cannot be prefetched to " + target.str());
  if (view.empty() || view.device().is_host()) return;                      // host backend: the memory is already here
  if (!device_properties(view.device()).concurrent_managed_access) return;  // a hint the GPU cannot take
  detail::cuda::prefetch(view.data(), view.size_bytes(), target, *stream.impl());
}

void advise(BufferView view, MemoryAdvice advice, Device target) {
  check_managed(view, "advise");
  GPUCLOUD_EXPECTS(target.is_host() || target == view.device(), "advise",
                   "target: managed memory of " + view.device().str() + " cannot be advised for " + target.str());
  if (view.empty() || view.device().is_host()) return;
  detail::cuda::advise(view.data(), view.size_bytes(), advice, target);
}

}  // namespace gpucloud
