// Shared pieces of the Python bindings (not API).
#pragma once

#include <gpucloud/gpucloud.hpp>

#include <pybind11/pybind11.h>

#include <functional>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace gpucloud::python {

void register_errors(py::module_& m);
/// The Python exception object for @p p (GIL held): a gpucloud error as its Python type, a
/// Python exception as itself, anything else a RuntimeError; None for null.
py::object exception_object(std::exception_ptr p);
/// Throws the Python exception of @p e (GIL held) as a C++ exception that may be rethrown any
/// number of times, from any thread: what work on a stream or a background thread raises, which
/// every synchronize() on that stream may see. (A py::error_already_set can be restored only once:
/// rethrown by two threads sharing a stream, it aborted the interpreter.)
[[noreturn]] void throw_shareable(py::error_already_set& e);
void bind_runtime(py::module_& m);
void bind_memory(py::module_& m);
void bind_movement(py::module_& m);
void bind_amp(py::module_& m);
void bind_compute(py::module_& m);
void bind_comm(py::module_& m);
void bind_monitor(py::module_& m);
void bind_checkpoint(py::module_& m);
void bind_telemetry(py::module_& m);
void bind_elastic(py::module_& m);

/// A StateDict as Python sees it: {name: BufferView} of memory owned by @p owner, whose exports
/// wait for @p stream (the stream the state is ordered on).
py::dict state_to_python(const StateDict& state, py::object owner, py::object stream);
/// {name: array} from Python (a load_state_dict's argument) as borrowed views; their owners are
/// appended to @p owners.
StateDict state_from_python(py::handle state, std::vector<py::object>& owners);

/// Python's Stream: an owned stream, or a borrowed one (a pipeline's internal stream handed to a
/// compute step) that keeps its owner (the pipeline) alive. The owned stream's destructor waits
/// for its work, which may need the GIL (Python host functions, releases of borrowed arrays), so
/// it drops the GIL first.
struct PyStream {
  explicit PyStream(Device device);
  PyStream(StreamView borrowed, py::object owner_of_borrowed) : view(borrowed), owner(std::move(owner_of_borrowed)) {}
  ~PyStream();
  PyStream(const PyStream&) = delete;
  PyStream& operator=(const PyStream&) = delete;
  std::unique_ptr<Stream> owned;
  StreamView view;
  py::object owner;  ///< what owns a borrowed stream
};

/// Python's View: a non-owning typed view (a pipeline chunk, a prefetched batch's array, an
/// optimizer's state) that keeps its owner alive and speaks the same array protocols as Buffer.
/// Exports wait for @p stream (a gpucloud.Stream, or None) first.
struct PyView {
  BufferView view;
  std::vector<std::int64_t> shape;
  py::object owner;
  py::object stream = py::none();  ///< the stream whose work produces the memory's contents
};

/// Python's Buffer: an owning Buffer plus the shape Python sees. Its memory may be freed in
/// stream order, and a CUDA free may wait for the device, so its destructor drops the GIL too.
/// The Python objects its memory depends on (the resource, the stream it is freed on) are
/// declared first, so they outlive the Buffer.
struct PyBuffer {
  PyBuffer(Buffer b, std::vector<std::int64_t> s, py::object mr, py::object stream_object = py::none())
      : resource(std::move(mr)), stream(std::move(stream_object)), buffer(std::move(b)), shape(std::move(s)) {}
  ~PyBuffer();
  PyBuffer(const PyBuffer&) = delete;
  PyBuffer& operator=(const PyBuffer&) = delete;
  py::object resource;  ///< the Python memory resource it came from, kept alive
  py::object stream;    ///< the gpucloud.Stream it is ordered on (freed in its order), kept alive
  Buffer buffer;
  std::vector<std::int64_t> shape;
};

/// Whether @p obj is a gpucloud.Buffer (or a subclass): a check against the type itself, looked
/// up once (py::isinstance<T> looks T up by name on each call).
inline bool is_buffer(py::handle obj) {
  static auto* const type = reinterpret_cast<PyTypeObject*>(py::type::of<PyBuffer>().ptr());
  return PyObject_TypeCheck(obj.ptr(), type) != 0;
}

/// Whether @p obj is a gpucloud.View (or a subclass), as is_buffer().
inline bool is_view(py::handle obj) {
  static auto* const type = reinterpret_cast<PyTypeObject*>(py::type::of<PyView>().ptr());
  return PyObject_TypeCheck(obj.ptr(), type) != 0;
}

/// Python's LossScaler: the scaler and the stream its state is ordered on (kept alive).
struct PyScaler {
  std::unique_ptr<LossScaler> scaler;
  py::object stream;
  ~PyScaler() {
    py::gil_scoped_release release;
    scaler.reset();
  }
};

/// Keeps Python objects alive until the work enqueued on @p stream so far has finished; they are
/// released on a Python thread (GIL held) at a later borrowing call or Stream.synchronize(), so no
/// stream thread ever waits for the GIL. The memory of Buffers and Views among them is recorded
/// as in use, so exports of it wait (wait_for_work_on). When @p abandoned (called with the GIL,
/// once the work has passed) says the work was abandoned while it may still touch them (a
/// collective that timed out, its messages left to MPI), they are kept for the process's life.
void keep_alive_until_done(StreamView stream, std::vector<py::object> objects, std::function<bool()> abandoned = {});
/// Always true: the parameter types below accept any object and convert it themselves.
inline bool accepts_anything(PyObject*) { return true; }
/// Parameter types that say in signatures and stubs what a parameter accepts (any object is
/// passed in; the function converts and checks it as before).
#define GPUCLOUD_PARAMETER_TYPE(Name)                           \
  class Name : public py::object {                              \
   public:                                                      \
    PYBIND11_OBJECT_DEFAULT(Name, py::object, accepts_anything) \
  }
/// A parameter that takes an array: NumPy or anything with __array_interface__ / __cuda_array_interface__ / __dlpack__
/// (torch, CuPy), a Buffer or a BufferView; the function borrows it.
GPUCLOUD_PARAMETER_TYPE(ArrayLike);
/// A parameter that takes an array or None.
GPUCLOUD_PARAMETER_TYPE(OptionalArrayLike);
/// A parameter that takes a gpucloud.Device or a string ("host", "cuda:0").
GPUCLOUD_PARAMETER_TYPE(DeviceLike);
/// A parameter that takes a device, or None for the default.
GPUCLOUD_PARAMETER_TYPE(OptionalDeviceLike);
/// A parameter that takes a gpucloud.MemoryKind or its name.
GPUCLOUD_PARAMETER_TYPE(KindLike);
/// A parameter that takes a gpucloud.DType, its name, or a NumPy dtype.
GPUCLOUD_PARAMETER_TYPE(DTypeLike);
/// A parameter that takes a dtype, or None.
GPUCLOUD_PARAMETER_TYPE(OptionalDTypeLike);
/// A parameter that takes an int or a pair of ints (a convolution's stride, padding, dilation).
GPUCLOUD_PARAMETER_TYPE(IntOrPair);
/// A parameter that takes a gpucloud.Stream (or a framework stream it adopts), kept alive by the object built.
GPUCLOUD_PARAMETER_TYPE(StreamArg);
/// A parameter that takes a gpucloud.Communicator, kept alive by the object built.
GPUCLOUD_PARAMETER_TYPE(CommunicatorArg);
/// A parameter that takes a communicator, or None.
GPUCLOUD_PARAMETER_TYPE(OptionalCommunicator);
/// A parameter that takes a memory resource, or None for the default.
GPUCLOUD_PARAMETER_TYPE(OptionalResource);
/// A parameter that takes a function called with each chunk, or None.
GPUCLOUD_PARAMETER_TYPE(ChunkFunction);
/// A parameter that takes a Python int (checked exactly: no floats, no overflow).
GPUCLOUD_PARAMETER_TYPE(IntArg);
/// A parameter that takes seconds (an int or a float, finite and not negative).
GPUCLOUD_PARAMETER_TYPE(Seconds);
/// A parameter that takes a {str: str} dict, or None.
GPUCLOUD_PARAMETER_TYPE(StrDict);
/// A parameter that takes a {name: array} dict.
GPUCLOUD_PARAMETER_TYPE(TensorDict);
/// A parameter that takes an int (exactly) or a float.
GPUCLOUD_PARAMETER_TYPE(Number);
/// A parameter that takes a file path, or None.
GPUCLOUD_PARAMETER_TYPE(OptionalPath);
/// A parameter that takes a gpucloud.MetricsMonitor.
GPUCLOUD_PARAMETER_TYPE(MonitorArg);
/// A parameter that takes a file system path: str, bytes or os.PathLike (os.fsencode's rules).
GPUCLOUD_PARAMETER_TYPE(PathArg);
/// A parameter that takes an element count or a shape.
GPUCLOUD_PARAMETER_TYPE(ShapeArg);
#undef GPUCLOUD_PARAMETER_TYPE

/// Runs @p fn with the GIL released (it may block: a wait, a free, a collective, enqueueing on a
/// full queue) and returns its result. Every binding that calls into C++ work goes through it.
template <class F>
decltype(auto) without_gil(F&& fn) {
  py::gil_scoped_release release;
  return std::forward<F>(fn)();
}
/// Runs @p enqueue (C++ calls that enqueue work on @p stream) with the GIL released, then keeps
/// @p owners (the arrays and objects that work touches) alive until it has finished; returns
/// what @p enqueue returns. Nothing is held when @p enqueue throws: it enqueued nothing.
/// @p abandoned: as keep_alive_until_done's.
template <class F>
auto enqueue_holding(StreamView stream, std::vector<py::object> owners, F&& enqueue,
                     std::function<bool()> abandoned = {}) {
  if constexpr (std::is_void_v<std::invoke_result_t<F&>>) {
    without_gil(enqueue);
    keep_alive_until_done(stream, std::move(owners), std::move(abandoned));
  } else {
    auto result = without_gil(enqueue);
    keep_alive_until_done(stream, std::move(owners), std::move(abandoned));
    return result;
  }
}
/// Waits (GIL released) until the gpucloud work enqueued so far that touches @p view's memory, or
/// that holds @p self, has run: what every export does first.
void wait_for_work_on(py::handle self, BufferView view);
/// At interpreter exit, before anything else: stops background threads (prefetchers), which
/// must not outlive the interpreter's ability to run them.
void stop_background_threads_at_exit();
/// Registers a prefetcher for stop_background_threads_at_exit (GIL held); @p stop ends it.
void register_background(const void* key, std::function<void()> stop);
/// Unregisters it (its destructor, GIL held).
void unregister_background(const void* key);
/// Releases the borrowed objects whose work has finished (GIL held).
void release_finished_borrows();
/// At interpreter exit: waits for every borrowing work to finish, then releases all.
void release_all_borrows_at_exit();

/// True once the interpreter is finalising: no thread may take the GIL any more (one that tries is
/// ended mid-call), so work running Python is skipped and Python objects are left alone.
bool interpreter_finalizing() noexcept;

/// A Python object that can be destroyed from any thread: the last release takes the GIL.
std::shared_ptr<py::object> gil_safe(py::object object);

// ---- the conversion layer: every Python value that becomes a C++ one passes here ------------

/// The Python type name of @p h, for messages.
std::string type_name(py::handle h);

/// An int (or anything with __index__: NumPy integers, bool) for parameter @p arg.
/// @throws TypeError naming @p arg for anything else (a float, a string), InvalidArgument for an
///         int outside int64.
std::int64_t arg_int(py::handle h, const char* arg);

/// A non-negative int for parameter @p arg (a size, a count, an index).
std::int64_t arg_size(py::handle h, const char* arg);

/// A sequence of ints for parameter @p arg (a shape): elements named arg[i] in errors.
std::vector<std::int64_t> arg_ints(py::handle h, const char* arg);

/// @p h as the bound C++ class T for parameter @p arg, or a TypeError that names @p arg,
/// @p expected and what was passed (in place of pybind11's "Unable to cast ... to C++ type '?'").
template <class T>
T& arg_as(py::handle h, const char* arg, const char* expected) {
  if (!py::isinstance<T>(h)) {
    throw py::type_error(std::string(arg) + ": expected " + expected + ", got " + type_name(h));
  }
  return h.cast<T&>();
}

/// A dict of {str: str} for parameter @p arg (None: empty). @throws TypeError naming @p arg.
std::map<std::string, std::string> arg_str_dict(py::handle h, const char* arg);

/// dtype from a DType, a name ("float32", "bf16"), a NumPy dtype or a torch dtype.
/// @throws TypeError for anything else.
DType to_dtype(py::handle h);

/// MemoryKind from a MemoryKind or its name. @throws TypeError otherwise.
MemoryKind to_kind(py::handle h);

/// Device from a Device or a string like "cuda:0". @throws TypeError otherwise.
Device to_device(py::handle h);

}  // namespace gpucloud::python

namespace pybind11::detail {
// What the parameter types above are called in signatures and stubs.
template <>
struct handle_type_name<gpucloud::python::ArrayLike> {
  static constexpr auto name = const_name("numpy.typing.ArrayLike");
};
template <>
struct handle_type_name<gpucloud::python::OptionalArrayLike> {
  static constexpr auto name = const_name("numpy.typing.ArrayLike | None");
};
template <>
struct handle_type_name<gpucloud::python::DeviceLike> {
  static constexpr auto name = const_name("gpucloud._core.Device | str");
};
template <>
struct handle_type_name<gpucloud::python::OptionalDeviceLike> {
  static constexpr auto name = const_name("gpucloud._core.Device | str | None");
};
template <>
struct handle_type_name<gpucloud::python::KindLike> {
  static constexpr auto name = const_name("gpucloud._core.MemoryKind | str");
};
template <>
struct handle_type_name<gpucloud::python::DTypeLike> {
  static constexpr auto name = const_name("gpucloud._core.DType | str | numpy.dtype");
};
template <>
struct handle_type_name<gpucloud::python::OptionalDTypeLike> {
  static constexpr auto name = const_name("gpucloud._core.DType | str | None");
};
template <>
struct handle_type_name<gpucloud::python::IntOrPair> {
  static constexpr auto name = const_name("int | tuple[int, int]");
};
template <>
struct handle_type_name<gpucloud::python::StreamArg> {
  static constexpr auto name = const_name("gpucloud._core.Stream");
};
template <>
struct handle_type_name<gpucloud::python::CommunicatorArg> {
  static constexpr auto name = const_name("gpucloud._core.Communicator");
};
template <>
struct handle_type_name<gpucloud::python::OptionalCommunicator> {
  static constexpr auto name = const_name("gpucloud._core.Communicator | None");
};
template <>
struct handle_type_name<gpucloud::python::OptionalResource> {
  static constexpr auto name = const_name("gpucloud._core.MemoryResource | None");
};
template <>
struct handle_type_name<gpucloud::python::ChunkFunction> {
  static constexpr auto name = const_name("collections.abc.Callable[[gpucloud._core.Chunk], None] | None");
};
template <>
struct handle_type_name<gpucloud::python::IntArg> {
  static constexpr auto name = const_name("int");
};
template <>
struct handle_type_name<gpucloud::python::Seconds> {
  static constexpr auto name = const_name("float");
};
template <>
struct handle_type_name<gpucloud::python::StrDict> {
  static constexpr auto name = const_name("dict[str, str] | None");
};
template <>
struct handle_type_name<gpucloud::python::TensorDict> {
  static constexpr auto name = const_name("dict[str, numpy.typing.ArrayLike]");
};
template <>
struct handle_type_name<gpucloud::python::Number> {
  static constexpr auto name = const_name("int | float");
};
template <>
struct handle_type_name<gpucloud::python::OptionalPath> {
  static constexpr auto name = const_name("str | None");
};
template <>
struct handle_type_name<gpucloud::python::PathArg> {
  static constexpr auto name = const_name("str | bytes | os.PathLike[str] | os.PathLike[bytes]");
};
template <>
struct handle_type_name<gpucloud::python::MonitorArg> {
  static constexpr auto name = const_name("gpucloud._core.MetricsMonitor");
};
template <>
struct handle_type_name<gpucloud::python::ShapeArg> {
  static constexpr auto name = const_name("int | collections.abc.Sequence[int]");
};
}  // namespace pybind11::detail
