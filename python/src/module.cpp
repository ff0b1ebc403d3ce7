#include "bindings.hpp"

PYBIND11_MODULE(_core, m) {
  m.doc() = "gpucloud's C++ core: devices, streams, events, buffers, memory resources, copies";
  gpucloud::python::register_errors(m);
  gpucloud::python::bind_runtime(m);
  gpucloud::python::bind_memory(m);
  gpucloud::python::bind_movement(m);
  gpucloud::python::bind_amp(m);
  gpucloud::python::bind_gemm(m);
  gpucloud::python::bind_collectives(m);
}
