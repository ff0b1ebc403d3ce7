// Zero-copy interop: borrowing memory from NumPy / PyTorch / CuPy objects (DLPack, the array
// interfaces), and exporting gpucloud buffers the same ways (not API).
#pragma once

#include "bindings.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace gpucloud::python {

/// Memory borrowed from a Python object for the duration of an operation.
struct Borrowed {
  BufferView view;
  std::vector<std::int64_t> shape;
  bool readonly = false;
  py::object owner;  ///< keeps the memory alive: the object itself, or the consumed DLPack capsule
};

/// Views @p obj (a gpucloud.Buffer or anything with __cuda_array_interface__, __array_interface__
/// or __dlpack__) without copying. @throws TypeError for unsupported objects or dtypes,
/// InvalidArgument (naming @p arg) for non-contiguous memory.
Borrowed borrow(py::handle obj, const char* arg);

/// As borrow(), and the memory must be writable. @throws InvalidArgument for read-only memory.
Borrowed borrow_writable(py::handle obj, const char* arg);

/// Numpy-style typestr ("<f4") of a dtype; bfloat16 and fp8 are raw void types ("<V2", "|V1").
std::string typestr(DType t);

/// A DLPack capsule for @p view of @p shape, keeping @p owner alive until consumed and freed:
/// "dltensor_versioned" (DLPack 1.0) when @p versioned, else the legacy "dltensor".
py::capsule to_dlpack(BufferView view, const std::vector<std::int64_t>& shape, py::object owner, bool versioned);

/// The address an export reports: the data, or for empty memory a valid aligned dummy (NumPy 1.x
/// refuses a null data pointer even for zero elements).
void* export_address(BufferView view);

/// (device_type, device_id) of @p view in DLPack's terms.
py::tuple dlpack_device(BufferView view);

}  // namespace gpucloud::python
