// Checkpoints: gpucloud.checkpoint (Checkpointer, PendingSave, Manifest, load, latest), and the
// state_dict()/load_state_dict() of the optimizers and the scaler live in amp.cpp.
#include "interop.hpp"

#include <pybind11/chrono.h>
#include <pybind11/stl.h>

namespace gpucloud::python {

namespace ck = gpucloud::checkpoint;

namespace {

// A Python checkpointer: the communicator and staging resource it uses are kept alive (declared
// first, so they outlive it). A save in flight is waited for at interpreter exit.
struct PyCheckpointer {
  py::object comm, staging;
  std::unique_ptr<ck::Checkpointer> checkpointer;
  ~PyCheckpointer() {
    unregister_background(this);
    py::gil_scoped_release release;
    checkpointer.reset();
  }
};

// True for a torch.Tensor (torch imported by the caller: nothing else can be one).
bool is_torch_tensor(py::handle obj) {
  PyObject* torch = PyDict_GetItemString(PyImport_GetModuleDict(), "torch");  // borrowed
  if (torch == nullptr) return false;
  const py::object tensor = py::reinterpret_borrow<py::object>(torch).attr("Tensor");
  return py::isinstance(obj, tensor);
}

// A path as the file system has it: os.fsencode's bytes (a name that is not UTF-8 round-trips
// through str's surrogate escapes). A NUL byte is refused by the C++ call, naming the argument.
std::string arg_path(py::handle path, const char* arg) {
  py::object encoded;
  try {
    encoded = py::module_::import("os").attr("fsencode")(path);
  } catch (py::error_already_set& e) {
    if (!e.matches(PyExc_TypeError)) throw;
    throw py::type_error(std::string(arg) + ": expected a path (str, bytes or os.PathLike), got " + type_name(path));
  }
  return encoded.cast<std::string>();
}

// A path back to Python: str, decoded as os.fsdecode does.
py::str path_to_python(const std::string& path) { return py::module_::import("os").attr("fsdecode")(py::bytes(path)); }

// A contiguous copy of a torch tensor or NumPy array that is not contiguous (channels_last
// weights, a transposed view), or None when @p obj is contiguous or neither. A CUDA tensor's copy
// is made on torch's current stream, which is synchronised: the snapshot may run on another.
py::object contiguous_copy(py::handle obj) {
  if (is_torch_tensor(obj)) {
    if (obj.attr("is_contiguous")().cast<bool>()) return py::none();
    py::object copy = obj.attr("contiguous")();
    if (obj.attr("is_cuda").cast<bool>()) {
      py::module_::import("torch").attr("cuda").attr("current_stream")(obj.attr("device")).attr("synchronize")();
    }
    return copy;
  }
  if (py::hasattr(obj, "flags") && py::hasattr(obj, "__array_interface__") &&
      py::hasattr(obj.attr("flags"), "c_contiguous")) {
    if (obj.attr("flags").attr("c_contiguous").cast<bool>()) return py::none();
    return py::module_::import("numpy").attr("ascontiguousarray")(obj);
  }
  return py::none();
}

// {name: array-like} -> a StateDict of borrowed views; the owners (arrays, capsules) in @p owners.
// With @p copy_back, a non-contiguous torch tensor or NumPy array is replaced by a contiguous copy:
// read from (a save), or, with @p writable, written into and then copied back by the caller (a
// load: {original, copy} pairs in *copy_back).
StateDict borrow_state(py::handle tensors, const char* arg, bool writable, std::vector<py::object>& owners,
                       std::vector<std::pair<py::object, py::object>>* copy_back = nullptr) {
  if (!py::isinstance<py::dict>(tensors)) {
    throw py::type_error(std::string(arg) + ": expected a dict of {name: array}, got " + type_name(tensors));
  }
  StateDict state;
  for (auto item : py::reinterpret_borrow<py::dict>(tensors)) {
    if (!py::isinstance<py::str>(item.first)) {
      throw py::type_error(std::string(arg) + ": names must be str, got " + type_name(item.first));
    }
    const std::string name = item.first.cast<std::string>();
    const std::string what = std::string(arg) + "['" + name + "']";
    py::object source = py::reinterpret_borrow<py::object>(item.second);
    if (copy_back != nullptr) {
      py::object copy = contiguous_copy(source);
      if (!copy.is_none()) {
        copy_back->emplace_back(source, copy);
        source = copy;
      }
    }
    Borrowed b = writable ? borrow_writable(source, what.c_str()) : borrow(source, what.c_str());
    state[name] = TensorRef{b.view, b.shape};
    owners.push_back(b.owner);
  }
  return state;
}

// Metadata values are strings: the caller json.dumps anything else.
ck::Metadata to_metadata(py::handle metadata) { return arg_str_dict(metadata, "metadata"); }

}  // namespace

/// A StateDict as Python sees it: {name: View} of memory owned by @p owner.
py::dict state_to_python(const StateDict& state, py::object owner, py::object stream) {
  py::dict out;
  for (const auto& [name, ref] : state) {
    std::vector<std::int64_t> shape =
        ref.shape.empty() ? std::vector<std::int64_t>{static_cast<std::int64_t>(ref.view.size())} : ref.shape;
    out[py::str(name)] = py::cast(PyView{ref.view, std::move(shape), owner, stream});
  }
  return out;
}

/// {name: array} from Python for a load_state_dict: borrowed views, their owners in @p owners.
StateDict state_from_python(py::handle state, std::vector<py::object>& owners) {
  return borrow_state(state, "state", false, owners);
}

// Bound into _core with checkpoint-specific names (one stub file describes the whole extension);
// gpucloud/checkpoint.py presents them as gpucloud.checkpoint.Checkpointer, .load, .latest, ...
void bind_checkpoint(py::module_& m) {
  m.attr("CHECKPOINT_FORMAT_VERSION") = ck::kFormatVersion;

  py::class_<ck::TensorInfo>(m, "CheckpointTensorInfo", "Where one tensor lives in a checkpoint.")
      .def_readonly("dtype", &ck::TensorInfo::dtype)
      .def_readonly("shape", &ck::TensorInfo::shape)
      .def_readonly("file", &ck::TensorInfo::file)
      .def_readonly("begin", &ck::TensorInfo::begin, "First byte in the file.")
      .def_readonly("end", &ck::TensorInfo::end, "One past the last byte.")
      .def_readonly("xxh3", &ck::TensorInfo::xxh3, "XXH3-64 of the bytes.")
      .def("__repr__", [](const ck::TensorInfo& t) {
        return "TensorInfo(" + std::string(dtype_name(t.dtype)) +
               ", shape=" + py::repr(py::cast(t.shape)).cast<std::string>() + ", file='" + t.file + "')";
      });

  py::class_<ck::Manifest>(m, "CheckpointManifest", "A checkpoint's manifest, verified against its checksum.")
      .def_readonly("format_version", &ck::Manifest::format_version)
      .def_readonly("step", &ck::Manifest::step)
      .def_readonly("world_size", &ck::Manifest::world_size, "Ranks that wrote it.")
      .def_readonly("files", &ck::Manifest::files)
      .def_readonly("tensors", &ck::Manifest::tensors)
      .def_readonly("metadata", &ck::Manifest::metadata)
      .def_property_readonly("directory", [](const ck::Manifest& mf) { return path_to_python(mf.directory); })
      .def("__repr__", [](const ck::Manifest& mf) {
        return "Manifest(step=" + std::to_string(mf.step) + ", world_size=" + std::to_string(mf.world_size) +
               ", tensors=" + std::to_string(mf.tensors.size()) +
               ", directory=" + py::repr(path_to_python(mf.directory)).cast<std::string>() + ")";
      });

  py::class_<ck::Progress>(m, "CheckpointProgress", "How far a Checkpointer's background writer is behind.")
      .def_readonly("writing_step", &ck::Progress::writing_step, "The step of the save in flight, or None.")
      .def_readonly("committed_step", &ck::Progress::committed_step,
                    "The newest step this Checkpointer committed, or None.")
      .def_readonly("seconds_since_commit", &ck::Progress::seconds_since_commit, "Age of that commit (0 before one).")
      .def_readonly("committed_unix_time", &ck::Progress::committed_unix_time,
                    "When it committed, seconds since the epoch (0: none).")
      .def_readonly("last_save_seconds", &ck::Progress::last_save_seconds,
                    "save_async to commit of the last committed save.")
      .def_readonly("waited_seconds", &ck::Progress::waited_seconds,
                    "Total time save_async blocked for the previous save (the writer lagging).")
      .def_readonly("saves_committed", &ck::Progress::saves_committed)
      .def_readonly("saves_failed", &ck::Progress::saves_failed)
      .def("__repr__", [](const ck::Progress& p) {
        auto opt = [](const std::optional<std::int64_t>& v) { return v ? std::to_string(*v) : std::string("None"); };
        return "CheckpointProgress(writing_step=" + opt(p.writing_step) + ", committed_step=" + opt(p.committed_step) +
               ", seconds_since_commit=" + std::to_string(p.seconds_since_commit) +
               ", waited_seconds=" + std::to_string(p.waited_seconds) + ")";
      });

  py::class_<ck::PendingSave>(m, "PendingSave", "A save in flight: wait() for its commit.")
      .def(
          "wait", [](ck::PendingSave& p) { without_gil([&] { p.wait(); }); },
          "Block until committed (on every rank); raise CheckpointError with the I/O error, once.")
      .def("done", &ck::PendingSave::done, "True once committed or failed; never blocks.")
      .def_property_readonly("directory", [](const ck::PendingSave& p) { return path_to_python(p.directory()); })
      .def_property_readonly("step", &ck::PendingSave::step)
      .def_property_readonly("seconds", &ck::PendingSave::seconds,
                             "Seconds from save_async to the commit (or the failure); 0 while in flight.");

  py::class_<PyCheckpointer>(m, "Checkpointer",
                             "Writes the checkpoints of one training run under a root directory (root/step-N).")
      .def(py::init([](PathArg root_arg, IntArg keep_last, OptionalCommunicator comm, OptionalResource staging,
                       double commit_timeout) {
             const std::string root = arg_path(root_arg, "root");
             ck::Options o;
             o.keep_last = static_cast<int>(arg_size(keep_last, "keep_last"));
             GPUCLOUD_EXPECTS(commit_timeout > 0, "Checkpointer", "commit_timeout: must be positive (seconds)");
             o.commit_timeout = std::chrono::milliseconds(static_cast<std::int64_t>(commit_timeout * 1000));
             if (!comm.is_none()) o.comm = &arg_as<Communicator>(comm, "comm", "a gpucloud.Communicator or None");
             if (!staging.is_none()) {
               o.staging = &arg_as<MemoryResource>(staging, "staging", "a gpucloud.MemoryResource or None");
             }
             auto p = std::make_unique<PyCheckpointer>();
             p->comm = comm;
             p->staging = staging;
             // a collective with a communicator
             without_gil([&] { p->checkpointer = std::make_unique<ck::Checkpointer>(root, o); });
             ck::Checkpointer* raw = p->checkpointer.get();
             register_background(p.get(), [raw] {
               try {
                 raw->wait();  // a save in flight commits before the interpreter goes
               } catch (...) {
               }
             });
             return p;
           }),
           py::arg("root"), py::arg("keep_last") = 0, py::arg("comm") = py::none(), py::arg("staging") = py::none(),
           py::arg("commit_timeout") = 600.0,
           "keep_last: committed checkpoints kept (0: all). comm: the ranks that write together (every rank calls "
           "every save). staging: a pinned (or host) MemoryResource for the snapshots. commit_timeout: seconds.")
      .def(
          "save_async",
          [](PyCheckpointer& self, IntArg step, TensorDict tensors, PyStream& stream, StrDict metadata) {
            const std::int64_t s = arg_int(step, "step");
            std::vector<py::object> owners;
            std::vector<std::pair<py::object, py::object>> copies;  // non-contiguous: saved from a copy
            const StateDict state = borrow_state(tensors, "tensors", false, owners, &copies);
            const ck::Metadata meta = to_metadata(metadata);
            // The snapshot reads the arrays; the stream waits for it, so they live until then.
            return enqueue_holding(stream.view, std::move(owners),
                                   [&] { return self.checkpointer->save_async(s, state, stream.view, meta); });
          },
          py::arg("step"), py::arg("tensors"), py::arg("stream"), py::arg("metadata") = py::none(),
          "Snapshot {name: array} after the stream's work (the stream waits for the snapshot), write it in the "
          "background, return a PendingSave at once. Waits for the previous save first (raising its error).")
      .def(
          "save",
          [](PyCheckpointer& self, IntArg step, TensorDict tensors, PyStream& stream, StrDict metadata) {
            const std::int64_t s = arg_int(step, "step");
            std::vector<py::object> owners;
            std::vector<std::pair<py::object, py::object>> copies;
            const StateDict state = borrow_state(tensors, "tensors", false, owners, &copies);
            const ck::Metadata meta = to_metadata(metadata);
            without_gil([&] { self.checkpointer->save(s, state, stream.view, meta); });
          },
          py::arg("step"), py::arg("tensors"), py::arg("stream"), py::arg("metadata") = py::none(),
          "save_async(...).wait(): returns once committed.")
      .def(
          "wait", [](PyCheckpointer& self) { without_gil([&] { self.checkpointer->wait(); }); },
          "Wait for the save in flight, if any; raise its error.")
      .def_property_readonly("root", [](PyCheckpointer& self) { return path_to_python(self.checkpointer->root()); })
      .def_property_readonly(
          "progress", [](PyCheckpointer& self) { return self.checkpointer->progress(); },
          "The writer's lag: the save in flight, the newest commit and its age, time save_async waited.")
      .def("__enter__", [](py::object self) { return self; })
      .def(
          "__exit__",
          [](PyCheckpointer& self, py::handle type, py::handle, py::handle) {
            py::gil_scoped_release release;
            if (type.is_none()) {
              self.checkpointer->wait();
            } else {
              try {
                self.checkpointer->wait();
              } catch (...) {  // the exception already leaving the block wins
              }
            }
          },
          "Waits for the save in flight (raising its error unless another is already raised).");

  m.def(
      "checkpoint_find_latest",
      [](PathArg root_arg) {
        const std::string root = arg_path(root_arg, "root");
        const ck::LatestScan scan = without_gil([&] { return ck::find_latest(root); });
        py::list skipped;
        for (const auto& s : scan.skipped) skipped.append(py::make_tuple(path_to_python(s.directory), s.reason));
        return py::make_tuple(scan.directory ? path_to_python(*scan.directory) : py::object(py::none()), skipped);
      },
      py::arg("root"),
      "(directory or None, [(skipped directory, reason), ...]): the newest valid checkpoint under root and the "
      "newer ones that are not valid, newest first.");
  m.def(
      "checkpoint_read_manifest",
      [](PathArg directory_arg) {
        const std::string directory = arg_path(directory_arg, "directory");
        return without_gil([&] { return ck::read_manifest(directory); });
      },
      py::arg("directory"), "Read and verify a checkpoint's manifest.");
  m.def(
      "checkpoint_load",
      [](PathArg directory_arg, TensorDict into, PyStream& stream, bool strict, const std::string& verify_arg) {
        const std::string directory = arg_path(directory_arg, "directory");
        if (verify_arg != "before_writing" && verify_arg != "while_copying") {
          throw InvalidArgument("checkpoint.load",
                                "verify: '" + verify_arg + "' is not 'before_writing' or 'while_copying'", __FILE__,
                                __LINE__);
        }
        const ck::Verify verify =
            verify_arg == "while_copying" ? ck::Verify::while_copying : ck::Verify::before_writing;
        std::vector<py::object> owners;
        std::vector<std::pair<py::object, py::object>> copies;  // non-contiguous: loaded via a copy
        const StateDict state = borrow_state(into, "into", true, owners, &copies);
        // synchronises the stream
        ck::Manifest loaded = without_gil([&] { return ck::load(directory, state, stream.view, strict, verify); });
        for (auto& [original, copy] : copies) {
          if (is_torch_tensor(original)) {
            original.attr("copy_")(copy);
          } else {
            original.attr("__setitem__")(py::ellipsis(), copy);
          }
        }
        return loaded;
      },
      py::arg("directory"), py::arg("into"), py::arg("stream"), py::arg("strict") = true,
      py::arg("verify") = "before_writing",
      "Load into {name: array} (each found by name): everything verified (manifest, headers, dtypes, shapes, and "
      "with verify='before_writing' the checksums) before the first write; then copied in stream order, and the "
      "stream synchronised. verify='while_copying' checks each host tensor's checksum as it is copied (one pass "
      "over the data: faster from the page cache, but a damaged tensor then leaves the others written). A "
      "non-contiguous tensor or array (channels_last, a transposed view) is filled through a contiguous copy. "
      "Returns the Manifest.");
  m.def("checkpoint_directory_name", &ck::directory_name, py::arg("step"),
        "The name of a step's directory: step-000000001000.");
}

}  // namespace gpucloud::python
