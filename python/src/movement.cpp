// The copy pipeline and the batch prefetcher.
#include "interop.hpp"

#include <pybind11/functional.h>
#include <pybind11/stl.h>

namespace gpucloud::python {

namespace {

struct PyChunk {
  std::size_t index;
  std::size_t offset;
  py::object data;    // a View of the chunk in device memory
  py::object stream;  // the (borrowed) stream to enqueue work on
};

// A batch holds the stream it was handed to (its memory is released in that stream's order), so
// it stays valid after the consumer drops the stream, the prefetcher or both.
struct PyBatch {
  PyBatch(Batch b, py::object consumer_stream) : stream(std::move(consumer_stream)), batch(std::move(b)) {}
  ~PyBatch() {
    // freeing may wait for the last pool returns
    without_gil([&] { Batch gone = std::move(batch); });
  }
  py::object stream;  // declared first: outlives the batch
  Batch batch;
};

// A prefetcher's producer thread calls the Python source, so it must stop before the interpreter
// finalises (a thread taking the GIL then is ended mid-call: "terminate called ..."): every live
// prefetcher is registered to be stopped at exit.
struct PyPrefetcher {
  std::unique_ptr<Prefetcher> prefetcher;
  ~PyPrefetcher() {
    unregister_background(this);
    py::gil_scoped_release release;  // the producer may be waiting for the GIL to call the source
    prefetcher.reset();
  }
};

std::vector<std::int64_t> flat(BufferView v) { return {static_cast<std::int64_t>(v.size())}; }

// Runs one pipeline call with Python's step; the GIL is dropped while the pipeline works.
void run_pipeline(py::object self, ArrayLike dst, ArrayLike src, PyStream& stream, py::object step, int which) {
  auto& pipeline = self.cast<CopyPipeline&>();
  Borrowed d = borrow_writable(dst, "dst");
  Borrowed s = borrow(src, "src");
  ChunkStep chunk_step;
  if (!step.is_none()) {
    // A chunk's data is a slice of dst (upload) or a slot of the pipeline's device ring (transform):
    // its View holds both, and its stream (the pipeline's) holds the pipeline.
    py::object memory_owners = py::make_tuple(self, d.owner);
    chunk_step = [&step, self, memory_owners](const Chunk& c) {
      py::gil_scoped_acquire acquire;
      auto borrowed = py::cast(std::make_unique<PyStream>(c.stream, self));
      auto view = py::cast(PyView{c.data, flat(c.data), memory_owners, borrowed});
      step(py::cast(PyChunk{c.index, c.offset, view, borrowed}));
    };
  }
  enqueue_holding(stream.view, {d.owner, s.owner, self}, [&] {
    if (which == 0) pipeline.upload(d.view, s.view, stream.view, chunk_step);
    if (which == 1) pipeline.download(d.view, s.view, stream.view);
    if (which == 2) pipeline.transform(d.view, s.view, stream.view, chunk_step);
  });
}

BatchSource python_source(py::object iterable) {
  auto iterator = gil_safe(py::iter(iterable));
  return [iterator]() -> std::optional<HostBatch> {
    py::gil_scoped_acquire acquire;
    py::object item = py::reinterpret_steal<py::object>(PyIter_Next(iterator->ptr()));
    if (!item) {
      if (PyErr_Occurred()) {
        py::error_already_set e;
        throw_shareable(e);  // read by the consumer thread(s), maybe more than once
      }
      return std::nullopt;
    }
    std::vector<py::object> arrays;
    if (py::isinstance<py::tuple>(item) || py::isinstance<py::list>(item)) {
      for (auto a : item) arrays.push_back(py::reinterpret_borrow<py::object>(a));
    } else {
      arrays.push_back(item);
    }
    HostBatch batch;
    std::vector<py::object> owners;
    for (auto& a : arrays) {
      Borrowed b = borrow(a, "source");
      batch.arrays.push_back(b.view);
      owners.push_back(b.owner);
    }
    batch.keep_alive = gil_safe(py::cast(owners));
    return batch;
  };
}

}  // namespace

void bind_movement(py::module_& m) {
  py::class_<PyChunk>(m, "Chunk", "One chunk handed to a pipeline's compute step.")
      .def_readonly("index", &PyChunk::index, "0, 1, 2, ... in order of the data.")
      .def_readonly("offset", &PyChunk::offset, "First element of the chunk in the whole array.")
      .def_readonly("data", &PyChunk::data, "The chunk in device memory (a View).")
      .def_readonly("stream", &PyChunk::stream, "The stream to enqueue the chunk's work on.");

  py::class_<ChunkTimes>(m, "ChunkTimes", "When each stage of a chunk ended, in ms after the call's start.")
      .def_readonly("index", &ChunkTimes::index)
      .def_readonly("stream", &ChunkTimes::stream)
      .def_readonly("copy_in_begin", &ChunkTimes::copy_in_begin)
      .def_readonly("copy_in_end", &ChunkTimes::copy_in_end)
      .def_readonly("compute_end", &ChunkTimes::compute_end)
      .def_readonly("copy_out_end", &ChunkTimes::copy_out_end);

  py::class_<CopyPipeline>(m, "CopyPipeline",
                           "Moves arrays between host and device in chunks over several streams, overlapping "
                           "copies with the compute step.")
      .def(py::init([](DeviceLike device, std::size_t chunk_bytes, int depth, bool record_timeline) {
             return std::make_unique<CopyPipeline>(to_device(device),
                                                   PipelineOptions{chunk_bytes, depth, record_timeline});
           }),
           py::arg_v("device", Device::host(), "Device.host()"), py::kw_only(),
           py::arg("chunk_bytes") = PipelineOptions{}.chunk_bytes, py::arg("depth") = PipelineOptions{}.depth,
           py::arg("record_timeline") = false)
      .def(
          "upload",
          [](py::object self, ArrayLike dst, ArrayLike src, PyStream& stream, ChunkFunction step) {
            run_pipeline(self, dst, src, stream, step, 0);
          },
          py::arg("dst"), py::arg("src"), py::arg("stream"), py::arg("step") = py::none(),
          "Copy host `src` into device `dst` chunk by chunk; `step(chunk)` enqueues work on each chunk.")
      .def(
          "download",
          [](py::object self, ArrayLike dst, ArrayLike src, PyStream& stream) {
            run_pipeline(self, dst, src, stream, py::none(), 1);
          },
          py::arg("dst"), py::arg("src"), py::arg("stream"), "Copy device `src` into host `dst` chunk by chunk.")
      .def(
          "transform",
          [](py::object self, ArrayLike dst, ArrayLike src, PyStream& stream, ChunkFunction step) {
            run_pipeline(self, dst, src, stream, step, 2);
          },
          py::arg("dst"), py::arg("src"), py::arg("stream"), py::arg("step"),
          "Stream host `src` through device chunks: copy in, `step(chunk)`, copy back into host `dst`.")
      .def(
          "timeline", [](CopyPipeline& p) { return without_gil([&] { return p.timeline(); }); },
          "Stage times of every chunk of the last call (record_timeline=True).")
      .def_property_readonly("device", &CopyPipeline::device)
      .def_property_readonly("chunk_bytes", [](CopyPipeline& p) { return p.options().chunk_bytes; })
      .def_property_readonly("depth", [](CopyPipeline& p) { return p.options().depth; });

  py::class_<PyBatch>(m, "Batch", "A batch on the device, handed out by Prefetcher.next().")
      .def_property_readonly("index", [](PyBatch& b) { return b.batch.index(); })
      .def_property_readonly(
          "arrays",
          [](py::object self) {
            auto& b = self.cast<PyBatch&>();
            py::list out;
            for (const BufferView& v : b.batch.arrays()) out.append(py::cast(PyView{v, flat(v), self, b.stream}));
            return out;
          },
          "The arrays in device memory (flat Views; reshape on the consumer's side).")
      .def_property_readonly(
          "ready", [](PyBatch& b) { return &b.batch.ready(); }, py::return_value_policy::reference_internal,
          "The event recorded after the batch's copies.");

  py::class_<PrefetchWait>(m, "PrefetchWait",
                           "What Prefetcher.next() waited: seconds it blocked, and of those the seconds its "
                           "stream sat idle (the stall a prefetcher exists to hide).")
      .def_readonly("blocked_seconds", &PrefetchWait::blocked_seconds, "next() blocked for a batch (0: one was ready)")
      .def_readonly("stream_idle_seconds", &PrefetchWait::stream_idle_seconds, "of those, the stream had no work left")
      .def("__repr__", [](const PrefetchWait& w) {
        return "PrefetchWait(blocked_seconds=" + std::to_string(w.blocked_seconds) +
               ", stream_idle_seconds=" + std::to_string(w.stream_idle_seconds) + ")";
      });

  py::class_<PyPrefetcher>(m, "Prefetcher",
                           "Keeps the next `depth` batches of a source on the device, copied on its own stream.")
      .def(py::init([](py::object source, DeviceLike device, int depth, KindLike kind) {
             auto p = std::make_unique<PyPrefetcher>();
             p->prefetcher = std::make_unique<Prefetcher>(to_device(device), python_source(std::move(source)),
                                                          PrefetchOptions{depth, to_kind(kind)});
             Prefetcher* raw = p->prefetcher.get();
             register_background(p.get(), [raw] { raw->stop(); });
             return p;
           }),
           py::arg("source"), py::arg_v("device", Device::host(), "Device.host()"), py::kw_only(),
           py::arg("depth") = PrefetchOptions{}.depth, py::arg_v("kind", MemoryKind::device, "MemoryKind.device"),
           "`source` is an iterable of host arrays or of tuples of host arrays (NumPy, torch CPU, ...).")
      .def(
          "next",
          [](PyPrefetcher& p, PyStream& stream) -> py::object {
            std::optional<Batch> b = without_gil([&] { return p.prefetcher->next(stream.view); });
            if (!b) return py::none();
            return py::cast(
                std::make_unique<PyBatch>(std::move(*b), py::cast(&stream, py::return_value_policy::reference)));
          },
          py::arg("stream"),
          "The next Batch with `stream` already waiting for its copies, or None at the end; re-raises "
          "the source's exception.")
      .def(
          "stop", [](PyPrefetcher& p) { without_gil([&] { p.prefetcher->stop(); }); },
          "End early: drop the batches not handed out and join the producer thread.")
      .def_property_readonly("device", [](PyPrefetcher& p) { return p.prefetcher->device(); })
      .def_property_readonly(
          "last_wait", [](PyPrefetcher& p) { return p.prefetcher->last_wait(); },
          "What the last next() waited (a PrefetchWait; zeros before the first).");
}

}  // namespace gpucloud::python
