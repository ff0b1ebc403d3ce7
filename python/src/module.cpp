#include "bindings.hpp"

PYBIND11_MODULE(_core, m) {
  m.doc() =
      "gpucloud's C++ core, bound by capability: runtime, memory, movement, compute, amp, comm, monitor, checkpoint, "
      "telemetry "
      "(the same names as the C++ API)";
  m.def(
      "_noop", [] {}, "A bare pybind11 call: the baseline of bench/bench_python_overhead.py.");
  struct Noop {};
  py::class_<Noop>(m, "_Noop", "A bare pybind11 class: the method and property baselines of the overhead bench.")
      .def(py::init<>())
      .def("noop", [](Noop&) { return true; })
      .def_property_readonly("value", [](Noop&) { return 0; });
  gpucloud::python::register_errors(m);
  gpucloud::python::bind_runtime(m);
  gpucloud::python::bind_memory(m);
  gpucloud::python::bind_movement(m);
  gpucloud::python::bind_amp(m);
  gpucloud::python::bind_compute(m);
  gpucloud::python::bind_comm(m);
  gpucloud::python::bind_monitor(m);
  gpucloud::python::bind_checkpoint(m);
  gpucloud::python::bind_telemetry(m);
  gpucloud::python::bind_elastic(m);
  // At exit, while the interpreter can still run them: background threads stop (a thread that
  // needs the GIL during finalisation is ended mid-call), then borrowed objects are released.
  py::module_::import("atexit").attr("register")(py::cpp_function([] {
    gpucloud::python::stop_background_threads_at_exit();
    gpucloud::python::release_all_borrows_at_exit();
  }));
}
