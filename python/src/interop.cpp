#include "interop.hpp"

#include <dlpack/dlpack.h>
#include <pybind11/stl.h>

#include <numeric>
#include <optional>
#include <utility>
#include <vector>

namespace gpucloud::python {

namespace {

[[noreturn]] void fail_type(const char* arg, const std::string& what) {
  throw py::type_error(std::string(arg) + ": " + what);
}

std::size_t element_count(const std::vector<std::int64_t>& shape, const char* arg) {
  std::size_t n = 1;
  for (auto d : shape) {
    GPUCLOUD_EXPECTS(d >= 0, "gpucloud", std::string(arg) + ": negative dimension in shape");
    n *= static_cast<std::size_t>(d);
  }
  return n;
}

// Compact row-major strides (in elements); size-1 dimensions may carry any stride.
void check_contiguous(const std::vector<std::int64_t>& shape, const std::vector<std::int64_t>& strides,
                      const char* arg) {
  std::int64_t expected = 1;
  for (std::size_t i = shape.size(); i-- > 0;) {
    if (shape[i] != 1 && strides[i] != expected) {
      std::string s;
      for (auto v : strides) s += (s.empty() ? "" : ", ") + std::to_string(v);
      GPUCLOUD_FAIL(InvalidArgument, "gpucloud",
                    std::string(arg) + ": non-contiguous memory (strides [" + s +
                        "] in elements); pass a contiguous copy, e.g. numpy.ascontiguousarray(x)");
    }
    expected *= shape[i];
  }
}

DType dtype_from_typestr(const std::string& t, const char* arg) {
  if (t.size() < 3 || (t[0] != '<' && t[0] != '|' && t[0] != '=')) fail_type(arg, "unsupported typestr '" + t + "'");
  const std::string body = t.substr(1);
  if (body == "f4") return DType::float32;
  if (body == "f8") return DType::float64;
  if (body == "f2") return DType::float16;
  if (body == "i4") return DType::int32;
  if (body == "i8") return DType::int64;
  if (body == "u1") return DType::uint8;
  fail_type(arg, "dtype '" + t + "' is not supported (float32/64/16, int32/64, uint8)");
}

Borrowed from_array_interface(py::handle obj, const py::dict& ai, bool cuda, const char* arg) {
  Borrowed b;
  for (auto d : ai["shape"].cast<py::tuple>()) b.shape.push_back(d.cast<std::int64_t>());
  const DType dtype = dtype_from_typestr(ai["typestr"].cast<std::string>(), arg);
  auto data = ai["data"].cast<py::tuple>();
  const auto ptr = data[0].cast<std::uintptr_t>();
  b.readonly = data[1].cast<bool>();
  if (ai.contains("strides") && !ai["strides"].is_none()) {
    std::vector<std::int64_t> strides;
    for (auto s : ai["strides"].cast<py::tuple>()) {
      const auto bytes = s.cast<std::int64_t>();
      if (bytes % static_cast<std::int64_t>(dtype_size(dtype)) != 0) {
        GPUCLOUD_FAIL(InvalidArgument, "gpucloud",
                      std::string(arg) + ": strides are not multiples of the element size");
      }
      strides.push_back(bytes / static_cast<std::int64_t>(dtype_size(dtype)));
    }
    check_contiguous(b.shape, strides, arg);
  }
  if (ai.contains("mask") && !ai["mask"].is_none()) fail_type(arg, "masked arrays are not supported");
  const std::size_t n = element_count(b.shape, arg);
  void* p = reinterpret_cast<void*>(ptr);
  const PointerInfo where = pointer_info(p);
  if (cuda && where.device.is_host() && cuda_device_count() == 0) {
    fail_type(arg, "__cuda_array_interface__ memory but no CUDA device is usable");
  }
  b.view = BufferView(n == 0 ? nullptr : p, n, dtype, where.kind, where.device);
  b.owner = py::reinterpret_borrow<py::object>(obj);
  return b;
}

// gpucloud's dtype for a DLPack one, if it has one (without raising).
std::optional<DType> dtype_of_dl(DLDataType t) {
  constexpr std::uint8_t float8_e4m3fn = 10, float8_e5m2 = 12;  // DLPack 1.1's codes (not in 0.6)
  if (t.lanes != 1) return std::nullopt;
  switch (t.code) {
    case kDLFloat:
      if (t.bits == 32) return DType::float32;
      if (t.bits == 64) return DType::float64;
      if (t.bits == 16) return DType::float16;
      return std::nullopt;
    case kDLBfloat:
      return t.bits == 16 ? std::optional(DType::bfloat16) : std::nullopt;
    case kDLInt:
      if (t.bits == 32) return DType::int32;
      if (t.bits == 64) return DType::int64;
      return std::nullopt;
    case kDLUInt:
      return t.bits == 8 ? std::optional(DType::uint8) : std::nullopt;
    case float8_e4m3fn:
      return t.bits == 8 ? std::optional(DType::float8_e4m3) : std::nullopt;
    case float8_e5m2:
      return t.bits == 8 ? std::optional(DType::float8_e5m2) : std::nullopt;
    default:
      return std::nullopt;
  }
}

DType dtype_from_dl(DLDataType t, const char* arg) {
  if (t.lanes != 1) fail_type(arg, "vector dtypes (lanes != 1) are not supported");
  if (const std::optional<DType> dtype = dtype_of_dl(t)) return *dtype;
  fail_type(arg,
            "DLPack dtype (code " + std::to_string(t.code) + ", " + std::to_string(t.bits) + " bits) is not supported");
}

DLDataType dl_from_dtype(DType t) {
  switch (t) {
    case DType::float32:
      return {kDLFloat, 32, 1};
    case DType::float64:
      return {kDLFloat, 64, 1};
    case DType::float16:
      return {kDLFloat, 16, 1};
    case DType::bfloat16:
      return {kDLBfloat, 16, 1};
    case DType::int32:
      return {kDLInt, 32, 1};
    case DType::int64:
      return {kDLInt, 64, 1};
    case DType::uint8:
      return {kDLUInt, 8, 1};
    default:
      break;
  }
  throw py::type_error(std::string("dtype: ") + dtype_name(t) + " has no DLPack 0.6 type; view the bytes as uint8");
}

Borrowed from_dlpack(py::handle obj, const char* arg) {
  // A PyTorch parameter (requires_grad) refuses DLPack export; its detached alias shares the same
  // storage, which is what fused optimizers update (as torch.optim does under no_grad).
  py::object source = py::reinterpret_borrow<py::object>(obj);
  if (py::hasattr(obj, "requires_grad") && py::hasattr(obj, "detach") && obj.attr("requires_grad").cast<bool>()) {
    source = obj.attr("detach")();
  }
  py::object capsule_obj = source.attr("__dlpack__")();
  PyObject* cap = capsule_obj.ptr();
  if (!PyCapsule_IsValid(cap, "dltensor")) fail_type(arg, "__dlpack__ did not return an unconsumed 'dltensor' capsule");
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap, "dltensor"));
  // Consume it: from now on we own the tensor and call its deleter when we are done.
  PyCapsule_SetName(cap, "used_dltensor");
  py::capsule owner(managed, [](void* p) {
    auto* t = static_cast<DLManagedTensor*>(p);
    if (t->deleter != nullptr) t->deleter(t);
  });
  const DLTensor& t = managed->dl_tensor;
  Borrowed b;
  b.owner = owner;
  b.shape.assign(t.shape, t.shape + t.ndim);
  const DType dtype = dtype_from_dl(t.dtype, arg);
  if (t.strides != nullptr) check_contiguous(b.shape, std::vector<std::int64_t>(t.strides, t.strides + t.ndim), arg);
  Device device = Device::host();
  MemoryKind kind = MemoryKind::host;
  switch (t.device.device_type) {
    case kDLCPU:
      break;
    case kDLCUDAHost:
      kind = MemoryKind::pinned;
      break;
    case kDLCUDA:
      device = Device::cuda(t.device.device_id);
      kind = MemoryKind::device;
      break;
    case kDLCUDAManaged:
      device = Device::cuda(t.device.device_id);
      kind = MemoryKind::managed;
      break;
    default:
      fail_type(arg, "DLPack device type " + std::to_string(t.device.device_type) + " is not supported");
  }
  const std::size_t n = element_count(b.shape, arg);
  void* p = static_cast<char*>(t.data) + t.byte_offset;
  b.view = BufferView(n == 0 ? nullptr : p, n, dtype, kind, device);
  return b;
}

}  // namespace

namespace {

// numpy.ndarray's type once NumPy is imported (nullptr before: nothing can be an ndarray yet).
PyTypeObject* ndarray_type() {
  static PyObject* type = nullptr;  // a reference kept for the process's life
  if (type == nullptr) {
    PyObject* numpy = PyDict_GetItemString(PyImport_GetModuleDict(), "numpy");  // borrowed
    if (numpy == nullptr) return nullptr;
    type = PyObject_GetAttrString(numpy, "ndarray");
    if (type == nullptr) PyErr_Clear();
  }
  return reinterpret_cast<PyTypeObject*>(type);
}

bool is_ndarray(py::handle obj) {
  PyTypeObject* t = ndarray_type();
  return t != nullptr && Py_TYPE(obj.ptr()) == t;
}

// An exact numpy.ndarray of a supported dtype, contiguous, through the buffer protocol: what
// __array_interface__ says, without building its dict on every call. Anything else (another
// dtype, a byte order, strides) is left to the general path and its messages (nullopt).
std::optional<Borrowed> from_ndarray(py::handle obj, const char* arg) {
  if (!is_ndarray(obj)) return std::nullopt;
  Py_buffer v;
  if (PyObject_GetBuffer(obj.ptr(), &v, PyBUF_RECORDS_RO) != 0) {
    PyErr_Clear();
    return std::nullopt;
  }
  struct Release {
    Py_buffer* v;
    ~Release() { PyBuffer_Release(v); }
  } release{&v};
  const char* f = v.format != nullptr ? v.format : "B";
  if (*f == '<' || *f == '=' || *f == '@') ++f;
  if (f[0] == '\0' || f[1] != '\0' || !PyBuffer_IsContiguous(&v, 'C')) return std::nullopt;
  std::optional<DType> dtype;
  switch (f[0]) {
    case 'f':
      dtype = DType::float32;
      break;
    case 'd':
      dtype = DType::float64;
      break;
    case 'e':
      dtype = DType::float16;
      break;
    case 'B':
      dtype = DType::uint8;
      break;
    case 'i':
    case 'l':
    case 'q':
      if (v.itemsize == 4) dtype = DType::int32;
      if (v.itemsize == 8) dtype = DType::int64;
      break;
    default:
      break;
  }
  if (!dtype || static_cast<std::size_t>(v.itemsize) != dtype_size(*dtype)) return std::nullopt;
  Borrowed b;
  b.shape.assign(v.shape, v.shape + v.ndim);
  b.readonly = v.readonly != 0;
  const std::size_t n = element_count(b.shape, arg);
  const PointerInfo where = pointer_info(v.buf);
  b.view = BufferView(n == 0 ? nullptr : v.buf, n, *dtype, where.kind, where.device);
  b.owner = py::reinterpret_borrow<py::object>(obj);
  return b;
}

// An attribute of torch.Tensor read on a tensor: by name, or (on torch.Tensor and
// torch.nn.Parameter themselves, which override none) through the C getter or method that
// torch's own type holds, skipping the lookup (~20 ns a read).
struct TensorAttr {
  PyObject* name = nullptr;
  PyGetSetDef* getset = nullptr;  // a property's getter
  PyObject* method = nullptr;     // a method's descriptor (vectorcall with the tensor as self)

  explicit TensorAttr(PyTypeObject* tensor, const char* n) : name(PyUnicode_InternFromString(n)) {
    PyObject* d = PyObject_GetAttr(reinterpret_cast<PyObject*>(tensor), name);  // the descriptor itself
    if (d == nullptr) {
      PyErr_Clear();
      return;
    }
    if (Py_IS_TYPE(d, &PyGetSetDescr_Type) && reinterpret_cast<PyGetSetDescrObject*>(d)->d_getset->get != nullptr) {
      getset = reinterpret_cast<PyGetSetDescrObject*>(d)->d_getset;
    } else if (Py_IS_TYPE(d, &PyMethodDescr_Type)) {
      method = d;
      return;  // kept for the process's life
    }
    Py_DECREF(d);  // a getset stays alive in the type's dict
  }
  // A new reference, or nullptr with the error set.
  PyObject* get(PyObject* obj, bool direct) const {
    return direct && getset != nullptr ? getset->get(obj, getset->closure) : PyObject_GetAttr(obj, name);
  }
  PyObject* call(PyObject* obj, bool direct) const {
    return direct && method != nullptr ? PyObject_Vectorcall(method, &obj, 1, nullptr)
                                       : PyObject_CallMethodNoArgs(obj, name);
  }
};

// DLPack's C exchange API (DLPack 1.3): a table of C functions a tensor type offers as the capsule
// `type.__dlpack_c_exchange_api__` ("dlpack_exchange_api"; torch 2.15 is tested). Mirrored here, as
// Debian's dlpack.h (0.6) predates it; DLTensor is unchanged since 0.6. Only the non-owning read is
// called; the other entries are never used.
struct DLPackExchangeVersion {
  std::uint32_t major, minor;
};
struct DLPackExchangeHeader {
  DLPackExchangeVersion version;
  DLPackExchangeHeader* prev_api;  // an older version's table, or null
};
struct DLPackExchange {
  DLPackExchangeHeader header;
  void* managed_tensor_allocator;
  void* managed_tensor_from_py_object_no_sync;
  void* managed_tensor_to_py_object_no_sync;
  int (*dltensor_from_py_object_no_sync)(void* py_object, DLTensor* out);  // 0, or -1 with an error set
  void* current_work_stream;
};

// The exchange table of major version 1 that @p type offers, or null (an older torch, another
// version, no non-owning read).
const DLPackExchange* dlpack_exchange_of(PyTypeObject* type) {
  PyObject* capsule = PyObject_GetAttrString(reinterpret_cast<PyObject*>(type), "__dlpack_c_exchange_api__");
  if (capsule == nullptr) {
    PyErr_Clear();
    return nullptr;
  }
  auto* header = static_cast<DLPackExchangeHeader*>(PyCapsule_GetPointer(capsule, "dlpack_exchange_api"));
  if (header == nullptr) PyErr_Clear();
  while (header != nullptr && header->version.major > 1) header = header->prev_api;
  if (header == nullptr || header->version.major != 1) {
    Py_DECREF(capsule);
    return nullptr;
  }
  // The table lives as long as the process (the protocol's rule); the capsule's reference is kept too.
  const auto* api = reinterpret_cast<const DLPackExchange*>(header);
  return api->dltensor_from_py_object_no_sync != nullptr ? api : nullptr;
}

// torch's Tensor and Parameter types, its strided layout and the dtypes gpucloud takes, once
// torch is imported (nothing can be a tensor before). References kept for the process's life.
struct TorchTypes {
  PyTypeObject* tensor = nullptr;
  PyTypeObject* parameter = nullptr;
  PyObject* strided = nullptr;
  std::vector<std::pair<PyObject*, DType>> dtypes;
  PyObject* layout_name = PyUnicode_InternFromString("layout");
  std::optional<TensorAttr> dtype, is_contiguous, is_cpu, is_cuda, data_ptr, shape, get_device;
  const DLPackExchange* exchange = nullptr;  // torch.Tensor's DLPack exchange table, or null (torch 1.x)
};

const TorchTypes* torch_types() {
  static TorchTypes* types = nullptr;
  if (types != nullptr) return types;
  PyObject* torch = PyDict_GetItemString(PyImport_GetModuleDict(), "torch");  // borrowed
  if (torch == nullptr) return nullptr;
  auto* t = new TorchTypes();
  py::module_ mod = py::reinterpret_borrow<py::module_>(torch);
  try {
    t->tensor = reinterpret_cast<PyTypeObject*>(py::object(mod.attr("Tensor")).release().ptr());
    t->parameter = reinterpret_cast<PyTypeObject*>(py::object(mod.attr("nn").attr("Parameter")).release().ptr());
    t->strided = py::object(mod.attr("strided")).release().ptr();
    const std::pair<const char*, DType> names[] = {{"float32", DType::float32}, {"float64", DType::float64},
                                                   {"float16", DType::float16}, {"bfloat16", DType::bfloat16},
                                                   {"int32", DType::int32},     {"int64", DType::int64},
                                                   {"uint8", DType::uint8}};
    for (const auto& [name, dtype] : names) t->dtypes.emplace_back(py::object(mod.attr(name)).release().ptr(), dtype);
    // fp8 from torch 2.1 (1.13 has none): OCP e4m3 ("fn": finite, no infinities) and e5m2.
    const std::pair<const char*, DType> fp8[] = {{"float8_e4m3fn", DType::float8_e4m3},
                                                 {"float8_e5m2", DType::float8_e5m2}};
    for (const auto& [name, dtype] : fp8) {
      if (py::hasattr(mod, name)) t->dtypes.emplace_back(py::object(mod.attr(name)).release().ptr(), dtype);
    }
  } catch (const py::error_already_set&) {  // a module named torch that is not PyTorch
    delete t;
    return nullptr;
  }
  t->dtype.emplace(t->tensor, "dtype");
  t->is_contiguous.emplace(t->tensor, "is_contiguous");
  t->is_cpu.emplace(t->tensor, "is_cpu");
  t->is_cuda.emplace(t->tensor, "is_cuda");
  t->data_ptr.emplace(t->tensor, "data_ptr");
  t->shape.emplace(t->tensor, "shape");
  t->get_device.emplace(t->tensor, "get_device");
  t->exchange = dlpack_exchange_of(t->tensor);
  types = t;
  return types;
}

// A tensor of a layout other than strided (sparse, mkldnn) has no storage to borrow: a typed
// error naming its layout. Returns for a strided one.
void check_strided(py::handle obj, const TorchTypes* t, const char* arg) {
  const py::object layout = py::reinterpret_steal<py::object>(PyObject_GetAttr(obj.ptr(), t->layout_name));
  if (!layout) throw py::error_already_set();
  if (layout.ptr() != t->strided) {
    fail_type(arg, "a tensor of layout " + py::str(layout).cast<std::string>() +
                       ": only dense (strided) tensors can be borrowed; pass t.to_dense()");
  }
}

// What a tensor the fast path could not read is: a typed error naming its layout (sparse, mkldnn:
// no storage to borrow) or, for a strided one torch cannot describe (a nested tensor), torch's reason.
[[noreturn]] void fail_unreadable(py::handle obj, const TorchTypes* t, const char* arg) {
  py::error_already_set reason;  // takes (and clears) the error the read raised
  check_strided(obj, t, arg);
  fail_type(arg, std::string("a tensor torch cannot describe as strided memory: ") + reason.what());
}

// A torch.Tensor or Parameter (exactly: a subclass may override what a read sees) read in one C
// call through torch's DLPack exchange table (~0.1 us, against ~0.4 us for five attribute reads on
// torch 2), for the common case only: a supported dtype, contiguous, on the CPU or a CUDA device.
// Anything else (and a read torch refuses) is left to the attribute reads, which name the reason.
std::optional<Borrowed> from_torch_exchange(py::handle obj, const TorchTypes* t, const char* arg) {
  DLTensor dl{};
  if (t->exchange->dltensor_from_py_object_no_sync(obj.ptr(), &dl) != 0) {
    PyErr_Clear();
    return std::nullopt;
  }
  const std::optional<DType> dtype = dtype_of_dl(dl.dtype);
  if (!dtype || dl.ndim < 0 || (dl.ndim > 0 && dl.shape == nullptr)) return std::nullopt;
  Device device = Device::host();
  MemoryKind kind = MemoryKind::host;
  if (dl.device.device_type == kDLCUDA) {
    device = Device::cuda(dl.device.device_id);
    kind = MemoryKind::device;
  } else if (dl.device.device_type != kDLCPU) {
    return std::nullopt;
  }
  Borrowed b;
  b.shape.assign(dl.shape, dl.shape + dl.ndim);
  if (dl.strides != nullptr) {  // null: compact row-major
    std::int64_t expected = 1;
    for (std::int32_t i = dl.ndim; i-- > 0;) {
      if (dl.shape[i] != 1 && dl.strides[i] != expected) return std::nullopt;
      expected *= dl.shape[i];
    }
  }
  const std::size_t n = element_count(b.shape, arg);
  b.view = BufferView(n == 0 ? nullptr : static_cast<char*>(dl.data) + dl.byte_offset, n, *dtype, kind, device);
  b.owner = py::reinterpret_borrow<py::object>(obj);
  return b;
}

// A torch.Tensor (a Parameter too) of a supported dtype, strided, contiguous, on the CPU or a
// CUDA device: read through torch's DLPack exchange table where torch has one, or from its
// attributes: five reads (dtype, is_contiguous(), is_cpu, shape, data_ptr()), ~0.3 us, where the
// DLPack export (and the __cuda_array_interface__ probe a CPU tensor answers by raising) cost
// ~4 us. The layout is read only when a read fails: every layout but strided has no storage, so
// its data_ptr() raises (and CSR's is_contiguous()). The tensor itself is the owner. A
// non-contiguous tensor is left to the general path, which names its strides. Every read keeps the
// GIL (getters and hand-written methods; torch's generated methods, is_neg() among them, release it
// inside, which a borrow must not do), so torch's negative bit (x.conj().imag) is not read.
std::optional<Borrowed> from_torch(py::handle obj, const char* arg) {
  const TorchTypes* t = torch_types();
  if (t == nullptr || !PyObject_TypeCheck(obj.ptr(), t->tensor)) return std::nullopt;
  const bool direct = Py_TYPE(obj.ptr()) == t->tensor || Py_TYPE(obj.ptr()) == t->parameter;
  auto get = [&](const std::optional<TensorAttr>& a) {
    auto v = py::reinterpret_steal<py::object>(a->get(obj.ptr(), direct));
    if (!v) fail_unreadable(obj, t, arg);
    return v;
  };
  auto call = [&](const std::optional<TensorAttr>& a) {  // a vectorcall: no bound method is made
    auto v = py::reinterpret_steal<py::object>(a->call(obj.ptr(), direct));
    if (!v) fail_unreadable(obj, t, arg);
    return v;
  };
  if (direct && t->exchange != nullptr) {
    if (auto b = from_torch_exchange(obj, t, arg)) return b;
  }
  const py::object dtype_obj = get(t->dtype);
  std::optional<DType> dtype;
  for (const auto& [torch_dtype, ours] : t->dtypes) {
    if (dtype_obj.ptr() == torch_dtype) dtype = ours;
  }
  if (!dtype) {
    fail_type(arg, "a tensor of " + py::str(dtype_obj).cast<std::string>() +
                       ": not supported (float32, float64, float16, bfloat16, float8_e4m3fn, float8_e5m2, "
                       "int32, int64, uint8)");
  }
  if (call(t->is_contiguous).ptr() != Py_True) {
    // torch 2 answers False for a sparse COO tensor (1.13 raised): its layout is named here, before
    // the general path's DLPack export would raise torch's untyped error.
    check_strided(obj, t, arg);
    return std::nullopt;
  }
  Device device = Device::host();
  MemoryKind kind = MemoryKind::host;
  if (get(t->is_cpu).ptr() != Py_True) {
    if (get(t->is_cuda).ptr() != Py_True) {
      fail_type(arg, "a tensor on device '" + py::str(obj.attr("device")).cast<std::string>() +
                         "': only CPU and CUDA tensors can be borrowed");
    }
    device = Device::cuda(call(t->get_device).cast<int>());
    kind = MemoryKind::device;
  }
  const py::object shape = get(t->shape);  // a torch.Size: a tuple of ints
  if (!PyTuple_Check(shape.ptr())) return std::nullopt;
  const py::object ptr = call(t->data_ptr);  // raises for every layout without storage
  Borrowed b;
  const Py_ssize_t ndim = PyTuple_GET_SIZE(shape.ptr());
  b.shape.resize(static_cast<std::size_t>(ndim));
  for (Py_ssize_t i = 0; i < ndim; ++i)
    b.shape[static_cast<std::size_t>(i)] = PyLong_AsLongLong(PyTuple_GET_ITEM(shape.ptr(), i));
  const std::size_t n = element_count(b.shape, arg);
  void* data = PyLong_AsVoidPtr(ptr.ptr());  // data_ptr() is an int: no pybind conversion needed
  if (data == nullptr && PyErr_Occurred() != nullptr) throw py::error_already_set();
  b.view = BufferView(n == 0 ? nullptr : data, n, *dtype, kind, device);
  b.owner = py::reinterpret_borrow<py::object>(obj);
  return b;
}

}  // namespace

Borrowed borrow(py::handle obj, const char* arg) {
  // The tests in the order of what calls pass most, each a type check (no pybind lookup by name).
  if (is_buffer(obj)) {
    auto& pb = obj.cast<PyBuffer&>();
    Borrowed b;
    b.view = pb.buffer.view();
    b.shape = pb.shape;
    b.owner = py::reinterpret_borrow<py::object>(obj);
    return b;
  }
  if (auto b = from_torch(obj, arg)) return std::move(*b);
  if (is_view(obj)) {
    auto& pv = obj.cast<PyView&>();
    return Borrowed{pv.view, pv.shape, false, py::reinterpret_borrow<py::object>(obj)};
  }
  if (auto b = from_ndarray(obj, arg)) return std::move(*b);
  if (py::hasattr(obj, "__cuda_array_interface__")) {
    return from_array_interface(obj, obj.attr("__cuda_array_interface__").cast<py::dict>(), true, arg);
  }
  if (py::hasattr(obj, "__array_interface__")) {
    return from_array_interface(obj, obj.attr("__array_interface__").cast<py::dict>(), false, arg);
  }
  if (py::hasattr(obj, "__dlpack__")) return from_dlpack(obj, arg);
  fail_type(arg,
            "expected a gpucloud.Buffer or an object with __dlpack__, __array_interface__ or "
            "__cuda_array_interface__, got " +
                py::str(py::type::handle_of(obj)).cast<std::string>());
}

namespace {
// NumPy scalars (numpy.generic) export a fresh copy each time: a write would go to a temporary.
bool is_numpy_scalar(py::handle obj) {
  static PyObject* generic = nullptr;  // numpy.generic once NumPy is imported; kept for the process's life
  if (generic == nullptr) {
    PyObject* numpy = PyDict_GetItemString(PyImport_GetModuleDict(), "numpy");  // borrowed
    if (numpy == nullptr) return false;                                         // nothing can be a NumPy scalar yet
    generic = PyObject_GetAttrString(numpy, "generic");
    if (generic == nullptr || !PyType_Check(generic)) {
      PyErr_Clear();
      generic = nullptr;
      return false;
    }
  }
  return PyObject_TypeCheck(obj.ptr(), reinterpret_cast<PyTypeObject*>(generic));
}
}  // namespace

Borrowed borrow_writable(py::handle obj, const char* arg) {
  GPUCLOUD_EXPECTS(!is_numpy_scalar(obj), "gpucloud",
                   std::string(arg) +
                       ": a NumPy scalar is immutable (a write would go to a temporary copy); pass "
                       "an array, e.g. numpy.zeros(1)");
  Borrowed b = borrow(obj, arg);
  GPUCLOUD_EXPECTS(!b.readonly, "gpucloud", std::string(arg) + ": read-only memory cannot be written");
  return b;
}

std::string typestr(DType t) {
  switch (t) {
    case DType::float32:
      return "<f4";
    case DType::float64:
      return "<f8";
    case DType::float16:
      return "<f2";
    case DType::int32:
      return "<i4";
    case DType::int64:
      return "<i8";
    case DType::uint8:
      return "|u1";
    case DType::bfloat16:
      return "<V2";
    default:
      return "|V1";
  }
}

namespace {
// DLPack 1.0's versioned tensor (Debian ships the 0.6 header, whose DLTensor is the same): lets
// consumers such as NumPy 2 import the buffer as writable.
struct DLPackVersion {
  std::uint32_t major;
  std::uint32_t minor;
};
struct DLManagedTensorVersioned {
  DLPackVersion version;
  void* manager_ctx;
  void (*deleter)(DLManagedTensorVersioned* self);
  std::uint64_t flags;
  DLTensor dl_tensor;
};

struct ExportContext {
  DLManagedTensor tensor{};
  DLManagedTensorVersioned versioned{};
  std::vector<std::int64_t> shape;
  PyObject* owner = nullptr;
};

void delete_export(DLManagedTensor* t) {
  auto* ctx = static_cast<ExportContext*>(t->manager_ctx);
  {
    py::gil_scoped_acquire acquire;  // consumers may free from any thread
    Py_XDECREF(ctx->owner);
  }
  delete ctx;
}

void delete_export_versioned(DLManagedTensorVersioned* t) {
  delete_export(&static_cast<ExportContext*>(t->manager_ctx)->tensor);
}

void destroy_unconsumed_capsule(PyObject* cap) {
  if (PyCapsule_IsValid(cap, "dltensor")) {  // never consumed: we still own it
    auto* t = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap, "dltensor"));
    t->deleter(t);
  }
}

void destroy_unconsumed_versioned_capsule(PyObject* cap) {
  if (PyCapsule_IsValid(cap, "dltensor_versioned")) {
    auto* t = static_cast<DLManagedTensorVersioned*>(PyCapsule_GetPointer(cap, "dltensor_versioned"));
    t->deleter(t);
  }
}
}  // namespace

void* export_address(BufferView view) {
  alignas(64) static char empty[64] = {};
  return view.data() != nullptr ? view.data() : static_cast<void*>(empty);
}

py::tuple dlpack_device(BufferView view) {
  if (view.device().is_cuda()) {
    return py::make_tuple(static_cast<int>(view.kind() == MemoryKind::managed ? kDLCUDAManaged : kDLCUDA),
                          view.device().index());
  }
  const bool pinned = view.kind() == MemoryKind::pinned && cuda_device_count() > 0;
  return py::make_tuple(static_cast<int>(pinned ? kDLCUDAHost : kDLCPU), 0);
}

py::capsule to_dlpack(BufferView view, const std::vector<std::int64_t>& shape, py::object owner, bool versioned) {
  auto* ctx = new ExportContext();
  ctx->shape = shape;
  ctx->owner = owner.release().ptr();
  DLTensor& t = ctx->tensor.dl_tensor;
  t.data = export_address(view);
  const auto dev = dlpack_device(view);
  t.device = DLDevice{static_cast<DLDeviceType>(dev[0].cast<int>()), dev[1].cast<int>()};
  try {
    t.dtype = dl_from_dtype(view.dtype());
  } catch (...) {
    Py_XDECREF(ctx->owner);
    delete ctx;
    throw;
  }
  t.ndim = static_cast<int>(ctx->shape.size());
  t.shape = ctx->shape.data();
  t.strides = nullptr;  // compact row-major
  t.byte_offset = 0;
  ctx->tensor.manager_ctx = ctx;
  ctx->tensor.deleter = delete_export;
  PyObject* cap = nullptr;
  if (versioned) {
    ctx->versioned.version = DLPackVersion{1, 0};
    ctx->versioned.manager_ctx = ctx;
    ctx->versioned.deleter = delete_export_versioned;
    ctx->versioned.flags = 0;  // writable, not a copy
    ctx->versioned.dl_tensor = t;
    cap = PyCapsule_New(&ctx->versioned, "dltensor_versioned", destroy_unconsumed_versioned_capsule);
  } else {
    cap = PyCapsule_New(&ctx->tensor, "dltensor", destroy_unconsumed_capsule);
  }
  if (cap == nullptr) {
    delete_export(&ctx->tensor);
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::capsule>(cap);
}

}  // namespace gpucloud::python
