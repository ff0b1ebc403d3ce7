// Devices, dtypes, streams and events.
#include "bindings.hpp"

#include <pybind11/functional.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>

namespace gpucloud::python {

namespace {
StreamView view_of(PyStream& s) { return s.view; }

// Streams adopted from frameworks, one per (device, handle), kept for the process's life: work
// enqueued through a temporary wrapper must still find it when it runs. GIL-guarded.
std::map<std::pair<int, std::uintptr_t>, std::unique_ptr<Stream>>& adopted() {
  static auto* map = new std::map<std::pair<int, std::uintptr_t>, std::unique_ptr<Stream>>();
  return *map;
}

// The (handle, device) of a framework's stream: an object with __cuda_stream__ (the CUDA stream
// protocol: a (version, handle) pair), a torch.cuda.Stream (.cuda_stream), a cupy.cuda.Stream
// (.ptr), or a handle as an int; the device from the object (.device / .device_id) or @p device.
std::pair<std::uintptr_t, Device> native_stream_of(py::handle obj, DeviceLike device) {
  std::int64_t handle = 0;
  if (py::hasattr(obj, "__cuda_stream__")) {
    py::object pair = obj.attr("__cuda_stream__");
    if (PyCallable_Check(pair.ptr())) pair = pair();
    if (!py::isinstance<py::tuple>(pair) || py::len(pair) != 2) {
      throw py::type_error("stream: __cuda_stream__ must give a (version, handle) pair, got " + type_name(pair));
    }
    handle = arg_int(pair.cast<py::tuple>()[1], "stream.__cuda_stream__()[1]");
  } else if (py::hasattr(obj, "cuda_stream")) {
    handle = arg_int(obj.attr("cuda_stream"), "stream.cuda_stream");
  } else if (py::hasattr(obj, "ptr") && py::hasattr(obj, "device_id")) {
    handle = arg_int(obj.attr("ptr"), "stream.ptr");
  } else if (PyIndex_Check(obj.ptr()) != 0) {
    handle = arg_int(obj, "stream");
  } else {
    throw py::type_error(
        "stream: expected a gpucloud.Stream, an object with __cuda_stream__, a torch.cuda.Stream, "
        "a cupy.cuda.Stream or a cudaStream_t as an int, got " +
        type_name(obj));
  }
  Device d = device.is_none() ? Device::host() : to_device(device);
  if (device.is_none()) {
    if (py::hasattr(obj, "device") && py::hasattr(obj.attr("device"), "index") &&
        !obj.attr("device").attr("index").is_none()) {
      d = Device::cuda(static_cast<int>(arg_int(obj.attr("device").attr("index"), "stream.device.index")));
    } else if (py::hasattr(obj, "device_id")) {
      d = Device::cuda(static_cast<int>(arg_int(obj.attr("device_id"), "stream.device_id")));
    } else {
      d = Device::cuda(0);
    }
  }
  return {static_cast<std::uintptr_t>(handle), d};
}

std::unique_ptr<PyStream> adopt(py::handle obj, DeviceLike device) {
  const auto [handle, d] = native_stream_of(obj, device);
  auto& slot = adopted()[{d.is_cuda() ? d.index() : -1, handle}];
  if (!slot) slot = std::make_unique<Stream>(Stream::from_native(reinterpret_cast<void*>(handle), d));
  return std::make_unique<PyStream>(slot->view(), py::none());
}
}  // namespace

namespace {
// Streams made from Python, drained at exit while Python host functions can still run. GIL-guarded.
std::set<PyStream*>& live_streams() {
  static auto* set = new std::set<PyStream*>();
  return *set;
}
}  // namespace

PyStream::PyStream(Device device) : owned(std::make_unique<Stream>(device)), view(*owned) {
  live_streams().insert(this);
}

PyStream::~PyStream() {
  if (!owned) return;
  live_streams().erase(this);
  py::gil_scoped_release release;
  owned.reset();
}

bool interpreter_finalizing() noexcept {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing() != 0;
#else
  return _Py_IsFinalizing() != 0;
#endif
}

std::shared_ptr<py::object> gil_safe(py::object object) {
  return std::shared_ptr<py::object>(new py::object(std::move(object)), [](py::object* o) {
    if (interpreter_finalizing()) return;  // leaked: the GIL can no longer be taken
    py::gil_scoped_acquire acquire;
    delete o;
  });
}

namespace {
// Objects that enqueued work borrows, each with a flag that the stream sets (without the GIL) once
// it has passed that work. They are released here, on a Python thread that holds the GIL, at the
// next binding call or synchronize(): a stream thread taking the GIL to release them would stall
// its stream whenever Python holds it (the host backend's worker, at every borrowed array).
// The memory ranges of the Buffers and Views among them, and the objects themselves, tell
// exports which pending work touches what they export.
struct PendingBorrow {
  std::shared_ptr<std::atomic<bool>> done;
  std::function<bool()> abandoned;  // true: keep the objects for ever (see keep_alive_until_done)
  py::object objects;
  std::vector<std::pair<std::uintptr_t, std::uintptr_t>> ranges;  // [begin, end) of gpucloud memory
  std::vector<const PyObject*> ids;                               // the objects, and the owners of Views
};
std::vector<PendingBorrow>& borrowed() {  // guarded by the GIL; never destroyed (cleared at exit)
  static auto* list = new std::vector<PendingBorrow>();
  return *list;
}

std::pair<std::uintptr_t, std::uintptr_t> range_of(BufferView v) {
  const auto begin = reinterpret_cast<std::uintptr_t>(v.data());
  return {begin, begin + v.size_bytes()};
}

void wait_for_flags(const std::vector<std::shared_ptr<std::atomic<bool>>>& flags) {
  if (flags.empty()) return;
  py::gil_scoped_release release;
  for (const auto& f : flags) {
    while (!f->load(std::memory_order_acquire)) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

// What abandoned work may still write: kept for the process's life, never released (not even at
// exit: the job ends with the operation pending). Guarded by the GIL.
std::vector<py::object>& kept_for_ever() {
  static auto* list = new std::vector<py::object>();
  return *list;
}

// Background threads (prefetchers) to stop at exit: key -> how to stop it. Guarded by the GIL.
std::map<const void*, std::function<void()>>& background() {
  static auto* map = new std::map<const void*, std::function<void()>>();
  return *map;
}
}  // namespace

void release_finished_borrows() {
  auto& list = borrowed();
  if (list.empty()) return;
  // Moved out first: releasing an object can run Python code that calls back into gpucloud.
  std::vector<PendingBorrow> finished;
  auto keep = std::stable_partition(list.begin(), list.end(),
                                    [](const PendingBorrow& b) { return !b.done->load(std::memory_order_acquire); });
  std::move(keep, list.end(), std::back_inserter(finished));
  list.erase(keep, list.end());
  for (auto& f : finished) {
    if (f.abandoned && f.abandoned()) kept_for_ever().push_back(std::move(f.objects));
  }
  finished.clear();
}

void release_all_borrows_at_exit() {
  auto& list = borrowed();
  std::vector<std::shared_ptr<std::atomic<bool>>> flags;
  for (const auto& b : list) flags.push_back(b.done);
  wait_for_flags(flags);  // the streams finish their work, then set the flags
  std::vector<PendingBorrow> all;
  all.swap(list);
}

void keep_alive_until_done(StreamView stream, std::vector<py::object> objects, std::function<bool()> abandoned) {
  release_finished_borrows();
  if (objects.empty()) return;
  // A host stream that has already run everything (a small copy runs in place on an idle stream)
  // holds nothing: the objects are released here, with the GIL, as a finished borrow would be.
  if (stream.device().is_host() && stream.query()) {
    if (abandoned && abandoned()) kept_for_ever().push_back(py::cast(std::move(objects)));
    return;
  }
  PendingBorrow pending;
  pending.abandoned = std::move(abandoned);
  for (const auto& o : objects) {
    pending.ids.push_back(o.ptr());
    if (is_buffer(o)) {
      pending.ranges.push_back(range_of(o.cast<PyBuffer&>().buffer.view()));
    } else if (is_view(o)) {
      const auto& v = o.cast<PyView&>();
      pending.ranges.push_back(range_of(v.view));
      pending.ids.push_back(v.owner.ptr());
    }
  }
  pending.done = std::make_shared<std::atomic<bool>>(false);
  // always_run: the flag must be set even if earlier work on the stream failed.
  launch_cleanup(stream, [done = pending.done] { done->store(true, std::memory_order_release); });
  pending.objects = py::cast(std::move(objects));
  borrowed().push_back(std::move(pending));
}

void wait_for_work_on(py::handle self, BufferView view) {
  release_finished_borrows();
  const auto mine = range_of(view);
  // The exported object and what it views: a View's owner, that owner's owner, ...
  std::vector<const PyObject*> chain{self.ptr()};
  for (py::handle h = self; is_view(h);) {
    h = h.cast<PyView&>().owner;
    chain.push_back(h.ptr());
  }
  std::vector<std::shared_ptr<std::atomic<bool>>> flags;
  for (const auto& b : borrowed()) {
    if (b.done->load(std::memory_order_acquire)) continue;
    bool touches = false;
    for (const PyObject* id : chain) touches = touches || std::find(b.ids.begin(), b.ids.end(), id) != b.ids.end();
    for (const auto& r : b.ranges) touches = touches || (r.first < mine.second && mine.first < r.second);
    if (touches) flags.push_back(b.done);
  }
  wait_for_flags(flags);
}

void register_background(const void* key, std::function<void()> stop) { background()[key] = std::move(stop); }

void unregister_background(const void* key) { background().erase(key); }

void stop_background_threads_at_exit() {
  auto stops = std::move(background());
  background().clear();
  for (auto& [key, stop] : stops) {
    (void)key;
    // the thread may be waiting for the GIL to finish its call
    without_gil([&] { stop(); });
  }
  // Work still queued on Python's streams runs now, while it may still call Python; its errors
  // have nobody left to hear them.
  const std::vector<PyStream*> streams(live_streams().begin(), live_streams().end());
  for (PyStream* s : streams) {
    py::gil_scoped_release release;
    try {
      s->view.synchronize();
    } catch (...) {
    }
  }
}

DType to_dtype(py::handle h) {
  if (py::isinstance<DType>(h)) return h.cast<DType>();
  std::string name;
  if (py::isinstance<py::str>(h)) {
    name = h.cast<std::string>();
  } else if (py::hasattr(h, "name") && py::isinstance<py::str>(h.attr("name"))) {
    name = h.attr("name").cast<std::string>();  // numpy.dtype
  } else if (py::isinstance<py::type>(h) && py::hasattr(h, "__name__")) {
    name = h.attr("__name__").cast<std::string>();  // numpy.float32
  } else {
    name = py::str(h).cast<std::string>();  // torch.float32
    if (name.rfind("torch.", 0) == 0) name = name.substr(6);
  }
  try {
    return dtype_from_name(name);
  } catch (const InvalidArgument&) {
    throw py::type_error("dtype: " + py::repr(h).cast<std::string>() + " is not a gpucloud dtype");
  }
}

void bind_runtime(py::module_& m) {
  py::enum_<DType>(m, "DType", "Element types.")
      .value("float32", DType::float32)
      .value("float64", DType::float64)
      .value("float16", DType::float16)
      .value("bfloat16", DType::bfloat16)
      .value("int32", DType::int32)
      .value("int64", DType::int64)
      .value("uint8", DType::uint8)
      .value("float8_e4m3", DType::float8_e4m3)
      .value("float8_e5m2", DType::float8_e5m2)
      .def_property_readonly(
          "itemsize", [](DType t) { return dtype_size(t); }, "Bytes per element.")
      .def("__str__", [](DType t) { return std::string(dtype_name(t)); });
  m.def(
      "dtype", [](py::handle h) { return to_dtype(h); }, py::arg("spec"),
      "The DType named by a DType, a string ('float32', 'bf16'), a NumPy or a torch dtype.");

  py::enum_<DeviceKind>(m, "DeviceKind").value("host", DeviceKind::host).value("cuda", DeviceKind::cuda);

  py::class_<Device>(m, "Device", "The host, or CUDA GPU i.")
      .def(
          py::init([](const std::string& text) { return Device::parse(text); }), py::arg("spec") = "host",
          "A device from 'host', 'cpu', 'cuda', 'cuda:N' or a visible GPU's or MIG instance's UUID ('GPU-…', 'MIG-…').")
      .def_static("host", &Device::host, "The host device; always available.")
      .def_static("cuda", &Device::cuda, py::arg("index") = 0, "CUDA device `index`; raises if it is not there.")
      .def_property_readonly("kind", &Device::kind)
      .def_property_readonly("index", &Device::index)
      .def_property_readonly("is_host", &Device::is_host)
      .def_property_readonly("is_cuda", &Device::is_cuda)
      .def("__str__", &Device::str)
      .def("__repr__", [](Device d) { return "gpucloud.Device('" + d.str() + "')"; })
      .def("__eq__", [](Device a, Device b) { return a == b; })
      .def("__hash__", [](Device d) { return std::hash<std::string>()(d.str()); });

  py::class_<DeviceProperties>(m, "DeviceProperties", "What a device is and can do.")
      .def_readonly("name", &DeviceProperties::name)
      .def_readonly("compute_capability_major", &DeviceProperties::compute_capability_major)
      .def_readonly("compute_capability_minor", &DeviceProperties::compute_capability_minor)
      .def_readonly("total_memory", &DeviceProperties::total_memory)
      .def_readonly("multiprocessor_count", &DeviceProperties::multiprocessor_count)
      .def_readonly("concurrent_managed_access", &DeviceProperties::concurrent_managed_access)
      .def_readonly("backend", &DeviceProperties::backend)
      .def_readonly("uuid", &DeviceProperties::uuid)
      .def("__repr__", [](const DeviceProperties& p) {
        return "DeviceProperties(name='" + p.name + "', backend='" + p.backend +
               "', compute_capability=" + std::to_string(p.compute_capability_major) + "." +
               std::to_string(p.compute_capability_minor) + ", total_memory=" + std::to_string(p.total_memory) + ")";
      });
  py::class_<MemoryInfo>(m, "MemoryInfo", "Free and total bytes of a device's memory.")
      .def_readonly("free", &MemoryInfo::free)
      .def_readonly("total", &MemoryInfo::total);
  py::class_<BuildInfo>(m, "BuildInfo", "How the library was built.")
      .def_readonly("version", &BuildInfo::version)
      .def_readonly("cuda", &BuildInfo::cuda)
      .def_readonly("cuda_runtime_version", &BuildInfo::cuda_runtime_version)
      .def_readonly("cuda_architectures", &BuildInfo::cuda_architectures)
      .def_readonly("nccl", &BuildInfo::nccl, "NCCL communicators available.")
      .def_readonly("cudnn", &BuildInfo::cudnn, "cuDNN convolutions available on GPUs.")
      .def_readonly("mpi", &BuildInfo::mpi, "MPI communicators available.")
      .def_readonly("telemetry", &BuildInfo::telemetry, "Prometheus telemetry available (built with prometheus-cpp).")
      .def_readonly("host_blas", &BuildInfo::host_blas, "The host GEMM's implementation: 'OpenBLAS' or 'built-in'.")
      .def_readonly("host_bf16_gemm", &BuildInfo::host_bf16_gemm,
                    "The host bf16 GEMM's: 'oneDNN' (native bf16 products) or 'widened to fp32'.")
      .def_readonly("host_conv", &BuildInfo::host_conv, "The host fp32 convolution's: 'oneDNN' or 'im2col + GEMM'.");

  m.def("device_properties", &device_properties, py::arg("device"), "Properties of a device.");
  py::class_<HostThreads>(m, "HostThreads", "How many host threads the library runs and why.")
      .def_readonly("cpus", &HostThreads::cpus, "CPUs the process may use (affinity, capped by the cgroup CPU quota).")
      .def_readonly("pool", &HostThreads::pool, "The library's compute pool, the calling thread included.")
      .def_readonly("blas", &HostThreads::blas, "OpenBLAS's threads (0 without OpenBLAS).")
      .def_readonly("reason", &HostThreads::reason, "Where the figures come from.")
      .def("__repr__", [](const HostThreads& t) {
        return "HostThreads(cpus=" + std::to_string(t.cpus) + ", pool=" + std::to_string(t.pool) +
               ", blas=" + std::to_string(t.blas) + ", reason='" + t.reason + "')";
      });
  m.def("host_threads", &host_threads,
        "The process's host thread budget: CPUs it may use (affinity, cgroup CPU quota), the library's pool "
        "(GPUCLOUD_HOST_THREADS overrides) and OpenBLAS's threads.");
  // OpenBLAS gets the budget at import, before a neighbour in the process (torch) starts its threads.
  host_threads();
  m.def(
      "memory_info", [](DeviceLike device) { return memory_info(to_device(device)); }, py::arg("device"),
      "Free and total memory of a device now (the host's capped by its cgroup memory limit).");
  m.def("cuda_device_count", &cuda_device_count, "Visible CUDA devices (0 without a usable driver).");
  m.def("cuda_unavailable_reason", &cuda_unavailable_reason, "Why there is no CUDA device, or ''.");
  m.def("available_devices", &available_devices, "The host, then every visible CUDA device.");
  m.def("build_info", &build_info, "The configuration this library was built with.");

  // Both classes first, so each one's signatures can name the other.
  py::class_<PyStream> stream_class(m, "Stream", "An in-order asynchronous work queue on one device.");
  py::class_<Event> event_class(
      m, "Event", "A marker recorded on a stream, to order work across streams (a TimedEvent also times it).");
  stream_class.def(py::init<Device>(), py::arg_v("device", Device::host(), "Device.host()"))
      .def(py::init([](py::object stream_like) { return adopt(stream_like, py::none()); }), py::arg("stream"),
           "Adopts a framework's CUDA stream (an object with __cuda_stream__, a torch.cuda.Stream, a "
           "cupy.cuda.Stream): gpucloud work is then ordered with the framework's. Every function that takes a "
           "Stream accepts these directly.")
      .def_static(
          "from_native", [](py::object native, OptionalDeviceLike device) { return adopt(native, device); },
          py::arg("native"), py::arg("device") = py::none(),
          "Adopts a caller's stream (as Stream(stream), with the device given or taken from the object); the "
          "caller keeps it alive.")
      .def(
          "__cuda_stream__",
          [](PyStream& s) {
            GPUCLOUD_EXPECTS(s.view.device().is_cuda(), "Stream.__cuda_stream__",
                             "a host stream has no CUDA stream to share (" + s.view.device().str() + ")");
            return py::make_tuple(0, reinterpret_cast<std::uintptr_t>(s.view.native_handle()));
          },
          "The CUDA stream protocol: (0, cudaStream_t as an int), so frameworks can adopt this stream.")
      .def_property_readonly("device", [](PyStream& s) { return s.view.device(); })
      .def(
          "synchronize",
          [](PyStream& s) {
            without_gil([&] { s.view.synchronize(); });
            release_finished_borrows();
          },
          "Wait for the work enqueued so far; raises the first error that work raised.")
      .def(
          "query", [](PyStream& s) { return s.view.query(); }, "True when all enqueued work has finished.")
      .def(
          "wait", [](PyStream& s, const Event& e) { s.view.wait(e); }, py::arg("event"),
          "Later work on this stream waits for the event's latest record.")
      .def_property_readonly(
          "native_handle", [](PyStream& s) { return reinterpret_cast<std::uintptr_t>(s.view.native_handle()); },
          "The cudaStream_t as an integer (0 on the host).")
      .def("__repr__", [](PyStream& s) { return "gpucloud.Stream(" + s.view.device().str() + ")"; });

  // Framework streams convert to gpucloud.Stream wherever one is expected.
  py::implicitly_convertible<py::object, PyStream>();

  event_class
      .def(py::init<Device>(), py::arg_v("device", Device::host(), "Device.host()"),
           "An untimed event (the cheaper kind): it orders work; TimedEvent measures time.")
      .def_property_readonly("device", &Event::device)
      .def_property_readonly("timed", &Event::timed, "True for a TimedEvent.")
      .def(
          "record", [](Event& e, PyStream& s) { e.record(view_of(s)); }, py::arg("stream"),
          "Capture the work enqueued on `stream` so far.")
      .def("query", &Event::query, "True when the latest record has completed.")
      .def(
          "synchronize",
          [](Event& e) {
            without_gil([&] { e.synchronize(); });
            release_finished_borrows();
          },
          "Block until the latest record has completed.");
  py::class_<TimedEvent, Event>(m, "TimedEvent", "An event that also keeps time: what elapsed_ms() measures between.")
      .def(py::init<Device>(), py::arg_v("device", Device::host(), "Device.host()"));
  m.def(
      "elapsed_ms",
      // Events of either kind (Python picks no overloads by type), checked at run time. Only a
      // TimedEvent is timed (every Event constructor makes an untimed one), so a timed one is one.
      [](const Event& start, const Event& end) {
        GPUCLOUD_EXPECTS(start.timed(), "elapsed_ms", "start: an untimed event (create a TimedEvent to measure time)");
        GPUCLOUD_EXPECTS(end.timed(), "elapsed_ms", "end: an untimed event (create a TimedEvent to measure time)");
        return elapsed_ms(static_cast<const TimedEvent&>(start), static_cast<const TimedEvent&>(end));
      },
      py::arg("start"), py::arg("end"), "Milliseconds between two completed records of TimedEvents.");

  m.def(
      "launch_host_func",
      [](PyStream& s, py::function fn) {
        auto held = gil_safe(std::move(fn));
        launch_host_func(view_of(s), [held] {
          if (interpreter_finalizing()) return;  // Python can no longer run
          py::gil_scoped_acquire acquire;
          try {
            (*held)();
          } catch (py::error_already_set& e) {
            throw_shareable(e);  // to every synchronize() that sees it, as itself
          }
        });
      },
      py::arg("stream"), py::arg("fn"),
      "Run `fn()` on the stream once earlier work finished; its exception surfaces at synchronize().");
  m.def(
      "add_callback",
      [](PyStream& s, py::function fn) {
        auto held = gil_safe(std::move(fn));
        add_callback(view_of(s), [held](std::exception_ptr error) {
          if (interpreter_finalizing()) return;  // Python can no longer run
          py::gil_scoped_acquire acquire;
          try {
            (*held)(exception_object(error));
          } catch (py::error_already_set& e) {
            e.discard_as_unraisable("gpucloud.add_callback");  // fn's own error: reported, not the stream's
          }
        });
      },
      py::arg("stream"), py::arg("fn"),
      "Run `fn(error)` on the stream once earlier work finished, also after a failure: `error` is the "
      "exception that work raised (taken over: synchronize() will not raise it again), or None. For "
      "completing futures from a stream; an exception from `fn` is reported as unraisable.");
}

}  // namespace gpucloud::python
