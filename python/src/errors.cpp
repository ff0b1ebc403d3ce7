// C++ exceptions become Python exceptions with the C++ message, in a hierarchy that is both
// gpucloud's and Python's: InvalidArgument is a ValueError, OutOfMemory a MemoryError, ...
#include "bindings.hpp"

#include <Python.h>

#include <cstring>

namespace gpucloud::python {

namespace {
// Raises @p type with @p what; bytes that are not UTF-8 (a bytes argument echoed in a message) are
// replaced, so the error is the typed one and never a UnicodeDecodeError.
void set_error(PyObject* type, const char* what) {
  PyObject* message = PyUnicode_DecodeUTF8(what, static_cast<Py_ssize_t>(std::strlen(what)), "replace");
  if (message == nullptr) {
    PyErr_Clear();
    PyErr_SetString(type, "gpucloud error (its message could not be decoded)");
    return;
  }
  PyErr_SetObject(type, message);
  Py_DECREF(message);
}

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
  static PyObject* checkpoint_error =
      make(m, "CheckpointError", error, "A checkpoint cannot be written or read (I/O, truncation, checksum).");
  static PyObject* checkpoint_mismatch =
      make(m, "CheckpointMismatch", two(checkpoint_error, PyExc_ValueError),
           "A sound checkpoint that does not fit what it is loaded into; nothing was written.");

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const InvalidArgument& e) {
      set_error(invalid_argument, e.what());
    } catch (const OutOfMemory& e) {
      set_error(out_of_memory, e.what());
    } catch (const DeviceError& e) {
      set_error(device_error, e.what());
    } catch (const CommunicationError& e) {
      set_error(communication_error, e.what());
    } catch (const Unsupported& e) {
      set_error(unsupported, e.what());
    } catch (const CheckpointMismatch& e) {
      set_error(checkpoint_mismatch, e.what());
    } catch (const CheckpointError& e) {
      set_error(checkpoint_error, e.what());
    } catch (const Error& e) {
      set_error(error, e.what());
    } catch (const py::cast_error& e) {
      // A conversion no parameter check caught: still a TypeError, never a bare RuntimeError.
      set_error(PyExc_TypeError, (std::string("gpucloud: wrong argument type: ") + e.what()).c_str());
    }
  });
}

std::string type_name(py::handle h) { return py::str(py::type::handle_of(h).attr("__name__")).cast<std::string>(); }

std::int64_t arg_int(py::handle h, const char* arg) {
  if (PyIndex_Check(h.ptr()) == 0) {
    throw py::type_error(std::string(arg) + ": expected an int, got " + type_name(h) + " " +
                         py::repr(h).cast<std::string>());
  }
  const auto index = py::reinterpret_steal<py::object>(PyNumber_Index(h.ptr()));
  if (!index) throw py::error_already_set();
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
  if (overflow != 0) {
    GPUCLOUD_FAIL(InvalidArgument, "gpucloud",
                  std::string(arg) + ": " + py::repr(h).cast<std::string>() + " is outside the int64 range");
  }
  if (v == -1 && PyErr_Occurred()) throw py::error_already_set();
  return v;
}

std::int64_t arg_size(py::handle h, const char* arg) {
  const std::int64_t v = arg_int(h, arg);
  GPUCLOUD_EXPECTS(v >= 0, "gpucloud", std::string(arg) + ": " + std::to_string(v) + " is negative");
  return v;
}

std::vector<std::int64_t> arg_ints(py::handle h, const char* arg) {
  if (PyIndex_Check(h.ptr()) != 0) return {arg_int(h, arg)};
  if (!py::isinstance<py::sequence>(h) || py::isinstance<py::str>(h) || py::isinstance<py::bytes>(h)) {
    throw py::type_error(std::string(arg) + ": expected an int or a sequence of ints, got " + type_name(h));
  }
  std::vector<std::int64_t> out;
  std::size_t i = 0;
  for (auto item : py::reinterpret_borrow<py::sequence>(h)) {
    const std::string name = std::string(arg) + "[" + std::to_string(i++) + "]";
    out.push_back(arg_int(item, name.c_str()));
  }
  return out;
}

std::map<std::string, std::string> arg_str_dict(py::handle h, const char* arg) {
  std::map<std::string, std::string> out;
  if (h.is_none()) return out;
  if (!py::isinstance<py::dict>(h)) {
    throw py::type_error(std::string(arg) + ": expected a dict of {str: str}, got " + type_name(h));
  }
  for (auto item : py::reinterpret_borrow<py::dict>(h)) {
    if (!py::isinstance<py::str>(item.first) || !py::isinstance<py::str>(item.second)) {
      throw py::type_error(std::string(arg) + ": keys and values must be str, got " + type_name(item.first) + ": " +
                           type_name(item.second));
    }
    out[item.first.cast<std::string>()] = item.second.cast<std::string>();
  }
  return out;
}

}  // namespace gpucloud::python
