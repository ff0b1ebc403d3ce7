// Movement's CUDA backend: managed memory's prefetch and advice through the CUDA runtime.
#include "movement/cuda/movement_backend.hpp"

#include "runtime/cuda/cuda_check.hpp"
#include "runtime/cuda/native_stream.hpp"

#include <cuda_runtime_api.h>

namespace gpucloud::detail::cuda {

namespace {

cudaMemLocation location_of(Device target) {
  cudaMemLocation loc{};
  if (target.is_host()) {
    loc.type = cudaMemLocationTypeHost;
    loc.id = 0;
  } else {
    loc.type = cudaMemLocationTypeDevice;
    loc.id = target.index();
  }
  return loc;
}

}  // namespace

void prefetch(const void* p, std::size_t bytes, Device target, StreamImpl& stream) {
  DeviceGuard guard(stream.device().index());
  GPUCLOUD_CUDA_CHECK(cudaMemPrefetchAsync(p, bytes, location_of(target), 0, native(stream)));
}

void advise(const void* p, std::size_t bytes, MemoryAdvice advice, Device target) {
  cudaMemoryAdvise a = cudaMemAdviseSetReadMostly;
  switch (advice) {
    case MemoryAdvice::read_mostly:
      a = cudaMemAdviseSetReadMostly;
      break;
    case MemoryAdvice::unset_read_mostly:
      a = cudaMemAdviseUnsetReadMostly;
      break;
    case MemoryAdvice::preferred_location:
      a = cudaMemAdviseSetPreferredLocation;
      break;
    case MemoryAdvice::unset_preferred_location:
      a = cudaMemAdviseUnsetPreferredLocation;
      break;
    case MemoryAdvice::accessed_by:
      a = cudaMemAdviseSetAccessedBy;
      break;
    case MemoryAdvice::unset_accessed_by:
      a = cudaMemAdviseUnsetAccessedBy;
      break;
  }
  GPUCLOUD_CUDA_CHECK(cudaMemAdvise(p, bytes, a, location_of(target)));
}

}  // namespace gpucloud::detail::cuda
