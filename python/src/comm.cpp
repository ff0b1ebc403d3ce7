// Communicators, collectives and gradient buckets.
#include "interop.hpp"

#include <gpucloud/comm/transport.hpp>

#include <cstring>

#include <pybind11/chrono.h>
#include <pybind11/functional.h>
#include <pybind11/stl.h>

namespace gpucloud::python {

namespace {

// A Python object as a HostTransport: its methods run with the GIL, on gpucloud's stream worker,
// with memoryviews of the buffers (no export, which would wait for the very collective running),
// the dtype's and the op's names.
class PythonTransport final : public HostTransport {
 public:
  explicit PythonTransport(py::object object) : object_(gil_safe(std::move(object))) {
    for (const char* name : {"rank", "size", "all_reduce", "all_gather", "broadcast", "split"}) {
      if (!py::hasattr(*object_, name)) {
        GPUCLOUD_FAIL(InvalidArgument, "Communicator.from_transport",
                      std::string("transport: ") + type_name(*object_) + " has no method " + name + "()");
      }
    }
    rank_ = static_cast<int>(arg_int(object_->attr("rank")(), "transport.rank()"));
    size_ = static_cast<int>(arg_int(object_->attr("size")(), "transport.size()"));
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void all_reduce(BufferView data, ReduceOp op) override {
    const char* name = op == ReduceOp::max ? "max" : op == ReduceOp::min ? "min" : "sum";
    with_gil([&] { object_->attr("all_reduce")(bytes_of(data), dtype_name(data.dtype()), name); });
  }
  void all_gather(BufferView send, BufferView recv) override {
    with_gil([&] { object_->attr("all_gather")(bytes_of(send), bytes_of(recv), dtype_name(send.dtype())); });
  }
  void broadcast(BufferView data, int root) override {
    with_gil([&] { object_->attr("broadcast")(bytes_of(data), dtype_name(data.dtype()), root); });
  }
  std::shared_ptr<HostTransport> split(int color, int key) override {
    std::shared_ptr<HostTransport> part;
    with_gil([&] { part = std::make_shared<PythonTransport>(object_->attr("split")(color, key)); });
    return part;
  }

 private:
  // Runs @p f holding the GIL; a Python exception becomes a C++ one with its text (gpucloud then
  // raises CommunicationError naming the collective).
  template <class F>
  static void with_gil(F f) {
    if (interpreter_finalizing()) throw std::runtime_error("the Python interpreter is exiting");
    py::gil_scoped_acquire acquire;
    try {
      f();
    } catch (py::error_already_set& e) {
      throw std::runtime_error(e.what());
    }
  }
  static py::object bytes_of(BufferView v) {
    PyObject* view =
        PyMemoryView_FromMemory(static_cast<char*>(v.data()), static_cast<Py_ssize_t>(v.size_bytes()), PyBUF_WRITE);
    if (view == nullptr) throw py::error_already_set();
    return py::reinterpret_steal<py::object>(view);
  }
  std::shared_ptr<py::object> object_;
  int rank_ = 0, size_ = 1;
};

ReduceOp to_op(const std::string& name) {
  if (name == "sum") return ReduceOp::sum;
  if (name == "average" || name == "avg" || name == "mean") return ReduceOp::average;
  if (name == "max") return ReduceOp::max;
  if (name == "min") return ReduceOp::min;
  GPUCLOUD_FAIL(InvalidArgument, "Communicator", "op: '" + name + "' is not sum, average, max or min");
}

struct PyBucketer {
  std::unique_ptr<GradBucketer> bucketer;
  std::vector<py::object> owners;  // the gradient arrays and the communicator
  ~PyBucketer() {
    py::gil_scoped_release release;
    bucketer.reset();
  }
};

// Runs a collective on borrowed arrays, the GIL dropped, the arrays kept until the stream is done;
// for ever when the collective broke the communicator (a timeout: its messages are left to MPI,
// and a peer that comes late still writes into them: freed, that was a segfault).
template <class F>
void collective(Communicator& c, PyStream& stream, std::vector<Borrowed> arrays, F f) {
  std::vector<py::object> owners;
  for (auto& b : arrays) owners.push_back(b.owner);
  py::object comm = py::cast(&c, py::return_value_policy::reference);
  owners.push_back(comm);  // alive while the predicate may be asked
  Communicator* raw = &c;
  enqueue_holding(
      stream.view, std::move(owners), [&] { f(); }, [raw] { return raw->broken(); });
}

}  // namespace

void bind_comm(py::module_& m) {
  py::class_<LaunchInfo>(m, "LaunchInfo", "Where this process sits in the job, as the launcher told it.")
      .def_readonly("rank", &LaunchInfo::rank)
      .def_readonly("size", &LaunchInfo::size)
      .def_readonly("local_rank", &LaunchInfo::local_rank)
      .def_readonly("local_size", &LaunchInfo::local_size)
      .def_readonly("launcher", &LaunchInfo::launcher)
      .def_readonly("node", &LaunchInfo::node,
                    "Index of this process's node; -1 when the launcher does not say (mpirun).")
      .def_readonly("nodes", &LaunchInfo::nodes, "Nodes in the job; 0 when the launcher does not say (mpirun).")
      .def("__repr__", [](const LaunchInfo& l) {
        return "LaunchInfo(rank=" + std::to_string(l.rank) + ", size=" + std::to_string(l.size) +
               ", local_rank=" + std::to_string(l.local_rank) + ", local_size=" + std::to_string(l.local_size) +
               ", node=" + std::to_string(l.node) + ", nodes=" + std::to_string(l.nodes) + ", launcher='" + l.launcher +
               "')";
      });
  m.def("launch_info_from_environment", &launch_info_from_environment,
        "Rank, size and node from mpirun / srun / torchrun variables (GPUCLOUD_LOCAL_SIZE overrides the node size).");

  py::class_<Hierarchy>(m, "Hierarchy",
                        "The hierarchical all-reduce's inner groups: a node, or (GPUCLOUD_HIERARCHY) a node's NVLink "
                        "island, NUMA node or block of local ranks.")
      .def_readonly("level", &Hierarchy::level, "'node', 'nvlink', 'numa' or 'blocks of K'.")
      .def_readonly("group", &Hierarchy::group, "This rank's group, numbered by first rank.")
      .def_readonly("groups", &Hierarchy::groups, "Groups in the communicator.")
      .def_readonly("group_rank", &Hierarchy::group_rank, "Rank within its group.")
      .def_readonly("group_size", &Hierarchy::group_size, "Ranks per group.")
      .def("__repr__", [](const Hierarchy& h) {
        return "Hierarchy(level='" + h.level + "', group=" + std::to_string(h.group) +
               ", groups=" + std::to_string(h.groups) + ", group_rank=" + std::to_string(h.group_rank) +
               ", group_size=" + std::to_string(h.group_size) + ")";
      });

  py::class_<LinkCost>(m, "LinkCost", "A link's cost per step: alpha seconds + bytes * beta.")
      .def(py::init([](double alpha, double beta) {
             return LinkCost{alpha, beta};
           }),
           py::arg("alpha"), py::arg("beta"))
      .def_readwrite("alpha", &LinkCost::alpha)
      .def_readwrite("beta", &LinkCost::beta);
  py::class_<AllReduceCostModel>(m, "AllReduceCostModel", "Alpha-beta predictions of flat and hierarchical all-reduce.")
      .def(py::init([](LinkCost intra, LinkCost inter, int local_size, int nodes) {
             return AllReduceCostModel{intra, inter, local_size, nodes};
           }),
           py::arg("intra"), py::arg("inter"), py::arg("local_size"), py::arg("nodes"))
      .def_readwrite("intra", &AllReduceCostModel::intra)
      .def_readwrite("inter", &AllReduceCostModel::inter)
      .def_readwrite("local_size", &AllReduceCostModel::local_size)
      .def_readwrite("nodes", &AllReduceCostModel::nodes)
      .def_readwrite("flat_halving", &AllReduceCostModel::flat_halving)
      .def("flat_seconds", &AllReduceCostModel::flat_seconds, py::arg("bytes"))
      .def("hierarchical_seconds", &AllReduceCostModel::hierarchical_seconds, py::arg("bytes"))
      .def("prefer_hierarchical", &AllReduceCostModel::prefer_hierarchical, py::arg("bytes"))
      .def("ties", &AllReduceCostModel::ties, py::arg("bytes"),
           "Whether the predictions are within 10 % of each other (all_reduce_auto then times both).")
      .def("to_json", &AllReduceCostModel::to_json)
      .def_static("from_json", &AllReduceCostModel::from_json, py::arg("json"));

  py::enum_<AllReduceForm>(m, "AllReduceForm", "Which form all_reduce_auto takes for a size.")
      .value("flat", AllReduceForm::flat)
      .value("hierarchical", AllReduceForm::hierarchical)
      .value("measuring", AllReduceForm::measuring);
  py::enum_<CommBackend>(m, "CommBackend", "Which library moves a communicator's data.")
      .value("mpi", CommBackend::mpi)
      .value("nccl", CommBackend::nccl)
      .value("transport", CommBackend::transport);
  py::class_<Communicator>(m, "Communicator", "A group of processes and stream-ordered collectives between them.")
      .def_static(
          "from_transport",
          [](py::object transport) {
            auto t = std::make_shared<PythonTransport>(std::move(transport));
            // its collectives block; the transport takes the GIL to run
            return without_gil([&] { return Communicator::from_transport(std::move(t)); });
          },
          py::arg("transport"),
          "The ranks of a transport's blocking host collectives: an object with rank(), size(), "
          "all_reduce(data, dtype, op), all_gather(send, recv, dtype), broadcast(data, dtype, root) and "
          "split(color, key), where data/send/recv are writable memoryviews of the bytes, dtype and op "
          "names (gloo through torch.distributed: gpucloud.torch.process_group_communicator). A "
          "collective: all ranks call.")
      .def_static(
          "mpi_world", [] { return without_gil([&] { return Communicator::mpi_world(); }); },
          "All processes of the MPI job (mpirun); nodes from shared memory or GPUCLOUD_LOCAL_SIZE.")
      .def_static(
          "mpi",
          [](py::handle comm) {
            // An mpi4py communicator (anything with py2f()), or a Fortran handle as an int.
            std::int64_t handle = 0;
            if (py::hasattr(comm, "py2f")) {
              // mpi4py's py2f() after MPI_Finalize aborts the whole process: ask its module first.
              const auto module_name = py::str(py::type::handle_of(comm).attr("__module__")).cast<std::string>();
              const py::module_ mpi = py::module_::import(module_name.c_str());
              if (py::hasattr(mpi, "Is_finalized") && mpi.attr("Is_finalized")().cast<bool>()) {
                GPUCLOUD_FAIL(InvalidArgument, "Communicator.mpi",
                              "comm: MPI is already finalised (MPI.Finalize() was called), so no MPI communicator "
                              "exists any more");
              }
              handle = arg_int(comm.attr("py2f")(), "comm.py2f()");
            } else if (py::isinstance<py::int_>(comm)) {
              handle = arg_int(comm, "comm");
            } else {
              GPUCLOUD_FAIL(InvalidArgument, "Communicator.mpi",
                            "comm: expected an mpi4py communicator or an MPI Fortran handle (int), got " +
                                std::string(py::str(py::type::of(comm))));
            }
            return without_gil([&] { return Communicator::mpi(handle); });
          },
          py::arg("comm"), "The processes of an existing MPI communicator (mpi4py's, or a Fortran handle), duplicated.")
      .def_static(
          "nccl_unique_id",
          [] {
            const NcclUniqueId id = Communicator::nccl_unique_id();
            return py::bytes(reinterpret_cast<const char*>(id.bytes.data()), id.bytes.size());
          },
          "A fresh NCCL unique id (128 bytes) for rank 0 to hand to the others.")
      .def_static(
          "nccl",
          [](py::bytes id, int rank, int size, DeviceLike device) {
            const std::string raw = id;
            NcclUniqueId uid;
            GPUCLOUD_EXPECTS(raw.size() == uid.bytes.size(), "Communicator.nccl",
                             "id: " + std::to_string(raw.size()) + " bytes, a NCCL unique id has 128");
            std::memcpy(uid.bytes.data(), raw.data(), raw.size());
            const Device d = to_device(device);
            return without_gil([&] { return Communicator::nccl(uid, rank, size, d); });
          },
          py::arg("id"), py::arg("rank"), py::arg("size"), py::arg("device"),
          "Rank `rank` of `size` processes, one GPU each, joined through `id` (every rank calls it).")
      .def_static(
          "nccl_from_mpi",
          [](OptionalDeviceLike device) {
            const Device d = device.is_none() ? Device::host() : to_device(device);
            return without_gil([&] { return Communicator::nccl_from_mpi(d); });
          },
          py::arg("device") = py::none(),
          "The MPI job's processes over NCCL (the id broadcast through MPI); the GPU is `device`, or the "
          "local rank's.")
      .def_static(
          "nccl_single_process",
          [](const std::vector<py::handle>& devices) {
            std::vector<Device> ds;
            for (auto d : devices) ds.push_back(to_device(d));
            return without_gil([&] { return Communicator::nccl_single_process(ds); });
          },
          py::arg("devices"), "One process driving several GPUs: a communicator per device (use comm_group).")
      .def_property_readonly("backend", &Communicator::backend)
      .def_property_readonly("device", &Communicator::device)
      .def_property_readonly("rank", &Communicator::rank)
      .def_property_readonly("size", &Communicator::size)
      .def_property_readonly("local_rank", &Communicator::local_rank)
      .def_property_readonly("local_size", &Communicator::local_size)
      .def_property_readonly("node", &Communicator::node)
      .def_property_readonly("nodes", &Communicator::nodes)
      .def_property_readonly("hierarchy", &Communicator::hierarchy,
                             "The hierarchical all-reduce's groups (GPUCLOUD_HIERARCHY; the nodes by default).")
      .def_property_readonly("broken", &Communicator::broken)
      .def_property_readonly(
          "busy_seconds", &Communicator::busy_seconds,
          "Seconds the completed collectives took, measured by the backend (deltas: a step's comm time).")
      .def_property("timeout", &Communicator::timeout, &Communicator::set_timeout, "How long a collective may take.")
      .def(
          "all_reduce",
          [](Communicator& c, ArrayLike send, ArrayLike recv, PyStream& stream, const std::string& op) {
            Borrowed s = borrow(send, "send"), r = borrow_writable(recv, "recv");
            collective(c, stream, {s, r}, [&] { c.all_reduce(s.view, r.view, to_op(op), stream.view); });
          },
          py::arg("send"), py::arg("recv"), py::arg("stream"), py::kw_only(), py::arg("op") = "sum",
          "recv = op over ranks of send (in place when they are the same array).")
      .def(
          "hierarchical_all_reduce",
          [](Communicator& c, ArrayLike send, ArrayLike recv, PyStream& stream, const std::string& op) {
            Borrowed s = borrow(send, "send"), r = borrow_writable(recv, "recv");
            collective(c, stream, {s, r}, [&] { c.hierarchical_all_reduce(s.view, r.view, to_op(op), stream.view); });
          },
          py::arg("send"), py::arg("recv"), py::arg("stream"), py::kw_only(), py::arg("op") = "sum",
          "The same result through the node hierarchy (Horovod): reduce-scatter inside each node, all-reduce "
          "across nodes, all-gather inside each node.")
      .def(
          "reduce_scatter",
          [](Communicator& c, ArrayLike send, ArrayLike recv, PyStream& stream, const std::string& op) {
            Borrowed s = borrow(send, "send"), r = borrow_writable(recv, "recv");
            collective(c, stream, {s, r}, [&] { c.reduce_scatter(s.view, r.view, to_op(op), stream.view); });
          },
          py::arg("send"), py::arg("recv"), py::arg("stream"), py::kw_only(), py::arg("op") = "sum")
      .def(
          "all_gather",
          [](Communicator& c, ArrayLike send, ArrayLike recv, PyStream& stream) {
            Borrowed s = borrow(send, "send"), r = borrow_writable(recv, "recv");
            collective(c, stream, {s, r}, [&] { c.all_gather(s.view, r.view, stream.view); });
          },
          py::arg("send"), py::arg("recv"), py::arg("stream"))
      .def(
          "broadcast",
          [](Communicator& c, ArrayLike buffer, int root, PyStream& stream) {
            Borrowed b = borrow_writable(buffer, "buffer");
            collective(c, stream, {b}, [&] { c.broadcast(b.view, root, stream.view); });
          },
          py::arg("buffer"), py::arg("root"), py::arg("stream"))
      .def(
          "measure_cost_model",
          [](Communicator& c, PyStream& stream) {
            return without_gil([&] { return c.measure_cost_model(stream.view); });
          },
          py::arg("stream"), "Fit the cost model's alpha and beta on this job (every rank calls it).")
      .def("set_cost_model", &Communicator::set_cost_model, py::arg("model"))
      .def(
          "all_reduce_auto",
          [](Communicator& c, ArrayLike send, ArrayLike recv, PyStream& stream, const std::string& op) {
            Borrowed s = borrow(send, "send"), r = borrow_writable(recv, "recv");
            collective(c, stream, {s, r}, [&] { c.all_reduce_auto(s.view, r.view, to_op(op), stream.view); });
          },
          py::arg("send"), py::arg("recv"), py::arg("stream"), py::kw_only(), py::arg("op") = "sum",
          "All-reduce, flat or hierarchical as the cost model predicts faster (where its predictions tie, "
          "the first calls of a size time both forms).")
      .def("all_reduce_auto_form", &Communicator::all_reduce_auto_form, py::arg("nbytes"),
           "The form all_reduce_auto takes for nbytes now: flat, hierarchical or measuring.")
      .def(
          "barrier", [](Communicator& c, PyStream& stream) { without_gil([&] { c.barrier(stream.view); }); },
          py::arg("stream"));

  m.def(
      "comm_group", [](py::function issue) { comm_group([&] { issue(); }); }, py::arg("issue"),
      "Calls issue() and sends the collectives it enqueues on several communicators as one NCCL group.");

  py::class_<PyBucketer>(m, "GradBucketer", "DDP-style gradient buckets all-reduced (averaged) as they become ready.")
      .def(py::init([](CommunicatorArg comm, py::iterable grads, std::size_t bucket_bytes,
                       std::size_t first_bucket_bytes, bool hierarchical, OptionalDTypeLike wire_dtype) {
             auto p = std::make_unique<PyBucketer>();
             std::vector<BufferView> views;
             std::size_t i = 0;
             for (auto g : grads) {
               const std::string arg = "grads[" + std::to_string(i++) + "]";
               Borrowed b = borrow_writable(g, arg.c_str());
               views.push_back(b.view);
               p->owners.push_back(b.owner);
             }
             p->owners.push_back(comm);
             BucketOptions o;
             o.bucket_bytes = bucket_bytes;
             o.first_bucket_bytes = first_bucket_bytes;
             o.hierarchical = hierarchical;
             if (!wire_dtype.is_none()) o.wire_dtype = to_dtype(wire_dtype);
             p->bucketer = std::make_unique<GradBucketer>(arg_as<Communicator>(comm, "comm", "a gpucloud.Communicator"),
                                                          views, o);
             return p;
           }),
           py::arg("comm"), py::arg("grads"), py::kw_only(), py::arg("bucket_bytes") = BucketOptions{}.bucket_bytes,
           py::arg("first_bucket_bytes") = BucketOptions{}.first_bucket_bytes, py::arg("hierarchical") = false,
           py::arg("wire_dtype") = py::none())
      .def(
          "mark_ready",
          [](PyBucketer& b, std::size_t index, PyStream& stream) {
            without_gil([&] { b.bucketer->mark_ready(index, stream.view); });
          },
          py::arg("index"), py::arg("stream"))
      .def(
          "wait", [](PyBucketer& b, PyStream& stream) { without_gil([&] { b.bucketer->wait(stream.view); }); },
          py::arg("stream"))
      .def_property_readonly("bucket_count", [](PyBucketer& b) { return b.bucketer->bucket_count(); })
      .def(
          "bucket_of", [](PyBucketer& b, std::size_t i) { return b.bucketer->bucket_of(i); }, py::arg("index"));
}

}  // namespace gpucloud::python
