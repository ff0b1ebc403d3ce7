#include <gpucloud/runtime/build_info.hpp>

#include "compute/conv/host/onednn_conv.hpp"
#include "compute/gemm/host/host_bf16_gemm.hpp"
#include "compute/gemm/host/host_sgemm.hpp"
#include "runtime/cuda/runtime_backend.hpp"

namespace gpucloud {

BuildInfo build_info() {
  BuildInfo info;
  info.version = GPUCLOUD_VERSION_STRING;
  info.cuda = detail::cuda::built();
  info.cuda_runtime_version = detail::cuda::runtime_version();
  info.cuda_architectures = info.cuda ? GPUCLOUD_CUDA_ARCHS_STRING : "";
  info.nccl = GPUCLOUD_WITH_NCCL;
  info.cudnn = GPUCLOUD_WITH_CUDNN;
  info.mpi = GPUCLOUD_WITH_MPI;
  info.telemetry = GPUCLOUD_WITH_PROMETHEUS;
  info.host_blas = detail::host_sgemm_implementation();
  info.host_bf16_gemm = detail::host_bf16_gemm_implementation();
  info.host_conv = detail::host_conv_implementation();
  return info;
}

}  // namespace gpucloud
