#include <gpucloud/build_info.hpp>

#include "detail/cuda_backend.hpp"

namespace gpucloud {

BuildInfo build_info() {
  BuildInfo info;
  info.version = GPUCLOUD_VERSION_STRING;
  info.cuda = detail::cuda::built();
  info.cuda_runtime_version = detail::cuda::runtime_version();
  info.cuda_architectures = info.cuda ? GPUCLOUD_CUDA_ARCHS_STRING : "";
  return info;
}

}  // namespace gpucloud
