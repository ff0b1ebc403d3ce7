/// @file buffer.hpp
/// @brief Owning, move-only buffers of any memory kind, and non-owning views of them.
#pragma once

#include <gpucloud/export.hpp>
#include <gpucloud/memory/memory_resource.hpp>
#include <gpucloud/runtime/device.hpp>
#include <gpucloud/runtime/dtype.hpp>
#include <gpucloud/runtime/error.hpp>
#include <gpucloud/runtime/stream.hpp>

#include <cstddef>
#include <optional>

namespace gpucloud {

/// @brief A non-owning view of typed memory: pointer, element count, dtype, kind and device.
///
/// What every operation takes; build one from a Buffer, or around memory owned elsewhere
/// (a NumPy array, a tensor of another framework).
class GPUCLOUD_API BufferView {
 public:
  /// @brief An empty host view.
  BufferView() noexcept = default;
  /// @brief Views @p size elements of @p dtype at @p data.
  /// @throws InvalidArgument if the byte count overflows, or data is null with size > 0.
  BufferView(void* data, std::size_t size, DType dtype, MemoryKind kind, Device device);

  /// @brief Start of the memory.
  void* data() const noexcept { return data_; }
  /// @brief Number of elements.
  std::size_t size() const noexcept { return size_; }
  /// @brief Number of bytes.
  std::size_t size_bytes() const noexcept { return size_ * dtype_size(dtype_); }
  /// @brief True for zero elements.
  bool empty() const noexcept { return size_ == 0; }
  /// @brief Element type.
  DType dtype() const noexcept { return dtype_; }
  /// @brief Memory kind.
  MemoryKind kind() const noexcept { return kind_; }
  /// @brief Device the memory belongs to.
  Device device() const noexcept { return device_; }
  /// @brief True when a host thread may read and write the memory directly (all but a GPU's
  ///        device memory).
  bool host_accessible() const noexcept { return !(kind_ == MemoryKind::device && device_.is_cuda()); }
  /// @brief Elements [offset, offset + count). @throws InvalidArgument when out of range.
  BufferView slice(std::size_t offset, std::size_t count) const;
  /// @brief Typed pointer. @throws InvalidArgument if T does not match dtype().
  template <class T>
  T* data_as() const {
    GPUCLOUD_EXPECTS(dtype_of<T>() == dtype_, "BufferView::data_as", "element type does not match the buffer's dtype");
    return static_cast<T*>(data_);
  }

 private:
  void* data_ = nullptr;
  std::size_t size_ = 0;
  DType dtype_ = DType::uint8;
  MemoryKind kind_ = MemoryKind::host;
  Device device_ = Device::host();
};

/// @brief An owning, move-only allocation of @p size elements of one dtype (like rmm::device_buffer).
///
/// Allocated from a memory resource, optionally stream-ordered: the memory is freed on the
/// stream it was allocated on, after that stream's earlier work. Contents are uninitialised.
class GPUCLOUD_API Buffer {
 public:
  /// @brief An empty buffer.
  Buffer() noexcept = default;
  /// @brief Allocates @p size elements of @p dtype of @p kind on @p device from
  ///        default_resource(kind, device).
  /// @throws InvalidArgument (overflowing size, host/pinned memory on a GPU), OutOfMemory,
  ///         Unsupported/DeviceError for an unavailable device.
  Buffer(std::size_t size, DType dtype, Device device = Device::host(), MemoryKind kind = MemoryKind::device);
  /// @brief As above, from @p mr (a non-null reference, as rmm's resource_ref).
  /// @throws InvalidArgument also when @p mr serves another kind or device.
  Buffer(std::size_t size, DType dtype, Device device, MemoryKind kind, MemoryResource& mr);
  /// @brief As above (default resource), allocated and freed in the order of @p stream.
  Buffer(std::size_t size, DType dtype, Device device, MemoryKind kind, StreamView stream);
  /// @brief As above, from @p mr, allocated and freed in the order of @p stream.
  Buffer(std::size_t size, DType dtype, Device device, MemoryKind kind, StreamView stream, MemoryResource& mr);
  /// @brief Frees the memory (stream-ordered when allocated so); never throws.
  ~Buffer();
  Buffer(Buffer&& other) noexcept;             ///< Moves ownership; other becomes empty.
  Buffer& operator=(Buffer&& other) noexcept;  ///< Frees the current memory, then moves.
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  /// @brief Start of the memory (nullptr when empty).
  void* data() const noexcept { return view_.data(); }
  /// @brief Number of elements.
  std::size_t size() const noexcept { return view_.size(); }
  /// @brief Number of bytes.
  std::size_t size_bytes() const noexcept { return view_.size_bytes(); }
  /// @brief True for zero elements.
  bool empty() const noexcept { return view_.empty(); }
  /// @brief Element type.
  DType dtype() const noexcept { return view_.dtype(); }
  /// @brief Memory kind.
  MemoryKind kind() const noexcept { return view_.kind(); }
  /// @brief Device the memory belongs to.
  Device device() const noexcept { return view_.device(); }
  /// @brief The stream the buffer is ordered on, if any.
  std::optional<StreamView> stream() const noexcept { return stream_; }
  /// @brief A view of the whole buffer.
  BufferView view() const noexcept { return view_; }
  /// @brief Implicit conversion to a view, so buffers can be passed where views are taken.
  operator BufferView() const noexcept { return view_; }  // NOLINT(google-explicit-constructor)
  /// @brief Typed pointer. @throws InvalidArgument if T does not match dtype().
  template <class T>
  T* data_as() const {
    return view_.data_as<T>();
  }
  /// @brief Copies element @p i into @p out (dtype_size() bytes) after @p stream's earlier work,
  ///        from any memory; synchronises @p stream. @throws InvalidArgument when out of range.
  void read_element(std::size_t i, void* out, StreamView stream) const;
  /// @brief Copies @p value (dtype_size() bytes) into element @p i after @p stream's earlier
  ///        work, into any memory; synchronises @p stream. @throws InvalidArgument when out of range.
  void write_element(std::size_t i, const void* value, StreamView stream);

 private:
  struct Allocate {};
  Buffer(Allocate, std::size_t size, DType dtype, Device device, MemoryKind kind, std::optional<StreamView> stream,
         MemoryResource* mr);
  void release() noexcept;
  BufferView view_;
  MemoryResource* mr_ = nullptr;
  std::optional<StreamView> stream_;
};

/// @brief A Buffer whose element type is fixed at compile time.
template <class T>
class TypedBuffer {
 public:
  /// @brief An empty buffer.
  TypedBuffer() = default;
  /// @brief Allocates @p size elements of T from the default resource (see Buffer).
  explicit TypedBuffer(std::size_t size, Device device = Device::host(), MemoryKind kind = MemoryKind::device)
      : buffer_(size, dtype_of<T>(), device, kind) {}
  /// @brief Allocates @p size elements of T from @p mr (see Buffer).
  TypedBuffer(std::size_t size, Device device, MemoryKind kind, MemoryResource& mr)
      : buffer_(size, dtype_of<T>(), device, kind, mr) {}
  /// @brief Allocates @p size elements of T ordered on @p stream (see Buffer).
  TypedBuffer(std::size_t size, Device device, MemoryKind kind, StreamView stream)
      : buffer_(size, dtype_of<T>(), device, kind, stream) {}
  /// @brief Allocates @p size elements of T from @p mr, ordered on @p stream (see Buffer).
  TypedBuffer(std::size_t size, Device device, MemoryKind kind, StreamView stream, MemoryResource& mr)
      : buffer_(size, dtype_of<T>(), device, kind, stream, mr) {}

  /// @brief Typed start of the memory.
  T* data() const noexcept { return static_cast<T*>(buffer_.data()); }
  /// @brief Number of elements.
  std::size_t size() const noexcept { return buffer_.size(); }
  /// @brief Element @p i of memory the host can access (host, pinned, managed, host device);
  ///        the caller orders it with the streams that write the memory.
  /// @throws InvalidArgument for a GPU's device memory: use element() / set_element().
  T& operator[](std::size_t i) const { return host_data("TypedBuffer::operator[]")[i]; }
  /// @brief First element, for range-for over host-accessible memory. @throws as operator[].
  T* begin() const { return host_data("TypedBuffer::begin"); }
  /// @brief One past the last element. @throws as operator[].
  T* end() const { return host_data("TypedBuffer::end") + size(); }
  /// @brief Element @p i of any memory, read after @p stream's earlier work (synchronises it;
  ///        as rmm::device_uvector::element). @throws InvalidArgument when out of range.
  T element(std::size_t i, StreamView stream) const {
    T value{};
    buffer_.read_element(i, &value, stream);
    return value;
  }
  /// @brief Writes element @p i of any memory after @p stream's earlier work (synchronises it).
  /// @throws InvalidArgument when out of range.
  void set_element(std::size_t i, const T& value, StreamView stream) { buffer_.write_element(i, &value, stream); }
  /// @brief The untyped buffer.
  const Buffer& buffer() const noexcept { return buffer_; }
  /// @brief A view of the whole buffer.
  BufferView view() const noexcept { return buffer_.view(); }
  /// @brief Implicit conversion to a view.
  operator BufferView() const noexcept { return buffer_.view(); }  // NOLINT(google-explicit-constructor)

 private:
  T* host_data(const char* call) const {
    GPUCLOUD_EXPECTS(buffer_.view().host_accessible(), call,
                     "the buffer is device memory of " + buffer_.device().str() +
                         ", which the host cannot read: use element(i, stream) or copy() it to the host");
    return data();
  }
  Buffer buffer_;
};

}  // namespace gpucloud
