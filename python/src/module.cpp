#include "bindings.hpp"

PYBIND11_MODULE(_core, m) {
  m.doc() = "gpucloud's C++ core: devices, streams, events, buffers, memory resources, copies";
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
  gpucloud::python::bind_gemm(m);
  gpucloud::python::bind_collectives(m);
  gpucloud::python::bind_monitor(m);
  // Borrowed objects still held at exit are released while the interpreter can still do it.
  py::module_::import("atexit").attr("register")(
      py::cpp_function([] { gpucloud::python::release_all_borrows_at_exit(); }));
}
