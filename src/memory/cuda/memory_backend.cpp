// Memory's CUDA backend: allocation, stream-ordered scratch, copies and pointer queries through
// the CUDA runtime.
#include "memory/cuda/memory_backend.hpp"

#include <gpucloud/runtime/error.hpp>

#include "runtime/cuda/cuda_check.hpp"
#include "runtime/cuda/native_stream.hpp"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <exception>
#include <limits>
#include <mutex>
#include <optional>
#include <set>

namespace gpucloud::detail::cuda {

void* allocate(MemoryKind kind, std::size_t bytes, int device) {
  std::optional<DeviceGuard> guard;
  if (device >= 0) guard.emplace(device);
  void* p = nullptr;
  switch (kind) {
    case MemoryKind::device:
      GPUCLOUD_CUDA_CHECK_ALLOC(cudaMalloc(&p, bytes), bytes);
      break;
    case MemoryKind::pinned:  // portable: pinned for every device's context, whichever made it
      GPUCLOUD_CUDA_CHECK_ALLOC(cudaHostAlloc(&p, bytes, cudaHostAllocPortable), bytes);
      break;
    case MemoryKind::managed:
      GPUCLOUD_CUDA_CHECK_ALLOC(cudaMallocManaged(&p, bytes, cudaMemAttachGlobal), bytes);
      break;
    case MemoryKind::host:
      GPUCLOUD_FAIL(InvalidArgument, "allocate", "kind: host memory is not a CUDA allocation");
  }
  return p;
}

void deallocate(MemoryKind kind, void* p, int device) noexcept {
  try {
    std::optional<DeviceGuard> guard;
    if (device >= 0) guard.emplace(device);
    if (kind == MemoryKind::pinned) {
      GPUCLOUD_CUDA_CHECK_NOTHROW(cudaFreeHost(p));
    } else {
      GPUCLOUD_CUDA_CHECK_NOTHROW(cudaFree(p));
    }
  } catch (const std::exception&) {
    // cudaSetDevice failed: the runtime is going away; nothing more can be freed.
  }
}

namespace {
// The device's default stream-ordered pool keeps what it has (release threshold: all of it), as
// PyTorch's cudaMallocAsync backend sets it: at the default of 0 the pool unmaps its memory at every
// synchronisation and maps it again at the next allocation. Once per device.
void keep_pool_memory(int device) {
  static std::mutex mutex;
  static std::set<int> done;
  std::lock_guard<std::mutex> lock(mutex);
  if (!done.insert(device).second) return;
  cudaMemPool_t pool = nullptr;
  GPUCLOUD_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
  std::uint64_t threshold = std::numeric_limits<std::uint64_t>::max();
  GPUCLOUD_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
}
}  // namespace

void* allocate_async(std::size_t bytes, int device, StreamImpl* stream) {
  DeviceGuard guard(device);
  keep_pool_memory(device);
  void* p = nullptr;
  if (stream != nullptr) {
    GPUCLOUD_CUDA_CHECK_ALLOC(cudaMallocAsync(&p, bytes, native(*stream)), bytes);
  } else {
    GPUCLOUD_CUDA_CHECK_ALLOC(cudaMallocAsync(&p, bytes, cudaStreamPerThread), bytes);
    GPUCLOUD_CUDA_CHECK(cudaStreamSynchronize(cudaStreamPerThread));
  }
  return p;
}

void deallocate_async(void* p, int device, StreamImpl* stream) noexcept {
  try {
    DeviceGuard guard(device);
    GPUCLOUD_CUDA_CHECK_NOTHROW(cudaFreeAsync(p, stream != nullptr ? native(*stream) : cudaStreamPerThread));
  } catch (const std::exception&) {
  }
}

void memcpy_async(void* dst, const void* src, std::size_t bytes, StreamImpl& stream) {
  DeviceGuard guard(stream.device().index());
  GPUCLOUD_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, native(stream)));
}

PointerInfo pointer_info(const void* p) {
  cudaPointerAttributes attr{};
  const cudaError_t status = cudaPointerGetAttributes(&attr, p);
  PointerInfo info;
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    return info;
  }
  switch (attr.type) {
    case cudaMemoryTypeDevice:
      info.kind = MemoryKind::device;
      info.device = Device::cuda(attr.device);
      break;
    case cudaMemoryTypeManaged:
      info.kind = MemoryKind::managed;
      info.device = Device::cuda(attr.device);
      break;
    case cudaMemoryTypeHost:
      info.kind = MemoryKind::pinned;
      break;
    default:
      break;
  }
  return info;
}

}  // namespace gpucloud::detail::cuda
