// C++ exceptions become Python exceptions with the C++ message, in a hierarchy that is both
// gpucloud's and Python's: InvalidArgument is a ValueError, OutOfMemory a MemoryError, ...
#include "bindings.hpp"

#include <Python.h>

namespace gpucloud::python {

namespace {
PyObject* make(py::module_& m, const char* name, PyObject* bases, const char* doc) {
  const std::string qualified = std::string("gpucloud.") + name;
  PyObject* type = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, bases, nullptr);
  if (type == nullptr) throw py::error_already_set();
  m.add_object(name, py::handle(type));  // the module owns a reference
  return type;
}
}  // namespace

void register_errors(py::module_& m) {
  static PyObject* error = make(m, "Error", PyExc_RuntimeError, "Base of every gpucloud error.");
  auto two = [](PyObject* a, PyObject* b) { return py::make_tuple(py::handle(a), py::handle(b)).release().ptr(); };
  static PyObject* invalid_argument =
      make(m, "InvalidArgument", two(error, PyExc_ValueError), "A bad argument; nothing was changed.");
  static PyObject* out_of_memory =
      make(m, "OutOfMemory", two(error, PyExc_MemoryError), "An allocation failed; recoverable.");
  static PyObject* device_error = make(m, "DeviceError", error, "A device or runtime failure.");
  static PyObject* communication_error =
      make(m, "CommunicationError", error, "A collective failed, timed out or a peer died.");
  static PyObject* unsupported =
      make(m, "Unsupported", two(error, PyExc_NotImplementedError), "Not available in this build or on this device.");

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const InvalidArgument& e) {
      PyErr_SetString(invalid_argument, e.what());
    } catch (const OutOfMemory& e) {
      PyErr_SetString(out_of_memory, e.what());
    } catch (const DeviceError& e) {
      PyErr_SetString(device_error, e.what());
    } catch (const CommunicationError& e) {
      PyErr_SetString(communication_error, e.what());
    } catch (const Unsupported& e) {
      PyErr_SetString(unsupported, e.what());
    } catch (const Error& e) {
      PyErr_SetString(error, e.what());
    }
  });
}

}  // namespace gpucloud::python
