// Device monitoring: read_metrics, DeviceMetrics, MetricsMonitor (a context manager).
#include "bindings.hpp"

#include <gpucloud/monitor/monitor.hpp>
#include <gpucloud/monitor/topology.hpp>

#include <pybind11/chrono.h>
#include <pybind11/stl.h>

#include <chrono>

namespace gpucloud::python {

namespace {

py::dict stats_dict(const MetricStats& s) {
  py::dict d;
  d["count"] = s.count;
  d["min"] = s.min;
  d["mean"] = s.mean;
  d["max"] = s.max;
  return d;
}

}  // namespace

void bind_monitor(py::module_& m) {
  py::class_<NumaNode>(m, "NumaNode", "A NUMA node: its CPUs and its memory.")
      .def_readonly("index", &NumaNode::index, "The OS's node number.")
      .def_readonly("cpus", &NumaNode::cpus, "Its logical CPUs.")
      .def_readonly("memory_bytes", &NumaNode::memory_bytes, "Its local memory.")
      .def("__repr__", [](const NumaNode& n) {
        return "NumaNode(index=" + std::to_string(n.index) + ", cpus=" + std::to_string(n.cpus.size()) +
               ", memory_bytes=" + std::to_string(n.memory_bytes) + ")";
      });
  py::class_<GpuPlacement>(m, "GpuPlacement", "Where a GPU sits: its PCI address, nearest NUMA node and CPUs.")
      .def_readonly("index", &GpuPlacement::index, "The CUDA device index.")
      .def_readonly("pci_bus_id", &GpuPlacement::pci_bus_id, "Its PCI address, e.g. '0000:17:00.0'.")
      .def_readonly("numa_node", &GpuPlacement::numa_node, "The nearest NUMA node; -1 when the platform does not say.")
      .def_readonly("cpus", &GpuPlacement::cpus, "The CPUs local to it.");
  py::class_<Topology>(m, "Topology", "How the machine's CPUs, memory and GPUs are connected.")
      .def_readonly("packages", &Topology::packages, "CPU sockets.")
      .def_readonly("cores", &Topology::cores, "Physical cores.")
      .def_readonly("hardware_threads", &Topology::hardware_threads, "Logical CPUs.")
      .def_readonly("allowed_cpus", &Topology::allowed_cpus, "The logical CPUs this process may run on.")
      .def_readonly("numa_nodes", &Topology::numa_nodes, "Every NUMA node.")
      .def_readonly("gpus", &Topology::gpus, "Every visible CUDA device's placement.")
      .def_readonly("gpu_links", &Topology::gpu_links,
                    "GPUs x GPUs as nvidia-smi topo -m ('X', 'NV<n>', 'PIX', 'PXB', 'PHB', 'NODE', 'SYS'); "
                    "empty without NVML.")
      .def_readonly("source", &Topology::source, "'hwloc <version>' or 'sysfs'.");
  py::class_<MigInstance>(m, "MigInstance", "A MIG instance of a GPU in MIG mode, as nvidia-smi -L lists it.")
      .def_readonly("gpu", &MigInstance::gpu, "The parent GPU's NVML index.")
      .def_readonly("gpu_uuid", &MigInstance::gpu_uuid, "The parent GPU's UUID.")
      .def_readonly("uuid", &MigInstance::uuid, "The instance's UUID: Device(uuid) and CUDA_VISIBLE_DEVICES take it.")
      .def_readonly("gpu_instance_id", &MigInstance::gpu_instance_id, "Its GPU instance id.")
      .def_readonly("compute_instance_id", &MigInstance::compute_instance_id, "Its compute instance id.")
      .def_readonly("multiprocessors", &MigInstance::multiprocessors, "Its SMs.")
      .def_readonly("memory_bytes", &MigInstance::memory_bytes, "Its memory.")
      .def("__repr__", [](const MigInstance& i) {
        return "MigInstance(uuid=" + i.uuid + ", gpu=" + std::to_string(i.gpu) +
               ", multiprocessors=" + std::to_string(i.multiprocessors) +
               ", memory_bytes=" + std::to_string(i.memory_bytes) + ")";
      });
  m.def(
      "mig_instances", [] { return without_gil([] { return mig_instances(); }); },
      "Every MIG instance on the machine's GPUs (NVML); empty without NVML or MIG mode.");
  py::class_<BindingAdvice>(m, "BindingAdvice", "Where a rank's host threads belong.")
      .def_readonly("cpus", &BindingAdvice::cpus, "The logical CPUs for the rank.")
      .def_readonly("numa_node", &BindingAdvice::numa_node, "Their NUMA node (-1: several).")
      .def_readonly("reason", &BindingAdvice::reason, "Why.")
      .def("__repr__", [](const BindingAdvice& a) {
        return "BindingAdvice(cpus=" + std::to_string(a.cpus.size()) + ", numa_node=" + std::to_string(a.numa_node) +
               ", reason='" + a.reason + "')";
      });
  m.def(
      "topology", [] { return without_gil([] { return topology(); }); },
      "The machine's topology: CPUs, NUMA nodes, GPUs and their links (hwloc, NVML).");
  m.def("binding_advice", &binding_advice, py::arg("topology"), py::arg("local_rank"), py::arg("local_size"),
        py::arg("gpu") = -1,
        "The CPUs for a local rank: near its GPU (gpu >= 0), else an even share within NUMA nodes "
        "(os.sched_setaffinity(0, advice.cpus) applies it).");
  py::class_<DeviceMetrics::Health>(m, "DeviceHealth",
                                    "A GPU's health counters (NVML); a figure the GPU does not report is None.")
      .def_readonly("xid", &DeviceMetrics::Health::xid, "The last XID error seen since monitoring began (0: none).")
      .def_readonly("ecc_sbe_volatile", &DeviceMetrics::Health::ecc_sbe_volatile,
                    "Corrected ECC errors since the driver loaded.")
      .def_readonly("ecc_dbe_volatile", &DeviceMetrics::Health::ecc_dbe_volatile,
                    "Uncorrected (double-bit) ECC errors since the driver loaded.")
      .def_readonly("ecc_sbe_aggregate", &DeviceMetrics::Health::ecc_sbe_aggregate,
                    "Corrected ECC errors over the GPU's life.")
      .def_readonly("ecc_dbe_aggregate", &DeviceMetrics::Health::ecc_dbe_aggregate,
                    "Uncorrected ECC errors over the GPU's life.")
      .def_readonly("retired_pages_sbe", &DeviceMetrics::Health::retired_pages_sbe,
                    "Pages retired for corrected errors.")
      .def_readonly("retired_pages_dbe", &DeviceMetrics::Health::retired_pages_dbe,
                    "Pages retired for uncorrected errors.")
      .def_readonly("remapped_rows_correctable", &DeviceMetrics::Health::remapped_rows_correctable,
                    "Rows remapped for corrected errors.")
      .def_readonly("remapped_rows_uncorrectable", &DeviceMetrics::Health::remapped_rows_uncorrectable,
                    "Rows remapped for uncorrected errors.")
      .def_readonly("row_remap_failure", &DeviceMetrics::Health::row_remap_failure, "1 when a row remapping failed.")
      .def_readonly("pcie_replay_counter", &DeviceMetrics::Health::pcie_replay_counter, "PCIe replays.")
      .def_readonly("throttle_reasons", &DeviceMetrics::Health::throttle_reasons,
                    "NVML's clock throttle reason bits (0x8 HW slowdown, 0x20 SW thermal, 0x40 HW thermal, "
                    "0x80 HW power brake).");
  py::class_<DeviceMetrics>(m, "DeviceMetrics",
                            "One reading of a device's load and health; a figure the platform cannot report is None.")
      .def_readonly("device", &DeviceMetrics::device, "The device read.")
      .def_readonly("source", &DeviceMetrics::source, "Where the figures came from: 'nvml', 'cuda' or 'procfs'.")
      .def_readonly("utilization", &DeviceMetrics::utilization, "% of the last sample period the device was busy.")
      .def_readonly("memory_utilization", &DeviceMetrics::memory_utilization,
                    "GPU: % of the last sample period device memory was read or written.")
      .def_readonly("memory_used", &DeviceMetrics::memory_used, "Bytes in use on the device.")
      .def_readonly("memory_total", &DeviceMetrics::memory_total, "Bytes in all.")
      .def_readonly("temperature_c", &DeviceMetrics::temperature_c, "Degrees Celsius.")
      .def_readonly("power_w", &DeviceMetrics::power_w, "Watts drawn.")
      .def_readonly("power_limit_w", &DeviceMetrics::power_limit_w, "The enforced power limit, watts.")
      .def_readonly("clock_mhz", &DeviceMetrics::clock_mhz, "SM clock (host: mean CPU core clock), MHz.")
      .def_readonly("health", &DeviceMetrics::health, "The GPU's health counters (all None on the host).")
      .def_readonly("energy_j", &DeviceMetrics::energy_j,
                    "GPU: joules used since the driver loaded (NVML's counter), or None.")
      .def(
          "as_dict",
          [](const DeviceMetrics& d) {
            py::dict out;
            out["device"] = d.device.str();
            out["source"] = d.source;
            out["utilization"] = d.utilization;
            out["memory_utilization"] = d.memory_utilization;
            out["memory_used"] = d.memory_used;
            out["memory_total"] = d.memory_total;
            out["temperature_c"] = d.temperature_c;
            out["power_w"] = d.power_w;
            out["power_limit_w"] = d.power_limit_w;
            out["clock_mhz"] = d.clock_mhz;
            out["energy_j"] = d.energy_j;
            const DeviceMetrics::Health& h = d.health;
            for (const auto& [name, value] : {std::pair<const char*, std::optional<double>>{"xid", h.xid},
                                              {"ecc_sbe_volatile", h.ecc_sbe_volatile},
                                              {"ecc_dbe_volatile", h.ecc_dbe_volatile},
                                              {"ecc_sbe_aggregate", h.ecc_sbe_aggregate},
                                              {"ecc_dbe_aggregate", h.ecc_dbe_aggregate},
                                              {"retired_pages_sbe", h.retired_pages_sbe},
                                              {"retired_pages_dbe", h.retired_pages_dbe},
                                              {"remapped_rows_correctable", h.remapped_rows_correctable},
                                              {"remapped_rows_uncorrectable", h.remapped_rows_uncorrectable},
                                              {"row_remap_failure", h.row_remap_failure},
                                              {"pcie_replay_counter", h.pcie_replay_counter},
                                              {"throttle_reasons", h.throttle_reasons}}) {
              if (value) out[name] = *value;  // a GPU's health counters, where it reports them
            }
            return out;
          },
          "The figures as a dict, for logging.")
      .def("__repr__", [](const DeviceMetrics& d) {
        return "DeviceMetrics(device=" + d.device.str() + ", source=" + d.source +
               ", memory_used=" + std::to_string(d.memory_used) + "/" + std::to_string(d.memory_total) + ")";
      });

  py::class_<MetricStats>(m, "MetricStats", "Minimum, mean and maximum of one figure over a monitored run.")
      .def_readonly("count", &MetricStats::count, "Readings that reported the figure (0: never reported).")
      .def_readonly("min", &MetricStats::min, "Smallest reading.")
      .def_readonly("mean", &MetricStats::mean, "Mean of the readings.")
      .def_readonly("max", &MetricStats::max, "Largest reading.");

  py::class_<MetricsSummary>(m, "MetricsSummary", "What a MetricsMonitor saw since it started or was reset.")
      .def_readonly("device", &MetricsSummary::device, "The device monitored.")
      .def_readonly("samples", &MetricsSummary::samples, "Readings taken.")
      .def_readonly("seconds", &MetricsSummary::seconds, "From the first reading to the last.")
      .def_readonly("utilization", &MetricsSummary::utilization, "% busy.")
      .def_readonly("memory_utilization", &MetricsSummary::memory_utilization, "GPU memory traffic, %.")
      .def_readonly("memory_used", &MetricsSummary::memory_used, "Bytes in use.")
      .def_readonly("temperature_c", &MetricsSummary::temperature_c, "Degrees Celsius.")
      .def_readonly("power_w", &MetricsSummary::power_w, "Watts.")
      .def_readonly("energy_j", &MetricsSummary::energy_j,
                    "Joules: the device's energy counter's increase, or power integrated over time; or None.")
      .def(
          "as_dict",
          [](const MetricsSummary& s) {
            py::dict out;
            out["device"] = s.device.str();
            out["samples"] = s.samples;
            out["seconds"] = s.seconds;
            out["utilization"] = stats_dict(s.utilization);
            out["memory_utilization"] = stats_dict(s.memory_utilization);
            out["memory_used"] = stats_dict(s.memory_used);
            out["temperature_c"] = stats_dict(s.temperature_c);
            out["power_w"] = stats_dict(s.power_w);
            out["energy_j"] = s.energy_j;
            return out;
          },
          "The statistics as nested dicts, for logging and JSON.");

  m.def(
      "read_metrics",
      [](DeviceLike device) {
        const Device d = to_device(device);
        // the host's first reading measures over 100 ms
        return without_gil([&] { return read_metrics(d); });
      },
      py::arg("device"), "Reads a device's utilisation, memory, temperature, power and clock now.");
  m.def("nvml_unavailable_reason", &nvml_unavailable_reason,
        "Why GPU readings lack NVML's figures (no driver library, no GPU), or '' when NVML works.");

  py::class_<MetricsMonitor>(m, "MetricsMonitor",
                             "Samples a device every `interval` seconds on a background thread; a context manager "
                             "that stops on exit.")
      .def(py::init([](DeviceLike device, double interval) {
             const Device d = to_device(device);  // a Device or its name, as everywhere else
             GPUCLOUD_EXPECTS(interval > 0 && interval < 1e6, "MetricsMonitor",
                              "interval: " + std::to_string(interval) + " is not a positive number of seconds");
             const auto ms = std::chrono::milliseconds(static_cast<std::int64_t>(interval * 1000.0));
             return without_gil([&] { return std::make_unique<MetricsMonitor>(d, ms); });
           }),
           py::arg("device"), py::arg("interval") = 0.5)
      .def("latest", &MetricsMonitor::latest, "The most recent reading.")
      .def("summary", &MetricsMonitor::summary, py::call_guard<py::gil_scoped_release>(),
           "The statistics since the start or the last reset(), including a reading taken now.")
      .def("reset", &MetricsMonitor::reset, "Forgets the statistics and starts a new period.")
      .def("stop", &MetricsMonitor::stop, py::call_guard<py::gil_scoped_release>(),
           "Stops sampling; the statistics stay readable.")
      .def("__enter__", [](MetricsMonitor& self) -> MetricsMonitor& { return self; })
      .def("__exit__", [](MetricsMonitor& self, const py::args&) { without_gil([&] { self.stop(); }); });
}

}  // namespace gpucloud::python
