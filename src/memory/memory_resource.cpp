#include <gpucloud/memory/memory_resource.hpp>
#include <gpucloud/memory/plain_resource.hpp>
#include <gpucloud/runtime/error.hpp>

#include "memory/cuda/memory_backend.hpp"
#include "memory/host_memory.hpp"
#include "memory/quota_ledger.hpp"
#include "memory/workspace.hpp"
#include "runtime/host/host_stream.hpp"
#include "runtime/stream_impl.hpp"

#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <mutex>
#include <sstream>
#include <utility>

namespace gpucloud {

const char* memory_kind_name(MemoryKind kind) noexcept {
  switch (kind) {
    case MemoryKind::host:
      return "host";
    case MemoryKind::pinned:
      return "pinned";
    case MemoryKind::device:
      return "device";
    case MemoryKind::managed:
      return "managed";
  }
  return "unknown";
}

namespace detail {

std::string describe_bytes(std::size_t bytes) {
  std::ostringstream out;
  out << bytes << " bytes";
  if (bytes >= (std::size_t{1} << 20)) {
    out.precision(3);
    out << " (" << static_cast<double>(bytes) / static_cast<double>(std::size_t{1} << 30) << " GiB)";
  }
  return out.str();
}

void* host_allocate(std::size_t bytes, MemoryKind kind) {
  const MemoryInfo info = memory_info(Device::host());
  auto fail = [&] {
    throw OutOfMemory("allocate",
                      "cannot allocate " + describe_bytes(bytes) + " of " + memory_kind_name(kind) +
                          " memory on host: " + describe_bytes(info.free) + " free of " + describe_bytes(info.total),
                      bytes, __FILE__, __LINE__);
  };
  // Linux overcommits: refuse up front what physical memory can never back.
  if (bytes > info.total) fail();
  const std::size_t rounded = (bytes + kAllocationAlignment - 1) / kAllocationAlignment * kAllocationAlignment;
  void* p = std::aligned_alloc(kAllocationAlignment, rounded);
  if (p == nullptr) fail();
  return p;
}

void host_deallocate(void* p) noexcept { std::free(p); }

void release_after(std::optional<StreamView> stream, std::function<void()> free_fn) noexcept {
  if (stream) {
    try {
      // An idle host stream has run everything before this release: free now (what runs in
      // place, such as a small mse_loss's partial sums, then leaves the stream idle).
      if (stream->device().is_host()) {
        run_or_enqueue(*stream->impl(), /*small=*/true, free_fn, /*always_run=*/true);
      } else {
        stream->impl()->launch_host_func(free_fn, /*always_run=*/true);
      }
      return;
    } catch (...) {
      try {
        stream->impl()->synchronize();
      } catch (...) {
        // the stream's own error is reported to whoever synchronises it; we only need it idle
      }
    }
    free_fn();
    return;
  }
  // No stream: like cudaFree, after the work every stream was given so far (which may still use
  // the memory: a buffer dropped while the step that reads it is in flight).
  HostStream::after_enqueued_work(std::move(free_fn));
}

}  // namespace detail

PointerInfo pointer_info(const void* ptr) {
  if (ptr == nullptr || cuda_device_count() == 0) return PointerInfo{};
  return detail::cuda::pointer_info(ptr);
}

// ---- MemoryResource -------------------------------------------------------------------------

void* MemoryResource::allocate(std::size_t bytes, std::optional<StreamView> stream) {
  if (bytes == 0) return nullptr;
  GPUCLOUD_EXPECTS(bytes <= static_cast<std::size_t>(std::numeric_limits<std::ptrdiff_t>::max()), "allocate",
                   "bytes: " + std::to_string(bytes) + " exceeds the largest possible allocation");
  if (stream && device_.is_cuda()) {
    GPUCLOUD_EXPECTS(
        stream->device() == device_, "allocate",
        "stream: memory of " + device_.str() + " cannot be ordered on a stream of " + stream->device().str());
  }
  return do_allocate(bytes, stream);
}

void MemoryResource::deallocate(void* p, std::size_t bytes, std::optional<StreamView> stream) noexcept {
  if (p == nullptr) return;
  do_deallocate(p, bytes, stream);
}

// ---- PlainResource --------------------------------------------------------------------------

namespace {
void check_kind_on_device(MemoryKind kind, Device device, const char* call) {
  GPUCLOUD_EXPECTS(
      device.is_host() || (kind != MemoryKind::host && kind != MemoryKind::pinned), call,
      std::string("device: ") + memory_kind_name(kind) + " memory belongs to the host device, not " + device.str());
}

// Pinned memory is page-locked through CUDA when a GPU is usable; otherwise plain host memory.
bool pinned_through_cuda(MemoryKind kind, Device device) {
  return kind == MemoryKind::pinned && device.is_host() && cuda_device_count() > 0;
}
}  // namespace

PlainResource::PlainResource(MemoryKind kind, Device device) : MemoryResource(kind, device) {
  check_kind_on_device(kind, device, "PlainResource");
}

void* PlainResource::do_allocate(std::size_t bytes, std::optional<StreamView>) {
  detail::quota_take(device(), kind(), bytes);  // what the process holds from the device, under its quota
  try {
    if (device().is_cuda()) return detail::cuda::allocate(kind(), bytes, device().index());
    if (pinned_through_cuda(kind(), device())) return detail::cuda::allocate(MemoryKind::pinned, bytes, -1);
    return detail::host_allocate(bytes, kind());
  } catch (...) {
    detail::quota_give(device(), bytes);
    throw;
  }
}

void PlainResource::do_deallocate(void* p, std::size_t bytes, std::optional<StreamView> stream) noexcept {
  detail::quota_give(device(), bytes);  // at once, as RMM's limiting adaptor: the caller is done with it
  if (device().is_cuda()) {
    // cudaFree / cudaFreeHost wait for the device's outstanding work themselves.
    detail::cuda::deallocate(kind(), p, device().index());
  } else if (pinned_through_cuda(kind(), device())) {
    detail::cuda::deallocate(MemoryKind::pinned, p, -1);
  } else {
    detail::release_after(stream, [p] { detail::host_deallocate(p); });
  }
}

// ---- default resources ----------------------------------------------------------------------

namespace {
struct DefaultResources {
  std::mutex mutex;
  std::map<std::pair<int, int>, MemoryResource*> current;  // (kind, device key) -> resource
  std::map<std::pair<int, int>, std::unique_ptr<PlainResource>> builtin;
};

DefaultResources& defaults() {
  static auto* d = new DefaultResources();  // never destroyed: buffers may outlive static teardown
  return *d;
}

std::pair<int, int> key_of(MemoryKind kind, Device device) {
  return {static_cast<int>(kind), device.is_host() ? -1 : device.index()};
}
}  // namespace

MemoryResource& default_resource(MemoryKind kind, Device device) {
  check_kind_on_device(kind, device, "default_resource");
  if (MemoryResource* user = detail::user_default_resource(kind, device)) return *user;
  return detail::builtin_resource(kind, device);
}

namespace detail {
MemoryResource& builtin_resource(MemoryKind kind, Device device) {
  check_kind_on_device(kind, device, "builtin_resource");
  auto& d = defaults();
  std::lock_guard<std::mutex> lock(d.mutex);
  auto& slot = d.builtin[key_of(kind, device)];
  if (!slot) slot = std::make_unique<PlainResource>(kind, device);
  return *slot;
}

MemoryResource* user_default_resource(MemoryKind kind, Device device) {
  auto& d = defaults();
  std::lock_guard<std::mutex> lock(d.mutex);
  const auto it = d.current.find(key_of(kind, device));
  return it == d.current.end() ? nullptr : it->second;
}
}  // namespace detail

MemoryResource* set_default_resource(MemoryKind kind, Device device, MemoryResource* mr) {
  check_kind_on_device(kind, device, "set_default_resource");
  if (mr != nullptr) {
    GPUCLOUD_EXPECTS(mr->kind() == kind && mr->device() == device, "set_default_resource",
                     std::string("mr: serves ") + memory_kind_name(mr->kind()) + " memory on " + mr->device().str() +
                         ", not " + memory_kind_name(kind) + " memory on " + device.str());
  }
  MemoryResource& previous = default_resource(kind, device);
  auto& d = defaults();
  std::lock_guard<std::mutex> lock(d.mutex);
  if (mr == nullptr) {
    d.current.erase(key_of(kind, device));
  } else {
    d.current[key_of(kind, device)] = mr;
  }
  return &previous;
}

}  // namespace gpucloud
