#include <gpucloud/runtime/gpu_specs.hpp>

#include <algorithm>

namespace gpucloud {

const char* precision_name(Precision p) noexcept {
  switch (p) {
    case Precision::fp32:
      return "fp32";
    case Precision::tf32:
      return "tf32";
    case Precision::fp16:
      return "fp16";
    case Precision::bf16:
      return "bf16";
    case Precision::fp8:
      return "fp8";
  }
  return "unknown";
}

const std::vector<GpuSpec>& gpu_specs() {
  // ../shared/GPU_SPECS.md: dense rates. A10, L4 and RTX 4090 are vendor figures as quoted.
  static const std::vector<GpuSpec> table = {
      {"V100 SXM2 32GB", 70, 125, 0, 0, 15.7, 0, 32, 900, 300, 3, 300, true},
      {"T4", 75, 65, 0, 0, 8.1, 0, 16, 320, 0, 3, 70, false},
      {"A100 SXM4 40GB", 80, 312, 312, 156, 19.5, 0, 40, 1555, 600, 4, 400, false},
      {"A100 SXM4 80GB", 80, 312, 312, 156, 19.5, 0, 80, 2039, 600, 4, 400, false},
      {"A10", 86, 125, 125, 62.5, 31.2, 0, 24, 600, 0, 4, 150, false},
      {"L4", 89, 121, 121, 60, 30.3, 242.5, 24, 300, 0, 4, 72, false},
      {"RTX 4090", 89, 165, 165, 82.6, 82.6, 330, 24, 1008, 0, 4, 450, false},
      {"H100 SXM", 90, 989, 989, 494.5, 67, 1979, 80, 3350, 900, 5, 700, false},
      {"H200 SXM", 90, 989, 989, 494.5, 67, 1979, 141, 4800, 900, 5, 700, false},
  };
  return table;
}

std::optional<GpuSpec> find_gpu_spec(const std::string& device_name) {
  // Match on the family token ("H100", "A100", "V100", "RTX 4090", ...), then on memory size.
  std::optional<GpuSpec> best;
  std::size_t best_score = 0;
  for (const GpuSpec& s : gpu_specs()) {
    const std::string family = s.name.substr(0, s.name.rfind("RTX", 0) == 0 ? s.name.size() : s.name.find(' '));
    if (device_name.find(family) == std::string::npos) continue;
    std::size_t score = family.size() * 4;
    if (s.name.find("80GB") != std::string::npos && device_name.find("80GB") != std::string::npos) score += 2;
    if (s.name.find("40GB") != std::string::npos && device_name.find("40GB") != std::string::npos) score += 2;
    if (s.name.find("32GB") != std::string::npos && device_name.find("32GB") != std::string::npos) score += 2;
    if (score > best_score) {
      best = s;
      best_score = score;
    }
  }
  return best;
}

double peak_tflops(const GpuSpec& spec, Precision precision) noexcept {
  switch (precision) {
    case Precision::fp32:
      return spec.fp32_tflops;
    case Precision::tf32:
      return spec.tf32_tflops;
    case Precision::fp16:
      return spec.fp16_tflops;
    case Precision::bf16:
      return spec.bf16_tflops;
    case Precision::fp8:
      return spec.fp8_tflops;
  }
  return 0;
}

}  // namespace gpucloud
