/// @file build_info.hpp
/// @brief How this copy of the library was built.
#pragma once

#include <gpucloud/export.hpp>

#include <string>

namespace gpucloud {

/// @brief The build configuration.
struct BuildInfo {
  std::string version;             ///< library version, "major.minor.patch"
  bool cuda = false;               ///< built with the CUDA backend
  int cuda_runtime_version = 0;    ///< CUDART_VERSION it was built against (e.g. 13000), 0 without CUDA
  std::string cuda_architectures;  ///< the GPUCLOUD_CUDA_ARCHS it was compiled for
  bool nccl = false;               ///< NCCL communicators available
  bool cudnn = false;              ///< cuDNN convolutions available on GPUs
  bool mpi = false;                ///< MPI communicators available
  bool telemetry = false;          ///< Prometheus telemetry (built with prometheus-cpp)
  std::string host_blas;           ///< the host GEMM's implementation: "OpenBLAS" or "built-in"
  std::string host_bf16_gemm;      ///< the host bf16 GEMM's: "oneDNN" (native bf16) or "widened to fp32"
  std::string host_conv;           ///< the host fp32 convolution's: "oneDNN" or "im2col + GEMM"
};

/// @brief The configuration this library was built with.
GPUCLOUD_API BuildInfo build_info();

}  // namespace gpucloud
