// Buffers, memory resources, copies, casts and managed-memory hints.
#include "interop.hpp"

#include <pybind11/stl.h>

#include <map>
#include <mutex>
#include <optional>
#include <tuple>
#include <variant>

namespace gpucloud::python {

PyBuffer::~PyBuffer() {
  py::gil_scoped_release release;
  Buffer gone = std::move(buffer);
}

MemoryKind to_kind(py::handle h) {
  if (py::isinstance<MemoryKind>(h)) return h.cast<MemoryKind>();
  const auto name = py::str(h).cast<std::string>();
  for (auto k : {MemoryKind::host, MemoryKind::pinned, MemoryKind::device, MemoryKind::managed}) {
    if (name == memory_kind_name(k)) return k;
  }
  throw py::type_error("kind: " + py::repr(h).cast<std::string>() + " is not 'host', 'pinned', 'device' or 'managed'");
}

Device to_device(py::handle h) {
  if (py::isinstance<Device>(h)) return h.cast<Device>();
  if (py::isinstance<py::str>(h)) return Device::parse(h.cast<std::string>());
  throw py::type_error("device: expected a gpucloud.Device or a string like 'cuda:0', got " +
                       py::repr(h).cast<std::string>());
}

namespace {

StreamView view_of(PyStream& s) { return s.view; }

std::vector<std::int64_t> to_shape(py::handle h) {
  std::vector<std::int64_t> shape = arg_ints(h, "shape");
  for (auto d : shape) GPUCLOUD_EXPECTS(d >= 0, "Buffer", "shape: negative dimension " + std::to_string(d));
  return shape;
}

// A Python memory resource argument: None (the default resource) or a gpucloud.MemoryResource.
MemoryResource* to_resource(py::handle mr) {
  return mr.is_none() ? nullptr : &arg_as<MemoryResource>(mr, "mr", "a gpucloud.MemoryResource or None");
}

std::size_t count_of(const std::vector<std::int64_t>& shape) {
  std::size_t n = 1;
  for (auto d : shape) {
    const auto u = static_cast<std::size_t>(d);
    GPUCLOUD_EXPECTS(u == 0 || n <= SIZE_MAX / u, "Buffer", "shape: the element count overflows");
    n *= u;
  }
  return n;
}

std::string shape_str(const std::vector<std::int64_t>& shape) {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i)
    s += std::to_string(shape[i]) + (shape.size() == 1 ? "," : i + 1 < shape.size() ? ", " : "");
  return s + ")";
}

void check_same_shape(const Borrowed& dst, const Borrowed& src, const char* call) {
  GPUCLOUD_EXPECTS(dst.shape == src.shape, call,
                   "src: shape " + shape_str(src.shape) + " differs from dst's " + shape_str(dst.shape));
}

// Every export first waits for the work that produces the memory's contents: the memory's own
// stream, and any gpucloud work enqueued on it (on any stream) that has not run yet.
void ready_for_export(py::handle self, BufferView v, const std::optional<StreamView>& own_stream) {
  if (own_stream) {
    without_gil([&] { own_stream->synchronize(); });
  }
  wait_for_work_on(self, v);
}

py::dict array_interface(BufferView v, const std::vector<std::int64_t>& shape, bool cuda) {
  if (!cuda) {
    const bool host_readable = v.device().is_host() || v.kind() == MemoryKind::managed;
    if (!host_readable) throw py::attribute_error("__array_interface__: GPU device memory is not host-accessible");
  } else if (!v.device().is_cuda()) {
    throw py::attribute_error("__cuda_array_interface__: the memory is not on a GPU");
  }
  py::dict d;
  d["shape"] = py::tuple(py::cast(shape));
  d["typestr"] = typestr(v.dtype());
  d["data"] = py::make_tuple(reinterpret_cast<std::uintptr_t>(export_address(v)), false);
  d["strides"] = py::none();
  d["version"] = 3;
  return d;
}

// The gpucloud.Stream a View made from @p self (a Buffer or a View) must wait for on export.
py::object export_stream(py::handle self) {
  if (is_view(self)) return self.cast<PyView&>().stream;
  return self.cast<PyBuffer&>().stream;
}

// The array protocols and properties Buffer and View share. Get(self) -> (view, &shape, stream):
// the shape by pointer, so a property read copies nothing.
template <class T, class Get>
void add_array_protocols(py::class_<T>& cls, Get get) {
  cls.def_property_readonly("shape", [get](py::object self) { return py::tuple(py::cast(*std::get<1>(get(self)))); })
      .def_property_readonly("dtype", [get](py::object self) { return std::get<0>(get(self)).dtype(); })
      .def_property_readonly(
          "size", [get](py::object self) { return std::get<0>(get(self)).size(); }, "Number of elements.")
      .def_property_readonly("nbytes", [get](py::object self) { return std::get<0>(get(self)).size_bytes(); })
      .def_property_readonly("kind", [get](py::object self) { return std::get<0>(get(self)).kind(); })
      .def_property_readonly("device", [get](py::object self) { return std::get<0>(get(self)).device(); })
      .def_property_readonly(
          "data_ptr",
          [get](py::object self) { return reinterpret_cast<std::uintptr_t>(std::get<0>(get(self)).data()); })
      .def("__len__",
           [get](py::object self) {
             const auto& shape = *std::get<1>(get(self));
             return shape.empty() ? std::size_t{1} : static_cast<std::size_t>(shape[0]);
           })
      .def_property_readonly("__array_interface__",
                             [get](py::object self) {
                               auto [v, shape, stream] = get(self);
                               py::dict d = array_interface(v, *shape, false);
                               ready_for_export(self, v, stream);
                               return d;
                             })
      .def_property_readonly("__cuda_array_interface__",
                             [get](py::object self) {
                               auto [v, shape, stream] = get(self);
                               py::dict d = array_interface(v, *shape, true);
                               ready_for_export(self, v, stream);
                               return d;
                             })
      .def(
          "__dlpack__",
          [get](py::object self, py::object stream, py::object max_version, py::object dl_device, py::object copy) {
            (void)stream;  // the memory's own stream is synchronised below, whatever the consumer's
            auto [v, shape, own_stream] = get(self);
            const bool versioned = !max_version.is_none() && max_version.cast<py::tuple>()[0].cast<int>() >= 1;
            if (!copy.is_none() && copy.cast<bool>()) {
              throw py::buffer_error("__dlpack__: copy=True is not supported; use gpucloud.copy into a new buffer");
            }
            if (!dl_device.is_none() && !dl_device.equal(dlpack_device(v))) {
              throw py::buffer_error("__dlpack__: the memory is not on the requested device");
            }
            ready_for_export(self, v, own_stream);  // pending work on the memory finishes first
            return to_dlpack(v, *shape, self, versioned);
          },
          py::kw_only(), py::arg("stream") = py::none(), py::arg("max_version") = py::none(),
          py::arg("dl_device") = py::none(), py::arg("copy") = py::none(),
          "A DLPack capsule viewing the memory (zero-copy); keeps it alive.")
      .def("__dlpack_device__", [get](py::object self) { return dlpack_device(std::get<0>(get(self))); })
      .def(
          "reshape",
          [get](py::object self, py::args dims) {
            auto [v, shape, stream] = get(self);
            const auto s =
                to_shape(dims.size() == 1 && !py::isinstance<py::int_>(dims[0]) ? dims[0] : py::object(dims));
            GPUCLOUD_EXPECTS(count_of(s) == v.size(), "reshape",
                             "shape: " + shape_str(s) + " has " + std::to_string(count_of(s)) + " elements, not " +
                                 std::to_string(v.size()));
            return PyView{v, s, self, export_stream(self)};
          },
          "A View of the same memory with another shape (same number of elements).");
}

// Memory resources are destroyed with the GIL released: a pool's destructor waits for the blocks
// still in flight on streams, whose work may be a Python host function that needs the GIL.
struct DeleteWithoutGil {
  template <class T>
  void operator()(T* p) const {
    without_gil([&] { delete p; });
  }
};
template <class T>
using ResourceHolder = std::unique_ptr<T, DeleteWithoutGil>;

// Default resources set from Python stay alive while they are the default.
std::map<std::pair<int, std::string>, py::object>& default_owners() {
  static auto* owners = new std::map<std::pair<int, std::string>, py::object>();
  return *owners;
}

}  // namespace

void bind_memory(py::module_& m) {
  py::enum_<MemoryKind>(m, "MemoryKind", "Where the bytes of a buffer live.")
      .value("host", MemoryKind::host)
      .value("pinned", MemoryKind::pinned)
      .value("device", MemoryKind::device)
      .value("managed", MemoryKind::managed)
      .def("__str__", [](MemoryKind k) { return std::string(memory_kind_name(k)); });

  py::class_<MemoryResource, ResourceHolder<MemoryResource>>(m, "MemoryResource",
                                                             "Allocates memory of one kind on one device.")
      .def_property_readonly("kind", &MemoryResource::kind)
      .def_property_readonly("device", &MemoryResource::device);
  py::class_<PlainResource, MemoryResource, ResourceHolder<PlainResource>>(m, "PlainResource",
                                                                           "One system allocation per request.")
      .def(py::init(
               [](KindLike kind, DeviceLike device) { return new PlainResource(to_kind(kind), to_device(device)); }),
           py::arg("kind"), py::arg_v("device", Device::host(), "Device.host()"));
  py::class_<PoolResource, MemoryResource, ResourceHolder<PoolResource>>(
      m, "PoolResource", "Caching pool with power-of-two size classes and stream-ordered reuse.")
      .def(py::init<MemoryResource&, std::size_t>(), py::arg("upstream"),
           py::arg("max_block_bytes") = std::size_t{1} << 30, py::keep_alive<1, 2>())
      .def("release", &PoolResource::release, "Return every cached block upstream.")
      .def_property_readonly("pool_bytes", &PoolResource::pool_bytes)
      .def_property_readonly("cached_bytes", &PoolResource::cached_bytes);
  py::class_<AsyncPoolResource, MemoryResource, ResourceHolder<AsyncPoolResource>>(m, "AsyncPoolResource",
                                                                                   "CUDA's stream-ordered allocator.")
      .def(py::init<Device>(), py::arg("device"));
  py::class_<MemoryStatistics>(m, "MemoryStatistics")
      .def_readonly("current_bytes", &MemoryStatistics::current_bytes)
      .def_readonly("peak_bytes", &MemoryStatistics::peak_bytes)
      .def_readonly("total_bytes", &MemoryStatistics::total_bytes)
      .def_readonly("current_allocations", &MemoryStatistics::current_allocations)
      .def_readonly("total_allocations", &MemoryStatistics::total_allocations);
  py::class_<StatisticsAdaptor, MemoryResource, ResourceHolder<StatisticsAdaptor>>(m, "StatisticsAdaptor",
                                                                                   "Counts bytes and allocations.")
      .def(py::init<MemoryResource&>(), py::arg("upstream"), py::keep_alive<1, 2>())
      .def("statistics", &StatisticsAdaptor::statistics)
      .def("reset_peak", &StatisticsAdaptor::reset_peak);
  py::class_<LimitingAdaptor, MemoryResource, ResourceHolder<LimitingAdaptor>>(m, "LimitingAdaptor",
                                                                               "Fails allocations beyond a byte limit.")
      .def(py::init<MemoryResource&, std::size_t>(), py::arg("upstream"), py::arg("limit_bytes"),
           py::keep_alive<1, 2>())
      .def_property_readonly("allocated_bytes", &LimitingAdaptor::allocated_bytes)
      .def_property_readonly("limit_bytes", &LimitingAdaptor::limit_bytes);

  py::class_<MemoryQuota>(m, "MemoryQuota", "A device's memory quota and what the process holds under it.")
      .def_readonly("device", &MemoryQuota::device, "The device.")
      .def_readonly("limit_bytes", &MemoryQuota::limit_bytes, "The quota in bytes; None when unset.")
      .def_readonly("source", &MemoryQuota::source, "Where the limit came from ('' without one).")
      .def_readonly("held_bytes", &MemoryQuota::held_bytes, "Bytes the library's resources hold from the device.")
      .def_readonly("peak_bytes", &MemoryQuota::peak_bytes, "Highest held_bytes seen.")
      .def_readonly("refused", &MemoryQuota::refused, "Allocations the quota refused.")
      .def("__repr__", [](const MemoryQuota& q) {
        return "MemoryQuota(device=" + q.device.str() +
               ", limit_bytes=" + (q.limit_bytes ? std::to_string(*q.limit_bytes) : std::string("None")) +
               ", held_bytes=" + std::to_string(q.held_bytes) + ", peak_bytes=" + std::to_string(q.peak_bytes) +
               ", refused=" + std::to_string(q.refused) + ")";
      });
  m.def(
      "set_memory_quota",
      [](DeviceLike device, const std::variant<std::size_t, std::string>& limit) {
        const Device d = to_device(device);
        set_memory_quota(d, std::holds_alternative<std::string>(limit)
                                ? parse_bytes(std::get<std::string>(limit), "limit")
                                : std::get<std::size_t>(limit));
      },
      py::arg("device"), py::arg("limit"),
      "Cap what the library holds from `device` (pools' caches included) at `limit`: bytes, or a size "
      "such as '8GiB'; an allocation beyond it raises OutOfMemory naming the quota, the request and what is held.");
  m.def(
      "set_memory_fraction",
      [](DeviceLike device, double fraction) { set_memory_fraction(to_device(device), fraction); }, py::arg("device"),
      py::arg("fraction"),
      "The quota as a share of the device's memory (the host's: its cgroup limit when set), as "
      "torch.cuda.set_per_process_memory_fraction.");
  m.def(
      "clear_memory_quota", [](DeviceLike device) { clear_memory_quota(to_device(device)); }, py::arg("device"),
      "Remove the device's quota (GPUCLOUD_MEMORY_QUOTA's included).");
  m.def(
      "memory_quota", [](DeviceLike device) { return memory_quota(to_device(device)); }, py::arg("device"),
      "The device's quota and what the process holds under it.");
  m.def("memory_quotas", &memory_quotas, "Every device the process allocated on or set a quota for, host first.");
  m.def(
      "parse_bytes", [](const std::string& text) { return parse_bytes(text, "text"); }, py::arg("text"),
      "Bytes of a size such as '512MiB', '2GB', '4G' (K/M/G/T, KiB..TiB: 1024s; KB..TB: 1000s).");

  m.def(
      "set_default_resource",
      [](KindLike kind, DeviceLike device, OptionalResource mr) {
        const MemoryKind k = to_kind(kind);
        const Device d = to_device(device);
        MemoryResource* raw = to_resource(mr);
        set_default_resource(k, d, raw);
        auto key = std::make_pair(static_cast<int>(k), d.str());
        if (raw == nullptr) {
          default_owners().erase(key);
        } else {
          default_owners()[key] = mr;
        }
      },
      py::arg("kind"), py::arg("device"), py::arg("mr"),
      "Make `mr` the resource buffers of `kind` on `device` use by default (None restores the built-in one).");

  py::class_<PyBuffer> buffer_class(m, "Buffer",
                                    "An owning allocation of one dtype, of any memory kind, on one device.");
  // Both classes first, so each one's signatures (reshape returns a View) can name the other.
  py::class_<PyView> view_class(m, "BufferView",
                                "A non-owning view (a pipeline chunk, a batch's array); keeps its owner alive.");
  buffer_class
      .def(py::init([](ShapeArg shape, DTypeLike dtype, DeviceLike device, KindLike kind, PyStream* stream,
                       OptionalResource mr) {
             auto s = to_shape(shape);
             const std::size_t n = count_of(s);
             const DType t = to_dtype(dtype);
             const Device d = to_device(device);
             const MemoryKind k = to_kind(kind);
             MemoryResource* raw = to_resource(mr);
             Buffer b = without_gil([&] {
               if (stream != nullptr) {
                 return raw != nullptr ? Buffer(n, t, d, k, view_of(*stream), *raw)
                                       : Buffer(n, t, d, k, view_of(*stream));
               }
               return raw != nullptr ? Buffer(n, t, d, k, *raw) : Buffer(n, t, d, k);
             });
             return std::make_unique<PyBuffer>(
                 std::move(b), std::move(s), mr,
                 stream != nullptr ? py::cast(stream, py::return_value_policy::reference) : py::object(py::none()));
           }),
           py::arg("shape"), py::arg("dtype") = "float32", py::arg_v("device", Device::host(), "Device.host()"),
           py::arg_v("kind", MemoryKind::device, "MemoryKind.device"), py::arg("stream") = nullptr,
           py::arg("mr") = py::none())
      .def("__repr__", [](PyBuffer& b) {
        return "gpucloud.Buffer(shape=" + shape_str(b.shape) + ", dtype=" + dtype_name(b.buffer.dtype()) +
               ", device='" + b.buffer.device().str() + "', kind='" + memory_kind_name(b.buffer.kind()) + "')";
      });
  add_array_protocols(buffer_class, [](py::object self) {
    auto& b = self.cast<PyBuffer&>();
    return std::make_tuple(b.buffer.view(), &b.shape, b.buffer.stream());
  });

  view_class.def("__repr__", [](PyView& v) {
    return "gpucloud.BufferView(shape=" + shape_str(v.shape) + ", dtype=" + dtype_name(v.view.dtype()) + ", device='" +
           v.view.device().str() + "', kind='" + memory_kind_name(v.view.kind()) + "')";
  });
  add_array_protocols(view_class, [](py::object self) {
    auto& v = self.cast<PyView&>();
    std::optional<StreamView> stream;
    if (!v.stream.is_none()) stream = v.stream.cast<PyStream&>().view;
    return std::make_tuple(v.view, &v.shape, stream);
  });

  // copy and cast: borrow dst (writable) and src, same shape, run with the GIL dropped, keep both
  // alive until the stream is done with them.
  auto dst_src = [](const char* call, void (*op)(BufferView, BufferView, StreamView)) {
    return [call, op](ArrayLike dst, ArrayLike src, PyStream& stream) {
      Borrowed d = borrow_writable(dst, "dst");
      Borrowed s = borrow(src, "src");
      check_same_shape(d, s, call);
      enqueue_holding(view_of(stream), {d.owner, s.owner}, [&] { op(d.view, s.view, view_of(stream)); });
    };
  };
  m.def("copy", dst_src("copy", &copy), py::arg("dst"), py::arg("src"), py::arg("stream"),
        "Copy `src` into `dst` in stream order (any memory kinds; zero-copy views of NumPy/PyTorch/CuPy).");
  m.def("cast", dst_src("cast", &cast), py::arg("dst"), py::arg("src"), py::arg("stream"),
        "dst = src converted to dst's dtype, in stream order.");
  m.def(
      "fill",
      [](ArrayLike dst, Number value, PyStream& stream) {
        Borrowed d = borrow_writable(dst, "dst");
        // A Python int is filled exactly (int64 beyond 2^53 must not pass through a double).
        const bool integer = PyIndex_Check(value.ptr()) != 0;  // int, bool, NumPy integers
        std::int64_t as_int = 0;
        double as_double = 0.0;
        if (integer) {
          const auto index = py::reinterpret_steal<py::object>(PyNumber_Index(value.ptr()));
          if (!index) throw py::error_already_set();
          int overflow = 0;
          as_int = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
          if (overflow != 0) {
            GPUCLOUD_FAIL(InvalidArgument, "fill",
                          "value: " + py::repr(value).cast<std::string>() + " does not fit an int64");
          }
        } else if (py::isinstance<py::float_>(value) || py::hasattr(value, "__float__")) {
          as_double = py::float_(py::reinterpret_borrow<py::object>(value)).cast<double>();
        } else {
          throw py::type_error("fill: value: expected an int or a float, got " +
                               py::str(py::type::handle_of(value)).cast<std::string>());
        }
        enqueue_holding(view_of(stream), {d.owner}, [&] {
          if (integer) {
            fill_integer(d.view, as_int, view_of(stream));
          } else {
            fill(d.view, as_double, view_of(stream));
          }
        });
      },
      py::arg("dst"), py::arg("value"), py::arg("stream"),
      "Set every element of dst to value, in stream order: an int exactly (int64 beyond 2^53 too), a float "
      "converted as cast() does.");

  py::enum_<MemoryAdvice>(m, "MemoryAdvice", "Hints for managed memory.")
      .value("read_mostly", MemoryAdvice::read_mostly)
      .value("unset_read_mostly", MemoryAdvice::unset_read_mostly)
      .value("preferred_location", MemoryAdvice::preferred_location)
      .value("unset_preferred_location", MemoryAdvice::unset_preferred_location)
      .value("accessed_by", MemoryAdvice::accessed_by)
      .value("unset_accessed_by", MemoryAdvice::unset_accessed_by);
  m.def(
      "prefetch",
      [](ArrayLike buffer, ArrayLike target, PyStream& stream) {
        Borrowed b = borrow(buffer, "buffer");
        const Device t = to_device(target);
        without_gil([&] { prefetch(b.view, t, view_of(stream)); });
      },
      py::arg("buffer"), py::arg("target"), py::arg("stream"), "Migrate managed memory to `target` in stream order.");
  m.def(
      "advise",
      [](ArrayLike buffer, MemoryAdvice advice, ArrayLike target) {
        Borrowed b = borrow(buffer, "buffer");
        advise(b.view, advice, to_device(target));
      },
      py::arg("buffer"), py::arg("advice"), py::arg("target"), "Apply a cudaMemAdvise hint to managed memory.");
}

}  // namespace gpucloud::python
