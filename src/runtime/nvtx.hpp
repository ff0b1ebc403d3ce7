// Internal: NVTX ranges, so Nsight Systems timelines show each stage (no-ops without CUDA).
#pragma once

#if GPUCLOUD_WITH_NVTX
#include <nvtx3/nvToolsExt.h>
#endif

namespace gpucloud::detail {

/// Marks a range on the calling thread for its lifetime.
class NvtxRange {
 public:
  explicit NvtxRange(const char* name) noexcept {
#if GPUCLOUD_WITH_NVTX
    nvtxRangePushA(name);
#else
    (void)name;
#endif
  }
  ~NvtxRange() {
#if GPUCLOUD_WITH_NVTX
    nvtxRangePop();
#endif
  }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;
};

}  // namespace gpucloud::detail
