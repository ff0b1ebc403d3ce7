// Internal: what the CUDA backend provides (src/*/cuda/*, kernels/*/*.cu), or its stand-in when
// the library is built without CUDA (src/runtime/cuda/cuda_disabled.cpp). Not API.
#pragma once

#include <gpucloud/memory/buffer.hpp>
#include <gpucloud/memory/managed_memory.hpp>
#include <gpucloud/memory/memory_resource.hpp>
#include <gpucloud/monitor/monitor.hpp>
#include <gpucloud/runtime/device.hpp>

#include "compute/conv/conv_plan.hpp"
#include "compute/gemm/gemm_plan.hpp"
#include "runtime/stream_impl.hpp"

#include <cstddef>
#include <memory>
#include <string>

namespace gpucloud::detail::cuda {

/// True when the library was built with the CUDA backend.
bool built() noexcept;
/// CUDART_VERSION the library was built against, or 0.
int runtime_version() noexcept;
/// Visible devices; on failure 0 and the reason in @p reason. Never throws.
int device_count(std::string& reason) noexcept;
DeviceProperties properties(int device);
MemoryInfo memory_info(int device);

std::unique_ptr<StreamImpl> make_stream(int device);
/// A stream over the caller's cudaStream_t @p native of @p device, which it does not destroy.
std::unique_ptr<StreamImpl> adopt_stream(int device, void* native);
std::unique_ptr<EventImpl> make_event(int device, bool timing);

/// cudaMalloc / cudaMallocHost / cudaMallocManaged. @throws OutOfMemory naming the request.
void* allocate(MemoryKind kind, std::size_t bytes, int device);
void deallocate(MemoryKind kind, void* p, int device) noexcept;
/// cudaMallocAsync on @p stream (nullptr: allocate and wait on an internal stream).
void* allocate_async(std::size_t bytes, int device, StreamImpl* stream);
void deallocate_async(void* p, int device, StreamImpl* stream) noexcept;

/// Stream-ordered scratch from CUDA's async pool, handed back in stream order when it goes out of
/// scope (after the work enqueued on the stream meanwhile). Empty for 0 bytes.
class AsyncScratch {
 public:
  AsyncScratch(std::size_t bytes, int device, StreamImpl& stream)
      : p_(bytes > 0 ? allocate_async(bytes, device, &stream) : nullptr), device_(device), stream_(&stream) {}
  ~AsyncScratch() {
    if (p_ != nullptr) deallocate_async(p_, device_, stream_);
  }
  AsyncScratch(const AsyncScratch&) = delete;
  AsyncScratch& operator=(const AsyncScratch&) = delete;
  void* get() const noexcept { return p_; }

 private:
  void* p_;
  int device_;
  StreamImpl* stream_;
};

void memcpy_async(void* dst, const void* src, std::size_t bytes, StreamImpl& stream);
void prefetch(const void* p, std::size_t bytes, Device target, StreamImpl& stream);
void advise(const void* p, std::size_t bytes, MemoryAdvice advice, Device target);

/// cudaPointerGetAttributes; host memory when the pointer is unknown to CUDA.
PointerInfo pointer_info(const void* p);

/// cuBLASLt GEMM (src/compute/gemm/cuda/gemm_cublaslt.cpp) of a validated plan.
void gemm(BufferView c, BufferView a, BufferView b, const GemmPlan& plan, StreamImpl& stream);

/// cuDNN convolution (src/compute/conv/cuda/conv_cudnn.cpp) of a validated plan: out = y, dx or dfilter; in1,
/// in2 = (x, filter), (dy, filter) or (x, dy) by the plan's pass.
void conv2d(const ConvPlan& plan, BufferView out, BufferView in1, BufferView in2, StreamImpl& stream);

/// NVML's figures for CUDA device @p device (src/monitor/cuda/nvml_metrics.cpp), or the runtime's memory
/// figures alone when NVML is unavailable.
void read_metrics(int device, DeviceMetrics& m);
/// Why NVML is unusable, or empty.
std::string nvml_unavailable_reason();

/// Kernels (src/compute/cuda/cast.cu).
void cast(BufferView dst, BufferView src, StreamImpl& stream);
void fill(BufferView dst, double value, StreamImpl& stream);
void fill(BufferView dst, std::int64_t value, StreamImpl& stream);

}  // namespace gpucloud::detail::cuda
