/// @file topology.hpp
/// @brief How the machine's CPUs, memory and GPUs are connected (hwloc; NVML for links between
///        GPUs), and where a rank's threads belong: what `nvidia-smi topo -m` and `lstopo` tell.
#pragma once

#include <gpucloud/export.hpp>
#include <gpucloud/runtime/device.hpp>

#include <cstddef>
#include <string>
#include <vector>

namespace gpucloud {

/// @brief A NUMA node: its CPUs and its memory.
struct NumaNode {
  int index = 0;                 ///< the OS's node number
  std::vector<int> cpus;         ///< its logical CPUs (all of them, allowed to this process or not)
  std::size_t memory_bytes = 0;  ///< its local memory
};

/// @brief Where a GPU sits: its PCI address and the NUMA node and CPUs nearest to it.
struct GpuPlacement {
  int index = 0;           ///< the CUDA device index
  std::string pci_bus_id;  ///< "0000:17:00.0"
  int numa_node = -1;      ///< the nearest NUMA node; -1 when the platform does not say
  std::vector<int> cpus;   ///< the CPUs local to it (its PCI bridge's)
};

/// @brief The machine as this process sees it.
struct Topology {
  int packages = 0;                  ///< CPU sockets
  int cores = 0;                     ///< physical cores
  int hardware_threads = 0;          ///< logical CPUs (cores times SMT)
  std::vector<int> allowed_cpus;     ///< the logical CPUs this process may run on (its affinity)
  std::vector<NumaNode> numa_nodes;  ///< every NUMA node (one on a machine without NUMA)
  std::vector<GpuPlacement> gpus;    ///< every visible CUDA device
  /// @brief gpus x gpus, as `nvidia-smi topo -m`: "X" on the diagonal, "NV<n>" (n NVLinks),
  ///        "PIX", "PXB", "PHB", "NODE" or "SYS" (the PCIe path); empty without NVML.
  std::vector<std::vector<std::string>> gpu_links;
  std::string source;  ///< "hwloc 2.9.0" or "sysfs" (built without hwloc)
};

/// @brief The topology (read at each call: cheap, and a job's affinity may change).
/// @throws DeviceError when the OS's description cannot be read.
GPUCLOUD_API Topology topology();

/// @brief A MIG instance of a GPU in MIG mode: what `nvidia-smi -L` lists under it.
struct MigInstance {
  int gpu = 0;                   ///< the parent GPU's NVML index (all GPUs, as nvidia-smi counts them)
  std::string gpu_uuid;          ///< the parent GPU's UUID ("GPU-…")
  std::string uuid;              ///< the instance's UUID ("MIG-…"): Device::parse and CUDA_VISIBLE_DEVICES take it
  int gpu_instance_id = -1;      ///< its GPU instance id
  int compute_instance_id = -1;  ///< its compute instance id
  int multiprocessors = 0;       ///< its SMs
  std::size_t memory_bytes = 0;  ///< its memory
};

/// @brief Every MIG instance on the machine's GPUs (NVML; visible to this process or not), empty
///        without NVML (nvml_unavailable_reason() says why) or without a GPU in MIG mode.
GPUCLOUD_API std::vector<MigInstance> mig_instances();

/// @brief Where a rank's host threads belong.
struct BindingAdvice {
  std::vector<int> cpus;  ///< the logical CPUs for this rank (a share of the allowed ones, never empty)
  int numa_node = -1;     ///< the NUMA node they are on (-1: several)
  std::string reason;     ///< why, e.g. "cuda:1 is on NUMA node 0; ranks 0-1 share its 16 allowed CPUs"
};

/// @brief The CPUs for local rank @p local_rank of @p local_size on this node: the allowed CPUs near
///        CUDA device @p gpu (shared evenly by the ranks whose GPUs are on the same NUMA node, GPU i
///        serving local rank i modulo the GPUs), or, for the host (@p gpu -1, or a GPU whose
///        locality the platform does not say), an even share of the allowed CPUs that keeps each
///        rank within one NUMA node where the ranks fit.
/// @throws InvalidArgument unless 0 <= local_rank < local_size and @p gpu is -1 or in @p topo.
GPUCLOUD_API BindingAdvice binding_advice(const Topology& topo, int local_rank, int local_size, int gpu = -1);

}  // namespace gpucloud
