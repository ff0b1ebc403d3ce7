// The MPI backend of Communicator: host buffers, nonblocking MPI collectives run on the stream's
// worker and polled against the timeout; fp16/bf16 reductions through custom MPI ops.
#include <gpucloud/communicator.hpp>
#include <gpucloud/error.hpp>

#include "detail/access.hpp"
#include "detail/mpi_check.hpp"
#include "detail/nvtx.hpp"
#include "detail/stream_impl.hpp"

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

std::string hostname() {
  char name[256] = {};
  gethostname(name, sizeof name - 1);
  return name;
}

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

struct Communicator::Impl {
  MPI_Comm world = MPI_COMM_NULL, local = MPI_COMM_NULL, cross = MPI_COMM_NULL;
  int rank = 0, size = 1, local_rank = 0, local_size = 1, node = 0, nodes = 1;
  bool uniform_nodes = true;
  std::chrono::milliseconds timeout{600000};
  std::atomic<bool> broken{false};
  std::mutex order;   // collectives on one communicator are issued in one order on every rank
  std::string where;  // "host:rank N" for messages
  std::optional<AllReduceCostModel> model;

  ~Impl() {
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
  static std::unique_ptr<Impl> build(MPI_Comm parent, const char* call);

  void check_usable(const char* op) const {
    if (broken) {
      throw CommunicationError(op, where + ": the communicator is broken by an earlier timeout or failure", __FILE__,
                               __LINE__);
    }
  }
};

Communicator::Communicator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Communicator::~Communicator() = default;
Communicator::Communicator(Communicator&&) noexcept = default;
Communicator& Communicator::operator=(Communicator&&) noexcept = default;

Communicator Communicator::mpi_world() {
  ensure_mpi();
  return Communicator(Impl::build(MPI_COMM_WORLD, "Communicator::mpi_world"));
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
  return Communicator(Impl::build(parent, "Communicator::mpi"));
}

std::unique_ptr<Communicator::Impl> Communicator::Impl::build(MPI_Comm parent, const char* call) {
  auto c = std::make_unique<Impl>();
  GPUCLOUD_MPI_CHECK(MPI_Comm_dup(parent, &c->world));
  GPUCLOUD_MPI_CHECK(MPI_Comm_rank(c->world, &c->rank));
  GPUCLOUD_MPI_CHECK(MPI_Comm_size(c->world, &c->size));
  c->where = hostname() + ":rank " + std::to_string(c->rank);
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
  if (const char* t = std::getenv("GPUCLOUD_COMM_TIMEOUT"); t != nullptr && *t != '\0') {
    c->timeout = std::chrono::milliseconds(static_cast<std::int64_t>(std::atof(t) * 1000.0));
  }
  return c;
}

int Communicator::rank() const noexcept { return impl_->rank; }
int Communicator::size() const noexcept { return impl_->size; }
int Communicator::local_rank() const noexcept { return impl_->local_rank; }
int Communicator::local_size() const noexcept { return impl_->local_size; }
int Communicator::node() const noexcept { return impl_->node; }
int Communicator::nodes() const noexcept { return impl_->nodes; }
std::chrono::milliseconds Communicator::timeout() const noexcept { return impl_->timeout; }
bool Communicator::broken() const noexcept { return impl_->broken; }

void Communicator::set_timeout(std::chrono::milliseconds timeout) {
  GPUCLOUD_EXPECTS(timeout.count() > 0, "Communicator::set_timeout", "timeout: must be positive");
  impl_->timeout = timeout;
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

void Communicator::all_reduce(BufferView send, BufferView recv, ReduceOp op, StreamView stream) {
  constexpr const char* call = "Communicator::all_reduce";
  impl_->check_usable(call);
  check_all_reduce(send, recv, op, stream, call);
  Impl* c = impl_.get();
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

void Communicator::hierarchical_all_reduce(BufferView send, BufferView recv, ReduceOp op, StreamView stream) {
  constexpr const char* call = "Communicator::hierarchical_all_reduce";
  impl_->check_usable(call);
  check_all_reduce(send, recv, op, stream, call);
  GPUCLOUD_EXPECTS(impl_->uniform_nodes, call, "nodes have different numbers of processes");
  Impl* c = impl_.get();
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

void Communicator::reduce_scatter(BufferView send, BufferView recv, ReduceOp op, StreamView stream) {
  constexpr const char* call = "Communicator::reduce_scatter";
  impl_->check_usable(call);
  check_host(send, stream, call, "send");
  check_host(recv, stream, call, "recv");
  GPUCLOUD_EXPECTS(send.dtype() == recv.dtype(), call, "recv: must match send's dtype");
  GPUCLOUD_EXPECTS(send.size() == recv.size() * static_cast<std::size_t>(impl_->size), call,
                   "send: " + std::to_string(send.size()) + " elements, expected size() * recv = " +
                       std::to_string(recv.size() * static_cast<std::size_t>(impl_->size)));
  check_reduction(op, send.dtype(), call);
  detail::check_no_overlap(recv, send, call, "send");
  Impl* c = impl_.get();
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

void Communicator::all_gather(BufferView send, BufferView recv, StreamView stream) {
  constexpr const char* call = "Communicator::all_gather";
  impl_->check_usable(call);
  check_host(send, stream, call, "send");
  check_host(recv, stream, call, "recv");
  GPUCLOUD_EXPECTS(send.dtype() == recv.dtype(), call, "recv: must match send's dtype");
  GPUCLOUD_EXPECTS(recv.size() == send.size() * static_cast<std::size_t>(impl_->size), call,
                   "recv: " + std::to_string(recv.size()) + " elements, expected size() * send = " +
                       std::to_string(send.size() * static_cast<std::size_t>(impl_->size)));
  (void)mpi_type(send.dtype(), call);
  detail::check_no_overlap(recv, send, call, "send");
  Impl* c = impl_.get();
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

void Communicator::broadcast(BufferView buffer, int root, StreamView stream) {
  constexpr const char* call = "Communicator::broadcast";
  impl_->check_usable(call);
  check_host(buffer, stream, call, "buffer");
  GPUCLOUD_EXPECTS(root >= 0 && root < impl_->size, call,
                   "root: " + std::to_string(root) + " is not a rank of " + std::to_string(impl_->size));
  (void)mpi_type(buffer.dtype(), call);
  Impl* c = impl_.get();
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

void Communicator::barrier(StreamView stream) {
  constexpr const char* call = "Communicator::barrier";
  impl_->check_usable(call);
  GPUCLOUD_EXPECTS(stream.device().is_host(), call, "stream: the MPI backend runs on host streams");
  Impl* c = impl_.get();
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

AllReduceCostModel Communicator::measure_cost_model(StreamView stream) {
  constexpr const char* call = "Communicator::measure_cost_model";
  impl_->check_usable(call);
  stream.synchronize();  // ordered after the collectives enqueued before
  Impl& c = *impl_;
  std::lock_guard<std::mutex> lock(c.order);
  // Seconds per all-reduce of `bytes` on `comm` (every rank times its own group; the slowest counts).
  auto seconds = [&](MPI_Comm comm, std::size_t bytes, int reps) {
    std::vector<float> buf(std::max<std::size_t>(bytes / 4, 1));
    GPUCLOUD_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, buf.data(), static_cast<int>(buf.size()), MPI_FLOAT, MPI_SUM, comm));
    GPUCLOUD_MPI_CHECK(MPI_Barrier(c.world));
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) {
      GPUCLOUD_MPI_CHECK(
          MPI_Allreduce(MPI_IN_PLACE, buf.data(), static_cast<int>(buf.size()), MPI_FLOAT, MPI_SUM, comm));
    }
    double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
    GPUCLOUD_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, c.world));
    return t;
  };
  // Fit T(S) = 2(p-1) alpha + 2(p-1)/p S beta from a tiny and a large all-reduce.
  auto fit = [&](MPI_Comm comm, int p) {
    LinkCost link;
    const double small = seconds(comm, 8, 50);
    const std::size_t big_bytes = std::size_t{4} << 20;
    const double big = seconds(comm, big_bytes, 5);
    if (p <= 1) return link;
    link.alpha = small / (2.0 * (p - 1));
    link.beta = std::max(big - small, 0.0) / (2.0 * (p - 1) / p * static_cast<double>(big_bytes));
    return link;
  };
  AllReduceCostModel m;
  m.local_size = c.local_size;
  m.nodes = c.nodes;
  m.intra = fit(c.local, c.local_size);
  m.inter = c.nodes > 1 ? fit(c.cross, c.nodes) : m.intra;
  c.model = m;
  return m;
}

void Communicator::set_cost_model(const AllReduceCostModel& model) {
  GPUCLOUD_EXPECTS(model.local_size == impl_->local_size && model.nodes == impl_->nodes, "Communicator::set_cost_model",
                   "model: measured for " + std::to_string(model.nodes) + " node(s) of " +
                       std::to_string(model.local_size) + ", this job has " + std::to_string(impl_->nodes) + " of " +
                       std::to_string(impl_->local_size));
  impl_->model = model;
}

void Communicator::all_reduce_auto(BufferView send, BufferView recv, ReduceOp op, StreamView stream) {
  const bool hierarchical = impl_->model && impl_->nodes > 1 && impl_->local_size > 1 && impl_->uniform_nodes &&
                            impl_->model->prefer_hierarchical(send.size_bytes());
  if (hierarchical) {
    hierarchical_all_reduce(send, recv, op, stream);
  } else {
    all_reduce(send, recv, op, stream);
  }
}

}  // namespace gpucloud
