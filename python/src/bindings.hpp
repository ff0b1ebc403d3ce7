// Shared pieces of the Python bindings (not API).
#pragma once

#include <gpucloud/gpucloud.hpp>

#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace py = pybind11;

namespace gpucloud::python {

void register_errors(py::module_& m);
void bind_runtime(py::module_& m);
void bind_memory(py::module_& m);
void bind_movement(py::module_& m);
void bind_amp(py::module_& m);
void bind_gemm(py::module_& m);
void bind_collectives(py::module_& m);
void bind_monitor(py::module_& m);

/// Python's Stream: an owned stream, or a borrowed one (a pipeline's internal stream handed to a
/// compute step). The owned stream's destructor waits for its work, which may need the GIL
/// (Python host functions, releases of borrowed arrays), so it drops the GIL first.
struct PyStream {
  explicit PyStream(Device device) : owned(std::make_unique<Stream>(device)), view(*owned) {}
  explicit PyStream(StreamView borrowed) : view(borrowed) {}
  ~PyStream();
  PyStream(const PyStream&) = delete;
  PyStream& operator=(const PyStream&) = delete;
  std::unique_ptr<Stream> owned;
  StreamView view;
};

/// Python's View: a non-owning typed view (a pipeline chunk, a prefetched batch's array) that
/// keeps its owner alive and speaks the same array protocols as Buffer.
struct PyView {
  BufferView view;
  std::vector<std::int64_t> shape;
  py::object owner;
};

/// Python's Buffer: an owning Buffer plus the shape Python sees. Its memory may be freed in
/// stream order, and a CUDA free may wait for the device, so its destructor drops the GIL too.
struct PyBuffer {
  PyBuffer(Buffer b, std::vector<std::int64_t> s, py::object mr)
      : buffer(std::move(b)), shape(std::move(s)), resource(std::move(mr)) {}
  ~PyBuffer();
  PyBuffer(const PyBuffer&) = delete;
  PyBuffer& operator=(const PyBuffer&) = delete;
  Buffer buffer;
  std::vector<std::int64_t> shape;
  py::object resource;  ///< the Python memory resource it came from, kept alive
};

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
/// stream thread ever waits for the GIL.
void keep_alive_until_done(StreamView stream, std::vector<py::object> objects);
/// Releases the borrowed objects whose work has finished (GIL held).
void release_finished_borrows();
/// At interpreter exit: waits for every borrowing work to finish, then releases all.
void release_all_borrows_at_exit();

/// A Python object that can be destroyed from any thread: the last release takes the GIL.
std::shared_ptr<py::object> gil_safe(py::object object);

/// dtype from a DType, a name ("float32", "bf16"), a NumPy dtype or a torch dtype.
/// @throws TypeError for anything else.
DType to_dtype(py::handle h);

/// MemoryKind from a MemoryKind or its name. @throws TypeError otherwise.
MemoryKind to_kind(py::handle h);

/// Device from a Device or a string like "cuda:0". @throws TypeError otherwise.
Device to_device(py::handle h);

}  // namespace gpucloud::python
