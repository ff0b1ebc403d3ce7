#include <gpucloud/memory/buffer.hpp>
#include <gpucloud/runtime/error.hpp>

#include "memory/access.hpp"
#include "memory/cuda/memory_backend.hpp"
#include "runtime/host/host_stream.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include <limits>
#include <string>
#include <utility>

namespace gpucloud {

namespace {
std::string place(MemoryKind kind, Device device) {
  return std::string(memory_kind_name(kind)) + " memory on " + device.str();
}

std::string where(BufferView v) { return place(v.kind(), v.device()); }

void check_byte_count(std::size_t size, DType dtype, const char* call) {
  GPUCLOUD_EXPECTS(
      size <= std::numeric_limits<std::size_t>::max() / dtype_size(dtype), call,
      "size: " + std::to_string(size) + " elements of " + dtype_name(dtype) + " is more bytes than size_t can count");
}
}  // namespace

// ---- BufferView -----------------------------------------------------------------------------

BufferView::BufferView(void* data, std::size_t size, DType dtype, MemoryKind kind, Device device)
    : data_(data), size_(size), dtype_(dtype), kind_(kind), device_(device) {
  check_byte_count(size, dtype, "BufferView");
  GPUCLOUD_EXPECTS(data != nullptr || size == 0, "BufferView", "data: null pointer for a non-empty view");
}

BufferView BufferView::slice(std::size_t offset, std::size_t count) const {
  GPUCLOUD_EXPECTS(offset <= size_ && count <= size_ - offset, "BufferView::slice",
                   "offset/count: [" + std::to_string(offset) + ", " + std::to_string(offset) + " + " +
                       std::to_string(count) + ") is outside a view of " + std::to_string(size_) + " elements");
  BufferView out = *this;
  out.data_ = count == 0 ? data_ : static_cast<char*>(data_) + offset * dtype_size(dtype_);
  out.size_ = count;
  return out;
}

// ---- Buffer ---------------------------------------------------------------------------------

namespace {
MemoryResource& pick_resource(std::size_t size, DType dtype, Device device, MemoryKind kind, MemoryResource* mr) {
  check_byte_count(size, dtype, "Buffer");
  MemoryResource& resource = mr != nullptr ? *mr : default_resource(kind, device);
  GPUCLOUD_EXPECTS(
      resource.kind() == kind && resource.device() == device, "Buffer",
      "mr: serves " + place(resource.kind(), resource.device()) + ", but the buffer asks for " + place(kind, device));
  return resource;
}
}  // namespace

Buffer::Buffer(Allocate, std::size_t size, DType dtype, Device device, MemoryKind kind,
               std::optional<StreamView> stream, MemoryResource* mr)
    : mr_(&pick_resource(size, dtype, device, kind, mr)), stream_(stream) {
  void* p = stream ? mr_->allocate(size * dtype_size(dtype), *stream) : mr_->allocate(size * dtype_size(dtype));
  view_ = BufferView(p, size, dtype, kind, device);
}

Buffer::Buffer(std::size_t size, DType dtype, Device device, MemoryKind kind)
    : Buffer(Allocate{}, size, dtype, device, kind, std::nullopt, nullptr) {}

Buffer::Buffer(std::size_t size, DType dtype, Device device, MemoryKind kind, MemoryResource& mr)
    : Buffer(Allocate{}, size, dtype, device, kind, std::nullopt, &mr) {}

Buffer::Buffer(std::size_t size, DType dtype, Device device, MemoryKind kind, StreamView stream)
    : Buffer(Allocate{}, size, dtype, device, kind, std::optional<StreamView>(stream), nullptr) {}

Buffer::Buffer(std::size_t size, DType dtype, Device device, MemoryKind kind, StreamView stream, MemoryResource& mr)
    : Buffer(Allocate{}, size, dtype, device, kind, std::optional<StreamView>(stream), &mr) {}

namespace {
// Copies element @p element of a buffer from (@p to_buffer: to) the caller's @p value in @p stream's
// order and waits for it (the value lives on the caller's stack): cudaMemcpyAsync on a GPU stream,
// memmove on a host stream (on this thread when the stream is idle, else behind its work).
void copy_element(void* value, BufferView element, bool to_buffer, StreamView stream) {
  detail::check_access(element, stream, detail::Access::copy, "copy", to_buffer ? "dst" : "src");
  void* dst = to_buffer ? element.data() : value;
  const void* src = to_buffer ? value : element.data();
  const std::size_t bytes = element.size_bytes();
  if (stream.device().is_cuda()) {
    detail::cuda::memcpy_async(dst, src, bytes, *stream.impl());
  } else {
    detail::run_or_enqueue(*stream.impl(), true, [dst, src, bytes] { std::memmove(dst, src, bytes); });
  }
  stream.synchronize();
}
}  // namespace

void Buffer::read_element(std::size_t i, void* out, StreamView stream) const {
  GPUCLOUD_EXPECTS(i < size(), "Buffer::element",
                   "i: " + std::to_string(i) + " is out of range for " + std::to_string(size()) + " elements");
  GPUCLOUD_EXPECTS(out != nullptr, "Buffer::element", "out: null");
  copy_element(out, view_.slice(i, 1), /*to_buffer=*/false, stream);
}

void Buffer::write_element(std::size_t i, const void* value, StreamView stream) {
  GPUCLOUD_EXPECTS(i < size(), "Buffer::set_element",
                   "i: " + std::to_string(i) + " is out of range for " + std::to_string(size()) + " elements");
  GPUCLOUD_EXPECTS(value != nullptr, "Buffer::set_element", "value: null");
  copy_element(const_cast<void*>(value), view_.slice(i, 1), /*to_buffer=*/true, stream);
}

Buffer::~Buffer() { release(); }

void Buffer::release() noexcept {
  if (mr_ != nullptr) mr_->deallocate(view_.data(), view_.size_bytes(), stream_);
  mr_ = nullptr;
  view_ = BufferView();
  stream_.reset();
}

Buffer::Buffer(Buffer&& other) noexcept
    : view_(std::exchange(other.view_, BufferView())),
      mr_(std::exchange(other.mr_, nullptr)),
      stream_(std::exchange(other.stream_, std::nullopt)) {}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    release();
    view_ = std::exchange(other.view_, BufferView());
    mr_ = std::exchange(other.mr_, nullptr);
    stream_ = std::exchange(other.stream_, std::nullopt);
  }
  return *this;
}

// ---- access checks --------------------------------------------------------------------------

namespace detail {

void check_access(BufferView view, StreamView stream, Access access, const char* call, const char* arg) {
  const Device sd = stream.device();
  const std::string prefix = std::string(arg) + ": ";
  if (view.device().is_cuda()) {
    GPUCLOUD_EXPECTS(sd == view.device(), call,
                     prefix + where(view) + " cannot be used by work on a stream of " + sd.str());
    return;
  }
  // Memory of the host device: any stream may copy it; a GPU kernel can only reach pinned memory.
  if (access == Access::kernel && sd.is_cuda()) {
    GPUCLOUD_EXPECTS(view.kind() == MemoryKind::pinned, call,
                     prefix + where(view) + " is not reachable by a kernel on " + sd.str() +
                         " (use device, managed or pinned memory)");
  }
}

bool overlaps(BufferView a, BufferView b) noexcept {
  if (a.empty() || b.empty()) return false;
  const auto* a0 = static_cast<const char*>(a.data());
  const auto* b0 = static_cast<const char*>(b.data());
  return a0 < b0 + b.size_bytes() && b0 < a0 + a.size_bytes();
}

void check_no_overlap(BufferView a, BufferView b, const char* call, const char* arg) {
  GPUCLOUD_EXPECTS(!overlaps(a, b), call, std::string(arg) + ": overlaps the destination");
}

void check_disjoint(const std::vector<BufferView>& views, const std::function<std::string(std::size_t)>& name,
                    const char* call) {
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < views.size(); ++i) {
    if (!views[i].empty()) order.push_back(i);
  }
  auto begin = [&](std::size_t i) { return reinterpret_cast<std::uintptr_t>(views[i].data()); };
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return begin(a) < begin(b); });
  // Sorted by start: a view overlaps an earlier one exactly when it starts before the furthest end.
  std::uintptr_t furthest = 0;
  std::size_t holder = 0;
  for (std::size_t k = 0; k < order.size(); ++k) {
    const std::size_t i = order[k];
    if (k > 0 && begin(i) < furthest) {
      const std::size_t first = std::min(i, holder), second = std::max(i, holder);
      GPUCLOUD_FAIL(InvalidArgument, call,
                    name(second) + ": overlaps " + name(first) +
                        " (the same memory listed twice, or a parameter that is its own gradient); a fused pass "
                        "would update it twice");
    }
    const std::uintptr_t end = begin(i) + views[i].size_bytes();
    if (end > furthest) {
      furthest = end;
      holder = i;
    }
  }
}

}  // namespace detail
}  // namespace gpucloud
