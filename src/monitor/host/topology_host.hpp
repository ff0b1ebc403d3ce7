// Internal: the host's part of topology(): CPUs and NUMA nodes through hwloc (or, in builds
// without it, Linux's sysfs), and a PCI device's locality from sysfs. Not API.
#pragma once

#include <gpucloud/monitor/topology.hpp>

#include <string>
#include <vector>

namespace gpucloud::detail {

/// Fills packages, cores, hardware_threads, allowed_cpus, numa_nodes and source.
void host_topology(Topology& t);

/// The same figures from Linux's sysfs alone (what builds without hwloc use), allowed_cpus aside.
void sysfs_topology(Topology& t);

/// The NUMA node (-1: not said) and local CPUs of the PCI device at @p bus_id, from sysfs.
void pci_locality(const std::string& bus_id, int& numa_node, std::vector<int>& cpus);

/// A Linux CPU list ("0-3,8,10-11") as numbers; empty for anything else.
std::vector<int> parse_cpu_list(const std::string& text);

}  // namespace gpucloud::detail
