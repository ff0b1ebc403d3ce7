// C++ exceptions become Python exceptions with the C++ message, in a hierarchy that is both
// gpucloud's and Python's: InvalidArgument is a ValueError, OutOfMemory a MemoryError, ...
#include "bindings.hpp"

#include <Python.h>

#include <cstring>
#include <memory>
#include <string>

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

// The exception types, made once by register_errors (the module owns them).
struct Types {
  PyObject *error = nullptr, *invalid_argument = nullptr, *out_of_memory = nullptr, *device_error = nullptr,
           *communication_error = nullptr, *unsupported = nullptr, *checkpoint_error = nullptr,
           *checkpoint_mismatch = nullptr;
} types;

// A Python exception raised by work on a stream or a background thread: the exception object
// itself, raised again (as itself) wherever it is rethrown, as often as it is.
class PythonRaised : public std::exception {
 public:
  PythonRaised(std::shared_ptr<py::object> value, std::string what)
      : value_(std::move(value)), what_(std::move(what)) {}
  const char* what() const noexcept override { return what_.c_str(); }
  const py::object& value() const { return *value_; }

 private:
  std::shared_ptr<py::object> value_;  // released with the GIL (gil_safe)
  std::string what_;
};

// The Python type of a gpucloud exception, with its message; nullptr when @p p is not one.
PyObject* python_type(const std::exception_ptr& p, std::string& what) {
  try {
    std::rethrow_exception(p);
  } catch (const InvalidArgument& e) {
    what = e.what();
    return types.invalid_argument;
  } catch (const OutOfMemory& e) {
    what = e.what();
    return types.out_of_memory;
  } catch (const DeviceError& e) {
    what = e.what();
    return types.device_error;
  } catch (const CommunicationError& e) {
    what = e.what();
    return types.communication_error;
  } catch (const Unsupported& e) {
    what = e.what();
    return types.unsupported;
  } catch (const CheckpointMismatch& e) {
    what = e.what();
    return types.checkpoint_mismatch;
  } catch (const CheckpointError& e) {
    what = e.what();
    return types.checkpoint_error;
  } catch (const Error& e) {
    what = e.what();
    return types.error;
  } catch (const py::cast_error& e) {
    // A conversion no parameter check caught: still a TypeError, never a bare RuntimeError.
    what = std::string("gpucloud: wrong argument type: ") + e.what();
    return PyExc_TypeError;
  } catch (...) {
    return nullptr;
  }
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
  types.error = make(m, "Error", PyExc_RuntimeError, "Base of every gpucloud error.");
  auto two = [](PyObject* a, PyObject* b) { return py::make_tuple(py::handle(a), py::handle(b)).release().ptr(); };
  types.invalid_argument =
      make(m, "InvalidArgument", two(types.error, PyExc_ValueError), "A bad argument; nothing was changed.");
  types.out_of_memory =
      make(m, "OutOfMemory", two(types.error, PyExc_MemoryError), "An allocation failed; recoverable.");
  types.device_error = make(m, "DeviceError", types.error, "A device or runtime failure.");
  types.communication_error =
      make(m, "CommunicationError", types.error, "A collective failed, timed out or a peer died.");
  types.unsupported = make(m, "Unsupported", two(types.error, PyExc_NotImplementedError),
                           "Not available in this build or on this device.");
  types.checkpoint_error =
      make(m, "CheckpointError", types.error, "A checkpoint cannot be written or read (I/O, truncation, checksum).");
  types.checkpoint_mismatch = make(m, "CheckpointMismatch", two(types.checkpoint_error, PyExc_ValueError),
                                   "A sound checkpoint that does not fit what it is loaded into; nothing was written.");

  py::register_exception_translator([](std::exception_ptr p) {
    if (!p) return;
    try {
      std::rethrow_exception(p);
    } catch (const PythonRaised& r) {
      PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(r.value().ptr())), r.value().ptr());
      return;
    } catch (...) {
    }
    std::string what;
    if (PyObject* type = python_type(p, what)) {
      set_error(type, what.c_str());
    } else {
      std::rethrow_exception(p);  // not ours: pybind11's own translators
    }
  });
}

void throw_shareable(py::error_already_set& e) {
  py::object value = e.value();
  std::string what = e.what();
  throw PythonRaised(gil_safe(std::move(value)), std::move(what));
}

py::object exception_object(std::exception_ptr p) {
  if (!p) return py::none();
  try {
    std::rethrow_exception(p);
  } catch (py::error_already_set& e) {  // a Python exception raised by Python work on a stream
    return e.value();
  } catch (const PythonRaised& r) {
    return r.value();
  } catch (...) {
  }
  std::string what;
  PyObject* type = python_type(p, what);
  if (type == nullptr) {
    type = PyExc_RuntimeError;
    try {
      std::rethrow_exception(p);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
      what = "unknown C++ exception";
    }
  }
  set_error(type, what.c_str());
  PyObject *t = nullptr, *value = nullptr, *trace = nullptr;
  PyErr_Fetch(&t, &value, &trace);
  PyErr_NormalizeException(&t, &value, &trace);
  Py_XDECREF(t);
  Py_XDECREF(trace);
  return py::reinterpret_steal<py::object>(value);
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
