/// @file device.hpp
/// @brief Devices (the host and CUDA GPUs), discovery and properties.
#pragma once

#include <gpucloud/export.hpp>

#include <cstddef>
#include <string>
#include <vector>

namespace gpucloud {

/// @brief Which backend a device belongs to.
enum class DeviceKind { host, cuda };

/// @brief A place where memory lives and work runs: the host, or CUDA GPU i. A cheap value type.
class GPUCLOUD_API Device {
 public:
  /// @brief The host (CPU) device; always available.
  static Device host() noexcept { return Device(DeviceKind::host, 0); }
  /// @brief CUDA device @p index.
  /// @throws Unsupported when built without CUDA, DeviceError when no GPU is visible,
  ///         InvalidArgument when @p index is out of range.
  static Device cuda(int index = 0);
  /// @brief Parses "host", "cpu", "cuda", "cuda:N" (same checks as cuda()), or a visible GPU's or MIG
  ///        instance's UUID ("GPU-…", "MIG-…", as nvidia-smi -L prints them).
  static Device parse(const std::string& text);

  /// @brief The backend.
  DeviceKind kind() const noexcept { return kind_; }
  /// @brief Ordinal within the backend (0 for the host).
  int index() const noexcept { return index_; }
  /// @brief True for the host device.
  bool is_host() const noexcept { return kind_ == DeviceKind::host; }
  /// @brief True for a CUDA device.
  bool is_cuda() const noexcept { return kind_ == DeviceKind::cuda; }
  /// @brief "host" or "cuda:N".
  std::string str() const;

  /// @brief Equality of kind and index.
  friend bool operator==(Device a, Device b) noexcept { return a.kind_ == b.kind_ && a.index_ == b.index_; }
  /// @brief Inequality of kind and index.
  friend bool operator!=(Device a, Device b) noexcept { return !(a == b); }

 private:
  Device(DeviceKind kind, int index) noexcept : kind_(kind), index_(index) {}
  DeviceKind kind_;
  int index_;
};

/// @brief What a device is and can do.
struct DeviceProperties {
  std::string name;                        ///< e.g. "NVIDIA H200" or the CPU model
  int compute_capability_major = 0;        ///< 0 on the host
  int compute_capability_minor = 0;        ///< 0 on the host
  std::size_t total_memory = 0;            ///< bytes
  int multiprocessor_count = 0;            ///< SMs on a GPU, hardware threads on the host
  bool concurrent_managed_access = false;  ///< managed memory usable by CPU and GPU at once
  std::string backend;                     ///< "host" or "cuda"
  std::string uuid;                        ///< a GPU's UUID as nvidia-smi prints it (GPU-...); empty on the host
};

/// @brief Properties of @p device (free memory excluded: see memory_info()).
GPUCLOUD_API DeviceProperties device_properties(Device device);

/// @brief Free and total bytes of @p device's memory right now.
struct MemoryInfo {
  std::size_t free = 0;   ///< bytes available
  std::size_t total = 0;  ///< bytes in all
};

/// @brief Current free/total memory of @p device (host: available/total RAM, capped by the
///        process's cgroup memory limit and that cgroup's usage).
GPUCLOUD_API MemoryInfo memory_info(Device device);

/// @brief Number of visible CUDA devices; 0 without CUDA or without a usable driver, never throws.
GPUCLOUD_API int cuda_device_count() noexcept;

/// @brief Why cuda_device_count() is 0 ("built without CUDA", the driver's message, ...), or "".
GPUCLOUD_API std::string cuda_unavailable_reason();

/// @brief All usable devices: the host first, then every visible CUDA device.
GPUCLOUD_API std::vector<Device> available_devices();

}  // namespace gpucloud
