/// @file gpu_specs.hpp
/// @brief The GPU spec sheet: dense peak rates, memory and interconnect of common training GPUs.
#pragma once

#include <gpucloud/export.hpp>

#include <optional>
#include <string>
#include <vector>

namespace gpucloud {

/// @brief The arithmetic a GEMM runs in.
enum class Precision {
  fp32,  ///< fp32 inputs, fp32 (non-tensor-core) math
  tf32,  ///< fp32 inputs rounded to TF32 on tensor cores
  fp16,  ///< fp16 inputs, fp32 accumulation
  bf16,  ///< bf16 inputs, fp32 accumulation
  fp8,   ///< e4m3/e5m2 inputs with per-tensor scales, fp32 accumulation (sm_89+)
};

/// @brief "fp32", "tf32", "fp16", "bf16" or "fp8".
GPUCLOUD_API const char* precision_name(Precision p) noexcept;

/// @brief One row of the spec table (dense rates; 0 where the GPU has no such unit).
struct GpuSpec {
  std::string name;           ///< e.g. "H100 SXM"
  int sm = 0;                 ///< compute capability as major*10+minor (90 for sm_90)
  double fp16_tflops = 0;     ///< fp16 tensor, fp32 accumulate
  double bf16_tflops = 0;     ///< bf16 tensor (0 before Ampere)
  double tf32_tflops = 0;     ///< tf32 tensor
  double fp32_tflops = 0;     ///< fp32 non-tensor
  double fp8_tflops = 0;      ///< fp8 tensor
  double memory_gb = 0;       ///< device memory
  double memory_bw_gbs = 0;   ///< memory bandwidth, GB/s
  double nvlink_gbs = 0;      ///< NVLink per GPU, both directions, GB/s (0: none)
  int pcie_gen = 0;           ///< PCIe generation (x16)
  double tdp_watts = 0;       ///< board power
  bool needs_cuda12 = false;  ///< CUDA 13 dropped this architecture (Volta)
};

/// @brief The whole table: V100, T4, A100 40/80GB, A10, L4, RTX 4090, H100 SXM, H200 SXM.
GPUCLOUD_API const std::vector<GpuSpec>& gpu_specs();

/// @brief The row whose name a device name contains ("NVIDIA H100 80GB HBM3" -> "H100 SXM"),
///        preferring the longest match; std::nullopt for GPUs not in the table.
GPUCLOUD_API std::optional<GpuSpec> find_gpu_spec(const std::string& device_name);

/// @brief Dense peak TFLOP/s of @p spec in @p precision (0 when it has no such unit).
GPUCLOUD_API double peak_tflops(const GpuSpec& spec, Precision precision) noexcept;

}  // namespace gpucloud
