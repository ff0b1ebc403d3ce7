// gpucloud.elastic: JobControl (the stop every rank agrees on, the restart facts, the heartbeat).
#include "bindings.hpp"

#include <pybind11/stl.h>

namespace gpucloud::python {
namespace {

using elastic::JobControl;

// JobControl's destructor may wait for its last agreement, which on a communicator over a
// Python transport needs the GIL on the stream's thread: it runs without the GIL.
struct PyJobControl;
PyJobControl* g_live = nullptr;  // the one that lives (JobControl allows one); guarded by the GIL

struct PyJobControl {
  std::unique_ptr<JobControl> control;
  ~PyJobControl() { close(); }
  void close() {
    if (g_live == this) g_live = nullptr;
    py::gil_scoped_release release;
    control.reset();
  }
  JobControl& get() {
    if (!control) GPUCLOUD_FAIL(InvalidArgument, "JobControl", "closed: make a new one");
    return *control;
  }
};

// An exception nobody caught ends the interpreter after sys.excepthook: the live JobControl's
// heartbeat then says "failed" (e), so gpucloud-run ends the launch without waiting for its
// launcher. Chained in front of the previous hook, once per process.
void mark_failed_at_uncaught_exceptions() {
  static bool installed = false;
  if (installed) return;
  installed = true;
  py::module_ sys = py::module_::import("sys");
  py::object previous = sys.attr("excepthook");
  sys.attr("excepthook") = py::cpp_function([previous](py::object type, py::object value, py::object trace) {
    if (g_live != nullptr && g_live->control) g_live->control->mark_failed();
    previous(type, value, trace);
  });
}

}  // namespace

void bind_elastic(py::module_& m) {
  m.attr("PREEMPTED_EXIT_CODE") = elastic::kPreemptedExitCode;
  py::class_<elastic::RestartInfo>(m, "RestartInfo", "Which restart of the job this process belongs to.")
      .def_readonly("count", &elastic::RestartInfo::count, "0 for the first launch; the restarts before this one.")
      .def_readonly("reason", &elastic::RestartInfo::reason, "Why the previous launch ended ('' for the first).")
      .def("__repr__", [](const elastic::RestartInfo& r) {
        return "RestartInfo(count=" + std::to_string(r.count) +
               ", reason=" + py::repr(py::str(r.reason)).cast<std::string>() + ")";
      });
  m.def("restart_info_from_environment", &elastic::restart_info_from_environment,
        "GPUCLOUD_RESTART_COUNT / _REASON (gpucloud-run), else TORCHELASTIC_RESTART_COUNT, else SLURM_RESTART_COUNT.");
  py::class_<PyJobControl>(
      m, "JobControl",
      "A job's stop decision (SIGTERM/SIGUSR1 agreed by every rank at one step), its restart facts "
      "and the heartbeat gpucloud-run watches. One may live per process at a time.")
      .def(py::init([](std::vector<int> signals) {
             elastic::JobControlOptions o;
             o.signals = std::move(signals);
             auto p = std::make_unique<PyJobControl>();
             p->control = std::make_unique<JobControl>(o);
             mark_failed_at_uncaught_exceptions();
             g_live = p.get();
             return p;
           }),
           py::arg("signals") = std::vector<int>{SIGTERM, SIGUSR1},
           "Installs handlers for `signals` (the previous ones return at close()).")
      .def_property_readonly(
          "stop_requested", [](PyJobControl& c) { return c.get().stop_requested(); },
          "True once this process got one of the signals (or request_stop()).")
      .def_property_readonly(
          "stop_signal", [](PyJobControl& c) { return c.get().stop_signal(); },
          "The signal that asked for the stop (0: none, or request_stop()).")
      .def(
          "request_stop", [](PyJobControl& c) { c.get().request_stop(); },
          "Asks for a stop, as a signal would (a preemption notice polled by the trainer).")
      .def(
          "should_stop",
          [](PyJobControl& c, std::int64_t step, Communicator* comm, PyStream* stream) {
            JobControl& control = c.get();
            if (comm == nullptr) return control.should_stop(step);
            if (stream == nullptr) GPUCLOUD_FAIL(InvalidArgument, "JobControl.should_stop", "stream: needed with comm");
            py::object owner = py::cast(comm, py::return_value_policy::reference);
            return enqueue_holding(stream->view, {owner},
                                   [&] { return control.should_stop(step, comm, stream->view); });
          },
          py::arg("step"), py::arg("comm") = nullptr, py::arg("stream") = nullptr,
          "Once per step, after the step's work: True when the job must stop now with the state of `step` saved. "
          "With comm a collective: every rank calls it each step and all answer True at the same call.")
      .def_property_readonly(
          "restart", [](PyJobControl& c) { return c.get().restart(); },
          "Which restart this process belongs to (RestartInfo).")
      .def_property_readonly(
          "first_step", [](PyJobControl& c) { return c.get().first_step(); },
          "The step of the first should_stop() call (one past where this launch resumed), -1 before.")
      .def("close", &PyJobControl::close, "Restores the previous signal handlers (also at garbage collection).")
      .def("__enter__", [](py::object self) { return self; })
      .def(
          "mark_failed", [](PyJobControl& c) { c.get().mark_failed(); },
          "Marks this process as failing: its closed heartbeat says so (what __exit__ does for an exception).")
      .def("__exit__", [](PyJobControl& c, py::object type, py::object, py::object) {
        if (!type.is_none() && c.control) c.control->mark_failed();
        c.close();
      });
}

}  // namespace gpucloud::python
