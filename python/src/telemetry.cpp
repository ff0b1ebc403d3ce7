// Telemetry: the Prometheus exporter, training metrics and straggler detection, bound into _core
// as TelemetryExporter, StepMetrics, StragglerReport, telemetry_job_labels; gpucloud/telemetry.py
// presents them as gpucloud.telemetry.
#include "interop.hpp"

#include <pybind11/stl.h>

#include <algorithm>
#include <cmath>

namespace gpucloud::python {

namespace tel = gpucloud::telemetry;

namespace {

// The exporter and what it reads: watched monitors, the communicator and stream of straggler
// detection (kept alive, declared first so they outlive it). Serving threads are prometheus-cpp's
// and never call Python; the exporter is destroyed without the GIL.
struct PyExporter {
  py::list watched;
  py::object comm, stream;
  std::unique_ptr<tel::Exporter> exporter;
  ~PyExporter() {
    py::gil_scoped_release release;
    exporter.reset();
  }
};

tel::Labels to_labels(py::handle labels) { return arg_str_dict(labels, "labels"); }

double arg_seconds(py::handle h, const char* arg) {
  if (!py::isinstance<py::float_>(h) && PyIndex_Check(h.ptr()) == 0) {
    throw py::type_error(std::string(arg) + ": expected a number of seconds, got " + type_name(h));
  }
  return h.cast<double>();
}

}  // namespace

void bind_telemetry(py::module_& m) {
  py::class_<tel::StragglerReport>(m, "StragglerReport", "What the last exchange of step times found.")
      .def_readonly("step_seconds", &tel::StragglerReport::step_seconds, "Every rank's mean step time, by rank.")
      .def_readonly("compute_seconds", &tel::StragglerReport::compute_seconds,
                    "Every rank's mean own work per step (less data wait and collectives), by rank: what is compared.")
      .def_readonly("steps", &tel::StragglerReport::steps,
                    "The steps each rank had recorded at its last period's end, by rank.")
      .def_readonly("lost", &tel::StragglerReport::lost,
                    "Ranks whose channel closed (they ended or died); their last period is still compared.")
      .def_readonly("median", &tel::StragglerReport::median, "The median own work per step.")
      .def_readonly("slowest", &tel::StragglerReport::slowest, "The rank of the most own work per step, or -1.")
      .def_readonly("straggler", &tel::StragglerReport::straggler, "The slowest is beyond the threshold.")
      .def("__repr__", [](const tel::StragglerReport& r) {
        return "StragglerReport(slowest=" + std::to_string(r.slowest) +
               ", straggler=" + (r.straggler ? "True" : "False") + ", median=" + std::to_string(r.median) +
               ", lost=" + std::to_string(r.lost.size()) + ")";
      });

  py::class_<tel::StepMetrics>(m, "StepMetrics", "A process's training metrics (one record per step).")
      .def(
          "record",
          [](tel::StepMetrics& s, Seconds seconds, IntArg samples, Seconds data_wait_seconds, Seconds comm_seconds,
             Seconds loss_scale, IntArg skipped) {
            tel::StepRecord r;
            r.seconds = arg_seconds(seconds, "seconds");
            r.samples = arg_size(samples, "samples");
            r.data_wait_seconds = arg_seconds(data_wait_seconds, "data_wait_seconds");
            r.comm_seconds = arg_seconds(comm_seconds, "comm_seconds");
            r.loss_scale = arg_seconds(loss_scale, "loss_scale");
            r.skipped = arg_size(skipped, "skipped");
            // a straggler exchange may wait for the previous one
            without_gil([&] { s.record(r); });
          },
          py::arg("seconds"), py::arg("samples") = 0, py::arg("data_wait_seconds") = 0.0, py::arg("comm_seconds") = 0.0,
          py::arg("loss_scale") = 0.0, py::arg("skipped") = 0,
          "Record one step: its wall time, samples, time waiting for data and in collectives, the loss scale, "
          "the steps skipped since the last record (True/1 for this one).")
      .def(
          "record_checkpoint",
          [](tel::StepMetrics& s, Seconds seconds) { s.record_checkpoint(arg_seconds(seconds, "seconds")); },
          py::arg("seconds"), "Record one checkpoint save's duration.")
      .def("record_memory", &tel::StepMetrics::record_memory, py::arg("statistics"),
           "Set the memory-pool gauges from a StatisticsAdaptor's statistics().")
      .def("record_checkpoint_progress", &tel::StepMetrics::record_checkpoint_progress, py::arg("progress"),
           "Set the checkpoint writer's metrics from a Checkpointer's progress (pending saves, the last commit's "
           "step and time, time waited for the writer, failures).")
      .def_property_readonly("steps", &tel::StepMetrics::steps, "Steps recorded so far.");

  py::class_<PyExporter>(m, "TelemetryExporter",
                         "A Prometheus /metrics endpoint of this process (prometheus-cpp), its device and training "
                         "metrics.")
      .def(py::init([](IntArg port, const std::string& address, StrDict labels, OptionalPath textfile, IntArg threads,
                       Seconds request_timeout, OptionalPath tls_cert_file, OptionalPath tls_key_file,
                       StrDict basic_auth_users, py::object allow) {
             tel::ExporterOptions o;
             const std::int64_t port_number = arg_int(port, "port");
             GPUCLOUD_EXPECTS(port_number >= -1 && port_number <= 65535, "TelemetryExporter",
                              "port: " + std::to_string(port_number) + " is not a port (0 picks one, -1 serves none)");
             o.port = static_cast<int>(port_number);
             o.address = address;
             o.labels = to_labels(labels);
             const std::int64_t t = arg_int(threads, "threads");
             GPUCLOUD_EXPECTS(t >= 1 && t <= 1024, "TelemetryExporter",
                              "threads: " + std::to_string(t) + " is not in [1, 1024]");
             o.threads = static_cast<int>(t);
             const double timeout = arg_seconds(request_timeout, "request_timeout");
             GPUCLOUD_EXPECTS(std::isfinite(timeout) && timeout > 0 && timeout < 86400, "TelemetryExporter",
                              "request_timeout: " + std::to_string(timeout) + " is not a positive number of seconds");
             o.request_timeout =
                 std::chrono::milliseconds(std::max<std::int64_t>(1, static_cast<std::int64_t>(timeout * 1000)));
             auto path = [](py::handle h, const char* arg) -> std::string {
               if (h.is_none()) return {};
               if (!py::isinstance<py::str>(h))
                 throw py::type_error(std::string(arg) + ": expected a path (str) or None");
               return h.cast<std::string>();
             };
             o.tls_cert_file = path(tls_cert_file, "tls_cert_file");
             o.tls_key_file = path(tls_key_file, "tls_key_file");
             o.basic_auth_users = arg_str_dict(basic_auth_users, "basic_auth_users");
             if (!allow.is_none()) {
               if (py::isinstance<py::str>(allow) || !py::isinstance<py::sequence>(allow)) {
                 throw py::type_error("allow: expected a list of CIDR blocks (str) or None, got " + type_name(allow));
               }
               for (auto a : allow) {
                 if (!py::isinstance<py::str>(a))
                   throw py::type_error("allow: every entry must be a str, got " + type_name(a));
                 o.allow.push_back(a.cast<std::string>());
               }
             }
             if (!textfile.is_none()) {
               if (!py::isinstance<py::str>(textfile)) throw py::type_error("textfile: expected a path (str) or None");
               o.textfile = textfile.cast<std::string>();
             }
             auto p = std::make_unique<PyExporter>();
             p->comm = py::none();
             p->stream = py::none();
             p->exporter = std::make_unique<tel::Exporter>(o);
             return p;
           }),
           py::arg("port") = 0, py::arg("address") = "0.0.0.0", py::arg("labels") = py::none(),
           py::arg("textfile") = py::none(), py::kw_only(), py::arg("threads") = 8, py::arg("request_timeout") = 5.0,
           py::arg("tls_cert_file") = py::none(), py::arg("tls_key_file") = py::none(),
           py::arg("basic_auth_users") = py::none(), py::arg("allow") = py::none(),
           "port: 0 picks a free one, -1 serves none. address: an IPv4 or IPv6 address to bind. labels: put on every "
           "series (job_labels() gives rank, local_rank, node, job). textfile: where write_textfile() writes "
           "(node_exporter's textfile collector). threads: serving threads; request_timeout: seconds a client may "
           "take to send its request. tls_cert_file, tls_key_file: serve HTTPS. basic_auth_users: {user: bcrypt "
           "hash}. allow: the IPv4 CIDR blocks allowed to connect (Prometheus web-config's semantics).")
      .def_property_readonly("port", [](PyExporter& e) { return e.exporter->port(); })
      .def(
          "watch",
          [](PyExporter& e, MonitorArg monitor) {
            e.exporter->watch(arg_as<MetricsMonitor>(monitor, "monitor", "a gpucloud.MetricsMonitor"));
            e.watched.append(monitor);
          },
          py::arg("monitor"), "Export the monitor's latest reading at each scrape (DCGM_FI_DEV_* names on GPUs).")
      .def(
          "unwatch",
          [](PyExporter& e, MonitorArg monitor) {
            e.exporter->unwatch(arg_as<MetricsMonitor>(monitor, "monitor", "a gpucloud.MetricsMonitor"));
            py::list kept;
            for (auto w : e.watched) {
              if (!w.is(monitor)) kept.append(w);
            }
            e.watched = kept;
          },
          py::arg("monitor"))
      .def_property_readonly(
          "steps",
          [](py::object self) {
            return py::cast(&self.cast<PyExporter&>().exporter->steps(), py::return_value_policy::reference_internal,
                            self);
          },
          "The training metrics (StepMetrics).")
      .def(
          "detect_stragglers",
          [](PyExporter& e, CommunicatorArg comm, StreamArg stream, IntArg every, double threshold,
             double min_excess_seconds) {
            auto& c = arg_as<Communicator>(comm, "comm", "a gpucloud.Communicator");
            auto& s = arg_as<PyStream>(stream, "stream", "a gpucloud.Stream");
            tel::StragglerOptions o;
            o.every = static_cast<int>(arg_int(every, "every"));
            o.threshold = threshold;
            o.min_excess_seconds = min_excess_seconds;
            without_gil([&] { e.exporter->detect_stragglers(c, s.view, o); });
            e.comm = comm;
            e.stream = stream;
          },
          py::arg("comm"), py::arg("stream"), py::arg("every") = 50, py::arg("threshold") = 0.2,
          py::arg("min_excess_seconds") = 0.005,
          "Compare the ranks' own work per step: every `every` recorded steps each rank sends rank 0 its means over "
          "a TCP channel of its own (set up now by a broadcast and an all-reduce over comm on stream: every rank "
          "calls it); exports gpucloud_rank_step_seconds, gpucloud_rank_compute_seconds and gpucloud_straggler. "
          "Ranks may record different numbers of steps, stop or die.")
      .def("straggler_report", [](PyExporter& e) { return e.exporter->straggler_report(); })
      .def(
          "exposition", [](PyExporter& e) { return without_gil([&] { return e.exporter->exposition(); }); },
          "The text a scrape of /metrics returns now.")
      .def(
          "write_textfile", [](PyExporter& e) { without_gil([&] { e.exporter->write_textfile(); }); },
          "Write the exposition to the textfile, atomically.");

  m.def(
      "telemetry_job_labels", [] { return tel::job_labels(launch_info_from_environment()); },
      "rank, local_rank, node and job labels of this process, from the launcher's environment.");
}

}  // namespace gpucloud::python
