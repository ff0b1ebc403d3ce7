// The MPI backend of Communicator: host buffers, nonblocking MPI collectives run on the stream's
// worker and polled against the timeout; fp16/bf16 reductions through custom MPI ops.
#include <gpucloud/comm/communicator.hpp>
#include <gpucloud/runtime/error.hpp>

#include "comm/communicator_impl.hpp"
#include "comm/mpi/mpi_check.hpp"
#include "comm/nccl/nccl_communicator.hpp"
#include "runtime/access.hpp"
#include "runtime/nvtx.hpp"
#include "runtime/stream_impl.hpp"

#include <mpi.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

namespace gpucloud {

namespace {

// ---- fp16 / bf16 on MPI: 2-byte types and reductions that add in fp32 --------------------------

struct NarrowTypes {
  MPI_Datatype f16 = MPI_DATATYPE_NULL, bf16 = MPI_DATATYPE_NULL;
  MPI_Op sum = MPI_OP_NULL, max = MPI_OP_NULL, min = MPI_OP_NULL;
};

NarrowTypes& narrow();

template <class Combine>
void reduce_narrow(void* in, void* inout, int* len, MPI_Datatype* type, Combine combine) {
  const bool half = *type == narrow().f16;
  const auto* a = static_cast<const std::uint16_t*>(in);
  auto* b = static_cast<std::uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) {
    const float x = half ? detail::half_bits_to_float(a[i]) : detail::bfloat16_bits_to_float(a[i]);
    const float y = half ? detail::half_bits_to_float(b[i]) : detail::bfloat16_bits_to_float(b[i]);
    const float r = combine(x, y);
    b[i] = half ? detail::float_to_half_bits(r) : detail::float_to_bfloat16_bits(r);
  }
}

void narrow_sum(void* in, void* inout, int* len, MPI_Datatype* t) {
  reduce_narrow(in, inout, len, t, [](float x, float y) { return x + y; });
}
void narrow_max(void* in, void* inout, int* len, MPI_Datatype* t) {
  reduce_narrow(in, inout, len, t, [](float x, float y) { return x > y ? x : y; });
}
void narrow_min(void* in, void* inout, int* len, MPI_Datatype* t) {
  reduce_narrow(in, inout, len, t, [](float x, float y) { return x < y ? x : y; });
}

NarrowTypes& narrow() {
  static NarrowTypes t;
  return t;
}

void ensure_mpi() {
  static std::once_flag once;
  std::call_once(once, [] {
    int initialized = 0;
    GPUCLOUD_MPI_CHECK(MPI_Initialized(&initialized));
    if (!initialized) {
      int provided = 0;
      GPUCLOUD_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided));
      std::atexit([] {
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (!finalized) MPI_Finalize();
      });
    }
    int provided = 0;
    GPUCLOUD_MPI_CHECK(MPI_Query_thread(&provided));
    if (provided < MPI_THREAD_MULTIPLE) {
      GPUCLOUD_FAIL(Unsupported, "Communicator::mpi_world",
                    "MPI was initialised without MPI_THREAD_MULTIPLE, which stream workers need");
    }
    NarrowTypes& t = narrow();
    GPUCLOUD_MPI_CHECK(MPI_Type_contiguous(2, MPI_BYTE, &t.f16));
    GPUCLOUD_MPI_CHECK(MPI_Type_commit(&t.f16));
    GPUCLOUD_MPI_CHECK(MPI_Type_contiguous(2, MPI_BYTE, &t.bf16));
    GPUCLOUD_MPI_CHECK(MPI_Type_commit(&t.bf16));
    GPUCLOUD_MPI_CHECK(MPI_Op_create(&narrow_sum, 1, &t.sum));
    GPUCLOUD_MPI_CHECK(MPI_Op_create(&narrow_max, 1, &t.max));
    GPUCLOUD_MPI_CHECK(MPI_Op_create(&narrow_min, 1, &t.min));
  });
}

MPI_Datatype mpi_type(DType t, const char* call) {
  switch (t) {
    case DType::float32:
      return MPI_FLOAT;
    case DType::float64:
      return MPI_DOUBLE;
    case DType::int32:
      return MPI_INT32_T;
    case DType::int64:
      return MPI_INT64_T;
    case DType::float16:
      return narrow().f16;
    case DType::bfloat16:
      return narrow().bf16;
    case DType::uint8:
      return MPI_UINT8_T;
    default:
      break;
  }
  GPUCLOUD_FAIL(InvalidArgument, call, std::string("dtype: ") + dtype_name(t) + " is not supported by collectives");
}

MPI_Op mpi_op(ReduceOp op, DType t) {
  const bool narrow_type = t == DType::float16 || t == DType::bfloat16;
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::average:
      return narrow_type ? narrow().sum : MPI_SUM;
    case ReduceOp::max:
      return narrow_type ? narrow().max : MPI_MAX;
    case ReduceOp::min:
      return narrow_type ? narrow().min : MPI_MIN;
  }
  return MPI_SUM;
}

// recv /= size for average (floats only; checked before).
void divide(BufferView v, int size) {
  const double inv = 1.0 / size;
  for (std::size_t i = 0; i < v.size(); ++i) {
    switch (v.dtype()) {
      case DType::float32:
        static_cast<float*>(v.data())[i] = static_cast<float>(static_cast<float*>(v.data())[i] * inv);
        break;
      case DType::float64:
        static_cast<double*>(v.data())[i] *= inv;
        break;
      case DType::float16: {
        auto* p = static_cast<std::uint16_t*>(v.data()) + i;
        *p = detail::float_to_half_bits(static_cast<float>(detail::half_bits_to_float(*p) * inv));
        break;
      }
      case DType::bfloat16: {
        auto* p = static_cast<std::uint16_t*>(v.data()) + i;
        *p = detail::float_to_bfloat16_bits(static_cast<float>(detail::bfloat16_bits_to_float(*p) * inv));
        break;
      }
      default:
        break;
    }
  }
}

}  // namespace

// The MPI backend: the communicator's duplicate of the caller's MPI communicator, and the
// intra-node (local) and cross-node sub-communicators, built once.
struct MpiCommunicator final : Communicator::Impl {
  MPI_Comm world = MPI_COMM_NULL, local = MPI_COMM_NULL, cross = MPI_COMM_NULL;

  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    for (MPI_Comm* c : {&cross, &local, &world}) {
      if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
    }
  }

  // Waits for @p request, polling against the timeout; a timeout breaks the communicator.
  void wait(MPI_Request& request, const char* op) {
    const auto start = std::chrono::steady_clock::now();
    for (;;) {
      int done = 0;
      GPUCLOUD_MPI_CHECK(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
      if (done) return;
      const auto waited =
          std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
      if (waited > timeout) {
        broken = true;
        throw CommunicationError(op,
                                 where + " waited " + std::to_string(waited.count()) +
                                     " ms for the other ranks (GPUCLOUD_COMM_TIMEOUT); a rank is missing, slow or "
                                     "dead. The communicator is broken: later collectives on it fail",
                                 __FILE__, __LINE__);
      }
      // MPI progresses nonblocking collectives inside MPI_Test: poll eagerly (yielding the core to
      // other ranks), and only back off to sleeping once a wait has become long.
      if (waited < std::chrono::milliseconds(100)) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
    }
  }

  // Every rank must agree on the operation, count and dtype; a mismatch is an error on every
  // rank instead of corrupted data or a hang.
  void agree(const char* op, std::int64_t count, DType dtype, MPI_Comm comm) {
    std::int64_t mine[4] = {count, -count, static_cast<std::int64_t>(dtype), -static_cast<std::int64_t>(dtype)};
    std::int64_t all[4];
    MPI_Request r;
    GPUCLOUD_MPI_CHECK(MPI_Iallreduce(mine, all, 4, MPI_INT64_T, MPI_MAX, comm, &r));
    wait(r, op);
    if (all[0] != -all[1] || all[2] != -all[3]) {
      throw CommunicationError(op,
                               where + ": ranks disagree on the count (" + std::to_string(-all[1]) + " to " +
                                   std::to_string(all[0]) + ") or the dtype; nothing was exchanged",
                               __FILE__, __LINE__);
    }
  }

  // A communicator over a duplicate of @p parent: nodes from GPUCLOUD_LOCAL_SIZE or a
  // shared-memory split, the cross-node communicator, the timeout from GPUCLOUD_COMM_TIMEOUT.
  static std::unique_ptr<MpiCommunicator> build(MPI_Comm parent, const char* call);

  void all_reduce(BufferView send, BufferView recv, ReduceOp op, StreamView stream) override;
  void hierarchical_all_reduce(BufferView send, BufferView recv, ReduceOp op, StreamView stream) override;
  void reduce_scatter(BufferView send, BufferView recv, ReduceOp op, StreamView stream) override;
  void all_gather(BufferView send, BufferView recv, StreamView stream) override;
  void broadcast(BufferView buffer, int root, StreamView stream) override;
  void barrier(StreamView stream) override;
  double time_all_reduce(bool intra, std::size_t bytes, int repeats) override;
};

Communicator Communicator::mpi_world() {
  ensure_mpi();
  return Communicator(MpiCommunicator::build(MPI_COMM_WORLD, "Communicator::mpi_world"));
}

Communicator Communicator::nccl_from_mpi(Device device) {
  constexpr const char* call = "Communicator::nccl_from_mpi";
  Communicator world = mpi_world();
  const auto& mpi = static_cast<const MpiCommunicator&>(*world.impl_);
  if (device.is_host()) {
    const int gpus = cuda_device_count();
    GPUCLOUD_EXPECTS(gpus > 0, call, "device: no GPU is visible (" + cuda_unavailable_reason() + ")");
    device = Device::cuda(mpi.local_rank % gpus);
  }
  // Rank 0 makes the id, MPI hands it to everyone (a failure on rank 0 is everyone's).
  NcclUniqueId id;
  int ok = 1;
  std::string why;
  if (mpi.rank == 0) {
    try {
      id = nccl_unique_id();
    } catch (const Error& e) {
      ok = 0;
      why = e.what();
    }
  }
  GPUCLOUD_MPI_CHECK(MPI_Bcast(&ok, 1, MPI_INT, 0, mpi.world));
  if (!ok)
    GPUCLOUD_FAIL(CommunicationError, call,
                  "rank 0 could not make a NCCL unique id: " + (why.empty() ? std::string("see rank 0") : why));
  GPUCLOUD_MPI_CHECK(MPI_Bcast(id.bytes.data(), static_cast<int>(id.bytes.size()), MPI_BYTE, 0, mpi.world));
  return Communicator(detail::make_nccl_communicator(id, mpi.rank, mpi.size, device, mpi.local_size));
}

Communicator Communicator::mpi(std::int64_t fortran_handle) {
  int initialized = 0, finalized = 0;
  GPUCLOUD_MPI_CHECK(MPI_Initialized(&initialized));
  GPUCLOUD_MPI_CHECK(MPI_Finalized(&finalized));
  GPUCLOUD_EXPECTS(initialized && !finalized, "Communicator::mpi",
                   "fortran_handle: MPI is not initialised (or already finalised), so no MPI communicator exists");
  const MPI_Comm parent = MPI_Comm_f2c(static_cast<MPI_Fint>(fortran_handle));
  GPUCLOUD_EXPECTS(parent != MPI_COMM_NULL && static_cast<std::int64_t>(MPI_Comm_c2f(parent)) == fortran_handle,
                   "Communicator::mpi",
                   "fortran_handle: " + std::to_string(fortran_handle) + " is not a live MPI communicator");
  int inter = 0;
  GPUCLOUD_MPI_CHECK(MPI_Comm_test_inter(parent, &inter));
  GPUCLOUD_EXPECTS(!inter, "Communicator::mpi", "fortran_handle: an inter-communicator; pass an intra-communicator");
  ensure_mpi();
  return Communicator(MpiCommunicator::build(parent, "Communicator::mpi"));
}

std::unique_ptr<MpiCommunicator> MpiCommunicator::build(MPI_Comm parent, const char* call) {
  auto c = std::make_unique<MpiCommunicator>();
  GPUCLOUD_MPI_CHECK(MPI_Comm_dup(parent, &c->world));
  GPUCLOUD_MPI_CHECK(MPI_Comm_rank(c->world, &c->rank));
  GPUCLOUD_MPI_CHECK(MPI_Comm_size(c->world, &c->size));
  c->where = detail::where(c->rank);
  if (const char* forced = std::getenv("GPUCLOUD_LOCAL_SIZE"); forced != nullptr && *forced != '\0') {
    const int local_size = std::atoi(forced);
    GPUCLOUD_EXPECTS(local_size >= 1 && c->size % local_size == 0, call,
                     std::string("GPUCLOUD_LOCAL_SIZE: ") + forced + " does not divide the " + std::to_string(c->size) +
                         " processes into equal nodes");
    GPUCLOUD_MPI_CHECK(MPI_Comm_split(c->world, c->rank / local_size, c->rank, &c->local));
  } else {
    GPUCLOUD_MPI_CHECK(MPI_Comm_split_type(c->world, MPI_COMM_TYPE_SHARED, c->rank, MPI_INFO_NULL, &c->local));
  }
  GPUCLOUD_MPI_CHECK(MPI_Comm_rank(c->local, &c->local_rank));
  GPUCLOUD_MPI_CHECK(MPI_Comm_size(c->local, &c->local_size));
  GPUCLOUD_MPI_CHECK(MPI_Comm_split(c->world, c->local_rank, c->rank, &c->cross));
  GPUCLOUD_MPI_CHECK(MPI_Comm_rank(c->cross, &c->node));
  GPUCLOUD_MPI_CHECK(MPI_Comm_size(c->cross, &c->nodes));
  int sizes[2] = {c->local_size, -c->local_size};
  GPUCLOUD_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, sizes, 2, MPI_INT, MPI_MAX, c->world));
  c->uniform_nodes = sizes[0] == -sizes[1];
  c->timeout = detail::timeout_from_environment();
  return c;
}

namespace {

void check_host(BufferView v, StreamView s, const char* call, const char* arg) {
  GPUCLOUD_EXPECTS(s.device().is_host(), call, "stream: the MPI backend runs on host streams, not " + s.device().str());
  GPUCLOUD_EXPECTS(v.device().is_host(), call,
                   std::string(arg) + ": the MPI backend takes host memory, not memory of " + v.device().str());
  detail::check_access(v, s, detail::Access::copy, call, arg);
}

void check_reduction(ReduceOp op, DType t, const char* call) {
  (void)mpi_type(t, call);
  GPUCLOUD_EXPECTS(op != ReduceOp::average || is_floating(t), call,
                   std::string("op: average needs a floating dtype, not ") + dtype_name(t));
  GPUCLOUD_EXPECTS(t != DType::uint8, call, "dtype: uint8 is not reducible");
}

// The checks all_reduce and hierarchical_all_reduce share.
void check_all_reduce(BufferView send, BufferView recv, ReduceOp op, StreamView stream, const char* call) {
  check_host(send, stream, call, "send");
  check_host(recv, stream, call, "recv");
  GPUCLOUD_EXPECTS(send.dtype() == recv.dtype() && send.size() == recv.size(), call,
                   "recv: must match send's dtype and size");
  check_reduction(op, send.dtype(), call);
}

const void* send_or_in_place(BufferView send, BufferView recv) {
  return send.data() == recv.data() ? MPI_IN_PLACE : send.data();
}

}  // namespace

void MpiCommunicator::all_reduce(BufferView send, BufferView recv, ReduceOp op, StreamView stream) {
  constexpr const char* call = "Communicator::all_reduce";
  check_all_reduce(send, recv, op, stream, call);
  MpiCommunicator* c = this;
  launch_host_func(stream, [c, send, recv, op] {
    detail::NvtxRange range("gpucloud all_reduce");
    std::lock_guard<std::mutex> lock(c->order);
    c->check_usable(call);
    c->agree(call, static_cast<std::int64_t>(send.size()), send.dtype(), c->world);
    MPI_Request r;
    GPUCLOUD_MPI_CHECK(MPI_Iallreduce(send_or_in_place(send, recv), recv.data(), static_cast<int>(recv.size()),
                                      mpi_type(recv.dtype(), call), mpi_op(op, recv.dtype()), c->world, &r));
    c->wait(r, call);
    if (op == ReduceOp::average) divide(recv, c->size);
  });
}

void MpiCommunicator::hierarchical_all_reduce(BufferView send, BufferView recv, ReduceOp op, StreamView stream) {
  constexpr const char* call = "Communicator::hierarchical_all_reduce";
  check_all_reduce(send, recv, op, stream, call);
  MpiCommunicator* c = this;
  launch_host_func(stream, [c, send, recv, op] {
    detail::NvtxRange range("gpucloud hierarchical_all_reduce");
    std::lock_guard<std::mutex> lock(c->order);
    c->check_usable(call);
    c->agree(call, static_cast<std::int64_t>(send.size()), send.dtype(), c->world);
    const MPI_Datatype type = mpi_type(send.dtype(), call);
    const MPI_Op mop = mpi_op(op, send.dtype());
    const std::size_t elem = dtype_size(send.dtype());
    // Shards of the count over the node's ranks; the first n % L get one more.
    const int L = c->local_size;
    const std::int64_t n = static_cast<std::int64_t>(send.size());
    std::vector<int> counts(L), displs(L);
    for (int i = 0, at = 0; i < L; ++i) {
      counts[i] = static_cast<int>(n / L + (i < n % L ? 1 : 0));
      displs[i] = at;
      at += counts[i];
    }
    std::vector<unsigned char> shard(static_cast<std::size_t>(counts[c->local_rank]) * elem + 1);
    MPI_Request r;
    // (1) reduce-scatter inside the node
    GPUCLOUD_MPI_CHECK(MPI_Ireduce_scatter(send.data(), shard.data(), counts.data(), type, mop, c->local, &r));
    c->wait(r, call);
    // (2) all-reduce of the shard among the ranks holding it on the other nodes
    GPUCLOUD_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, shard.data(), counts[c->local_rank], type, mop, c->cross, &r));
    c->wait(r, call);
    // (3) all-gather inside the node
    GPUCLOUD_MPI_CHECK(MPI_Iallgatherv(shard.data(), counts[c->local_rank], type, recv.data(), counts.data(),
                                       displs.data(), type, c->local, &r));
    c->wait(r, call);
    if (op == ReduceOp::average) divide(recv, c->size);
  });
}

void MpiCommunicator::reduce_scatter(BufferView send, BufferView recv, ReduceOp op, StreamView stream) {
  constexpr const char* call = "Communicator::reduce_scatter";
  check_host(send, stream, call, "send");
  check_host(recv, stream, call, "recv");
  check_reduction(op, send.dtype(), call);
  detail::check_no_overlap(recv, send, call, "send");
  MpiCommunicator* c = this;
  launch_host_func(stream, [c, send, recv, op] {
    std::lock_guard<std::mutex> lock(c->order);
    c->check_usable(call);
    c->agree(call, static_cast<std::int64_t>(recv.size()), recv.dtype(), c->world);
    MPI_Request r;
    GPUCLOUD_MPI_CHECK(MPI_Ireduce_scatter_block(send.data(), recv.data(), static_cast<int>(recv.size()),
                                                 mpi_type(recv.dtype(), call), mpi_op(op, recv.dtype()), c->world, &r));
    c->wait(r, call);
    if (op == ReduceOp::average) divide(recv, c->size);
  });
}

void MpiCommunicator::all_gather(BufferView send, BufferView recv, StreamView stream) {
  constexpr const char* call = "Communicator::all_gather";
  check_host(send, stream, call, "send");
  check_host(recv, stream, call, "recv");
  (void)mpi_type(send.dtype(), call);
  detail::check_no_overlap(recv, send, call, "send");
  MpiCommunicator* c = this;
  launch_host_func(stream, [c, send, recv] {
    std::lock_guard<std::mutex> lock(c->order);
    c->check_usable(call);
    c->agree(call, static_cast<std::int64_t>(send.size()), send.dtype(), c->world);
    const MPI_Datatype type = mpi_type(send.dtype(), call);
    MPI_Request r;
    GPUCLOUD_MPI_CHECK(MPI_Iallgather(send.data(), static_cast<int>(send.size()), type, recv.data(),
                                      static_cast<int>(send.size()), type, c->world, &r));
    c->wait(r, call);
  });
}

void MpiCommunicator::broadcast(BufferView buffer, int root, StreamView stream) {
  constexpr const char* call = "Communicator::broadcast";
  check_host(buffer, stream, call, "buffer");
  (void)mpi_type(buffer.dtype(), call);
  MpiCommunicator* c = this;
  launch_host_func(stream, [c, buffer, root] {
    std::lock_guard<std::mutex> lock(c->order);
    c->check_usable(call);
    c->agree(call, static_cast<std::int64_t>(buffer.size()), buffer.dtype(), c->world);
    MPI_Request r;
    GPUCLOUD_MPI_CHECK(
        MPI_Ibcast(buffer.data(), static_cast<int>(buffer.size()), mpi_type(buffer.dtype(), call), root, c->world, &r));
    c->wait(r, call);
  });
}

void MpiCommunicator::barrier(StreamView stream) {
  constexpr const char* call = "Communicator::barrier";
  GPUCLOUD_EXPECTS(stream.device().is_host(), call, "stream: the MPI backend runs on host streams");
  MpiCommunicator* c = this;
  launch_host_func(stream, [c] {
    std::lock_guard<std::mutex> lock(c->order);
    c->check_usable(call);
    MPI_Request r;
    GPUCLOUD_MPI_CHECK(MPI_Ibarrier(c->world, &r));
    c->wait(r, call);
  });
}

}  // namespace gpucloud

namespace gpucloud {

double MpiCommunicator::time_all_reduce(bool intra, std::size_t bytes, int repeats) {
  const MPI_Comm comm = intra ? local : cross;
  std::vector<float> buf(std::max<std::size_t>(bytes / 4, 1));
  GPUCLOUD_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, buf.data(), static_cast<int>(buf.size()), MPI_FLOAT, MPI_SUM, comm));
  GPUCLOUD_MPI_CHECK(MPI_Barrier(world));
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < repeats; ++i) {
    GPUCLOUD_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, buf.data(), static_cast<int>(buf.size()), MPI_FLOAT, MPI_SUM, comm));
  }
  double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / repeats;
  GPUCLOUD_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, world));
  return t;
}

}  // namespace gpucloud
